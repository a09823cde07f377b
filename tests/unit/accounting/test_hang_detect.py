"""Hang detection in `slurmpod hook monitor`: phases from the log, the bound
max(k x median step x log interval, floor), saves and start-up left alone, once per attempt."""

from __future__ import annotations

import json
from pathlib import Path

from slurmpod.accounting.monitor import (
    HangDetector,
    HangPolicy,
    MonitorIO,
    hang_record,
    run_monitor,
)
from slurmpod.runs.attempts import parse_attempts
from tests.unit.accounting.test_hook_figures import iteration_line

POLICY = HangPolicy(k=10.0, floor_s=5.0, setup_s=60.0, save_s=30.0)


def lines(*text: str) -> bytes:
    return "".join(t if t.endswith("\n") else t + "\n" for t in text).encode()


def test_no_iteration_for_k_median_steps_is_a_hang() -> None:
    d = HangDetector(POLICY)
    d.feed(lines("slurmpod: attempt 2: launching on gpu001 gpu002"), 0.0)
    d.feed(lines(iteration_line(5, 100, 2000.0), iteration_line(6, 100, 2000.0)), 10.0)
    assert d.phase == "train" and d.attempt == 2
    assert d.check(29.9, 2.0) is None  # bound: 10 x 2 s
    hang = d.check(30.1, 2.0)
    assert hang is not None and hang.phase == "train" and hang.iteration == 6
    assert hang.bound_s == 20.0 and hang.attempt == 2
    assert d.check(100.0, 2.0) is None  # once per attempt
    d.feed(lines("slurmpod: attempt 3: launching on gpu001 gpu003"), 101.0)
    assert d.phase == "setup" and d.check(150.0, 2.0) is None and d.check(161.5, 2.0)


def test_the_floor_and_the_log_interval_scale_the_bound() -> None:
    d = HangDetector(POLICY)
    d.feed(lines(iteration_line(10, 100, 100.0), iteration_line(20, 100, 100.0)), 0.0)
    assert d.line_gap == 10
    assert d.bound_s(0.1) == 10.0  # 10 x 0.1 s x 10 iterations per line
    assert d.bound_s(0.01) == 5.0  # the floor


def test_a_long_save_and_a_slow_start_are_not_hangs() -> None:
    d = HangDetector(POLICY)
    d.feed(lines("slurmpod: attempt 1: launching on gpu001", " loading checkpoint from /c"), 0.0)
    assert d.check(59.0, None) is None  # start-up: setup_s
    d.feed(lines(iteration_line(1, 100, 1000.0),
                 "saving checkpoint at iteration       1 to /c in torch format"), 59.0)
    assert d.phase == "save" and d.check(88.0, 1.0) is None  # 29 s of save_s 30
    d.feed(lines("  successfully saved checkpoint from iteration       1 to /c"), 88.0)
    assert d.phase == "train" and d.check(97.0, 1.0) is None  # 9 s < 10 x 1 s
    assert d.check(98.5, 1.0) is not None
    d2 = HangDetector(POLICY)
    d2.feed(lines("slurmpod: attempt 1: launching on gpu001"), 0.0)
    hang = d2.check(61.0, None)
    assert hang is not None and hang.phase == "setup" and hang.iteration is None


def test_hang_record_is_a_v1_event_of_the_attempts_record() -> None:
    d = HangDetector(POLICY)
    d.feed(lines("slurmpod: attempt 4: launching on gpu001", iteration_line(7, 9, 500.0)), 0.0)
    hang = d.check(6.0, 0.5)
    assert hang is not None
    rec = hang_record("42", hang, 1.7e9)
    doc = json.loads(rec)
    assert doc["event"] == "hang" and doc["attempt"] == 4 and doc["iteration"] == 7
    log = parse_attempts(rec)
    att = log.find("42", 4)
    assert att is not None and att.hang is not None and att.hang["phase"] == "train"


def test_the_monitor_calls_on_hang_once_and_keeps_updating(tmp_path: Path) -> None:
    log = tmp_path / "job.out"
    log.write_text("slurmpod: attempt 1: launching on gpu001\n")
    clock = [0.0]
    feed = [[iteration_line(i, 100, 1000.0) for i in range(1, 4)]] + [[]] * 30
    hangs = []

    def sleep(s: float) -> bool:
        clock[0] += s
        if feed:
            with log.open("a") as fh:
                fh.writelines(feed.pop(0))
        return False

    io = MonitorIO(get_comment=lambda j: "", set_comment=lambda j, t: None,
                   job_running=lambda j: True, sleep=sleep, now=lambda: 1.7e9,
                   on_hang=hangs.append, monotonic=lambda: clock[0])
    state = run_monitor("7", str(log), io, interval_s=60.0, poll_s=1.0, max_cycles=25,
                        hang_policy=POLICY)
    assert len(hangs) == 1 and state.hangs == hangs
    # iterations seen at t=1 s; bound max(10 x 1 s, 5 s) = 10 s; polled once a second
    assert hangs[0].phase == "train" and 10.0 < hangs[0].silent_s <= 11.0
