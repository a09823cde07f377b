"""The HTML reports as Chromium lays them out: the headline card first and on the first screen,
sections in reading order, no horizontal scrolling at a desktop or a narrow window, every plot
drawn at a readable size; screenshots inspected for the plots' colours.

Chromium (Debian package `chromium`, in .ci/install's list) runs headless on local files: no
network. Layout is read with `--dump-dom` from a copy of the page with a probe script appended
(the reports themselves carry no script) that writes the bounding boxes into the DOM. In CI
(`CI=true`) a missing chromium fails the test; elsewhere it skips."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.unit.report.test_html import fleet_page, page

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
PROBE = """<script>
(() => {
  const box = e => { const r = e.getBoundingClientRect();
    return {id: e.id, top: r.top + scrollY, left: r.left, right: r.right, width: r.width,
            height: r.height}; };
  const out = {inner: innerWidth, scroll: document.documentElement.scrollWidth,
    sections: [...document.querySelectorAll('section[id]')].map(box),
    plots: [...document.querySelectorAll('svg.plot')].map(box),
    wide: [...document.querySelectorAll('body *')].filter(
      e => e.getBoundingClientRect().right > innerWidth + 1).map(e => e.tagName + '#' + e.id)
      .slice(0, 10)};
  const pre = document.createElement('pre');
  pre.id = 'probe'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        if CI:
            pytest.fail("CI must run this check: `chromium` is not installed (bash .ci/install)",
                        pytrace=False)
        pytest.skip("chromium not installed")
    return path


def _run(args: list[str], html: Path, width: int, height: int) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="slurmpod-chromium-") as tmp:
        return subprocess.run(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--hide-scrollbars", f"--user-data-dir={tmp}/profile",
             f"--window-size={width},{height}", *args, html.resolve().as_uri()],
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def layout(html_text: str, tmp: Path, width: int, height: int = 900) -> dict[str, Any]:
    probe = tmp / f"probe-{width}.html"
    probe.write_text(html_text.replace("</body>", PROBE + "</body>"))
    cp = _run(["--dump-dom"], probe, width, height)
    m = re.search(r'<pre id="probe">(.*?)</pre>', cp.stdout, re.S)
    assert m, f"chromium gave no layout (rc {cp.returncode}): {cp.stderr[-800:]}"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&amp;", "&")
                      .replace("&lt;", "<").replace("&gt;", ">"))


def screenshot(html_text: str, tmp: Path, width: int, height: int) -> np.ndarray:
    from PIL import Image

    src = tmp / "page.html"
    src.write_text(html_text)
    png = tmp / f"shot-{width}x{height}.png"
    cp = _run([f"--screenshot={png}"], src, width, height)
    assert png.exists(), f"chromium made no screenshot (rc {cp.returncode}): {cp.stderr[-800:]}"
    return np.asarray(Image.open(png).convert("RGB"), dtype=np.int16)


def pixels(img: np.ndarray, hex_colour: str, tol: int = 14) -> int:
    rgb = np.array([int(hex_colour[i:i + 2], 16) for i in (1, 3, 5)], dtype=np.int16)
    return int((np.abs(img - rgb).max(axis=2) <= tol).sum())


def _ids(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {i["id"]: i for i in items}


@pytest.mark.parametrize("width", [1280, 760])
def test_job_page_layout(tmp_path: Path, width: int) -> None:
    lay = layout(page(), tmp_path, width)
    assert lay["scroll"] <= lay["inner"], f"horizontal overflow: {lay['wide']}"
    secs = _ids(lay["sections"])
    tops = [secs[s]["top"] for s in ("headline", "model", "placement", "attempts", "plots",
                                     "resources", "gpu-time", "notes", "details")]
    assert tops == sorted(tops), tops
    if width >= 1200:  # a desktop window shows the whole card without scrolling
        assert secs["headline"]["top"] + secs["headline"]["height"] < 900
    plots = _ids(lay["plots"])
    assert set(plots) >= {"plot-mfu", "plot-step", "plot-hist", "plot-attempts",
                          "plot-placement", "plot-gpu-util", "plot-gpu-power"}
    for p in plots.values():
        assert p["width"] > 0.6 * min(width, 1100) - 80 and p["height"] > 80, p
        assert p["right"] <= width
    assert secs["placement"]["top"] < plots["plot-placement"]["top"] < secs["attempts"]["top"]
    assert secs["plots"]["top"] < plots["plot-mfu"]["top"] < plots["plot-step"]["top"]


@pytest.mark.parametrize("width", [1280, 760])
def test_fleet_page_layout(tmp_path: Path, width: int) -> None:
    lay = layout(fleet_page(), tmp_path, width)
    assert lay["scroll"] <= lay["inner"], f"horizontal overflow: {lay['wide']}"
    secs = _ids(lay["sections"])
    tops = [secs[s]["top"] for s in ("headline", "plots", "wasted", "chargeback", "by-user",
                                     "by-account", "by-partition")]
    assert tops == sorted(tops), tops
    assert {"plot-fleet-mfu", "plot-fleet-lost"} <= set(_ids(lay["plots"]))


def test_job_page_screenshots(tmp_path: Path) -> None:
    html = page()
    first = screenshot(html, tmp_path, 1280, 900)
    # The first screen: the headline card's green MFU/goodput figures and the verdict's orange
    # bar; no plot colour yet (the plots come after model, placement and attempts).
    assert pixels(first, "#2b8a3e") > 200
    assert pixels(first, "#f08c00") > 100
    assert pixels(first, "#e76f51") == 0
    full = screenshot(html, tmp_path, 1280, 5200)
    assert pixels(full, "#1d3557") > 400  # MFU line, utilisation heatmap
    assert pixels(full, "#6c757d") > 200  # the dashed 100 % line (and map cell borders)
    assert pixels(full, "#d8f3dc") > 5000  # the typical band
    assert pixels(full, "#e76f51") > 500  # step-time line
    assert pixels(full, "#b5179e") > 3000  # GPU power heatmap
    assert pixels(full, "#457b9d") > 500  # step-time histogram
    assert pixels(full, "#2a9d8f") > 1000  # placement map and the completed attempt
    # The same page without series or telemetry has none of the run's plot colours.
    bare = screenshot(page().split('<section id="plots">')[0] + "</body></html>", tmp_path,
                      1280, 2400)
    assert pixels(bare, "#e76f51") == 0 and pixels(bare, "#457b9d") == 0


def test_fleet_page_screenshot(tmp_path: Path) -> None:
    img = screenshot(fleet_page(), tmp_path, 1280, 2400)
    assert img.std() > 10
    assert pixels(img, "#457b9d") > 2000  # MFU distribution bars
    assert pixels(img, "#e63946") > 1000  # restarts in lost GPU-hours over time
