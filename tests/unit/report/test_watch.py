"""`slurmpod report JOBID --watch`: the progress line from a Megatron log's tail, the refresh
loop (terminal and no terminal, bounded, Ctrl-C) and the option checks.
tests/data/report/watch-emu-head.log holds the first iteration lines the sandbox's emulated
trainer (`megatron_emu`, Megatron-LM's line format) printed in a 400-iteration job."""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from slurmpod.cli.main import main
from slurmpod.model.jobs import JobRecord, JobState
from slurmpod.report.build import build_job_report
from slurmpod.report.model import JobReport
from slurmpod.report.sacct import Attempt, SacctJob
from slurmpod.report.watch import (
    CLEAR,
    Frame,
    Progress,
    progress_from_log,
    progress_line,
    watch,
)
from tests.helpers import DATA_DIR

LOG = DATA_DIR / "report" / "watch-emu-head.log"


def test_progress_from_a_real_log_head() -> None:
    p = progress_from_log(LOG.read_bytes())
    assert p is not None and p.iteration == 6 and p.train_iters == 400 and p.source == "log"
    ms = [float(line.split(b"(ms): ")[1].split(b" ")[0])
          for line in LOG.read_bytes().splitlines() if b"(ms): " in line]
    recent = sorted(ms[-5:])
    assert p.iter_ms == pytest.approx(recent[2])  # median of the last five
    assert p.eta_s == pytest.approx(394 * recent[2] / 1000)
    line = progress_line(p)
    assert "6 / 400 iterations (1.5 %)" in line and "ETA 0:0" in line


@pytest.mark.parametrize("tail", [b"", b"no iterations here\n", b" iteration x/ 1 |\n",
                                  b"\xff\xfe garbage \x00\n" * 100])
def test_no_iteration_lines_is_no_progress(tail: bytes) -> None:
    assert progress_from_log(tail) is None
    assert progress_line(None) == "progress: no iterations yet"


def test_progress_without_train_iters_or_times() -> None:
    # a line cut before its time, then a damaged time: ETA unknown, progress still shown
    p = progress_from_log(b" iteration       10/      20 |\n"
                          b" iteration       12/      20 | elapsed time per iteration (ms): "
                          b"nan |\n")
    assert p == Progress(12, 20, None, "log") and p.eta_s is None
    assert "12 / 20 iterations (60.0 %)" in progress_line(p) and "ETA" not in progress_line(p)
    assert "train_iters not known: comment" in progress_line(Progress(7, source="comment"))
    # a log whose iteration passed its train_iters (Megatron stops there): not a total
    assert progress_from_log(b" iteration       30/      20 |\n") == Progress(30, None, None)


def _report(state: JobState) -> JobReport:
    t0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
    rec = JobRecord(job_id="7", name="train", user="alice", account="ml", partition="batch",
                    state=state, exit_code=0, signal=0, submit_time=t0, start_time=t0,
                    end_time=None, elapsed_s=60, nodes="gpu001", n_nodes=1, n_gpus=8,
                    comment='{"v":1,"mfu":0.41,"tflops":405.5,"iter":120,"tokens_per_s":51234}')
    return build_job_report(SacctJob(rec, (Attempt(None, None, None, 60, str(state)),)))


def _frames(states: list[JobState]) -> Callable[[], Frame]:
    frames = iter([Frame(_report(s), Progress(100 * (i + 1), 400, 1000.0), f"10:0{i}:00")
                   for i, s in enumerate(states)])
    return lambda: next(frames)


