"""GPU telemetry end to end on the real sandbox Slurm: the emulated GPUs' `dcgmi` and
`nvidia-smi` (slurmpod/sandbox/gpu_shims.py) answer from what megatron_emu really did, the
EpilogSlurmctld hook stores the figures in the spool record, and `slurmpod report` shows them,
for a plain `sbatch --wrap` job and for a slurmpod-submitted run; the fleet report has both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from slurmpod.sandbox.workload import gpu_activity
from slurmpod.telemetry.schema import read_gpu_summary
from tests.helpers import EMU, TINY, log_iterations, wait_for

IDLE_W, MAX_W = 70.0, 700.0  # the emulated GPU: 10 % of the schema's 700 W `emu` limit
WIDE = ["--hidden-size", "512", "--num-attention-heads", "8"]  # MiB of arrays, not KiB


def env_with_venv(sandbox: Any) -> dict[str, str]:
    env = dict(sandbox.env)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["SLURMPOD_MONITOR_INTERVAL_S"] = "1"
    env["SLURMPOD_SPOOL"] = str(sandbox.sb.spool_dir)
    return env


def record_with_gpu(sandbox: Any, job_id: str) -> dict[str, Any] | None:
    for path in sorted((sandbox.sb.spool_dir / "records").glob(f"{job_id}.*.json")):
        try:
            rec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if read_gpu_summary(rec):
            return rec
    return None


def slurmpod_report(sandbox: Any, *args: str) -> str:
    cp = subprocess.run([sys.executable, "-m", "slurmpod", "report", *args],
                        env=env_with_venv(sandbox), capture_output=True, text=True, timeout=180,
                        stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stderr
    return cp.stdout


def activity(sandbox: Any, job_id: str) -> dict[str, Any]:
    act, _ = gpu_activity.read_job(sandbox.sb.layout.gpu_state / job_id)
    assert act is not None, f"the emulator recorded nothing for job {job_id}"
    return act


def check_dcgm_figures(rec: dict[str, Any], act: dict[str, Any], n: int, busy_gpus: int
                       ) -> dict[str, Any]:
    """The summary the epilog stored is what the emulator's counters give, through DCGM."""
    gpu = read_gpu_summary(rec)
    assert gpu is not None
    assert gpu["src"] == "dcgm" and gpu["trust"] == "site" and gpu["n"] == n
    # The span to the ms from the per-GPU figures (the summary's has 0.1 s, which matters in a
    # job of a few seconds); the ranks' start may precede rank 0's first counter.
    span = max(g["span_s"] for g in rec["gpu"]["gpus"])
    assert span >= act["t"] - act["t0"] - 0.01
    assert gpu["span_s"] == pytest.approx(span, abs=0.051)
    busy = act["busy_s"]
    assert 0 < busy < span
    # DCGM prints whole percents per GPU (+-0.5), over a window known to 0.051 s (above): in a
    # job of a few seconds the window's error moves the percent by more than the rounding.
    lo = 100 * busy / (span + 0.051) * busy_gpus / n - 0.51
    hi = 100 * busy / max(span - 0.051, busy) * busy_gpus / n + 0.51
    assert lo <= gpu["util"] <= hi, (gpu["util"], lo, hi)
    assert gpu["idle_gpus"] == (n - busy_gpus if busy / span >= 0.05 else n)
    want_j = n * IDLE_W * span + busy_gpus * (MAX_W - IDLE_W) * busy
    assert gpu["energy_j"] == pytest.approx(want_j, rel=0.01)
    assert IDLE_W <= gpu["power_w"] <= MAX_W and gpu["power_w"] == pytest.approx(
        want_j / n / span, rel=0.01)
    assert gpu["mem_gib"] == pytest.approx(act["mem_bytes"] / (1 << 30), abs=0.002)
    assert gpu["xid"] == 0
    assert "sm_mhz" not in gpu and "temp_max_c" not in gpu  # N/A: "not measured"
    return gpu


