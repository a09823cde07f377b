"""The sandbox's emulated GPU telemetry without Slurm: the emulator records what it did
(sandbox/workload/gpu_activity.py), the `dcgmi`/`nvidia-smi` shims answer from it, and slurmpod's
own parsers (telemetry/dcgm.py, telemetry/nvidia_smi.py) read the answers."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmpod.sandbox import gpu_shims
from slurmpod.sandbox.gpu_shims import EmuGpu
from slurmpod.sandbox.workload import gpu_activity
from slurmpod.sandbox.workload import megatron_emu as emu
from slurmpod.telemetry import dcgm, nvidia_smi
from tests.helpers import TINY

EMU_GPU = EmuGpu("emulated GPU (CPU matmul)", 80.0, 700.0, 70.0)
NODES = {"gpu001": 8, "gpu002": 8}


def job_env(gpu_dir: Path, job: str, node: str, **extra: str) -> dict[str, str]:
    return {gpu_activity.ENV: str(gpu_dir), "SLURM_JOB_ID": job, "SLURMD_NODENAME": node,
            **extra}


def fake_job(gpu_dir: Path, job: str, *, busy_s: float, span_s: float, util_max: float,
             mem: int, ranks: list[tuple[int, str, int]], job_gpus: list[int]) -> None:
    d = gpu_dir / job
    d.mkdir(parents=True)
    t0 = time.time() - span_s
    for rank, node, gpu in ranks:
        (d / f"rank-{rank}.json").write_text(json.dumps(
            {"node": node, "gpu": gpu, "job_gpus": job_gpus, "t": t0}))
    (d / "activity.json").write_text(json.dumps(
        {"t0": t0, "t": t0 + span_s, "busy_s": busy_s, "iters": 10, "mem_bytes": mem,
         "util_last": util_max, "util_max": util_max}))


def run_dcgmi(argv: list[str], gpu_dir: Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = gpu_shims.dcgmi(argv, gpu_dir, EMU_GPU, out, err)
    return rc, out.getvalue() + err.getvalue()


def test_dcgmi_job_stats_parse_with_slurmpods_dcgm_reader(tmp_path: Path) -> None:
    # Two ranks on gpu001 (GPUs 2 and 3) of a job that holds GPUs 2, 3 and 5 there.
    fake_job(tmp_path, "42", busy_s=30.0, span_s=100.0, util_max=0.5, mem=3 << 30,
             ranks=[(0, "gpu001", 2), (1, "gpu001", 3)], job_gpus=[2, 3, 5])
    rc, text = run_dcgmi(["stats", "--host", "gpu001", "-j", "42", "-v"], tmp_path)
    assert rc == 0, text
    gpus = dcgm.parse_job_stats(text, "gpu001")
    assert [g.index for g in gpus] == [2, 3, 5]
    busy, idle = gpus[0], gpus[2]
    assert busy.util == pytest.approx(30.0) and idle.util == 0
    assert busy.span_s == pytest.approx(100.0, abs=0.01)
    # energy = idle 70 W x 100 s + (700 - 70) W x 30 busy s; the mean power is energy / span
    assert busy.energy_j == pytest.approx(70 * 100 + 630 * 30, abs=1)
    assert busy.power_w == pytest.approx(259.0, abs=0.01)
    assert busy.power_max_w == pytest.approx(70 + 630 * 0.5, abs=0.01)
    assert busy.mem_gib == pytest.approx(3.0) and idle.mem_gib == 0
    assert idle.energy_j == pytest.approx(7000, abs=1) and idle.power_w == pytest.approx(70)
    assert busy.sm_mhz is None and busy.mem_util is None  # N/A: not measured, never 0
    assert busy.xid == 0
    # slurmpod's summary of it: one idle GPU of three, energy of all three
    tel = dcgm.job_stats(lambda argv, _t: (0, run_dcgmi(argv[1:], tmp_path)[1], ""), "42",
                         ["gpu001"])
    assert tel is not None
    summary = tel.summary(model="emu", max_gpus=3)
    assert summary is not None
    assert summary["n"] == 3 and summary["idle_gpus"] == 1 and summary["src"] == "dcgm"
    assert summary["util"] == pytest.approx(20.0)
    assert summary["energy_j"] == pytest.approx(2 * (7000 + 630 * 30) + 7000, rel=1e-3)


def test_dcgmi_knows_no_job_it_has_no_record_of(tmp_path: Path) -> None:
    fake_job(tmp_path, "42", busy_s=1, span_s=2, util_max=1, mem=1,
             ranks=[(0, "gpu001", 0)], job_gpus=[0])
    for argv in (["stats", "--host", "gpu002", "-j", "42", "-v"],  # not on that node
                 ["stats", "--host", "gpu001", "-j", "43", "-v"],
                 ["stats", "--host", "gpu001", "-j", "../42", "-v"]):
        rc, text = run_dcgmi(argv, tmp_path)
        assert rc != 0 and dcgm.parse_job_stats(text) == []
    rc, text = run_dcgmi(["discovery", "-l"], tmp_path)
    assert rc == 2 and "only `dcgmi stats" in text


def test_nvidia_smi_answers_the_monitors_query_and_rejects_the_energy_field(
        tmp_path: Path) -> None:
    fake_job(tmp_path, "7", busy_s=5, span_s=10, util_max=0.75, mem=512 << 20,
             ranks=[(0, "gpu002", 1)], job_gpus=[1, 4])

    def run(argv: list[str], _timeout: float) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        rc = gpu_shims.nvidia_smi(argv[1:], tmp_path, EMU_GPU, NODES,
                                  {"SLURMD_NODENAME": "gpu002"}, out, err)
        return rc, out.getvalue(), err.getvalue()

    samples, with_energy = nvidia_smi.query(run, [1, 4])
    assert not with_energy  # like a driver without NVML's energy counter: power is integrated
    by = {s.index: s for s in samples}
    assert set(by) == {1, 4}
    assert by[1].util == 75 and by[1].mem_gib == pytest.approx(0.5)
    assert by[1].power_w == pytest.approx(70 + 630 * 0.75)
    assert by[4].util == 0 and by[4].power_w == pytest.approx(70) and by[4].mem_gib == 0
    assert by[1].mem_total_gib == pytest.approx(80.0)
    assert by[1].uuid and by[1].uuid != by[4].uuid
    assert by[1].temp_c is None  # [N/A]
    # all 8 GPUs of the node without --id; a finished job's GPUs are idle again
    rc, out, _ = run(["nvidia-smi", "--query-gpu=index,utilization.gpu",
                      "--format=csv,noheader,nounits"], 10)
    assert rc == 0 and len(out.splitlines()) == 8
    old = time.time() - 3600
    for f in (tmp_path / "7").iterdir():
        os.utime(f, (old, old))
    rc, out, _ = run(["nvidia-smi", "--query-gpu=index,utilization.gpu",
                      "--format=csv,noheader,nounits", "--id=1"], 10)
    assert out.strip() == "1, 0"


def test_nvidia_smi_outside_a_node_finds_no_devices(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    rc = gpu_shims.nvidia_smi(["--query-gpu=index", "--format=csv"], tmp_path, EMU_GPU, NODES,
                              {}, out, err)
    assert rc == 6 and "No devices were found" in out.getvalue()


def test_the_installed_script_runs_with_the_sandboxs_python(tmp_path: Path) -> None:
    parent = str(Path(gpu_shims.__file__).resolve().parent.parent.parent)
    fig = {"name": EMU_GPU.name, "hbm_gib": 80.0, "max_w": 700.0, "idle_w": 70.0,
           "nodes": NODES}
    script = tmp_path / "nvidia-smi"
    script.write_text(gpu_shims.shim_script("nvidia-smi", sys.executable, parent,
                                            str(tmp_path / "gpu"), fig))
    script.chmod(0o755)
    cp = subprocess.run([str(script), "--query-gpu=index,power.draw",
                         "--format=csv,noheader,nounits"], capture_output=True, text=True,
                        timeout=30, check=False, env={"SLURMD_NODENAME": "gpu001"})
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.splitlines()[0] == "0, 70.00"


def test_the_emulator_records_its_real_work_only_in_the_sandbox(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = job_env(tmp_path, "99", "gpu003", SLURM_JOB_GPUS="4,5", SLURM_LOCALID="0")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SLURMPOD_SITE", raising=False)  # no pacing: a quick run
    assert emu.main([*TINY, "--train-iters", "5"]) == 0
    act, ranks = gpu_activity.read_job(tmp_path / "99")
    assert ranks == [{"node": "gpu003", "gpu": 4, "job_gpus": [4, 5], "t": ranks[0]["t"]}]
    assert act is not None and act["iters"] == 5
    span = act["t"] - act["t0"]
    assert 0 < act["busy_s"] <= span and 0 < act["util_max"] <= 1
    # the model's arrays: dataset and targets 4096 x 64 float32 each, weights and gradient
    assert act["mem_bytes"] >= 2 * 4096 * 64 * 4 + 2 * 64 * 64 * 4
    # a relaunch in the same job carries on
    assert emu.main([*TINY, "--train-iters", "3"]) == 0
    act2, _ = gpu_activity.read_job(tmp_path / "99")
    assert act2 is not None and act2["iters"] == 8 and act2["t0"] == act["t0"]
    assert act2["busy_s"] > act["busy_s"]
    # without the sandbox's variable nothing is written anywhere
    monkeypatch.delenv(gpu_activity.ENV)
    monkeypatch.setenv("SLURM_JOB_ID", "100")
    assert emu.main([*TINY, "--train-iters", "2"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["99"]