def test_no_terminal_prints_one_line_per_refresh_until_the_job_ends() -> None:
    out = io.StringIO()
    sleeps: list[float] = []
    rc = watch(_frames([JobState.RUNNING, JobState.RUNNING, JobState.COMPLETED]), out,
               interval_s=5, count=None, tty=False, sleep=sleeps.append)
    text = out.getvalue()
    assert rc == 0 and sleeps == [5, 5] and CLEAR not in text
    lines = text.splitlines()
    assert lines[0].startswith("10:00:00  job 7  RUNNING  progress: [")
    assert "100 / 400 iterations (25.0 %) at 1000 ms/iter, ETA 0:05:00" in lines[0]
    assert "MFU 41.0 %" in lines[0] and "tokens/s 51,234" in lines[0]
    assert lines[1].startswith("10:01:00  job 7  RUNNING")
    # the job ended: its last line, then the whole report once
    assert lines[2].startswith("10:02:00  job 7  COMPLETED") and "Job 7 (train)" in text


def test_terminal_redraws_and_count_bounds_it() -> None:
    out = io.StringIO()
    rc = watch(_frames([JobState.RUNNING] * 5), out, interval_s=1, count=2, tty=True,
               sleep=lambda _s: None)
    text = out.getvalue()
    assert rc == 0 and text.count(CLEAR) == 2 and "200 / 400 iterations" in text
    assert "300 / 400" not in text
    assert text.split(CLEAR)[1].startswith("slurmpod report 7 --watch  (10:00:00; Ctrl-C")


def test_ctrl_c_is_clean() -> None:
    out = io.StringIO()

    def interrupt(_s: float) -> None:
        raise KeyboardInterrupt

    rc = watch(_frames([JobState.RUNNING] * 3), out, interval_s=1, count=None, tty=False,
               sleep=interrupt)
    assert rc == 130 and out.getvalue().endswith("\nstopped (Ctrl-C)\n")


def test_live_figures_come_from_the_comment() -> None:
    r = _report(JobState.RUNNING)
    assert r.figures.source == "live_comment" and r.figures.last_iter == 120
    ended = replace(r, job=replace(r.job, state=JobState.COMPLETED))
    assert ended.job.state.is_terminal


@pytest.mark.parametrize("args", [["7", "--watch", "--json"], ["7", "--watch", "--html", "x"],
                                  ["7", "--count", "3"], ["--since", "1d", "--watch"],
                                  ["7", "--watch", "--interval", "0"]])
def test_watch_option_errors(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["report", *args])
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert err.startswith(("slurmpod: error: ", "Usage:")) and "Traceback" not in err


SLURM_DATA = DATA_DIR / "slurm"


@pytest.mark.parametrize(("version", "job_id", "state", "log"), [
    ("22.05", "4", JobState.RUNNING, ("/tmp/rec/out/4.out", 0)),
    ("22.05", "14", JobState.PENDING, ("/tmp/rec/slurm-14.out", 0)),  # slurmd's default name
    ("24.11", "21", JobState.RUNNING, None),  # job_state is a list on 23.02+
    ("24.11", "23", JobState.PENDING, None),  # ["PENDING", "REQUEUED"]
])
def test_live_state_comes_from_slurmctld(monkeypatch: pytest.MonkeyPatch, version: str,
                                         job_id: str, state: JobState,
                                         log: tuple[str, int] | None) -> None:
    """sacct can say PENDING for a job slurmctld already runs (slurmdbd hears of the start
    asynchronously): the watch takes the state from squeue's JSON, of both eras."""
    from slurmpod.backends.cli import CliBackend
    from slurmpod.cli import report as cli_report
    from slurmpod.transport.base import CommandResult

    text = (SLURM_DATA / version / "squeue.json").read_text()
    seen: list[list[str]] = []

    def query(self: object, argv: list[str], env: object = None) -> CommandResult:
        seen.append(list(argv))
        return CommandResult(argv=tuple(argv), returncode=0, stdout=text, stderr="",
                             duration_s=0.01)

    monkeypatch.setattr(CliBackend, "query", query)
    live = cli_report._live_job(job_id)
    assert seen == [["squeue", "--json", f"--jobs={job_id}"]]
    assert live is not None and live.state is state and live.log == log
    assert cli_report._live_job("999") is None  # not in squeue: purged or never there
