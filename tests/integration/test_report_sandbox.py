"""`slurmpod report` on the real sandbox Slurm: four sandbox-workload jobs (completed on a wider
placement than needed, failed, requeued after a crash, no training log) go through the real
EpilogSlurmctld hook and slurmdbd; per-job and fleet reports must agree with the jobs' own logs,
spool records and `sacct --json -D`, the HTML must render with its plots in headless Chromium,
and the Prometheus textfiles must pass `promtool check metrics`."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from slurmpod.model.comment import decode_field
from slurmpod.model.hostlist import expand
from slurmpod.sandbox.workload import megatron_emu
from tests.helpers import EMU, LOADED, TINY, segments, wait_for

SLOWER = ["--hidden-size", "256", "--seq-length", "128"]
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def need_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if CI:
            pytest.fail(f"CI must run this check: `{name}` is not installed (bash .ci/install)",
                        pytrace=False)
        pytest.skip(f"{name} not installed")
    return path


def model_flops(*extra: str) -> float:
    """Model FLOPs of one iteration of the workload with TINY (+ extra) arguments, as
    `slurmpod submit` would put in the comment."""
    parsed = megatron_emu.build_parser().parse_known_args([*TINY, "--train-iters", "1", *extra])
    args = megatron_emu.finish_args(parsed[0], megatron_emu.Dist(0, 1, 0, "", "0"))
    return megatron_emu.model_flops_per_iteration(args)


FLOPS = model_flops()


def site_peak(sandbox: Any) -> float:
    """The sandbox site's emulated GPU peak (measured at `up`): what the workload is paced to,
    and what `slurmpod submit` would put in the comment, so MFU stays within 0-100 %."""
    peak = megatron_emu.emulated_peak(None, sandbox.env).tflops
    assert peak is not None, sandbox.env.get("SLURMPOD_SITE")
    return peak


def comment(gpus: int, peak: float, flops: float = FLOPS) -> str:
    return json.dumps({"slurmpod": "it", "fmt": 1, "run": "report-it", "flops_per_iter": flops,
                       "gpus": gpus, "peak_tflops": peak})


def mfu_of(ms: float, gpus: int, peak: float) -> float:
    return FLOPS / (ms / 1000) / gpus / 1e12 / peak


@dataclass
class Jobs:
    done: str
    failed: str
    requeued: str
    nolog: str
    logs: dict[str, Path]
    work: Path
    peak: float


def _emu(d: Path, name: str, iters: int, extra: str = "") -> str:
    ck = d / f"ck-{name}"
    return (f"env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 {' '.join(EMU)} {' '.join(TINY)} "
            f"--train-iters {iters} --save {ck} --load {ck} --save-interval 10 {extra}")


@pytest.fixture(scope="module")
def jobs(sandbox: Any) -> Jobs:
    d = sandbox.tmp_dir / "report"
    d.mkdir(exist_ok=True)
    logs: dict[str, Path] = {}
    peak = site_peak(sandbox)

    def submit(name: str, gpus_nodes: int, script: str, *extra: str,
               flops: float = FLOPS) -> str:
        out = d / f"{name}-%j.out"
        jid = sandbox.sbatch(f"-N{gpus_nodes}", "--exclusive", "--gpus-per-node=8",
                             f"--job-name=rep-{name}", f"--output={out}",
                             f"--comment={comment(8 * gpus_nodes, peak, flops)}", *extra,
                             "--wrap", script)
        logs[jid] = d / f"{name}-{jid}.out"
        return jid

    # Two nodes in two SUs (gpu004 is the last of su1, gpu005 the first of su2): wider than
    # needed on purpose.
    done = submit("done", 2, _emu(d, "done", 25), "--nodelist=gpu[004-005]")
    failed = submit("failed", 1, _emu(d, "failed", 15) + "; exit 3")
    # Attempt 0 crashes (SIGKILL, as a NCCL timeout would) after iteration 17, between
    # checkpoints 10 and 20, and requeues itself; attempt 1 resumes from 10 and finishes.
    # The kill reacts to the log line itself (a pipe, not polling the file): the tiny model's
    # iterations take milliseconds, and a late kill would let checkpoint 20 be saved. A wider
    # model than TINY's (same for both attempts) gives the kill three slower iterations of slack.
    slower = " ".join(SLOWER)
    pid_file = d / "requeued-emu.pid"
    script = (
        'if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then '
        f"( {_emu(d, 'req', 30, slower)} & echo $! > {pid_file}; wait ) | "
        "while IFS= read -r line; do printf '%s\\n' \"$line\"; "
        f"case \"$line\" in *' iteration '*' 17/'*) kill -9 \"$(cat {pid_file})\";; esac; done; "
        "scontrol requeue $SLURM_JOB_ID; sleep 60; "
        f"else {_emu(d, 'req', 30, slower)}; fi")
    requeued = submit("requeued", 1, script, "--requeue", "--open-mode=append", "--time=5",
                      flops=model_flops(*SLOWER))
    nolog = submit("nolog", 1, "echo no training here")
    ids = [done, failed, requeued, nolog]
    try:
        # Slurm holds a requeued batch job for about 2 minutes (BeginTime); release it sooner.
        wait_for(lambda: release_requeued(sandbox, requeued), 120, "the requeued job to pend")
        for jid in ids:
            wait_for(lambda jid=jid: finished(sandbox, jid), 240, f"job {jid} in accounting")
        spool = sandbox.sb.spool_dir / "records"
        # Attempt 0's epilog already runs with restart count 1: wait for the final record,
        # the one that saw the relaunch in the appended log.
        wait_for(lambda: final_record(spool / f"{requeued}.1.json"), 90, "the final record")
        for jid in ids:
            wait_for(lambda jid=jid: epilog_wrote(sandbox, jid), 90, f"job {jid}'s AdminComment")
    except BaseException:
        sandbox.cancel(*ids)
        raise
    return Jobs(done, failed, requeued, nolog, logs, d, peak)


def epilog_wrote(sandbox: Any, job_id: str) -> bool:
    """The epilog's AdminComment (slurmpod's `v` key) is in accounting."""
    admin = ((sandbox.sacct_job(job_id) or {}).get("comment") or {}).get("administrator")
    return bool((decode_field(admin) or {}).get("v"))


def wait_finished(sandbox: Any, job_id: str, timeout_s: float = 300) -> None:
    """Until the job is complete in accounting and the epilog has written its AdminComment;
    the job is cancelled if the wait fails."""
    try:
        wait_for(lambda: finished(sandbox, job_id), timeout_s, f"job {job_id} in accounting")
        wait_for(lambda: epilog_wrote(sandbox, job_id), 90, f"job {job_id}'s AdminComment")
    except BaseException:
        sandbox.cancel(job_id)
        raise


def final_record(path: Path) -> bool:
    try:
        return json.loads(path.read_text())["summary"].get("restarts", 0) >= 1
    except (OSError, ValueError, KeyError):
        return False


def finished(sandbox: Any, job_id: str) -> bool:
    """The job's latest attempt is complete in accounting. (sacct --json on 22.05 lists a
    requeued job's earlier attempts too, so the text output, which shows the latest, is read.)"""
    cp = sandbox.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,Partition"],
                     check=False)
    last = cp.stdout.strip().splitlines()[-1:] or [""]
    state, _, partition = last[0].partition("|")
    return state.split()[0:1] in (["COMPLETED"], ["FAILED"]) and bool(partition)