def test_plain_sbatch_job_gets_gpu_telemetry(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "telemetry"
    d.mkdir(exist_ok=True)
    log = d / "plain-%j.out"
    # One process drives the first of the job's GPUs (the sandbox's partitions give whole
    # nodes: all 8); the others stay idle, as DCGM would show them.
    script = (f"env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 {' '.join(EMU)} {' '.join(TINY)} "
              f"{' '.join(WIDE)} --train-iters 30")
    job_id = sandbox.sbatch("-N1", "--gpus-per-node=2", "--job-name=tel-plain",
                            f"--output={log}", "--wrap", script)
    try:
        job = sandbox.wait_job(job_id, timeout_s=180)
        rec = wait_for(lambda: record_with_gpu(sandbox, job_id), 90, "GPU figures in the spool")
    except BaseException:
        sandbox.cancel(job_id)
        raise
    assert job["state"]["current"] in ("COMPLETED", ["COMPLETED"]), job["state"]
    text = Path(str(log).replace("%j", job_id)).read_text()
    its = log_iterations(text)
    assert len(its) == 30, text[-2000:]
    act = activity(sandbox, job_id)
    assert act["iters"] == 30
    # The GEMMs are part of each iteration: never longer than the iterations the log timed.
    assert act["busy_s"] <= sum(ms for _, ms in its) / 1000 + 0.01
    _, ranks = gpu_activity.read_job(sandbox.sb.layout.gpu_state / job_id)
    assert len(ranks) == 1
    job_gpus = ranks[0]["job_gpus"]  # SLURM_JOB_GPUS
    assert len(job_gpus) >= 2 and ranks[0]["gpu"] == job_gpus[0]
    gpu = check_dcgm_figures(rec, act, n=len(job_gpus), busy_gpus=1)
    assert gpu["span_s"] <= int(job["time"]["elapsed"]) + 2
    per_gpu = {g["index"]: g for g in rec["gpu"]["gpus"]}
    assert sorted(per_gpu) == sorted(job_gpus) and per_gpu[job_gpus[0]]["util"] > 0
    assert all(per_gpu[i]["util"] == 0 for i in job_gpus[1:])
    report = slurmpod_report(sandbox, job_id)
    util_line = next(line for line in report.splitlines() if "GPU util" in line)
    assert f"{gpu['util']:.1f} %" in util_line, report
    assert "energy" in report and "not measured" not in util_line
    js = json.loads(slurmpod_report(sandbox, job_id, "--json"))
    eff = js["efficiency"]
    assert eff["gpu"]["source"] == "dcgm" and eff["gpu"]["util_pct"] == gpu["util"]
    assert eff["energy_j"] == pytest.approx(gpu["energy_j"])
    check_fleet(sandbox, {job_id: gpu})


def test_slurmpod_run_gets_gpu_telemetry_and_the_monitors_series(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "telemetry-run"
    d.mkdir(exist_ok=True)
    run = d / "run.toml"
    run.write_text(f"""
[job]
name = "tel-run"
nodes = 1
time_limit = "00:10:00"
entrypoint = "{' '.join(EMU)}"
work_dir = "{d / 'tel-run'}"

[megatron]
num_layers = 8
hidden_size = 512
num_attention_heads = 8
seq_length = 64
vocab_size = 1024
tensor_model_parallel_size = 8
micro_batch_size = 1
global_batch_size = 2
train_iters = 60
log_interval = 1
""")
    cp = subprocess.run([sys.executable, "-m", "slurmpod", "submit", str(run), "--topo-dir", "",
                         "--json"], env=env_with_venv(sandbox), capture_output=True, text=True,
                        timeout=120, cwd=d, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stderr
    job_id = json.loads(cp.stdout)["job_id"]
    try:
        sandbox.wait_job(job_id, timeout_s=240)
        rec = wait_for(lambda: record_with_gpu(sandbox, job_id), 90, "GPU figures in the spool")
    except BaseException:
        sandbox.cancel(job_id)
        raise
    act = activity(sandbox, job_id)
    assert act["iters"] == 60
    _, ranks = gpu_activity.read_job(sandbox.sb.layout.gpu_state / job_id)
    assert sorted(r["gpu"] for r in ranks) == list(range(8))  # one rank per GPU
    gpu = check_dcgm_figures(rec, act, n=8, busy_gpus=8)  # the site's DCGM wins the monitor
    # The job's own monitor sampled the emulated nvidia-smi meanwhile: its series is kept
    # beside DCGM's figures, one key per GPU of the batch host, values in range.
    series = rec["gpu"].get("series")
    assert series, rec["gpu"]
    assert len(series["keys"]) == 8 and all(k.endswith(f":{i}") for i, k in
                                            enumerate(sorted(series["keys"])))
    utils = [v for row in series["util"] for v in row if v is not None]
    powers = [v for row in series["power_w"] for v in row if v is not None]
    assert utils and all(0 <= v <= 100 for v in utils) and max(utils) > 0
    assert powers and all(IDLE_W - 0.01 <= v <= MAX_W for v in powers)
    report = slurmpod_report(sandbox, job_id)
    assert f"{gpu['util']:.1f} %" in report and "GPU power" in report
    check_fleet(sandbox, {job_id: gpu})


def check_fleet(sandbox: Any, want: dict[str, dict[str, Any]]) -> None:
    fleet = json.loads(slurmpod_report(sandbox, "--since", "1d", "--json", "--jobs"))
    rows = {row["job_id"]: row for row in fleet["job_rows"]}
    for job_id, gpu in want.items():
        row = rows[job_id]
        assert row["gpu_util"] == gpu["util"]
        assert row["energy_j"] == gpu["energy_j"]
