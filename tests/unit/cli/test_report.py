"""`slurmpod report` end to end against a stand-in `sacct` on PATH that prints the recorded-shape
files of tests/data/report/ (and logs its argv), plus the text and HTML renderings."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmpod.cli.main import cli, main
from slurmpod.cli.report import slurm_since
from tests.helpers import DATA_DIR
from tests.unit.cli.conftest import FAKE

DATA = DATA_DIR / "report"


def run(*args: str):
    return CliRunner().invoke(cli, ["report", *args], catch_exceptions=False)


def main_rc(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """Through the real entry point: exit code and stderr as a user sees them."""
    with pytest.raises(SystemExit) as exc:
        main(["report", *args])
    return int(exc.value.code or 0), capsys.readouterr().err


def test_job_text_report(fake_sacct: Path) -> None:
    res = run("102", "--site", "sandbox")
    assert res.exit_code == 0, res.output
    out = res.output
    assert "Job 102 (fail-b)  FAILED  exit 3" in out
    assert "SUs 2 (min 1): su1, su2" in out and "MFU          10.0 % (p10 9.0 %, p90 11.0 %)" in out
    assert "[warn] the job spans 2 SUs" in out
    argv = fake_sacct.read_text().splitlines()
    assert argv[0].endswith("--duplicates --allocations --jobs=102") and len(argv) == 3
    assert argv[1].endswith("--format=JobID,Submit,Start,End,ElapsedRaw,State,AllocTRES "
                            "--jobs=102")
    # the usage query (step rows) fails in this stand-in: "not measured", never an error
    assert "TRESUsageInTot" in argv[2] and "--allocations" not in argv[2]
    assert "CPU, memory, time: not measured" in out and "GPU util     not measured" in out


def test_job_json_and_unknown_job(fake_sacct: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(run("103", "--json").output)
    assert doc["schema"] == "slurmpod.report.job/1" and doc["job"]["restarts"] == 1
    assert doc["gpu_time"]["goodput"] == pytest.approx(0.5)
    rc, err = main_rc(capsys, "999")
    assert rc == 4 and err.startswith("slurmpod: error: job 999 is not in Slurm's accounting")
    assert "Traceback" not in err


def test_fleet_filters_reach_sacct_and_csv(fake_sacct: Path) -> None:
    res = run("--since", "2w", "--user", "alice", "--account", "ml", "--partition", "batch",
              "--csv")
    assert res.exit_code == 0, res.output
    first = fake_sacct.read_text().splitlines()[0]
    assert first.endswith("--duplicates --allocations --starttime=now-2weeks --endtime=now "
                          "--user=alice --accounts=ml --partition=batch")
    assert res.output.splitlines()[0].startswith("job_id,name,user")
    # the stand-in sacct ignores the filters (as 22.05 did): slurmpod filters again
    assert [ln.split(",")[0] for ln in res.output.splitlines()[1:]] == ["101", "103", "104"]
    res = run("--since", "1d", "--partition", "gpu", "--json")
    assert json.loads(res.output)["jobs"] == 0


def test_fleet_text(fake_sacct: Path) -> None:
    res = run("--since", "7d")
    assert res.exit_code == 0, res.output
    assert "GPU-hour-weighted MFU 33.6 %" in res.output and "running or pending 1" in res.output
    assert "Top jobs by lost GPU-hours" in res.output
    assert "--allusers" in fake_sacct.read_text()


@pytest.mark.parametrize("args, msg", [
    ([], "give a JOB_ID or --since"),
    (["1", "--since", "7d"], "give a JOB_ID or --since"),
    (["abc"], "is not a Slurm job id"),
    (["--since", "7 days"], "--since '7 days'"),
    (["1", "--csv"], "are for the fleet report"),
    (["--since", "1d", "--json", "--csv"], "exclusive"),
])
def test_usage_errors(args: list[str], msg: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = main_rc(capsys, *args)
    assert rc == 2 and msg in err and len(err.strip().splitlines()) <= 2


def test_since_forms() -> None:
    assert slurm_since("7d") == "now-7days" and slurm_since("12h") == "now-12hours"
    assert slurm_since("2026-11-01") == "2026-11-01"


def test_html_is_self_contained_with_plots(fake_sacct: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    spool = tmp_path / "spool" / "records"
    spool.mkdir(parents=True)
    series = {"iter": list(range(1, 41)), "segment": [0] * 20 + [1] * 20,
              "t": [float(i) for i in range(40)], "iter_ms": [100.0 + (i % 7) for i in range(40)],
              "steady": [i > 10 for i in range(40)], "mfu": [0.2] * 40}
    (spool / "103.1.json").write_text(json.dumps({"v": 1, "summary": {
        "iters": 40, "mfu": 0.2, "tflops": 0.01, "peak": 0.05, "gpus": 8, "ttfi_s": 5,
        "metrics": {"productive_s": 900.0, "checkpoint_stalls": [
            {"iteration": 10, "duration_s": 2.0}]}}, "series": series}))
    res = run("103", "--html", str(out), "--site", "sandbox")
    assert res.exit_code == 0, res.output
    html = out.read_text()
    for plot in ("plot-mfu", "plot-step", "plot-hist", "plot-attempts", "plot-placement"):
        assert f'<svg id="{plot}"' in html  # inline SVG plots
    assert "http://" not in html and "https://" not in html and "<script" not in html
    assert 'id="plot-placement"' in html and "restarts" in html
    fl = tmp_path / "f.html"
    assert run("--since", "7d", "--html", str(fl)).exit_code == 0
    assert '<svg id="plot-fleet-mfu"' in fl.read_text()


def test_html_escapes_job_names(fake_sacct: Path, tmp_path: Path) -> None:
    import dataclasses

    from slurmpod.report.build import build_job_report
    from slurmpod.report.html import job_html
    from slurmpod.report.sacct import parse_sacct_jobs

    sj = parse_sacct_jobs((DATA / "sacct-handmade-22.05.json").read_text())[0]
    sj = dataclasses.replace(sj, record=dataclasses.replace(sj.record,
                                                            name="<script>alert(1)</script>"))
    html = job_html(build_job_report(sj), generated="now")
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_prometheus_file_written_atomically(fake_sacct: Path, tmp_path: Path) -> None:
    target = tmp_path / "out" / "slurmpod.prom"
    assert run("101", "--prometheus", str(target)).exit_code == 0
    assert target.read_text().startswith("# HELP slurmpod_job_mfu_ratio")
    assert [p.name for p in target.parent.iterdir()] == ["slurmpod.prom"]  # no temp left


def test_spool_index_takes_the_latest_attempt(tmp_path: Path) -> None:
    from slurmpod.cli.report import spool_index

    rec = tmp_path / "records"
    rec.mkdir()
    for name in ("7.0.json", "7.2.json", "7.10.json", "8_1.0.json", "x.0.json", "9.json",
                 ".7.3.json.tmp"):
        (rec / name).write_text("{}")
    idx = spool_index(tmp_path)
    assert {k: p.name for k, p in idx.items()} == {"7": "7.10.json", "8_1": "8_1.0.json"}
    assert spool_index(tmp_path / "missing") == {}


def test_typical_mfu_from_a_window(fake_sacct: Path) -> None:
    # Fleet typical for <1B (weighted median of 0.1/8 GPU-h, 0.3/4, 0.4/32) is 40 %: job 103's
    # 30 % is not far below it (60 % of 40 % = 24 %), but job 102's 10 % is.
    doc = json.loads(run("102", "--json", "--typical-since", "30d").output)
    (note,) = [n for n in doc["notes"] if n["code"] == "low-mfu"]
    assert "typical 40.0 % for <1B models" in note["text"]
    doc = json.loads(run("103", "--json", "--typical-since", "30d").output)
    assert "low-mfu" not in [n["code"] for n in doc["notes"]]
    assert "--starttime=now-30days" in fake_sacct.read_text()


def test_progress_bar_on_stderr_for_many_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    row = (DATA / "handmade.records.txt").read_text().splitlines()[0].split("\x1f")
    att = (DATA / "handmade.attempts.txt").read_text().splitlines()[0].split("|")
    recs, atts = [], []
    for k in range(150):
        jid = str(5000 + k)
        recs.append("\x1f".join([jid, *row[1:-1], jid]))
        atts.append("|".join([jid, *att[1:]]))
    (tmp_path / "r.txt").write_text("\n".join(recs) + "\n")
    (tmp_path / "a.txt").write_text("\n".join(atts) + "\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "sacct"
    script.write_text(f"""#!/bin/sh
