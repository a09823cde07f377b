"""The monitor's GPU sampler, the Comment/series path into the epilog's record, and garbage."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from slurmpod.accounting.epilog import run_epilog
from slurmpod.accounting.monitor import MonitorIO, run_monitor
from slurmpod.accounting.spool import Spool
from slurmpod.telemetry import comment as tcomment
from slurmpod.telemetry import dcgm, nvidia_smi, prometheus, slurm_tres
from slurmpod.telemetry.sampler import Sampler, job_gpu_ids
from slurmpod.telemetry.schema import (
    MAX_SERIES_POINTS,
    clean_gpu_summary,
    clean_record_part,
)
from tests.unit.accounting.test_hook_epilog import Slurm, job_env, scontrol_line, write_log
from tests.unit.accounting.test_hook_figures import iteration_line

UUID = "GPU-8f6c1d2a-5b3e-4c71-9a0e-2d4b6f8e1a1"


def smi_line(i: int, util: float, power: float, mem_mib: float, mj: float | None = None) -> str:
    base = f"{i}, {UUID}{i}, {util}, 40, {mem_mib}, 81559, {power}, 65, 1980, 2619"
    return base + (f", {mj}" if mj is not None else "")


class FakeSmi:
    """nvidia-smi with or without the energy field, answering from a list of rows per call."""

    def __init__(self, rows: list[list[tuple[float, float, float, float | None]]],
                 energy: bool = True) -> None:
        self.rows, self.energy, self.calls = rows, energy, 0

    def __call__(self, argv: list[str], timeout_s: float) -> tuple[int, str, str]:
        if nvidia_smi.ENERGY_FIELD in argv[1] and not self.energy:
            return 6, 'Field "total_energy_consumption" is not a valid field to query.', ""
        row = self.rows[min(self.calls, len(self.rows) - 1)]
        self.calls += 1
        return 0, "\n".join(smi_line(i, *r) for i, r in enumerate(row)) + "\n", ""


def clock(start: float = 1000.0, step: float = 10.0) -> Callable[[], float]:
    t = [start - step]

    def now() -> float:
        t[0] += step
        return t[0]

    return now


def test_sampler_counter_energy_and_means() -> None:
    smi = FakeSmi([[(100, 600, 70000, 1e6 * k), (0, 70, 10, 2e6 * k)] for k in (1, 2, 3)])
    smi.rows = [[(100, 600, 70000, 1e6), (0, 70, 10, 2e6)],
                [(80, 500, 71000, 7e6), (0, 70, 10, 2.7e6)],
                [(60, 400, 72000, 12e6), (0, 70, 10, 3.4e6)]]
    s = Sampler(smi, node="gpu001", now=clock())
    for _ in range(3):
        assert s.sample()
    tel = s.telemetry()
    assert tel is not None
    summary = tel.summary(model="h100", max_gpus=2)
    assert summary is not None
    assert summary["util"] == 40 and summary["util_min"] == 0 and summary["idle_gpus"] == 1
    assert summary["energy_src"] == "counter"
    assert summary["energy_j"] == (12e6 - 1e6 + 3.4e6 - 2e6) / 1000
    assert summary["mem_gib"] == round(72000 / 1024, 3) and summary["span_s"] == 20
    assert tel.series is not None and tel.series["keys"] == ["gpu001:0", "gpu001:1"]
    assert tel.series["util"][0] == [100, 80, 60]


def test_sampler_integrates_power_without_the_energy_field() -> None:
    smi = FakeSmi([[(50, 100, 1, None)], [(50, 300, 1, None)]], energy=False)
    s = Sampler(smi, node="n", now=clock(step=10))
    assert s.sample() and s.sample()
    summary = s.telemetry().summary()  # type: ignore[union-attr]
    assert summary["energy_src"] == "integrated" and summary["energy_j"] == 2000  # (100+300)/2×10


def test_sampler_series_is_bounded_and_spans_the_job() -> None:
    smi = FakeSmi([[(float(k % 101), 100, 1, None)] for k in range(1000)], energy=False)
    s = Sampler(smi, node="n", now=clock(step=1))
    for _ in range(1000):
        s.sample()
    ser = s.series()
    assert ser is not None and len(ser["t"]) < 2 * MAX_SERIES_POINTS
    # bucket centres, evenly over the whole job (buckets of at most 1000 / MAX_SERIES_POINTS)
    assert ser["t"][0] < 1000 + 1000 / MAX_SERIES_POINTS * 5 and ser["t"][-1] > 1000 + 950
    assert len(ser["util"][0]) == len(ser["t"])
    assert clean_record_part({"series": ser}) is not None


def test_sampler_failures_are_not_measured() -> None:
    s = Sampler(lambda a, t: (127, "", "nvidia-smi: not found"), node="n")
    assert not s.sample() and s.telemetry() is None and s.failures == 1
    s = Sampler(lambda a, t: (124, "", "timed out"), node="n")
    assert not s.sample() and s.telemetry() is None


def test_job_gpu_ids() -> None:
    assert job_gpu_ids({"SLURM_JOB_GPUS": "2,3"}) == [2, 3]
    assert job_gpu_ids({"SLURM_JOB_GPUS": "2,x"}) is None and job_gpu_ids({}) is None


def test_monitor_writes_gpu_figures_without_moving_t(tmp_path: Path) -> None:
    log = tmp_path / "job.out"
    log.write_text("".join(iteration_line(i, 10, 1000.0) for i in (10, 20)))
    comments: list[str] = []
    smi = FakeSmi([[(90, 500, 1000, None)], [(10, 200, 1000, None)],
                   [(50, 300, 1000, None)]], energy=False)
    ticks = iter(range(100, 1000, 10))
    mono = iter(range(0, 100_000, 1000))  # every cycle is a whole interval (180 s) later
    io = MonitorIO(get_comment=lambda j: None, set_comment=lambda j, c: comments.append(c),
                   job_running=lambda j: True, sleep=lambda s: False,
                   now=lambda: float(next(ticks)), sampler=Sampler(smi, node="n", now=clock()),
                   monotonic=lambda: float(next(mono)))
    run_monitor("7", str(log), io, max_cycles=3, peak_hint=1.0, gpus_hint=8,
                stop=threading.Event(), parent_pid=None)
    docs = [json.loads(c) for c in comments]
    assert len(docs) >= 2 and all("gpu" in d for d in docs)
    assert len({d["t"] for d in docs}) == 1  # no new iteration: `t` stays put
    assert docs[-1]["gpu"]["n"] == 1 and docs[-1]["gpu"]["u"] == 50
    assert all(len(c.encode()) <= 1024 for c in comments)
    part = json.loads(tcomment.series_path(log).read_text())
    assert part["series"]["util"] == [[90, 10, 50]]


def _epilog_env(tmp_path: Path, gpu: dict[str, object]) -> dict[str, str]:
    env = job_env(tmp_path)
    doc = json.loads(env["SLURM_JOB_COMMENT"])
    doc["gpu"] = gpu
    env["SLURM_JOB_COMMENT"] = json.dumps(doc)
    env["SLURMPOD_GPU_TELEMETRY"] = "comment"
    return env


def test_epilog_stores_the_monitors_figures_checked(tmp_path: Path) -> None:
    log = write_log(tmp_path)
    part = {"gpus": [{"node": "gpu001", "index": 0, "util": 91.0, "power_w": 500.0,
                      "span_s": 100.0, "energy_j": 5e4}],
            "series": {"t": [1.0, 2.0], "keys": ["gpu001:0"], "util": [[90.0, 400.0]]}}
    tcomment.series_path(log).write_text(json.dumps(part))
    gpu = {"n": 16, "u": 91.5, "p": 512.0, "e": 800000, "es": "c", "d": 100, "m": 70.1,
           "tc": 300}
    spool = tmp_path / "spool"
    run_epilog(_epilog_env(tmp_path, gpu), spool, deliver=Slurm(), peak_tflops=1000.0,
               show_job=lambda jid: scontrol_line(jid))
    rec = Spool(spool).read_record("42", 0)
    g = rec["summary"]["gpu"]
    assert g["src"] == "nvidia-smi" and g["trust"] == "job" and g["util"] == 91.5
    assert g["energy_j"] == 800000 and "temp_max_c" not in g  # 300 °C is not a reading
    assert rec["gpu"]["series"]["util"] == [[90.0, None]]  # 400 % dropped, not clamped
    assert rec["gpu"]["gpus"][0]["util"] == 91.0
    assert "gpu" not in json.loads(rec["admin_comment"])  # AdminComment keys unchanged


def test_epilog_refuses_a_symlinked_series_and_forged_counts(tmp_path: Path) -> None:
    log = write_log(tmp_path)
    other = tmp_path / "someone-elses.json"
    other.write_text(json.dumps({"gpus": [{"util": 50.0}]}))
    os.symlink(other, tcomment.series_path(log))
    gpu = {"n": 4096, "u": 50.0, "e": 1e15, "d": 100}  # more GPUs than Slurm allocated
    spool = tmp_path / "spool"
    run_epilog(_epilog_env(tmp_path, gpu), spool, deliver=Slurm(), peak_tflops=1000.0,
               show_job=lambda jid: scontrol_line(jid))
    rec = Spool(spool).read_record("42", 0)
    assert "gpu" not in rec  # the symlink was not followed
    g = rec["summary"]["gpu"]
    assert "n" not in g and "energy_j" not in g and g["util"] == 50.0


def test_epilog_without_any_source_is_not_measured(tmp_path: Path) -> None:
    write_log(tmp_path)
    env = job_env(tmp_path)
    env["SLURMPOD_GPU_TELEMETRY"] = "auto"
    spool = tmp_path / "spool"
    run_epilog(env, spool, deliver=Slurm(), peak_tflops=1000.0,
               show_job=lambda jid: scontrol_line(jid))
    rec = Spool(spool).read_record("42", 0)
    assert "gpu" not in rec["summary"] and rec["summary"]["mfu"] == 0.25
    assert "GPU telemetry none" in (spool / "hook.log").read_text()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=2000))
def test_garbage_never_crashes_the_parsers(text: str) -> None:
    for g in dcgm.parse_job_stats("Successfully retrieved statistics for job: 1.\n" + text):
        assert g.util is None or 0 <= g.util <= 100
    for s in nvidia_smi.parse_query(text):
        assert s.util is None or 0 <= s.util <= 100
    nvidia_smi.parse_xid_lines(text)
    slurm_tres.parse_steps(text)
    prometheus.parse_vector(text)
    tcomment.expand(text)


@settings(max_examples=300, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c,
                                                                        max_size=6),
                    max_leaves=30))
def test_garbage_json_never_passes_as_figures(doc: object) -> None:
    out = clean_gpu_summary(doc)
    if out is not None:
        for key in ("util", "util_min", "sm", "tensor", "mem_util"):
            assert key not in out or 0 <= out[key] <= 100
    clean_record_part(doc)
    clean_gpu_summary(tcomment.expand(doc))