def release_requeued(sandbox: Any, job_id: str) -> bool:
    cp = sandbox.run(["squeue", "-h", "-j", job_id, "-o", "%T %r"], check=False)
    if cp.stdout.split() != ["PENDING", "BeginTime"]:
        return sandbox.squeue_state(job_id) in ("", "COMPLETED")  # already went through
    sandbox.release_requeued(job_id)
    return True


def slurmpod(sandbox: Any, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = dict(sandbox.env)
    env["SLURMPOD_SPOOL"] = str(sandbox.sb.spool_dir)
    cp = subprocess.run([sys.executable, "-m", "slurmpod", "report", *args], env=env,
                        capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    if check:
        assert cp.returncode == 0, cp.stderr
    return cp


def report_json(sandbox: Any, job_id: str) -> dict[str, Any]:
    return json.loads(slurmpod(sandbox, job_id, "--json", "--series").stdout)


def attempts_elapsed(sandbox: Any, job_id: str) -> list[int]:
    """Every attempt's elapsed seconds, read straight from `sacct --json -D`."""
    cp = sandbox.run(["sacct", "--json", "-D", "-j", job_id])
    return [int(j["time"]["elapsed"]) for j in json.loads(cp.stdout)["jobs"]
            if str(j["job_id"]) == job_id]


def spool_record(sandbox: Any, job_id: str) -> dict[str, Any]:
    recs = sorted((sandbox.sb.spool_dir / "records").glob(f"{job_id}.*.json"))
    return json.loads(recs[-1].read_text())


def test_completed_job_report_matches_log_and_accounting(sandbox: Any, jobs: Jobs) -> None:
    r = report_json(sandbox, jobs.done)
    j = r["job"]
    assert r["status"] == "complete" and j["state"] == "COMPLETED" and j["exit_code"] == 0
    assert j["n_gpus"] == 16 and j["n_nodes"] == 2 and j["restarts"] == 0
    assert expand(j["nodes"]) == ["gpu004", "gpu005"]
    # Placement against the sandbox inventory: gpu004 in su1, gpu005 in su2; 2 nodes fit one SU.
    inv = sandbox.inventory.by_name
    want_sus = sorted({sandbox.inventory.su_names[inv[n].su] for n in ("gpu004", "gpu005")})
    p = r["placement"]
    assert sorted(p["sus"]) == want_sus == ["su1", "su2"] and p["min_sus"] == 1
    assert "SUs" in p["wider_than_needed"]
    assert any(n["code"] == "placement-wide-sus" for n in r["notes"])
    # MFU from the log itself: the steady state leaves out iterations 1-10.
    (seg,) = segments(jobs.logs[jobs.done].read_text())
    assert [i for i, _ in seg] == list(range(1, 26))
    steady = [mfu_of(ms, 16, jobs.peak) for i, ms in seg if i > 10]
    f = r["figures"]
    # Real FLOPs against the site's measured peak, the workload paced to it: one process doing
    # the work of 16 GPUs is at most 1/16 of the peak per GPU.
    assert all(0 < mfu_of(ms, 16, jobs.peak) <= 1 / 16 for _, ms in seg)
    assert 0 < f["mfu"]["median"] <= 1
    assert f["source"] == "spool" and f["iterations"] == 25
    assert f["mfu"]["median"] == pytest.approx(float(np.median(steady)), rel=2e-3)
    assert f["mfu"]["p10"] == pytest.approx(float(np.percentile(steady, 10)), rel=2e-3)
    assert f["mfu"]["p90"] == pytest.approx(float(np.percentile(steady, 90)), rel=2e-3)
    assert f["tflops_per_gpu"]["median"] == pytest.approx(
        float(np.median([FLOPS / (ms / 1000) / 16 / 1e12 for i, ms in seg if i > 10])),
        rel=2e-3)
    # GPU time: allocated from sacct, productive = the iteration times the log printed, capped
    # at the allocation (Slurm's elapsed is whole seconds, truncated: a 3.4 s job shows 3).
    alloc_s = sum(attempts_elapsed(sandbox, jobs.done))
    prod_s = min(sum(ms for _, ms in seg) / 1000, alloc_s)
    g = r["gpu_time"]
    assert g["allocated_gpu_hours"] == pytest.approx(alloc_s * 16 / 3600)
    assert g["productive_gpu_hours"] == pytest.approx(prod_s * 16 / 3600, rel=1e-3)
    assert g["goodput"] == pytest.approx(prod_s / alloc_s, rel=1e-3)
    lost = g["lost_gpu_hours_by_cause"]
    assert sum(lost.values()) == pytest.approx((alloc_s - prod_s) * 16 / 3600, rel=1e-6)
    assert lost["restarts"] == 0
    # Start-up and checkpoint stalls come from the record, capped (in that order) by what is
    # left of the allocation (Slurm's elapsed is whole seconds).
    summary = spool_record(sandbox, jobs.done)["summary"]
    ck = summary["metrics"]["checkpoint_stall_s"]
    assert 0 <= lost["checkpoint"] <= ck * 16 / 3600 * (1 + 1e-9) and ck > 0
    assert 0 <= lost["startup"] <= summary["ttfi_s"] * 16 / 3600
    # The AdminComment in sacct agrees with the report too.
    admin = decode_field(sandbox.sacct_job(jobs.done)["comment"]["administrator"])
    assert admin["mfu"] == pytest.approx(f["mfu"]["median"], rel=1e-3)
    assert len(r["series"]["iter"]) == 25
    # The emulator's memory report (rank 0 of 16, its arrays as the GPU's memory) against the
    # emulated GPU's 80 GiB and slurmpod's estimate for the dump's model and layout.
    mem = r["memory"]
    assert mem is not None and mem["rank"] == 0 and mem["hbm_gib"] == 80.0, mem
    assert 0 < mem["max_allocated_gib"] <= mem["max_reserved_gib"] < 1
    assert mem["estimate_gib"] is not None and mem["estimate_gib"] > 0
    text = slurmpod(sandbox, jobs.done).stdout
    assert f"Job {jobs.done}" in text and "spans 2 SUs" in text and "MFU" in text
    assert "  memory       rank 0 peak " in text


def test_failed_job_report(sandbox: Any, jobs: Jobs) -> None:
    r = report_json(sandbox, jobs.failed)
    assert r["job"]["state"] == "FAILED" and r["job"]["exit_code"] == 3
    assert r["status"] == "complete" and r["figures"]["iterations"] == 15
    assert any(n["code"] == "ended-badly" and "exit code 3" in n["text"] for n in r["notes"])
    (seg,) = segments(jobs.logs[jobs.failed].read_text())
    assert r["figures"]["mfu"]["median"] == pytest.approx(
        float(np.median([mfu_of(ms, 8, jobs.peak) for i, ms in seg if i > 10])), rel=2e-3)
    assert 0 < r["figures"]["mfu"]["median"] <= 1 / 8


def test_requeued_job_counts_both_attempts_and_the_redone_work(sandbox: Any,
                                                                jobs: Jobs) -> None:
    r = report_json(sandbox, jobs.requeued)
    j = r["job"]
    assert j["state"] == "COMPLETED" and j["restarts"] == 1 and len(j["attempts"]) == 2
    text = jobs.logs[jobs.requeued].read_text()
    first, second = segments(text)
    resumed = int(LOADED.findall(text)[-1])
    assert first[-1][0] >= 17 and resumed == 10 and second[0][0] == 11 and second[-1][0] == 30
    redone_ms = sum(ms for i, ms in first if i > resumed)
    alloc_s = sum(attempts_elapsed(sandbox, jobs.requeued))
    prod_s = min((sum(ms for _, ms in first) + sum(ms for _, ms in second) - redone_ms) / 1000,
                 alloc_s)  # capped at the allocation, as above
    assert alloc_s == sum(a["elapsed_s"] for a in j["attempts"])
    g = r["gpu_time"]
    assert g["allocated_gpu_hours"] == pytest.approx(alloc_s * 8 / 3600)
    assert g["productive_gpu_hours"] == pytest.approx(prod_s * 8 / 3600, rel=1e-3)
    assert r["figures"]["redone_s"] == pytest.approx(redone_ms / 1000, rel=1e-3)
    lost = g["lost_gpu_hours_by_cause"]
    # Redone work is charged to restarts, but never more than the allocation leaves beside the
    # productive time (sacct's whole seconds can leave less than the redone work itself).
    redone_charged_s = min(redone_ms / 1000, alloc_s - prod_s)
    assert lost["restarts"] >= redone_charged_s * 8 / 3600 * 0.999 and lost["other"] == 0
    assert sum(lost.values()) == pytest.approx((alloc_s - prod_s) * 8 / 3600, rel=1e-6)
    assert any(n["code"] == "restarts" for n in r["notes"])
    seg = r["series"]["segment"]
    assert seg.count(0) == len(first) and seg.count(1) == len(second)


def test_job_without_training_log_is_identity_and_placement_only(sandbox: Any,
                                                                  jobs: Jobs) -> None:
    r = report_json(sandbox, jobs.nolog)
    assert r["status"] == "no-training-log" and "no MFU" in r["status_text"]
    assert r["figures"]["mfu"] is None and r["gpu_time"]["productive_gpu_hours"] is None
    assert r["placement"]["n_sus"] == 1 and r["job"]["n_gpus"] == 8
    text = slurmpod(sandbox, jobs.nolog).stdout
    assert "efficiency from Slurm and the GPUs, no MFU" in text


def test_running_job_gets_a_partial_report(sandbox: Any, jobs: Jobs) -> None:
    jid = sandbox.sbatch("-N1", "--exclusive", "--gpus-per-node=8", "--job-name=rep-running",
                         f"--output={jobs.work}/running-%j.out", "--wrap", "sleep 60")
    try:
        sandbox.wait_running(jid)
        r = wait_for(lambda: (lambda d: d if d["job"]["state"] == "RUNNING" else None)(
            report_json(sandbox, jid)), 30, "the running job in accounting")
        assert r["status"] == "running" and "partial report" in r["status_text"]
        assert r["job"]["end"] is None and r["figures"]["source"] == "none"
        assert r["gpu_time"]["productive_gpu_hours"] is None
        fleet = json.loads(slurmpod(sandbox, "--since", "1d", "--json", "--jobs").stdout)
        assert fleet["running_jobs"] >= 1
        assert jid not in {row["job_id"] for row in fleet["job_rows"]}  # not in the sums
    finally:
        sandbox.cancel(jid)


def test_unknown_job_is_one_line_error(sandbox: Any) -> None:
    cp = slurmpod(sandbox, "999999", check=False)
    assert cp.returncode == 4 and cp.stderr.startswith("slurmpod: error: job 999999 is not")
    assert "Traceback" not in cp.stderr


def test_fleet_report_matches_job_reports(sandbox: Any, jobs: Jobs) -> None:
    fleet = json.loads(slurmpod(sandbox, "--since", "1d", "--json", "--jobs").stdout)
    rows = {row["job_id"]: row for row in fleet["job_rows"]}
    for jid in (jobs.done, jobs.failed, jobs.requeued, jobs.nolog):
        r = report_json(sandbox, jid)
        row = rows[jid]
        assert row["gpu_hours"] == pytest.approx(r["gpu_time"]["allocated_gpu_hours"])
        assert row["mfu"] == (r["figures"]["mfu"] or {}).get("median")
        assert row["goodput"] == pytest.approx(r["gpu_time"]["goodput"])
        assert row["restarts"] == r["job"]["restarts"] and row["state"] == r["job"]["state"]
    # Totals from the rows, computed here independently; implausible rows are listed apart
    # and enter no total.
    all_rows = [x for x in rows.values() if not x["implausible"]]
    assert sorted(j["job_id"] for j in fleet["implausible_jobs"]) == sorted(
        x["job_id"] for x in rows.values() if x["implausible"])
    total = fleet["total"]
    assert total["jobs"] == len(all_rows)
    assert total["gpu_hours"] == pytest.approx(sum(x["gpu_hours"] for x in all_rows))
    with_mfu = [x for x in all_rows if x["mfu"] is not None]
    assert total["mfu_weighted"] == pytest.approx(
        sum(x["mfu"] * x["gpu_hours"] for x in with_mfu) / sum(x["gpu_hours"] for x in with_mfu))
    known = [x for x in all_rows if x["productive_gpu_hours"] is not None]
    assert total["goodput"] == pytest.approx(
        sum(x["productive_gpu_hours"] for x in known) / sum(x["gpu_hours"] for x in known))
    assert total["lost_gpu_hours_by_cause"]["restarts"] == pytest.approx(
        sum(x["lost_restarts_gpu_hours"] or 0 for x in all_rows))
    assert fleet["top_lost"][0]["lost_gpu_hours"] == max(
        x["lost_gpu_hours"] or 0 for x in all_rows)
    assert sum(b["jobs"] for b in fleet["mfu_distribution"]["bins"]) == len(with_mfu)
    # CSV: the same rows.
    table = list(csv.DictReader(io.StringIO(slurmpod(sandbox, "--since", "1d", "--csv").stdout)))
    by_id = {row["job_id"]: row for row in table}
    assert float(by_id[jobs.done]["mfu"]) == pytest.approx(rows[jobs.done]["mfu"])
    assert by_id[jobs.nolog]["mfu"] == ""
    # Filters reach sacct.
    # ("daemon": a real user with no jobs; Slurm 25.11 refuses the name "nobody" outright.)
    none = json.loads(slurmpod(sandbox, "--since", "1d", "--json", "--user", "daemon").stdout)
    assert none["jobs"] == 0


def test_prometheus_textfiles_pass_promtool(sandbox: Any, jobs: Jobs) -> None:
    promtool = need_tool("promtool")
    out = jobs.work / "prom"
    out.mkdir(exist_ok=True)
    slurmpod(sandbox, jobs.requeued, "--prometheus", str(out / "job.prom"))
    slurmpod(sandbox, "--since", "1d", "--prometheus", str(out / "fleet.prom"))
    for name in ("job.prom", "fleet.prom"):
        text = (out / name).read_text()
        cp = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                            text=True, timeout=60)
        assert cp.returncode == 0, f"{name}: {cp.stdout}{cp.stderr}"
    job_text = (out / "job.prom").read_text()
    assert f'slurmpod_job_lost_gpu_seconds{{job_id="{jobs.requeued}"' in job_text
    assert re.search(r'^slurmpod_fleet_allocated_gpu_seconds\{window="1d"\} [0-9.e+]+$',
                     (out / "fleet.prom").read_text(), re.M)


def _screenshot(html: Path) -> np.ndarray:
    chromium = need_tool("chromium")
    from PIL import Image

    with tempfile.TemporaryDirectory(prefix="slurmpod-chromium-") as tmp:
        png = Path(tmp) / "shot.png"
        cp = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={tmp}/profile", f"--screenshot={png}",
             "--window-size=1200,3000", html.resolve().as_uri()],
            capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert png.exists(), f"chromium made no screenshot (rc {cp.returncode}): {cp.stderr[-800:]}"
        # RGB in 0..1, as colour_pixels compares
        return np.asarray(Image.open(png).convert("RGB"), dtype=np.float64) / 255.0