case "$*" in *Comment*) f={tmp_path / 'r.txt'} d=us ;; *) f={tmp_path / 'a.txt'} d=pipe ;; esac
exec {sys.executable} {FAKE} "$f" "$d" "$@"
""")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    rc, err = main_rc(capsys, "--since", "1d", "--json")
    assert rc == 0 and "reading jobs" in err


def test_log_hints_read_nccl_evidence_and_refuse_symlinks(tmp_path: Path) -> None:
    from slurmpod.cli.report import log_hints

    log = tmp_path / "job.out"
    # the warning slurmpod's sbatch template prints when the topology file is unreadable
    log.write_text("slurmpod: warning: NCCL_TOPO_FILE /etc/slurmpod/nccl-topo/x.xml is not "
                   "readable; unsetting it\ngpu001:1:1 [0] NCCL INFO Bootstrap : Using ib0\n")
    h = log_hints({"log": {"path": str(log)}, "job": {"uid": os.getuid()}})
    assert h.nccl_topo_warning and h.nccl_info and not h.nccl_topo_loaded
    log.write_text("gpu001 NCCL INFO NCCL_TOPO_FILE set by environment to /etc/t.xml\n")
    h = log_hints({"log": {"path": str(log)}, "job": {"uid": os.getuid()}})
    assert h.nccl_topo_loaded and not h.nccl_topo_warning
    link = tmp_path / "link.out"
    link.symlink_to(log)
    assert log_hints({"log": {"path": str(link)}, "job": {"uid": os.getuid()}}) is None
    assert log_hints({"log": {}}) is None and log_hints(None) is None
    # the job's uid decides whose file it may be (the report may run as root)
    assert log_hints({"log": {"path": str(log)}, "job": {"uid": os.getuid() + 1}}) is None
    assert log_hints({"log": {"path": str(log)}}) is None


def test_sacct_retried_while_slurmdbd_is_unreachable(
        fake_sacct: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The first call fails the way sacct does while slurmdbd restarts; the report's queries go
    # through the CLI backend's bounded retry, so the report still comes out.
    real = fake_sacct.parent / "bin" / "sacct"
    flaky = fake_sacct.parent / "bin" / "sacct.real"
    real.rename(flaky)
    marker = fake_sacct.parent / "failed-once"
    real.write_text(f"""#!/bin/sh
