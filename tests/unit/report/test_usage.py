"""seff/jobstats parity: sacct's usage fields (recorded on the sandbox with Slurm 22.05.8 and
24.11.5: tests/data/report/usage-*/README.md says what each job did), the efficiency figures
and verdicts built from them, and the GPU telemetry summary read from a spool record. Expected
numbers are worked out from the recorded rows in the comments next to them."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from slurmpod.backends.parse import (
    USAGE_FIELDS,
    req_mem,
    size_bytes,
    tres_values,
)
from slurmpod.model.jobs import JobRecord, JobState
from slurmpod.report.build import build_job_report
from slurmpod.report.rules import mem_request, time_request
from slurmpod.report.sacct import Attempt, SacctJob, Usage, parse_usage, usage_argv
from slurmpod.report.text import job_text
from tests.helpers import DATA_DIR

DATA = DATA_DIR / "report"
US = "\x1f"
K, M, G = 1 << 10, 1 << 20, 1 << 30


def usage(version: str, name: str = "finished") -> dict[str, Usage]:
    return parse_usage((DATA / f"usage-{version}" / f"{name}.txt").read_text(), US)


# -- field parsers ---------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "want"), [
    ("322100K", 322100 * K), ("4000M", 4000 * M), ("250G", 250 * G), ("1.50G", int(1.5 * G)),
    ("1718104", 1718104), ("0", 0), ("", None), ("12X", None), ("-5K", None), ("K", None)])
def test_sizes_as_sacct_prints_them(text: str, want: int | None) -> None:
    assert size_bytes(text) == want


@pytest.mark.parametrize(("text", "want"), [
    ("4000M", (4000 * M, "job")),  # 21.08 on: the job's total
    ("500G", (500 * G, "job")),
    ("16Gn", (16 * G, "node")),  # up to 20.11: per node
    ("2000Mc", (2000 * M, "cpu")),  # up to 20.11: per CPU
    ("", (None, "")), ("16Gx", (None, ""))])
def test_req_mem_forms(text: str, want: tuple[int | None, str]) -> None:
    assert req_mem(text) == want


def test_usage_query_is_framed_by_the_ids() -> None:
    assert USAGE_FIELDS[0] == "JobID" and USAGE_FIELDS[-1] == "JobIDRaw"
    argv = usage_argv("12", "\x1fabc")
    assert "--allocations" not in argv and "--duplicates" not in argv
    assert "--jobs=12" in argv and "--delimiter=\x1fabc" in argv
    assert tres_values("cpu=00:00:03,energy=0,mem=322100K,junk") == {
        "cpu": "00:00:03", "energy": "0", "mem": "322100K"}


# -- recorded sacct output, 22.05 and 24.11 ---------------------------------------------------

@pytest.mark.parametrize(("version", "ids"), [("22.05", ("2", "3", "4", "5")),
                                              ("24.11", ("1", "2", "3", "4"))])
def test_recorded_usage(version: str, ids: tuple[str, ...]) -> None:
    got = usage(version)
    assert set(got) == set(ids)
    plain, percpu, twonode, timeout = (got[i] for i in ids)
    # plain: --mem=4000M -t 10; the batch step's 300 MiB is the peak (the srun step: 200 MiB).
    assert plain.req_mem_bytes == 4000 * M and plain.limit_s == 600
    assert plain.alloc_cpus == 32 and plain.req_cpus == 1 and plain.steps == 2
    assert plain.mem_peak_bytes in (322100 * K, 322168 * K)
    assert plain.cpu_alloc_s == 32 * plain.elapsed_s
    assert plain.cpu_efficiency == pytest.approx(plain.cpu_s / plain.cpu_alloc_s)
    # 4 + 3 s of CPU burnt, plus start-up: 3.5-3.8 s over 32 cores x 11-12 s.
    assert 3.4 < plain.cpu_s < 4.5 and 0.008 < plain.cpu_efficiency < 0.013
    assert plain.mem_efficiency == pytest.approx(plain.mem_peak_bytes / (4000 * M))
    assert plain.time_fraction == pytest.approx(plain.elapsed_s / 600)
    assert plain.gpus == 8 and plain.energy_j is None and plain.gpu_util_pct is None
    # percpu: -n4 --mem-per-cpu=500M: ReqMem is the job's total (2000M); the peak is the four
    # tasks' sum (TRESUsageInTot mem 463328K in 22.05), not one task's MaxRSS (115964K).
    assert percpu.req_mem_bytes == 2000 * M and percpu.limit_s is None
    assert percpu.time_fraction is None
    assert 4 * 100 * M < percpu.mem_peak_bytes < 4 * 120 * M
    # twonode: the partition's 250G per node over 2 nodes is ReqMem 500G; the step's two
    # tasks (one per node) add up.
    assert twonode.req_mem_bytes == 500 * G and twonode.n_nodes == 2 and twonode.gpus == 16
    assert 2 * 150 * M < twonode.mem_peak_bytes < 2 * 170 * M
    assert twonode.limit_s == 3600
    # timeout: -t 1, ran past it (KillWait).
    assert timeout.state == "TIMEOUT" and timeout.limit_s == 60 and timeout.time_fraction > 1


def test_running_job_has_no_usage_yet() -> None:
    (u,) = usage("22.05", "running").values()
    assert u.state == "RUNNING" and u.steps == 0
    assert u.cpu_efficiency is None and u.mem_peak_bytes is None and u.mem_efficiency is None
    assert u.energy_j is None  # ConsumedEnergyRaw empty while running
    assert u.req_mem_bytes == 250 * G and u.limit_s == 1800


def _row(jid: str, **kw: str) -> str:
    base = {f: "" for f in USAGE_FIELDS} | {"JobID": jid, "JobIDRaw": jid, "State": "COMPLETED",
                                           "ElapsedRaw": "3600", "AllocCPUS": "16",
                                           "NNodes": "1"}
    base.update(kw)
    return US.join(base[f] for f in USAGE_FIELDS)


def _gpu_job(util: str, gpumem: str, energy: str = "0") -> Usage:
    """A job on a site with AccountingStorageTRES=gres/gpumem,gres/gpuutil (AutoDetect=nvml):
    the step rows carry both in TRESUsageIn* (sacct(1): gres/gpuutil in percent, gres/gpumem
    a size)."""
    tres = f"cpu=01:00:00,energy=0,gres/gpumem={gpumem},gres/gpuutil={util},mem=40G"
    text = "\n".join([
        _row("7", TotalCPU="02:00:00", CPUTimeRAW="57600", ReqMem="64G", TimelimitRaw="240",
             AllocTRES="cpu=16,gres/gpu=4,mem=64G,node=1", ConsumedEnergyRaw=energy),
        _row("7.0", TotalCPU="02:00:00", MaxRSS="40G", AllocTRES="cpu=16,gres/gpu=4,node=1",
             TRESUsageInTot=tres, TRESUsageInMax=tres, NTasks="1"),
    ]) + "\n"
    return parse_usage(text, US)["7"]


def test_slurm_gpu_tres_and_energy() -> None:
    u = _gpu_job("320", "30720M", energy="5400000")
    # one task using 4 GPUs: nvml adds their utilisation, so 320 / 4 GPUs = 80 % each.
    assert u.gpu_util_pct == pytest.approx(80.0) and u.gpu_mem_bytes == 30 * G
    assert u.energy_j == 5.4e6 and u.cpu_efficiency == pytest.approx(7200 / 57600)


@pytest.mark.parametrize("util", ["900", "-5", "abc", ""])
def test_slurm_gpu_util_out_of_range_is_not_measured(util: str) -> None:
    assert _gpu_job(util, "1G").gpu_util_pct is None


def test_bad_rows_are_left_out_not_guessed(caplog: pytest.LogCaptureFixture) -> None:
    good = _row("8")
    forged = _row("9", JobIDRaw="10")  # ids disagree
    short = US.join(["11", "COMPLETED", "5", "11"])
    got = parse_usage("\n".join([good, forged, short]) + "\n", US)
    assert list(got) == ["8"]
    assert "left out 2 record(s)" in caplog.text


# -- the report: efficiency figures and verdicts ------------------------------------------------

def _sacct_job(state: JobState = JobState.COMPLETED, elapsed: int = 3600,
               gpus: int = 4) -> SacctJob:
    t0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)
    rec = JobRecord(job_id="7", name="train", user="alice", account="ml", partition="batch",
                    state=state, exit_code=0, signal=0, submit_time=t0, start_time=t0,
                    end_time=t0, elapsed_s=elapsed, nodes="gpu001", n_nodes=1, n_gpus=gpus)
    return SacctJob(rec, (Attempt(None, None, None, elapsed, str(state)),))


def _codes(r: Any) -> dict[str, Any]:
    return {n.code: n for n in r.notes}


def test_plain_job_report_is_seff_style() -> None:
    u = usage("22.05")["2"]
    sj = _sacct_job(elapsed=u.elapsed_s, gpus=8)
    r = build_job_report(sj, usage=u)
    assert r.status == "no-training-log" and "no MFU" in r.status_text
    e = r.to_json()["efficiency"]
    assert e["slurm"]["cpu_efficiency"] == pytest.approx(3.706 / 384)
    assert e["slurm"]["mem_peak_bytes"] == 322100 * K
    assert e["gpu"]["util_pct"] is None and e["energy_j"] is None
    text = job_text(r)
    assert "CPU          1.0 % of 32 cores x 0:12 (CPU time 0:04)" in text
    assert "memory       315 MiB peak of 3.91 GiB requested (7.9 %)" in text
    assert "time         0:12, 2.0 % of the 10:00 limit" in text
    for what in ("GPU util", "GPU memory", "energy"):
        assert f"{what:<13}not measured" in text
    # a 12 s job: too short for CPU/memory verdicts; a 10 min limit is not worth a note
    assert not {"cpu-low", "mem-over-requested", "time-over-requested"} & set(_codes(r))


def test_verdicts_with_fixes() -> None:
    u = Usage(job_id="7", state="COMPLETED", elapsed_s=1800, limit_s=24 * 3600, alloc_cpus=64,
              req_cpus=64, cpu_s=1800 * 4.0, cpu_alloc_s=64 * 1800, req_mem_bytes=512 * G,
              alloc_mem_bytes=512 * G, mem_peak_bytes=20 * G, n_nodes=1, gpus=8, steps=2)
    r = build_job_report(_sacct_job(elapsed=1800, gpus=8), usage=u)
    notes = _codes(r)
    # 4 busy cores of 64: 6.25 %; 4 × 1.25 / 8 GPUs -> 1 CPU per GPU
    assert "6.2 %" in notes["cpu-low"].text and "--cpus-per-gpu=1" in notes["cpu-low"].fix
    # 20 GiB of 512: 3.9 %; 20 × 1.25 = 25 GiB
    assert "--mem=25G" in notes["mem-over-requested"].fix
    # 30 min of 24 h: 2.1 %; 1.5 × 30 min = 45 min
    assert "--time=0:45:00" in notes["time-over-requested"].fix
    near = replace(u, mem_peak_bytes=500 * G)
    r2 = build_job_report(_sacct_job(elapsed=1800, gpus=8), usage=near)
    assert "--mem=625G" in _codes(r2)["mem-near-limit"].fix
    assert "mem-over-requested" not in _codes(r2)
    # a failed or cancelled job's short run says nothing about the time it needed
    r3 = build_job_report(_sacct_job(JobState.FAILED, elapsed=1800, gpus=8), usage=u)
    assert "time-over-requested" not in _codes(r3) and "ended-badly" in _codes(r3)
    assert all(n.fix for n in r.notes if n.code != "no-training-log")


def test_timeout_and_oom_fixes() -> None:
    for state, word in ((JobState.TIMEOUT, "--time"), (JobState.OUT_OF_MEMORY, "--mem")):
        r = build_job_report(_sacct_job(state))
        assert word in _codes(r)["ended-badly"].fix


def test_request_suggestions() -> None:
    assert mem_request(20 * G, 1) == "--mem=25G"
    assert mem_request(20 * G, 4) == "--mem=7G"  # 25 GiB over 4 nodes, rounded up
    assert mem_request(1, 1) == "--mem=1G"
    assert time_request(60) == "--time=0:15:00"
    assert time_request(3 * 3600) == "--time=4:30:00"
    assert time_request(20 * 3600) == "--time=1-06:00:00"


def _gpu_record(**gpu: Any) -> dict[str, Any]:
    return {"v": 1, "summary": {"gpus": 8, "gpu": {"v": 1, "src": "dcgm", "trust": "site",
                                                    "n": 8, "span_s": 3600.0, **gpu}}}


def test_gpu_telemetry_figures_and_verdicts() -> None:
    rec = _gpu_record(util=41.5, util_min=0.3, idle_gpus=2, sm=30.2, tensor=12.0,
                      mem_gib=22.0, mem_total_gib=79.6, power_w=250.0, power_max_w=690.0,
                      energy_j=7.2e6, energy_src="dcgm", temp_max_c=71, xid=2, xid_codes="79")
    r = build_job_report(_sacct_job(gpus=8), spool_record=rec, usage=usage("22.05")["2"])
    e = r.to_json()["efficiency"]
    assert e["gpu"]["source"] == "dcgm" and e["gpu"]["util_pct"] == 41.5
    assert e["energy_j"] == 7.2e6 and e["energy_source"] == "gpu:dcgm"
    notes = _codes(r)
    assert "2 of 8 GPUs" in notes["gpus-idle"].text and "--gpus-per-node" in notes[
        "gpus-idle"].fix
    assert "gpu-low-util" in notes and "XID 79" in notes["gpu-xid"].text
    text = job_text(r)
    assert "GPU util     41.5 % mean, lowest GPU 0.3 %, 2 idle, SM active 30.2 %" in text
    assert "GPU memory   22 GiB peak of 79.6 GiB" in text
    assert "energy       2 kWh (gpu:dcgm)" in text


def test_idle_gpus_and_garbage_telemetry() -> None:
    r = build_job_report(_sacct_job(), spool_record=_gpu_record(util=0.4))
    assert "gpu-idle" in _codes(r) and "gpus-idle" not in _codes(r)
    # out-of-range values are dropped by the telemetry schema: "not measured", no verdict
    bad = _gpu_record(util=250.0, power_w=-3.0, energy_j=float("nan"))
    r2 = build_job_report(_sacct_job(), spool_record=bad)
    assert r2.efficiency is not None and r2.efficiency.gpu is None
    assert not {"gpu-idle", "gpu-low-util"} & set(_codes(r2))
    assert "GPU util     not measured" in job_text(r2)


def test_energy_per_token_from_megatron_log() -> None:
    """Megatron --log-energy: 600 J per iteration per GPU; 4 GPUs; 1,000 ms iterations at
    100,000 tokens/s -> 100,000 tokens per iteration -> 2,400 J / 1e5 = 0.024 J/token."""
    rec = {"v": 1, "summary": {
        "iters": 100, "last_iter": 1000, "mfu": 0.4, "tflops": 400.0, "peak": 989.0,
        "tokens_per_s": 1e5, "iter_ms": 1000.0, "gpus": 4,
        "metrics": {"tokens_per_s": {"median": 1e5}, "iter_time_ms": {"median": 1000.0},
                    "productive_s": 1000.0, "energy_j": {"median": 600.0}}}}
    r = build_job_report(_sacct_job(gpus=4), spool_record=rec)
    e = r.efficiency
    assert e is not None and e.energy_per_token_j == pytest.approx(0.024)
    # 1e8 tokens trained (1e5/s × 1,000 s) × 0.024 J
    assert e.energy_j == pytest.approx(2.4e6) and e.energy_src == "megatron-log"


def test_fleet_rows_skip_efficiency() -> None:
    r = build_job_report(_sacct_job(), with_series=False, with_notes=False)
    assert r.efficiency is None and "efficiency" not in r.to_json()
