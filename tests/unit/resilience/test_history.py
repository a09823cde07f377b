"""Failure history: exposure and interruptions from attempts.jsonl (format v1, docs/runs.md)
and from sacct's attempts, startup failures kept apart, shrinkage toward the site's figure,
measured save time from a log, and --history in plan/simulate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmpod.cli.main import cli
from slurmpod.errors import ConfigError
from slurmpod.model.jobs import JobRecord, JobState
from slurmpod.report.sacct import SacctJob
from slurmpod.report.sacct import parse_attempts as parse_sacct_attempts
from slurmpod.resilience.history import (
    History,
    attempt_files,
    from_attempts,
    from_sacct,
    measured_from_log,
    read_history,
)
from slurmpod.runs.attempts import parse_attempts

T0 = 1_700_000_000


def start(job: str, n: int, t: int, nodes: int) -> str:
    return json.dumps({"v": 1, "event": "start", "job_id": job, "attempt": n, "restart": n - 1,
                       "time": t, "nodes": [f"gpu{i:03d}" for i in range(nodes)],
                       "log": f"/runs/a/logs/a-{job}.out", "log_offset": 0})


def end(job: str, n: int, t: int, what: str, progress: bool = True) -> str:
    return json.dumps({"v": 1, "event": "end", "job_id": job, "attempt": n, "restart": n - 1,
                       "time": t, "end": what, "rc": 1, "iteration": 100, "progress": progress,
                       "failures": 0, "max_restarts": 3})


def attempts_text() -> str:
    return "\n".join([
        # job 10: 4 nodes; 10 h then a node failure, 5 h then a failure, 20 h to the limit
        start("10", 1, T0, 4), end("10", 1, T0 + 36000, "node_fail"),
        start("10", 2, T0 + 36600, 4), end("10", 2, T0 + 36600 + 18000, "failure"),
        start("10", 3, T0 + 60000, 4), end("10", 3, T0 + 60000 + 72000, "timelimit"),
        # job 11: 2 nodes; a bad argument fails in 60 s without progress (startup), then 1 h
        # completes; one preempted hour; one attempt still running (no end) is not counted
        start("11", 1, T0, 2), end("11", 1, T0 + 60, "failure", progress=False),
        start("11", 2, T0 + 100, 2), end("11", 2, T0 + 3700, "completed"),
        start("11", 3, T0 + 4000, 2), end("11", 3, T0 + 7600, "preempted"),
        start("11", 4, T0 + 8000, 2),
        "{not json", json.dumps({"v": 2, "event": "end"}),  # hostile lines are skipped
    ]) + "\n"


def test_exposure_and_interruptions_from_attempts() -> None:
    h = from_attempts(parse_attempts(attempts_text()))
    # job 10: 4 x (10 + 5 + 20) h = 140; job 11: 2 x (60 s + 1 h + 1 h)
    assert h.node_hours == pytest.approx(140 + 2 * (60 / 3600 + 2))
    assert h.failures == 2 and h.startup_failures == 1 and h.attempts == 6
    assert h.by_end == {"node_fail": 1, "failure": 2, "timelimit": 1, "completed": 1,
                        "preempted": 1}
    assert h.observed_mtbf_hours == pytest.approx(h.node_hours / 2)


def test_shrinkage_toward_the_site_figure() -> None:
    assert History().node_mtbf_hours(6300.0) == 6300.0  # no history: the site's figure
    quiet = History(node_hours=1000.0, failures=0, attempts=10)
    assert quiet.node_mtbf_hours(6300.0) == pytest.approx(7300.0)  # finite, not infinite
    big = History(node_hours=1e7, failures=5000, attempts=9000)
    assert big.node_mtbf_hours(6300.0) == pytest.approx(2000.0, rel=0.01)  # its own figure
    both = quiet + big
    assert both.failures == 5000 and both.node_hours == pytest.approx(1e7 + 1000)


def test_read_history_takes_files_run_dirs_and_dirs_of_runs(tmp_path: Path) -> None:
    runs = tmp_path / "slurmpod-runs"
    for name in ("a", "b"):
        (runs / name / ".slurmpod").mkdir(parents=True)
        (runs / name / ".slurmpod" / "attempts.jsonl").write_text(attempts_text())
    one = runs / "a" / ".slurmpod" / "attempts.jsonl"
    assert attempt_files(one) == [one]
    assert attempt_files(runs / "a") == [one]
    assert len(attempt_files(runs)) == 2
    h = read_history([runs, runs / "a", one])  # the same file once
    assert h.failures == 4 and len(h.sources) == 2
    with pytest.raises(ConfigError, match=r"no attempts\.jsonl there"):
        read_history([tmp_path / "nothing"])


def _record(job_id: str, n_nodes: int) -> JobRecord:
    return JobRecord(job_id=job_id, name="x", user="u", account="a", partition="p",
                     state=JobState.COMPLETED, exit_code=0, signal=0, submit_time=None,
                     start_time=None, end_time=None, elapsed_s=0, nodes="", n_nodes=n_nodes,
                     n_gpus=8 * n_nodes)


def test_exposure_and_interruptions_from_sacct() -> None:
    # `sacct --duplicates --allocations --format=JobID,Submit,Start,End,ElapsedRaw,State` with
    # SLURM_TIME_FORMAT=%s: job 20 was requeued after a node failure, then timed out; job 21
    # failed after 2 min (startup) and again after 2 h; its last attempt was cancelled.
    text = "\n".join([
        f"20|{T0}|{T0 + 10}|{T0 + 7210}|7200|NODE_FAIL",
        f"20|{T0 + 7300}|{T0 + 7400}|{T0 + 14600}|7200|TIMEOUT",
        f"21|{T0}|{T0 + 10}|{T0 + 130}|120|FAILED",
        f"21|{T0 + 200}|{T0 + 300}|{T0 + 7500}|7200|FAILED",
        f"21|{T0 + 7600}|{T0 + 7700}|{T0 + 9500}|1800|CANCELLED by 1000",
        f"21.batch|{T0}|{T0 + 10}|{T0 + 130}|120|FAILED",
    ]) + "\n"
    atts = parse_sacct_attempts(text)
    jobs = [SacctJob(_record("20", 16), tuple(atts["20"])),
            SacctJob(_record("21", 2), tuple(atts["21"]))]
    h = from_sacct(jobs)
    assert h.node_hours == pytest.approx(16 * 4 + 2 * (120 + 7200 + 1800) / 3600)
    assert h.failures == 2 and h.startup_failures == 1 and h.attempts == 5
    assert h.by_end["CANCELLED"] == 1 and h.by_end["NODE_FAIL"] == 1


def _it(i: int, t: str, ms: float = 1000.0) -> str:
    return (f" [{t}] iteration {i:8d}/{1000:8d} | consumed samples: {i * 64:12d} | elapsed time "
            f"per iteration (ms): {ms:.1f} | learning rate: 1.000000E-04 | global batch size: "
            f"   64 | lm loss: 2.000000E+00 | loss scale: 1.0 | number of skipped iterations: "
            "  0 | number of nan iterations:   0 |")


def test_measured_save_time_from_the_logs_save_timers(tmp_path: Path) -> None:
    # Megatron core 0.14 logs `save-checkpoint ...: (min, max)` in ms after each save.
    lines = [_it(10, "2025-01-01 00:00:10")]
    for k, ms in enumerate((20000.0, 30000.0, 25000.0), start=1):
        it = 10 + 10 * k
        lines += [f"saving checkpoint at iteration {it - 10:7d} to /ckpt in torch_dist format",
                  f"  successfully saved checkpoint from iteration {it - 10:7d} to /ckpt",
                  f"(min, max) time across ranks (ms):\n    save-checkpoint "
                  f"................................: ({ms - 100:.2f}, {ms:.2f})",
                  _it(it, f"2025-01-01 00:0{k}:00", 1500.0)]
    log = tmp_path / "run.out"
    log.write_text("\n".join(lines) + "\n")
    m = measured_from_log(log)
    assert m.saves == 3 and m.save_s == pytest.approx(25.0)
    assert m.step_s == pytest.approx(1.5)
    # plan takes them over the predictions
    spec = tmp_path / "run.toml"
    spec.write_text("""
