"""`slurmpod report --since W --efficiency`: the usage query of tests/data/report/usage-*
(recorded on the sandbox, 22.05.8 and 24.11.5; what each job did is in their README.md)
attached to the fleet's rows: seff's columns, verdict counts and medians per group. Expected
numbers are worked out from the recorded rows in the comments next to them."""

from __future__ import annotations

import csv
import io
import json
import os
import stat
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmpod.backends.parse import USAGE_FIELDS
from slurmpod.cli.main import cli
from slurmpod.model.jobs import JobState
from slurmpod.report.build import build_job_report
from slurmpod.report.fleet import (
    CSV_COLUMNS,
    EFFICIENCY_COLUMNS,
    attach_usage,
    fleet_from_rows,
    rows_of,
)
from slurmpod.report.sacct import usage_argv, usage_selection_argv
from slurmpod.report.text import fleet_text
from tests.helpers import DATA_DIR
from tests.unit.report.test_usage import _sacct_job, usage

DATA = DATA_DIR / "report"
FAKE = Path(__file__).parents[1] / "fake_sacct.py"
GIB = float(1 << 30)
M = 1 << 20


def _fleet(version: str, ids: tuple[str, ...], **over: object):
    """Rows of plain jobs with the recorded ids (user alice, account ml), their usage attached."""
    got = usage(version)
    jobs = []
    for jid in ids:
        u = got[jid]
        sj = _sacct_job(JobState.COMPLETED if u.state == "COMPLETED" else JobState.TIMEOUT,
                        elapsed=u.elapsed_s, gpus=u.gpus)
        jobs.append(replace(sj, record=replace(sj.record, job_id=jid, **over)))  # type: ignore
    rows, running = rows_of(build_job_report(sj, with_series=False, with_notes=False)
                            for sj in jobs)
    attach_usage(rows, got)
    return fleet_from_rows(rows, running, window="7d", efficiency=True)


@pytest.mark.parametrize(("version", "ids"), [("22.05", ("2", "3", "4", "5")),
                                              ("24.11", ("1", "2", "3", "4"))])
def test_rows_get_seff_figures(version: str, ids: tuple[str, ...]) -> None:
    fl = _fleet(version, ids)
    got = usage(version)
    for row in fl.rows:
        u = got[row.job_id]
        assert row.cpu_eff == u.cpu_efficiency and row.time_limit_s == u.limit_s
        assert row.mem_used_gib == pytest.approx((u.mem_peak_bytes or 0) / GIB)
        assert row.mem_req_gib == pytest.approx((u.req_mem_bytes or 0) / GIB)
        assert row.time_used_frac == u.time_fraction
    first = fl.rows[0]  # `--mem=4000M -t 10`: 4000M requested, a 10 min limit
    assert first.mem_req_gib == pytest.approx(4000 * M / GIB)
    assert first.time_limit_s == 600
    assert fl.rows[1].time_used_frac is None  # `-t UNLIMITED`: no fraction of a limit
    assert fl.efficiency is not None and fl.efficiency.measured == 4


def test_recorded_22_05_job_2_by_hand() -> None:
    (row,) = _fleet("22.05", ("2",)).rows
    # TotalCPU 00:03.706 of CPUTimeRAW 384 (32 CPUs x 12 s); peak: the batch step's 322100K
    assert row.cpu_eff == pytest.approx(3.706 / 384)
    assert row.mem_used_gib == pytest.approx(322100 * 1024 / GIB)
    assert row.time_used_frac == pytest.approx(12 / 600)


def test_csv_and_json_columns_only_when_asked() -> None:
    fl = _fleet("22.05", ("2", "3"))
    head, first, *_ = csv.reader(io.StringIO(fl.to_csv()))
    assert tuple(head) == (*CSV_COLUMNS, *EFFICIENCY_COLUMNS)
    cells = dict(zip(head, first, strict=True))
    assert float(cells["cpu_eff"]) == pytest.approx(3.706 / 384)
    assert cells["time_limit_s"] == "600"
    doc = fl.to_json(jobs=True)
    assert doc["job_rows"][1]["time_used_frac"] is None  # UNLIMITED: empty, not zero
    assert doc["efficiency"]["by_user"][0]["key"] == "alice"
    plain = replace(fl, efficiency=None)
    assert next(csv.reader(io.StringIO(plain.to_csv()))) == list(CSV_COLUMNS)
    assert "cpu_eff" not in plain.to_json(jobs=True)["job_rows"][0]
    assert "efficiency" not in plain.to_json()


def test_medians_per_group() -> None:
    fl = _fleet("22.05", ("2", "3", "4", "5"))
    assert fl.efficiency is not None
    (g,) = fl.efficiency.by["partition"]
    rows = fl.rows
    cpu = sorted(r.cpu_eff for r in rows if r.cpu_eff is not None)
    assert len(cpu) == 4 and g.cpu_eff == pytest.approx((cpu[1] + cpu[2]) / 2)
    times = sorted(r.time_used_frac for r in rows if r.time_used_frac is not None)
    assert len(times) == 3 and g.time_frac == times[1]  # job 3 is UNLIMITED
    text = fleet_text(fl)
    assert "Efficiency per user (medians)" in text and "Efficiency per partition" in text


