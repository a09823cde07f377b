"""The trust boundary of the accounting hooks: Slurm and the site decide the scale of every
figure, the job only what it measured, and whatever cannot be right is flagged."""

from __future__ import annotations

import base64
import gzip
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmpod.accounting import plausible
from slurmpod.accounting.epilog import run_epilog
from slurmpod.accounting.trusted import (
    allocated_gpus,
    gpus_in_tres,
    parse_scontrol_job,
    site_gpu,
)
from slurmpod.config import load_site, resolve_site_path
from slurmpod.model.comment import build_admin_comment, decode_field, validate_admin_comment
from tests.unit.accounting.test_hook_epilog import Slurm, job_env, scontrol_line, write_log

# -- scontrol show job: job-controlled text cannot plant keys ---------------------------------


def test_scontrol_fields_are_slurms() -> None:
    got = parse_scontrol_job(scontrol_line("42", "train", gpus=16, restarts=2), "42", "train")
    assert got is not None
    assert (got.restarts, got.start_time, got.end_time) == (2, 1699999900, 1700000000)
    assert got.gpus == 16 and got.nodelist == "gpu[001-002]" and got.n_nodes == 2


@pytest.mark.parametrize("name", [
    "x Restarts=9 TRES=gres/gpu=4096 StartTime=1 EndTime=2 NodeList=evil[1-9]",
    "train JobId=7 JobName=y Restarts=5",
    "a\nJobId=42 JobName=a Restarts=7 TRES=gres/gpu=9999",
])
def test_job_name_cannot_plant_keys(name: str) -> None:
    line = scontrol_line("42", name, gpus=16, restarts=1)
    got = parse_scontrol_job(line, "42", name)
    assert got is not None and got.restarts == 1 and got.gpus == 16
    assert got.nodelist == "gpu[001-002]"


def test_comment_cannot_plant_keys() -> None:
    line = scontrol_line(comment='{"v":1} Restarts=9 TRES=gres/gpu=4096 NodeList=x', gpus=8)
    got = parse_scontrol_job(line, "42", "train")
    assert got is not None and got.restarts == 0 and got.gpus == 8


def test_output_of_another_job_or_name_is_not_used() -> None:
    assert parse_scontrol_job(scontrol_line("43"), "42", "train") is None
    assert parse_scontrol_job(scontrol_line("42", "other"), "42", "train") is None
    assert parse_scontrol_job("slurm_load_jobs error: Invalid job id\n", "42", "train") is None


def test_array_task_and_slurm_24_11_alloc_tres() -> None:
    line = scontrol_line("125", "arr").replace("JobId=125 ", "JobId=125 ArrayJobId=120 "
                                                "ArrayTaskId=5 ")
    line = line.replace("TRES=cpu", "ReqTRES=cpu=1 AllocTRES=cpu")
    got = parse_scontrol_job(line, "125", "arr")
    assert got is not None and got.gpus == 16


def test_gpu_counts() -> None:
    assert gpus_in_tres("cpu=64,mem=500G,node=2,billing=64,gres/gpu=16") == 16
    assert gpus_in_tres("cpu=64,gres/gpu:h100=8,gres/gpu:a100=4") == 12
    assert gpus_in_tres("cpu=64,mem=1G,node=1") is None
    site = load_site(resolve_site_path("sandbox"))
    inv = site.inventory
    nodes = ",".join(n.name for n in inv.nodes[:2])
    gpu = site_gpu(nodes, site, inv)
    assert gpu is not None and gpu.gpus_per_node == 8
    assert site_gpu("nosuchnode[1-2]", site, inv) is None
    job = {"n_nodes": 2, "gpus": ""}
    assert allocated_gpus(None, job, gpu) == (16, "site")
    assert allocated_gpus(None, {"n_nodes": 2, "gpus": "0,1,2,3"}, gpu) == (8, "slurm")
    assert allocated_gpus(None, job, None) == (None, None)


# -- plausibility -----------------------------------------------------------------------------


