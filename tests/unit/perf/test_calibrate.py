"""`slurmpod calibrate`: a site's own jobs set its efficiency factors; plan then uses them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LOG = ROOT / "tests" / "data" / "megatron" / "megatron-2024-restart.log"


def slurmpod(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurmpod", *args], cwd=ROOT, text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=120)


def test_calibrate_stores_factors_that_plan_then_uses(tmp_path: Path) -> None:
    site = tmp_path / "mysite.toml"
    shutil.copy(ROOT / "site_configs" / "dgx-h100-superpod.toml", site)
    before = json.loads(slurmpod("plan", "--preset", "llama3-8b", "--site", str(site),
                                 "--json").stdout)["prediction"]
    r = slurmpod("calibrate", str(LOG), "--site", str(site))
    assert r.returncode == 0, r.stderr
    stored = tmp_path / "mysite.perf.toml"
    assert stored.is_file() and 'generation = "hopper"' in stored.read_text()
    # One job: after the fit its prediction is its achieved time.
    assert "predicted / achieved 1.00" in r.stdout
    after = json.loads(slurmpod("plan", "--preset", "llama3-8b", "--site", str(site),
                                "--json").stdout)["prediction"]
    assert "mysite.perf.toml" in after["efficiency"]["fitted_on"]
    assert after["step_time_s"] != before["step_time_s"]
    # The track record's errors are the built-in fit's: plan says the site's replaces it.
    assert before["track_record"]["site_calibrated"] is False
    assert after["track_record"]["site_calibrated"] is True
    text = slurmpod("plan", "--preset", "llama3-8b", "--site", str(site)).stdout
    assert "(with the built-in factors; this prediction uses the site's own calibration)" in text


def test_builtin_site_needs_output_and_a_log_without_dump_is_a_usage_error(tmp_path: Path
                                                                           ) -> None:
    r = slurmpod("calibrate", str(LOG))
    assert r.returncode == 2 and "built in" in r.stderr and "Traceback" not in r.stderr
    empty = tmp_path / "x.log"
    empty.write_text("no megatron here\n")
    r = slurmpod("calibrate", str(empty), "--dry-run")
    assert r.returncode == 2 and "Traceback" not in r.stderr
