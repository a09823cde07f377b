"""`slurmpod topo check` / `topo discover` / `topo synth` through the real entry point: exit codes
0/1/3, JSON output, one-line errors, nothing half-written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmpod.cli.main import main
from slurmpod.config import load_site
from tests.helpers import DATA_DIR

DATA = DATA_DIR / "ibnetdiscover"


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def synth(argv: list[str], capsys) -> tuple[int, str, str]:
    return run(["topo", "synth", *argv], capsys)


@pytest.fixture()
def fabric(tmp_path, capsys):
    def make(*faults: str) -> Path:
        out = tmp_path / f"fabric-{len(list(tmp_path.iterdir()))}.txt"
        assert synth(["sandbox", "-o", str(out), *faults], capsys)[0] == 0
        return out
    return make


def test_clean_fabric_exits_0(fabric, capsys):
    rc, out, _ = run(["topo", "check", "sandbox", "--ibnetdiscover", str(fabric())], capsys)
    assert rc == 0 and "clean: the fabric matches the plan" in out


def test_findings_exit_1_with_fix_lines(fabric, capsys):
    path = fabric("--swap", "gpu001:mlx5_0,gpu001:mlx5_1", "--missing", "gpu009:mlx5_2")
    rc, out, _ = run(["topo", "check", "sandbox", "--ibnetdiscover", str(path)], capsys)
    assert rc == 1
    assert "2 findings (missing-link 1, swapped-cables 1)" in out
    assert "fix: swap the cables in leaf-su1-rail" in out


def test_json_report(fabric, capsys):
    path = fabric("--slow", "gpu003:mlx5_4=4xHDR")
    rc, out, _ = run(["topo", "check", "sandbox", "--ibnetdiscover", str(path), "--json"], capsys)
    assert rc == 1
    doc = json.loads(out)
    assert doc["counts"] == {"degraded-link": 1} and doc["site"] == "sandbox"
    assert doc["findings"][0]["subject"] == "gpu003 mlx5_4"


def test_limit_truncates_text_output(fabric, capsys):
    path = fabric(*[a for r in range(8) for a in ("--missing", f"gpu00{r + 1}:mlx5_{r}")])
    rc, out, _ = run(["topo", "check", "sandbox", "--ibnetdiscover", str(path), "--limit", "3"],
                     capsys)
    assert rc == 1 and "... and 5 more" in out


@pytest.mark.parametrize(("args", "says"), [
    (["--ibnetdiscover", str(DATA / "garbage.txt")], "garbage.txt:10: cannot parse port line"),
    (["--ibnetdiscover", "/nonexistent/fabric.txt"], "fabric.txt: file not found"),
])
def test_bad_input_exits_3(args, says, capsys):
    rc, _out, err = run(["topo", "check", "sandbox", *args], capsys)
    assert rc == 3 and says in err and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 2


def test_bad_site_exits_3(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[site\n")
    rc, _, err = run(["topo", "check", str(bad), "--ibnetdiscover", str(DATA / "basic.txt")],
                     capsys)
    assert rc == 3 and "malformed TOML" in err


def test_bad_filter_regex_is_a_usage_error(capsys):
    rc, _, err = run(["topo", "check", "sandbox", "--ibnetdiscover", str(DATA / "basic.txt"),
                      "--hca-filter", "mlx5_("], capsys)
    assert rc == 2 and "--hca-filter" in err


def test_discover_writes_a_loadable_site_and_the_artefacts(fabric, tmp_path, capsys):
    path = fabric()
    out_dir = tmp_path / "found"
    rc, out, _ = run(["topo", "discover", "--ibnetdiscover", str(path), "-o", str(out_dir),
                      "--json"], capsys)
    assert rc == 0
    doc = json.loads(out)
    assert (doc["nodes"], doc["sus"], doc["rails"]) == (16, 4, 8)
    names = {p.name for p in out_dir.iterdir()}
    assert {"site.toml", "topology.conf", "cabling.csv", "rails.csv", "gres.conf"} <= names
    site = load_site(out_dir / "site.toml")
    assert site.site.name == "found"
    topo = (out_dir / "topology.conf").read_text()
    assert "gpu[001-004]" in topo and "gpu[013-016]" in topo
    rc, out, _ = run(["topo", "check", str(out_dir / "site.toml"), "--ibnetdiscover", str(path)],
                     capsys)
    assert rc == 0


def test_discover_garbage_writes_nothing(tmp_path, capsys):
    out_dir = tmp_path / "none"
    rc, _, _err = run(["topo", "discover", "--ibnetdiscover", str(DATA / "garbage.txt"), "-o",
                      str(out_dir)], capsys)
    assert rc == 3 and not out_dir.exists()


def test_synth_command_line_errors(tmp_path, capsys):
    rc, _, err = synth(["sandbox", "-o", str(tmp_path / "x.txt"), "--swap", "gpu001:mlx5_0"],
                       capsys)
    assert rc == 3 and "give two endpoints" in err and not (tmp_path / "x.txt").exists()
    assert "Traceback" not in err and err.startswith("slurmpod: error:")
    rc, _, _ = synth(["sandbox", "-o", str(tmp_path / "x.txt"), "--missing", "nosuch:mlx5_0"],
                     capsys)
    assert rc == 3
    rc, _, err = synth(["sandbox", "-o", str(tmp_path / "x.txt"), "--desc", "nosuch"], capsys)
    assert rc == 2 and "nosuch" in err
    (tmp_path / "a-file").write_text("")
    rc, _, err = synth(["sandbox", "-o", str(tmp_path / "a-file" / "x.txt")], capsys)
    assert rc == 73 and "Traceback" not in err  # EX_CANTCREAT, as for every output file


def test_synth_writes_stdout_and_planes(tmp_path, capsys):
    rc, out, _ = synth(["sandbox", "-o", "-", "--missing", "gpu002:mlx5_1"], capsys)
    assert rc == 0 and out.count("\nSwitch\t") > 0 and 'gpu002 mlx5_1' not in out
    rc, _, _ = synth(["sandbox", "-o", str(tmp_path / "rail"), "--planes"], capsys)
    assert rc == 0 and sorted(p.name for p in tmp_path.iterdir()) == [
        f"rail.{i}" for i in range(8)]


def test_check_reads_standard_input(fabric, capsys, monkeypatch):
    import io

    text = fabric("--missing", "gpu002:mlx5_1").read_text()
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    rc, out, _ = run(["topo", "check", "sandbox", "--ibnetdiscover", "-"], capsys)
    assert rc == 1 and "<stdin>" in out and "missing-link" in out


def test_a_repeated_ibnetdiscover_reads_every_file(tmp_path, capsys):
    # A missing file among several is an error, never skipped in favour of the last one.
    good = tmp_path / "clean.txt"
    assert synth(["sandbox", "-o", str(good)], capsys)[0] == 0
    rc, _out, err = run(["topo", "check", "sandbox", "--ibnetdiscover", str(tmp_path / "none"),
                         "--ibnetdiscover", str(good)], capsys)
    assert rc == 3 and "none: file not found" in err and "Traceback" not in err
    # The sandbox keeps each rail a plane of its own: eight dumps, one per subnet, merged.
    assert synth(["sandbox", "-o", str(tmp_path / "rail"), "--planes"], capsys)[0] == 0
    planes = [str(tmp_path / f"rail.{i}") for i in range(8)]
    args = [a for p in planes for a in ("--ibnetdiscover", p)]
    rc, out, _ = run(["topo", "check", "sandbox", *args], capsys)
    assert rc == 0 and "clean" in out
    rc, out, _ = run(["topo", "check", "sandbox", *args[:-2]], capsys)  # rail 7 left out
    assert rc == 1
    out_dir = tmp_path / "drafted"
    rc, out, _ = run(["topo", "discover", *args, "-o", str(out_dir)], capsys)
    assert rc == 0 and "discovered 16 nodes in 4 SUs, 8 rails" in out
    rc, out, _ = run(["topo", "check", str(out_dir / "site.toml"), *args], capsys)
    assert rc == 0, out


def test_site_file_names_its_dumps(tmp_path, capsys):
    site = tmp_path / "site.toml"
    text = (Path(__file__).resolve().parents[3] / "site_configs" / "sandbox.toml").read_text()
    site.write_text(text.replace("[fabric]", '[fabric]\nibnetdiscover = ["fab.txt"]', 1))
    assert synth([str(site), "-o", str(tmp_path / "fab.txt")], capsys)[0] == 0
    rc, out, _ = run(["topo", "check", str(site)], capsys)
    assert rc == 0 and "clean" in out
    (tmp_path / "fab.txt").unlink()
    rc, _out, err = run(["topo", "check", str(site)], capsys)
    assert rc == 3 and "fab.txt: file not found" in err