def test_plausibility_reasons() -> None:
    assert plausible.reasons({"mfu": 0.45, "goodput": 0.9, "ttfi_s": 30}) == ()
    assert plausible.reasons({"mfu": 1.0004}) == ()  # rounding of 4 significant digits
    assert plausible.reasons({"mfu": 1.77, "mfu_p90": 1.9}) == ("mfu-over-100",)
    assert plausible.reasons({"mfu": -0.1}) == ("mfu-negative",)
    assert plausible.reasons({"goodput": 3.0, "ttfi_s": -564}) == ("goodput-over-100",
                                                                   "ttfi-s-negative")
    assert plausible.reasons({"tflops": math.inf, "iter_ms": math.nan}) == (
        "iter-ms-not-finite", "tflops-not-finite")
    assert plausible.reasons({"mfu": "lots"}) == ("mfu-not-finite",)
    codes = plausible.reasons({"mfu": 2.0, "goodput": 1.5})
    assert plausible.split(plausible.joined(codes)) == codes


@settings(max_examples=200)
@given(st.dictionaries(st.sampled_from(["mfu", "goodput", "ttfi_s", "tflops", "iter_ms"]),
                       st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                                 st.integers(), st.text(max_size=5), st.none(), st.booleans())))
def test_flags_always_fit_admin_comment(figures: dict[str, object]) -> None:
    summary = {k: v for k, v in figures.items()}
    summary["implausible"] = plausible.joined(plausible.reasons(figures))
    doc = decode_field(build_admin_comment(summary))
    assert doc is not None and validate_admin_comment(doc) == []
    assert plausible.split(doc.get("implausible")) == plausible.reasons(figures)


# -- the epilog ------------------------------------------------------------------------------


def forged_env(tmp_path: Path) -> dict[str, str]:
    env = job_env(tmp_path)
    env["SLURM_JOB_COMMENT"] = json.dumps({"slurmpod": "0.1.0", "fmt": 1, "run": "t",
                                           "flops_per_iter": 8e15, "peak_tflops": 0.001,
                                           "gpus": 4096, "v": 1, "mfu": 99.0})
    return env


def test_epilog_uses_slurms_gpus_and_the_sites_peak_not_the_comments(tmp_path: Path) -> None:
    write_log(tmp_path)
    slurm = Slurm()
    run_epilog(forged_env(tmp_path), tmp_path / "spool", deliver=slurm, peak_tflops=1000.0,
               show_job=lambda jid: scontrol_line(jid, gpus=16, restarts=3))
    admin = decode_field(slurm.admin["42"])
    assert admin is not None and validate_admin_comment(admin) == []
    assert admin["gpus"] == 16 and admin["peak"] == 1000.0 and admin["mfu"] == 0.25
    assert admin["attempt"] == 3 and "implausible" not in admin
    # the attempt number is Slurm's restart count, so attempts keep separate records
    assert (tmp_path / "spool" / "records" / "42.3.json").exists()


def test_epilog_flags_forged_flops(tmp_path: Path) -> None:
    write_log(tmp_path)
    env = forged_env(tmp_path)
    env["SLURM_JOB_COMMENT"] = json.dumps({"slurmpod": "0.1.0", "flops_per_iter": 8e18})
    slurm = Slurm()
    run_epilog(env, tmp_path / "spool", deliver=slurm, peak_tflops=1000.0,
               show_job=lambda jid: scontrol_line(jid, gpus=16))
    admin = decode_field(slurm.admin["42"])
    assert admin is not None and admin["implausible"] == "mfu-over-100"


def jobstats(summary: dict[str, object]) -> str:
    """Princeton jobstats' AdminComment: `JS1:` + base64 of gzipped JSON."""
    raw = gzip.compress(json.dumps(summary).encode())
    return "JS1:" + base64.b64encode(raw).decode()