def colour_pixels(img: np.ndarray, hex_colour: str, tol: float = 0.06) -> int:
    rgb = np.array([int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(img - rgb).max(axis=2) < tol).sum())


def test_html_renders_with_plots_in_chromium(sandbox: Any, jobs: Jobs) -> None:
    out = jobs.work / "html"
    out.mkdir(exist_ok=True)
    slurmpod(sandbox, jobs.requeued, "--html", str(out / "job.html"), "--site", "sandbox")
    html = (out / "job.html").read_text()
    assert "http://" not in html and "https://" not in html  # nothing fetched
    for plot in ("plot-mfu", "plot-step", "plot-hist", "plot-attempts", "plot-placement"):
        assert f'<svg id="{plot}"' in html  # inline SVG
    img = _screenshot(out / "job.html")
    assert img.std() > 0.05  # not blank
    assert colour_pixels(img, "#1d3557") > 500  # MFU line and training bar
    assert colour_pixels(img, "#e76f51") > 100  # iteration-time line (no such colour elsewhere)
    assert colour_pixels(img, "#457b9d") > 500  # iteration-time histogram
    assert colour_pixels(img, "#2a9d8f") > 300  # placement map cell (and checkpoints)
    # The same check on a job without training figures finds no run plot and no histogram:
    # the pixel counts above come from the plots, not from the page around them.
    slurmpod(sandbox, jobs.nolog, "--html", str(out / "nolog.html"), "--site", "sandbox")
    bare = _screenshot(out / "nolog.html")
    assert colour_pixels(bare, "#e76f51") == 0 and colour_pixels(bare, "#457b9d") == 0
    assert colour_pixels(bare, "#2a9d8f") > 300  # its placement map is there
    slurmpod(sandbox, "--since", "1d", "--html", str(out / "fleet.html"))
    fimg = _screenshot(out / "fleet.html")
    assert fimg.std() > 0.05 and colour_pixels(fimg, "#457b9d") > 500  # MFU distribution
    assert colour_pixels(fimg, "#e63946") > 100  # restarts in lost GPU-hours over time