def test_verdict_counts_on_the_rules_thresholds() -> None:
    got = usage("22.05")
    # Job 4 stretched to 2 h of a 10 h limit on 500G: peak 334072K (<1 %) and 20 % of the time.
    long4 = replace(got["4"], elapsed_s=7200, limit_s=36000, state="COMPLETED")
    rows, _ = rows_of(build_job_report(replace(_sacct_job(elapsed=7200, gpus=16),
                                               record=replace(_sacct_job().record,
                                                              job_id=jid, elapsed_s=7200)),
                                       with_series=False, with_notes=False)
                      for jid in ("4", "2"))
    attach_usage(rows, {"4": long4, "2": got["2"]})
    rows[1].gpu_util = 1.0  # job 2's GPUs idle (telemetry)
    fl = fleet_from_rows(rows, 0, window="7d", efficiency=True)
    assert fl.efficiency is not None
    # job 4: 2 CPUs busy 1 s of 7200 s x 64 -> low CPU; job 2 is too short to judge (12 s)
    assert fl.efficiency.verdicts == {"gpu_idle": 1, "cpu_low": 1, "mem_over_requested": 1,
                                      "time_over_requested": 1}
    text = fleet_text(fl)
    assert "1 job(s): idle GPUs" in text and "1 job(s): memory over-requested" in text
    # the recorded jobs as they ran: too short for CPU and memory verdicts; job 4 used 56 s of
    # its partition's default 1 h limit (limits of an hour and more are judged)
    ran = _fleet("22.05", ("2", "3", "4", "5")).efficiency
    assert ran is not None and ran.verdicts == {"gpu_idle": 0, "cpu_low": 0,
                                                "mem_over_requested": 0,
                                                "time_over_requested": 1}


def test_usage_query_over_a_window_is_framed() -> None:
    sel = ["--starttime=now-7days", "--endtime=now", "--allusers"]
    argv = usage_selection_argv(sel, "\x1fq")
    assert argv[-3:] == sel and f"--format={','.join(USAGE_FIELDS)}" in argv
    assert "--allocations" not in argv and "--delimiter=\x1fq" in argv
    assert usage_argv("12", "\x1fq") == usage_selection_argv(["--jobs=12"], "\x1fq")


@pytest.fixture()
def fake_sacct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The handmade fleet (101-105) plus a usage query answer: the recorded 22.05 rows of job
    2 relabelled 101 (its JobID and JobIDRaw fields), so one fleet job has Slurm's usage."""
    rows = (DATA / "usage-22.05" / "finished.txt").read_text().split("\n")
    relabelled = []
    for line in rows:
        f = line.split("\x1f")
        if f[0].partition(".")[0] == "2":
            f[0] = "101" + f[0][1:]
            f[-1] = "101" + f[-1][1:]
            relabelled.append("\x1f".join(f))
    usage_file = tmp_path / "usage.txt"
    usage_file.write_text("\n".join(relabelled) + "\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "sacct.argv"
    script = bin_dir / "sacct"
    script.write_text(f"""#!/bin/sh
printf '%s\\n' "$*" >> {log}
case "$*" in
  *TRESUsageInTot*) exec {sys.executable} {FAKE} {usage_file} us "$@" ;;
  *Comment*) exec {sys.executable} {FAKE} {DATA / 'handmade.records.txt'} us "$@" ;;
  *ElapsedRaw,State*) exec {sys.executable} {FAKE} {DATA / 'handmade.attempts.txt'} pipe "$@" ;;
  *) echo "unexpected sacct call" >&2; exit 1 ;;
esac
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURMPOD_SPOOL", str(tmp_path / "spool"))
    return log


def _run(*args: str):
    return CliRunner().invoke(cli, ["report", *args], catch_exceptions=False)


def test_cli_efficiency_is_opt_in(fake_sacct: Path) -> None:
    res = _run("--since", "7d", "--csv")
    assert res.exit_code == 0, res.output
    assert "TRESUsageInTot" not in fake_sacct.read_text()  # no third query without the flag
    assert "cpu_eff" not in res.output.splitlines()[0]
    res = _run("--since", "7d", "--efficiency", "--json", "--jobs")
    assert res.exit_code == 0, res.output
    usage_call = fake_sacct.read_text().splitlines()[-1]
    assert "TRESUsageInTot" in usage_call and usage_call.endswith(
        "--starttime=now-7days --endtime=now --allusers")
    doc = json.loads(res.output)
    rows = {r["job_id"]: r for r in doc["job_rows"]}
    assert rows["101"]["cpu_eff"] == pytest.approx(3.706 / 384)
    assert rows["103"]["cpu_eff"] is None  # not in the usage answer: not measured
    assert doc["efficiency"]["jobs_measured"] == 1
    res = _run("--since", "7d", "--efficiency")
    assert "Efficiency (Slurm's usage, 1 of" in res.output


def test_cli_efficiency_is_for_the_fleet(fake_sacct: Path) -> None:
    res = CliRunner().invoke(cli, ["report", "101", "--efficiency"])
    assert res.exit_code != 0 and "fleet report" in str(res.exception)
    res = CliRunner().invoke(cli, ["report", "--since", "7d", "--efficiency", "--reliability"])
    assert res.exit_code != 0 and "--reliability" in str(res.exception)