def test_jobstats_admin_comment_is_never_overwritten(tmp_path: Path) -> None:
    write_log(tmp_path)
    slurm = Slurm()
    theirs = jobstats({"gpus": 16, "nodes": {"gpu001": {"gpu_utilization": {"0": 97}}}})
    run_epilog(job_env(tmp_path), tmp_path / "spool", deliver=slurm, peak_tflops=1000.0,
               show_job=lambda jid: scontrol_line(jid), admin_now=lambda jid: theirs)
    assert slurm.admin == {}  # left alone...
    rec = json.loads((tmp_path / "spool" / "records" / "42.0.json").read_text())
    assert rec["summary"]["mfu"] == 0.25  # ...and slurmpod's figures are in the spool
    assert "jobstats" in (tmp_path / "spool" / "hook.log").read_text()
    # slurmpod's own earlier AdminComment (a requeued job's first attempt) is replaced
    run_epilog(job_env(tmp_path), tmp_path / "spool", deliver=slurm, peak_tflops=1000.0,
               admin_now=lambda jid: '{`v`:1,`mfu`:0.1}')
    assert "42" in slurm.admin
    slurm.admin.clear()
    run_epilog(job_env(tmp_path), tmp_path / "spool", deliver=slurm, peak_tflops=1000.0,
               admin_now=lambda jid: theirs, admin_comment="always")
    assert "42" in slurm.admin
    slurm.admin.clear()
    run_epilog(job_env(tmp_path), tmp_path / "spool", deliver=slurm, peak_tflops=1000.0,
               admin_now=lambda jid: "", admin_comment="never")
    assert slurm.admin == {}


def test_untracked_job_is_decided_from_the_log_head_only(tmp_path: Path) -> None:
    """A job that is not slurmpod's and whose log's first MiB has no Megatron output is left
    alone without asking Slurm anything, whatever the log's size."""
    env = job_env(tmp_path)
    env["SLURM_JOB_COMMENT"] = ""
    log = tmp_path / "work" / "logs" / "train-42.out"
    log.parent.mkdir(parents=True)
    with log.open("wb") as f:
        f.write(b"x" * (2 << 20) + b"\n")
        f.write(b" iteration 1/ 10 | elapsed time per iteration (ms): 1.0 |\n")
    asked: list[str] = []

    def show_job(jid: str) -> str:
        asked.append(jid)
        return scontrol_line(jid)

    slurm = Slurm()
    run_epilog(env, tmp_path / "spool", deliver=slurm, show_job=show_job)
    assert slurm.admin == {} and asked == []
    assert not list((tmp_path / "spool" / "records").iterdir())


def test_requeued_jobs_hook_times_are_not_judged() -> None:
    """A requeued job's appended log starts before its last attempt: the hook's time to first
    iteration and goodput are artefacts the report does not show as they are."""
    from slurmpod.report.model import Dist, Figures, implausible_reasons

    fig = Figures("spool", iters=10, mfu=Dist(0.4), ttfi_s=-120.0, hook_goodput=1.6,
                  flagged=("ttfi-s-negative", "goodput-over-100"))
    assert implausible_reasons(fig, restarted=True) == ()
    assert implausible_reasons(fig, restarted=False) == ("ttfi-s-negative", "goodput-over-100")
    forged = Figures("spool", iters=10, mfu=Dist(2.5), ttfi_s=-120.0)
    assert implausible_reasons(forged, restarted=True) == ("mfu-over-100",)


def test_requeued_attempt_has_no_time_to_first_iteration() -> None:
    from slurmpod.accounting.figures import summarise_log
    from tests.unit.accounting.test_hook_figures import SLURM16, comment, iteration_line

    log = "".join(iteration_line(i + 1, 100, 1000.0) for i in range(20)).encode()
    job = {"comment": comment(), **SLURM16, "start_time": 1000, "end_time": 1040}
    assert summarise_log(log, {**job, "restart": 1})[0]["ttfi_s"] is None


def test_epilog_goodput_needs_slurms_allocation() -> None:
    """Without Slurm's start and end the log's own span is no allocation: no goodput (the
    log's clock could make it anything)."""
    from slurmpod.accounting.figures import summarise_log
    from tests.unit.accounting.test_hook_figures import SLURM16, comment, iteration_line

    log = "".join(iteration_line(i + 1, 100, 1000.0, ts="2026-01-02 03:04:05")
                  for i in range(20)).encode()
    assert summarise_log(log, {"comment": comment(), **SLURM16})[0]["goodput"] is None
    timed = {"comment": comment(), **SLURM16, "start_time": 1000, "end_time": 1040}
    assert summarise_log(log, timed)[0]["goodput"] == pytest.approx(0.5)
