"""The live monitor: log tailing and the Comment update loop, with Slurm faked."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from slurmpod.accounting.monitor import LogTail, MonitorIO, MonitorState, parse_chunk, run_monitor
from slurmpod.model.comment import validate_comment
from tests.unit.accounting.test_hook_figures import iteration_line


def test_tail_returns_complete_lines_only(tmp_path: Path) -> None:
    f = tmp_path / "log"
    tail = LogTail(f)
    assert tail.read_new() == b""  # not there yet
    f.write_bytes(b"one\ntw")
    assert tail.read_new() == b"one\n"
    with f.open("ab") as fh:
        fh.write(b"o\nthree\n")
    assert tail.read_new() == b"two\nthree\n"
    assert tail.read_new() == b""


def test_tail_follows_truncation_and_replacement(tmp_path: Path) -> None:
    f = tmp_path / "log"
    f.write_bytes(b"a\nb\n")
    tail = LogTail(f)
    assert tail.read_new() == b"a\nb\n"
    f.write_bytes(b"c\n")  # truncated and rewritten (smaller)
    assert tail.read_new() == b"c\n"
    new = tmp_path / "log.new"
    new.write_bytes(b"d\ne\nf\n")
    new.replace(f)  # replaced: new inode
    assert tail.read_new() == b"d\ne\nf\n"


def test_tail_big_backlog_keeps_head_and_newest_chunk(tmp_path: Path) -> None:
    f = tmp_path / "log"
    lines = [f"line {i:05d}\n".encode() for i in range(10000)]  # 11 bytes each
    f.write_bytes(b"".join(lines))
    tail = LogTail(f, max_chunk_bytes=1100, head_bytes=110)
    got = tail.read_new()
    assert got.startswith(b"line 00000\n")  # the head (arguments dump) is kept
    assert got.endswith(b"line 09999\n")
    assert b"line 05000\n" not in got
    assert tail.skipped_bytes > 0
    assert len(got) <= 110 + 1100


def test_parse_chunk_keeps_bounded_window() -> None:
    state = MonitorState()
    data = "".join(iteration_line(i, 1000, 1000.0) for i in range(1, 201)).encode()
    parse_chunk(data, state)
    assert len(state.window.rows) == 64 and state.window.rows[-1][0] == 200


class FakeJob:
    """A running job whose log grows each time the monitor sleeps."""

    def __init__(self, log: Path, comment: str, batches: list[list[float]]) -> None:
        self.log = log
        self.comment = comment
        self.batches = batches
        self.next_iter = 1
        self.running = True
        self.sets: list[str] = []
        self.fail_next = False
        self.grow()

    def grow(self) -> None:
        if not self.batches:
            self.running = False
            return
        with self.log.open("a") as fh:
            for ms in self.batches.pop(0):
                fh.write(iteration_line(self.next_iter, 100, ms))
                self.next_iter += 1

    def set_comment(self, job_id: str, text: str) -> None:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("Socket timed out")
        self.comment = text
        self.sets.append(text)

    def io(self) -> MonitorIO:
        def sleep(_s: float) -> bool:
            self.grow()
            return False

        return MonitorIO(get_comment=lambda j: self.comment, set_comment=self.set_comment,
                         job_running=lambda j: self.running, sleep=sleep, now=lambda: 1.7e9)


INITIAL = json.dumps({"slurmpod": "0.1.0", "fmt": 1, "run": "r", "flops_per_iter": 4e15,
                      "peak_tflops": 1000.0, "gpus": 8, "formula": "f1"})


def test_monitor_updates_comment_until_job_ends(tmp_path: Path) -> None:
    job = FakeJob(tmp_path / "log", INITIAL, [[2000.0, 1000.0], [1000.0], [500.0, 500.0, 500.0]])
    state = run_monitor("9", str(job.log), job.io(), interval_s=0.0)
    assert state.updates == 3 and not job.running
    docs = [json.loads(t) for t in job.sets]
    assert all(validate_comment(d) == [] for d in docs)
    assert [d["iter"] for d in docs] == [2, 3, 6]
    # medians of per-iteration rates: 4e15 FLOPs / t / 8 GPUs; 2 s -> 250, 1 s -> 500 TFLOP/s
    assert docs[0]["tflops"] == 375.0 and docs[0]["mfu"] == 0.375  # median(250, 500)
    # last window 2, 1, 1, .5, .5, .5 s -> 250, 500, 500, 1000, 1000, 1000: median 750
    assert docs[-1]["tflops"] == 750.0 and docs[-1]["mfu"] == 0.75
    for d in docs:  # the submit-time keys survive every update
        assert d["run"] == "r" and d["flops_per_iter"] == 4e15 and d["formula"] == "f1"
        assert d["peak"] == 1000.0 and d["t"] == 1700000000


def test_monitor_retries_after_failed_update(tmp_path: Path) -> None:
    job = FakeJob(tmp_path / "log", INITIAL, [[1000.0], [1000.0]])
    job.fail_next = True
    state = run_monitor("9", str(job.log), job.io(), interval_s=0.0)
    assert state.failures == 1 and state.updates == 1
    assert json.loads(job.sets[-1])["iter"] == 2


def test_monitor_stops_on_signal_after_final_update(tmp_path: Path) -> None:
    job = FakeJob(tmp_path / "log", INITIAL, [[1000.0], [1000.0], [1000.0], [1000.0]])
    stop = threading.Event()
    io = job.io()
    grow = io.sleep

    def sleep(s: float) -> bool:
        grow(s)
        stop.set()  # SIGTERM from the sbatch script's stop_monitor while sleeping
        return True

    io.sleep = sleep
    state = run_monitor("9", str(job.log), io, interval_s=0.0, stop=stop)
    assert state.updates == 2  # the one before the signal, and one last look after it
    assert json.loads(job.sets[-1])["iter"] == 2 and job.running


def test_monitor_without_iterations_leaves_comment_alone(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text("starting up\n")
    sets: list[str] = []
    io = MonitorIO(get_comment=lambda j: INITIAL, set_comment=lambda j, t: sets.append(t),
                   job_running=lambda j: False, sleep=lambda s: False)
    run_monitor("9", str(log), io)
    assert sets == []


def test_tail_backlog_where_head_meets_tail_has_no_duplicates(tmp_path: Path) -> None:
    f = tmp_path / "log"
    lines = [f"line {i:05d}\n".encode() for i in range(300)]  # 3300 bytes
    f.write_bytes(b"".join(lines))
    got = LogTail(f, max_chunk_bytes=2200, head_bytes=2200).read_new()
    assert got == b"".join(lines)  # head 2200 + the remaining 1100: every line exactly once


def test_tail_burst_after_start_skips_to_newest(tmp_path: Path) -> None:
    f = tmp_path / "log"
    f.write_bytes(b"first\n")
    tail = LogTail(f, max_chunk_bytes=110, head_bytes=110)
    assert tail.read_new() == b"first\n"
    with f.open("ab") as fh:
        fh.write(b"".join(f"line {i:05d}\n".encode() for i in range(100)))
    got = tail.read_new()
    assert got.endswith(b"line 00099\n") and b"first" not in got and len(got) <= 110
    assert tail.read_new() == b""


def test_monitor_command_with_stub_slurm(tmp_path: Path) -> None:
    """The CLI wiring: squeue/scontrol are stubs on PATH that record what they were asked."""
    import os
    import stat
    import subprocess
    import sys

    bindir = tmp_path / "bin"
    bindir.mkdir()
    calls = tmp_path / "calls"
    (bindir / "squeue").write_text(
        "#!/bin/sh\necho \"squeue $*\" >> \"$CALLS\"\n"
        "printf '%s|%s\\n' RUNNING \"$(cat \"$COMMENT_FILE\")\"\n")
    (bindir / "scontrol").write_text(
        "#!/bin/sh\necho \"scontrol $*\" >> \"$CALLS\"\n"
        "case \"$3\" in Comment=*) printf '%s' \"${3#Comment=}\" > \"$COMMENT_FILE\";; esac\n")
    for f in bindir.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IEXEC)
    comment_file = tmp_path / "comment"
    comment_file.write_text(INITIAL)
    log = tmp_path / "train.log"
    log.write_text("".join(iteration_line(i, 100, 1000.0) for i in range(1, 6)))
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "CALLS": str(calls),
           "COMMENT_FILE": str(comment_file), "SLURM_JOB_ID": "77"}
    cp = subprocess.run([sys.executable, "-m", "slurmpod", "hook", "monitor", "--log", str(log),
                         "--interval-s", "1", "--max-cycles", "2"], env=env,
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(comment_file.read_text())
    # 4e15 FLOPs / 1 s / 8 GPUs = 500 TFLOP/s per GPU = MFU 0.5 of 1000
    assert doc["iter"] == 5 and doc["mfu"] == 0.5 and doc["tflops"] == 500.0
    assert doc["run"] == "r" and doc["flops_per_iter"] == 4e15
    lines = calls.read_text().splitlines()
    assert lines[0] == "squeue -h -j 77 -o %T|%k"
    assert any(ln.startswith("scontrol update JobId=77 Comment={") for ln in lines)
    # the second cycle found no new iteration: the Comment (and its `t`) was not rewritten
    assert "monitor done (1 updates, 0 failed)" in cp.stderr
    assert sum(ln.startswith("scontrol update") for ln in lines) == 1
