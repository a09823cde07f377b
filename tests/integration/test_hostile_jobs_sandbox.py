"""Hostile jobs submitted with plain sbatch on the real sandbox: a Comment that forges the GPU
count, the peak and the FLOPs, a log swapped for a FIFO, and a jobstats AdminComment. The
epilog's AdminComment and record take the GPUs from Slurm and the peak from the site file,
flag what cannot be right, never overwrite another tool's AdminComment, and `slurmpod report`
finishes."""

from __future__ import annotations

import base64
import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from slurmpod.model.comment import decode_field, validate_admin_comment
from tests.helpers import wait_for

# Each iteration line claims 100 ms and the job sleeps 200 ms before it, so the log's claimed
# training time (1.6 s) stays below any allocation Slurm can record for the job (its whole
# seconds: >= 3 s): only the value a test forges is implausible, never the goodput.
ITER_MS = 100.0
ITERS = 16


def site_peak(sandbox: Any) -> float:
    """The peak the epilog reads: the sandbox's measured site file (`hook epilog --site`)."""
    from slurmpod.config import load_site

    (nt,) = load_site(sandbox.sb.layout.site_file).node_types.values()
    return float(nt.gpu.peak_tflops_bf16)


def log_script(tail: str = "") -> str:
    """A job that prints Megatron iteration lines of ITER_MS each, then runs `tail`."""
    line = (" iteration %8d/%8d | consumed samples: %12d | elapsed time per iteration (ms): "
            f"{ITER_MS:.1f} | learning rate: 1.0E-05 | global batch size:     8 | lm loss: "
            "2.0E+00 | loss scale: 1.0 | number of skipped iterations:   0 | number of nan "
            "iterations:   0 |\\n")
    return (f"for i in $(seq 1 {ITERS}); do sleep {2 * ITER_MS / 1000:g}; "
            f"printf '{line}' $i {ITERS} $((i*8)); done; "
            f"{tail}")


def admin_doc(sandbox: Any, job_id: str) -> dict[str, Any] | None:
    job = sandbox.sacct_job(job_id) or {}
    return decode_field((job.get("comment") or {}).get("administrator"))


def record(sandbox: Any, job_id: str) -> dict[str, Any] | None:
    path = sandbox.sb.spool_dir / "records" / f"{job_id}.0.json"
    return json.loads(path.read_text()) if path.exists() else None


def forged(flops_per_iter: float) -> str:
    return json.dumps({"slurmpod": "0.1.0", "fmt": 1, "run": "evil", "v": 1, "mfu": 0.99,
                       "flops_per_iter": flops_per_iter, "gpus": 4096, "peak_tflops": 1e-6,
                       "peak": 1e-6, "formula": "mine"})


def honest_flops(sandbox: Any, mfu: float) -> float:
    """FLOPs per iteration that make `mfu` on 8 GPUs at ITER_MS per iteration with the site
    peak."""
    return mfu * site_peak(sandbox) * 1e12 * 8 * ITER_MS / 1000.0