BURN = ("import sys, time\n"
        "b = bytearray(int(sys.argv[1]) << 20)\n"
        "for i in range(0, len(b), 4096): b[i] = 1\n"
        "t = time.time()\n"
        "while time.time() - t < float(sys.argv[2]): pass\n")


def test_plain_sbatch_job_gets_a_seff_style_report(sandbox: Any, jobs: Jobs) -> None:
    """A job slurmpod never saw (plain `sbatch --wrap`): CPU efficiency, peak memory against
    ReqMem, time against the limit, as Slurm measured them, and the verdicts with their fix."""
    burn = jobs.work / "burn.py"
    burn.write_text(BURN)
    py = sys.executable
    jid = sandbox.sbatch("-N1", "--gpus-per-node=2", "--mem=4000M", "--time=60",
                         "--job-name=rep-plain", f"--output={jobs.work}/plain-%j.out", "--wrap",
                         f"{py} {burn} 300 3; srun -n1 {py} {burn} 200 2")
    sandbox.wait_job(jid)
    r = report_json(sandbox, jid)
    s = r["efficiency"]["slurm"]
    # Slurm's own figures, read back directly (TotalCPU of the allocation row = its steps')
    raw = sandbox.run(["sacct", "-n", "-P", "-j", jid, "-o",
                       "JobID,TotalCPU,CPUTimeRAW,ElapsedRaw"]).stdout.splitlines()
    row = next(line.split("|") for line in raw if line.startswith(f"{jid}|"))
    mm, ss = row[1].split(":")
    assert s["cpu_s"] == pytest.approx(int(mm) * 60 + float(ss))
    assert s["cpu_alloc_s"] == int(row[2]) == s["alloc_cpus"] * int(row[3])
    assert s["cpu_s"] >= 2.5 and s["cpu_efficiency"] == pytest.approx(s["cpu_s"] / int(row[2]))
    # the batch step touched 300 MiB (the srun step 200 MiB): the peak, against 4000M
    assert 300 << 20 <= s["mem_peak_bytes"] < 400 << 20 and s["req_mem_bytes"] == 4000 << 20
    assert s["time_limit_s"] == 3600 and s["time_fraction"] == pytest.approx(
        s["elapsed_s"] / 3600)
    assert s["steps_measured"] == 2
    notes = {n["code"]: n for n in r["notes"]}
    assert notes["time-over-requested"]["fix"].startswith("request --time=0:15:00")
    text = slurmpod(sandbox, jid).stdout
    assert "Efficiency (Slurm accounting of the latest attempt" in text
    assert "of 3.91 GiB requested" in text and "of the 1:00:00 limit" in text
    assert "fix: request --time=0:15:00" in text
    if r["efficiency"]["gpu"]["source"] is None:  # no telemetry for this job: said so
        assert "GPU util     not measured" in text