[job]
name = "m"
nodes = 1
entrypoint = "pretrain_gpt.py"
[megatron]
num_layers = 4
hidden_size = 256
num_attention_heads = 8
seq_length = 256
vocab_size = 1024
tensor_model_parallel_size = 8
micro_batch_size = 1
global_batch_size = 8
""")
    r = CliRunner().invoke(cli, ["plan", str(spec), "--site", "sandbox", "--json",
                                 "--checkpoint-log", str(log)])
    assert r.exit_code == 0, r.output
    ck = json.loads(r.output)["checkpoint"]
    assert ck["save_s"] == pytest.approx(25.0) and ck["save_source"] == "measured"
    assert ck["step_s"] == pytest.approx(1.5) and ck["step_source"] == "measured"
    # and --history sets the MTBF from the fleet's attempts
    (tmp_path / "r" / ".slurmpod").mkdir(parents=True)
    (tmp_path / "r" / ".slurmpod" / "attempts.jsonl").write_text(attempts_text())
    r = CliRunner().invoke(cli, ["plan", str(spec), "--site", "sandbox", "--json",
                                 "--history", str(tmp_path / "r")])
    ck = json.loads(r.output)["checkpoint"]
    assert ck["mtbf_source"] == "history" and ck["history"]["failures"] == 2
    h = from_attempts(parse_attempts(attempts_text()))
    assert ck["node_mtbf_hours"] == pytest.approx(h.node_mtbf_hours(6300.0), abs=1e-3)
    r = CliRunner().invoke(cli, ["simulate", "--nodes", "10", "--save", "10", "--samples", "5",
                                 "--days", "1", "--history", str(tmp_path / "r"), "--json"])
    assert json.loads(r.output)["scenario"]["mtbf_source"] == "history"