def test_forged_gpus_and_peak_are_ignored(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "hostile-gpus"
    d.mkdir(exist_ok=True)
    comment = forged(honest_flops(sandbox, 0.5))
    job_id = sandbox.sbatch("-N1", "--exclusive", "--gpus-per-node=8", f"--output={d}/%j.out",
                            f"--comment={comment}", "--wrap", log_script())
    sandbox.wait_job(job_id, timeout_s=120)
    final = wait_for(lambda: admin_doc(sandbox, job_id), 60, "AdminComment in sacct")
    assert validate_admin_comment(final) == [], final
    # Slurm allocated 8 GPUs and the site's GPU has its measured peak: not 4096 and not 1e-6
    assert final["gpus"] == 8 and final["gsrc"] == "slurm"
    assert final["peak"] == pytest.approx(site_peak(sandbox), rel=1e-3)
    assert final["mfu"] == pytest.approx(0.5, rel=1e-3) and "implausible" not in final
    assert final["attempt"] == 0


def test_forged_flops_are_flagged_and_left_out_of_the_fleet(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "hostile-flops"
    d.mkdir(exist_ok=True)
    job_id = sandbox.sbatch("-N1", "--exclusive", "--gpus-per-node=8",
                            f"--output={d}/%j.out",
                            f"--comment={forged(honest_flops(sandbox, 250.0))}",
                            "--wrap", log_script())
    sandbox.wait_job(job_id, timeout_s=120)
    final = wait_for(lambda: admin_doc(sandbox, job_id), 60, "AdminComment in sacct")
    assert final["mfu"] == pytest.approx(250.0, rel=1e-3)
    assert final["implausible"] == "mfu-over-100"
    cp = subprocess.run([sys.executable, "-m", "slurmpod", "report", job_id, "--json",
                         "--spool", str(sandbox.sb.spool_dir)], env=sandbox.env,
                        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["figures"]["implausible"] == ["mfu-over-100"]


def test_fifo_log_is_refused_and_report_finishes(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "hostile-fifo"
    d.mkdir(exist_ok=True)
    comment = json.dumps({"slurmpod": "0.1.0", "fmt": 1, "flops_per_iter": 1e9})
    job_id = sandbox.sbatch(
        "-N1", "--exclusive", f"--output={d}/fifo-%j.out", f"--comment={comment}", "--wrap",
        log_script(f"rm -f {d}/fifo-$SLURM_JOB_ID.out; mkfifo {d}/fifo-$SLURM_JOB_ID.out"))
    sandbox.wait_job(job_id, timeout_s=120)
    final = wait_for(lambda: admin_doc(sandbox, job_id), 60, "AdminComment in sacct")
    assert final["err"] == "fifo" and "iters" not in final
    rec = record(sandbox, job_id)
    assert rec is not None and rec["log"]["refused"] == "fifo"
    # The report opens nothing that can block: it finishes (the timeout would fail the test).
    cp = subprocess.run([sys.executable, "-m", "slurmpod", "report", job_id,
                         "--spool", str(sandbox.sb.spool_dir)], env=sandbox.env,
                        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stderr
    assert Path(f"{d}/fifo-{job_id}.out").is_fifo()


def stored_admin(sandbox: Any, job_id: str) -> str:
    """The AdminComment in slurmdbd, lower-cased: sacctmgr before Slurm 23.02 lower-cases what
    it stores (so jobstats needs 23.02 or later to read its own back; slurmpod just must not
    overwrite it)."""
    job = sandbox.sacct_job(job_id) or {}
    return str((job.get("comment") or {}).get("administrator") or "").lower()


def test_jobstats_admin_comment_is_left_alone(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "hostile-jobstats"
    d.mkdir(exist_ok=True)
    theirs = "JS1:" + base64.b64encode(gzip.compress(json.dumps(
        {"gpus": 8, "nodes": {"n": {"gpu_utilization": {"0": 97.0}}}}).encode())).decode()
    comment = json.dumps({"slurmpod": "0.1.0", "fmt": 1,
                          "flops_per_iter": honest_flops(sandbox, 0.25)})
    marker = d / "go"
    job_id = sandbox.sbatch("-N1", "--exclusive", "--gpus-per-node=8", f"--output={d}/%j.out",
                            f"--comment={comment}", "--wrap",
                            log_script(f"while [ ! -e {marker} ]; do sleep 0.2; done"))
    sandbox.wait_running(job_id)
    # jobstats' store step writes slurmdbd's row with sacctmgr, as slurmpod does; a site runs
    # it before slurmpod's epilog. Here it lands while the job still runs.
    def stored() -> bool:
        sandbox.run(["sacctmgr", "-i", "modify", "job", "where", f"JobID={job_id}", "set",
                     f"AdminComment={theirs}"], check=False)
        return stored_admin(sandbox, job_id) == theirs.lower()

    wait_for(stored, 60, "the jobstats AdminComment in slurmdbd")
    marker.touch()
    sandbox.wait_job(job_id, timeout_s=120)
    rec = wait_for(lambda: record(sandbox, job_id), 60, "the epilog's spool record")
    assert rec["summary"]["mfu"] == pytest.approx(0.25, rel=1e-3)
    assert stored_admin(sandbox, job_id) == theirs.lower()
    hook_log = (sandbox.sb.spool_dir / "hook.log").read_text()
    assert f"job {job_id}: AdminComment holds jobstats's summary" in hook_log


def test_forged_memory_reports_measure_nothing(sandbox: Any) -> None:
    """A job prints Megatron memory reports no GPU of its nodes can have: rank 0 claims 95 TB
    (not read by the parser), rank 1 90,000 MiB of the emulated GPU's 80 GiB (kept in the
    record, the rank that held the most, but neither the job report nor the site's measured
    reserve takes it)."""
    d = sandbox.tmp_dir / "hostile-memory"
    d.mkdir(exist_ok=True)
    report = ("[Rank %d] (after 10 iterations) memory (MB) | allocated: 10.0 | max allocated: "
              "20.0 | reserved: 30.0 | max reserved: %s\\n")
    tail = (f"printf '{report}' 0 99999999999.0; printf '{report}' 1 90000.0; "
            f"printf '{report}' 2 40.0")
    job_id = sandbox.sbatch("-N1", "--exclusive", "--gpus-per-node=8", f"--output={d}/%j.out",
                            "--wrap", log_script(tail))
    sandbox.wait_job(job_id, timeout_s=120)
    rec = wait_for(lambda: record(sandbox, job_id), 60, "the epilog's record")
    mem = rec["summary"]["metrics"]["memory"]
    assert mem["ranks"] == 2 and mem["rank"] == 1 and mem["max_reserved_mib"] == 90000.0, mem
    env = sandbox.env
    cp = subprocess.run([sys.executable, "-m", "slurmpod", "report", job_id, "--json",
                         "--spool", str(sandbox.sb.spool_dir)], env=env, capture_output=True,
                        text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stderr
    assert json.loads(cp.stdout)["memory"] is None
    cp = subprocess.run([sys.executable, "-m", "slurmpod", "calibrate", "--since", "1h",
                         "--site", str(sandbox.sb.site_path), "--spool",
                         str(sandbox.sb.spool_dir), "--dry-run", "--json"], env=env,
                        capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    if cp.returncode == 0:  # other jobs of the sandbox gave points: not this one
        memory = json.loads(cp.stdout)["memory"]
        assert job_id not in {j["job_id"] for j in memory["jobs"]}
        assert memory["skipped"].get("bad-memory-report", 0) >= 1, memory
    else:  # nothing to fit on: the one-line error counts the forged report
        assert cp.returncode == 2 and "(bad-memory-report)" in cp.stderr, cp.stderr