def test_watch_shows_progress_of_a_running_job(sandbox: Any, jobs: Jobs) -> None:
    """Without a terminal: one line per refresh, with iterations / train_iters from the log."""
    log = jobs.work / "watch.out"
    jid = sandbox.sbatch("-N1", "--exclusive", "--gpus-per-node=8", "--job-name=rep-watch",
                         f"--output={log}", "--wrap",
                         _emu(jobs.work, "watch", 100000, " ".join(SLOWER)))
    try:
        sandbox.wait_running(jid)
        wait_for(lambda: log.exists() and b" iteration " in log.read_bytes(), 60,
                 "the first iteration line")
        cp = slurmpod(sandbox, jid, "--watch", "--interval", "1", "--count", "2")
        lines = cp.stdout.splitlines()
        assert len(lines) == 2, cp.stdout
        done = []
        for line in lines:
            m = re.search(r"job \d+  RUNNING  progress: \[[#.]{30}\] ([\d,]+) / 100,000 "
                          r"iterations \(\d+\.\d %\) at [\d.e+]+ ms/iter, ETA ", line)
            assert m is not None, line
            done.append(int(m.group(1).replace(",", "")))
        assert 1 <= done[0] <= done[1]
    finally:
        sandbox.cancel(jid)


def test_fleet_report_compares_a_submitted_job_with_its_prediction(sandbox: Any) -> None:
    """A job submitted through `slurmpod submit` carries the plan's prediction in its Comment
    (`pred`), and the fleet report compares the finished job with it (`vs_predicted`). The
    sandbox's emulated GPU is in the catalog, so the model predicts; its step (numpy on shared
    CPUs) has nothing of a real GPU's, so the ratio is checked present and finite, not near 1.
    The job also runs the health gate's all-reduce (`--health-allreduce`) on its two nodes."""
    from tests.integration.test_submit_sandbox import write_run  # its run spec, not its tests

    d = sandbox.tmp_dir / "report-pred"
    d.mkdir(exist_ok=True)
    run = write_run(d / "run.toml", "pred", 2, train_iters=30)
    cp = subprocess.run([sys.executable, "-m", "slurmpod", "submit", str(run), "--topo-dir", "",
                         "--health-allreduce", "--json"], env=sandbox.env, capture_output=True,
                        text=True, timeout=120, cwd=sandbox.tmp_dir, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stderr
    jid = json.loads(cp.stdout)["job_id"]
    wait_finished(sandbox, jid)
    run_dir = d / "pred"
    log = "".join(p.read_text() for p in sorted((run_dir / "logs").glob("*.out")))
    assert "COMPLETED" in json.dumps(sandbox.sacct_job(jid)["state"]), log[-3000:]
    # The gate's all-reduce ran between the two nodes (loopback on emulated GPUs) and passed.
    gate = (run_dir / ".slurmpod" / f"health-{jid}-1.out").read_text()
    assert "all-reduce (loopback) on 2 nodes" in gate, gate
    assert " fail " not in gate, gate
    # The Comment as Slurm stored it still holds the prediction (the monitor merges, keeps it).
    stored = decode_field((sandbox.sacct_job(jid) or {}).get("comment", {}).get("job")) or {}
    assert stored.get("pred", {}).get("layout") == "TP8 PP1 DP2 MBS1 GBS4", stored
    fleet = json.loads(slurmpod(sandbox, "--since", "1d", "--json", "--jobs").stdout)
    row = next(r for r in fleet["job_rows"] if r["job_id"] == jid)
    ratio = row["vs_predicted"]
    assert isinstance(ratio, float) and math.isfinite(ratio) and ratio > 0, row
    assert fleet["vs_predicted"]["jobs"] >= 1
    print(f"job {jid}: achieved / predicted speed {ratio:.3g} "
          f"(predicted {stored['pred']['s']} s per iteration on the emulated GPU)")


def test_calibrate_fits_on_the_finished_jobs_of_accounting(sandbox: Any, jobs: Jobs) -> None:
    """`slurmpod calibrate --since` reads the same accounting, spool and logs as the fleet
    report: the completed emulator job is a point of the fit (the emulated GPU's step has
    nothing of a real GPU's, so its ratio is checked present and finite, not near 1); the job
    that printed no training log is skipped, counted by reason."""
    cp = subprocess.run([sys.executable, "-m", "slurmpod", "calibrate", "--since", "1h",
                         "--site", str(sandbox.sb.site_path), "--spool",
                         str(sandbox.sb.spool_dir), "--dry-run", "--json"], env=sandbox.env,
                        capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    ratios = {j["job_id"]: j["ratio"] for j in doc["jobs"]}
    assert jobs.done in ratios, (doc, cp.stderr)
    assert isinstance(ratios[jobs.done], float) and math.isfinite(ratios[jobs.done])
    assert ratios[jobs.done] > 0
    assert jobs.nolog not in ratios and sum(doc["skipped"].values()) >= 1, doc
    assert doc["stored"] is None and doc["generation"] == "emulated"
    assert cp.stderr.count("\n") <= 1, cp.stderr  # one summary line, never one per job
    # The emulator printed Megatron's memory report; the real epilog kept it in the record, and
    # its PyTorch-cache figure (the emulated allocator's 2 MiB rounding) is a reserve point.
    memory = {j["job_id"]: j for j in doc["memory"]["jobs"]}
    assert jobs.done in memory, doc["memory"]
    assert 0 < memory[jobs.done]["max_allocated_gib"] < 1
    assert 0 <= memory[jobs.done]["cached_gib"] < 0.1, memory
    assert doc["memory"]["cached_gib"] is not None
    print(f"calibrate: {len(ratios)} jobs, skipped {doc['skipped']}, gemm "
          f"{doc['before']['gemm']} -> {doc['after']['gemm']}")