if [ ! -e {marker} ]; then
  touch {marker}
  echo "sacct: error: slurm_persist_conn_open_without_init: failed to open" >&2
  exit 1
fi
exec {flaky} "$@"
""")
    real.chmod(real.stat().st_mode | stat.S_IEXEC)
    res = run("102")
    assert res.exit_code == 0, res.output
    assert marker.exists() and "Job 102 (fail-b)  FAILED  exit 3" in res.output
    marker.unlink()
    real.write_text("#!/bin/sh\necho 'sacct: error: Invalid field requested' >&2\nexit 1\n")
    rc, err = main_rc(capsys, "102")
    assert rc == 4 and err.startswith("slurmpod: error: sacct failed: sacct: error: Invalid field")
    assert "slurmdbd" in err and not marker.exists()
    # A --user sacct cannot resolve is the caller's mistake, not Slurm's: exit 2, not retried.
    real.write_text("#!/bin/sh\necho 'sacct: error: Invalid user id: zz' >&2\nexit 1\n")
    rc, err = main_rc(capsys, "--since", "1d", "--user", "zz")
    assert rc == 2 and err.startswith("slurmpod: error: --user: sacct failed: ")
    assert "getent passwd" in err and not marker.exists()


def test_log_hints_read_why_each_attempt_ended(tmp_path: Path) -> None:
    from slurmpod.cli.report import attempt_ends, log_hints

    log = tmp_path / "logs" / "gpt-7.out"
    log.parent.mkdir()
    log.write_text("x\n")
    state = tmp_path / ".slurmpod"
    state.mkdir()
    rows = [{"v": 1, "event": "start", "job_id": "7", "attempt": 1, "restart": 0, "time": 1,
             "nodes": [], "log": str(log), "log_offset": 0},
            {"v": 1, "event": "end", "job_id": "7", "attempt": 1, "restart": 0, "time": 2,
             "end": "timelimit", "rc": 0, "iteration": 3, "progress": True, "failures": 0,
             "max_restarts": 3},
            {"v": 1, "event": "start", "job_id": "7", "attempt": 2, "restart": 1, "time": 3,
             "nodes": [], "log": str(log), "log_offset": 2},
            {"v": 1, "event": "end", "job_id": "7", "attempt": 2, "restart": 1, "time": 4,
             "end": "<script>", "rc": 0, "iteration": 6, "progress": True, "failures": 0,
             "max_restarts": 3},
            {"v": 1, "event": "start", "job_id": "9", "attempt": 1, "restart": 0, "time": 5,
             "nodes": [], "log": str(tmp_path / "logs" / "other-9.out"), "log_offset": 0}]
    (state / "attempts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # Another log's attempts are not this job's; a value outside the known ends is "unknown".
    assert attempt_ends(str(log)) == ("timelimit", "unknown")
    h = log_hints({"log": {"path": str(log)}, "job": {"uid": os.getuid()}})
    assert h is not None and h.attempt_ends == ("timelimit", "unknown")
    os.unlink(state / "attempts.jsonl")
    os.mkfifo(state / "attempts.jsonl")  # never blocks
    assert attempt_ends(str(log)) == ()


def test_log_hints_never_block_on_a_fifo_or_read_a_device(tmp_path: Path) -> None:
    from slurmpod.cli.report import log_hints

    fifo = tmp_path / "job.out"
    os.mkfifo(fifo)  # no writer: a blocking open would hang the report forever
    assert log_hints({"log": {"path": str(fifo)}, "job": {"uid": os.getuid()}}) is None
    assert log_hints({"log": {"path": "/dev/zero"}, "job": {"uid": os.getuid()}}) is None
