"""Achieved vs predicted in job reports (slurmpod/report/predicted.py, issue 19 item 6).

The model and layout are the recorded arguments dumps of tests/data/megatron (2024 layout: 8
GPUs; 2026 layout: 64 GPUs, `srun --label` prefixes), the achieved iteration time the steady
median the epilog computes from the same log's iteration lines (`job_metrics`), the GPU the
built-in DGX H100 site's. The expected ratio is computed here independently: the dump straight
into `slurmpod.perf.predict` with the Hopper fit, over the log's own median."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest

from slurmpod.accounting.logparse import parse_log
from slurmpod.accounting.metrics import job_metrics
from slurmpod.cli.report import megatron_args
from slurmpod.config import load_site, resolve_site_path
from slurmpod.megatron.runspec import ModelConfig
from slurmpod.model.jobs import JobState
from slurmpod.model.site import Site
from slurmpod.perf.calibrate import load_published
from slurmpod.perf.fitted import FITTED
from slurmpod.perf.hardware import hardware_from_site
from slurmpod.perf.model import Prediction, predict
from slurmpod.perf.options import RunOptions
from slurmpod.perf.track import architecture, load, track
from slurmpod.report.build import build_job_report
from slurmpod.report.html import job_html
from slurmpod.report.model import LogHints, Stability
from slurmpod.report.predicted import (
    HIGH_VS_PREDICTED,
    LOW_VS_PREDICTED,
    VsPredicted,
    cause_note,
    vs_predicted,
)
from slurmpod.report.sacct import parse_sacct_jobs
from slurmpod.report.text import job_text
from tests.helpers import DATA_DIR

DATA = DATA_DIR


@pytest.fixture(scope="module")
def h100() -> Site:
    return load_site(resolve_site_path("dgx-h100-superpod"))


@pytest.fixture(scope="module")
def base_job() -> object:
    text = (DATA / "report" / "sacct-handmade-22.05.json").read_text()
    return next(sj for sj in parse_sacct_jobs(text) if sj.record.job_id == "101")


def _log(name: str) -> tuple[dict, float]:
    """(the dump, the steady median iteration in seconds) of a recorded log."""
    raw = (DATA / "megatron" / name).read_bytes()
    summary = parse_log(io.BytesIO(raw))
    assert summary.args is not None
    m = job_metrics(summary, None, 989.0, summary.args["world_size"], seq_length=None,
                    flops_formula="none")
    assert m.iter_time_ms is not None
    return summary.args, m.iter_time_ms.median / 1000.0


def _independent(args: dict, site: Site, achieved_s: float) -> tuple[float, Prediction]:
    pred = predict(ModelConfig.from_args(args), args["world_size"], hardware_from_site(site),
                   FITTED["hopper"], RunOptions.from_args(args))
    assert pred is not None
    return pred.step_time_s / achieved_s, pred


def _record(achieved_s: float, p10: float | None = None, p90: float | None = None) -> dict:
    ms = achieved_s * 1000.0
    return {"v": 1, "summary": {"iters": 20, "last_iter": 20, "metrics": {"iter_time_ms": {
        "median": ms, "p10": ms if p10 is None else p10 * 1000, "p90": ms if p90 is None
        else p90 * 1000}}}}


def _job(base: object, nodes: str, n_nodes: int, state: JobState = JobState.COMPLETED) -> object:
    rec = replace(base.record, nodes=nodes, n_nodes=n_nodes, n_gpus=8 * n_nodes, state=state)
    return replace(base, record=rec)


def test_slow_job_is_flagged_with_the_ratio_of_an_independent_prediction(
        h100: Site, base_job: object) -> None:
    args, achieved = _log("megatron-2024-restart.log")
    ratio, pred = _independent(args, h100, achieved)
    assert ratio < LOW_VS_PREDICTED  # 1.5 s per iteration where ~0.38 s is predicted
    r = build_job_report(_job(base_job, "dgx0001", 1), spool_record=_record(achieved),
                         log_hints=LogHints("x.out", args=args), site=h100)
    v = r.predicted
    assert v is not None and v.gpu == "h100" and v.world == 8
    assert v.ratio == pytest.approx(ratio)
    assert v.predicted_step_s == pytest.approx(pred.step_time_s)
    assert v.achieved_mfu == pytest.approx(pred.mfu * ratio)
    note = next(n for n in r.notes if n.code == "below-predicted")
    # The model's step is compute-bound (no PP, one node): the GPUs themselves.
    assert pred.breakdown_s["compute"] > 0.8 * pred.step_time_s
    assert "compute-bound" in note.text and "nvidia-smi" in note.fix
    assert f"{100 * ratio:.0f} % of its predicted speed" in note.text
    j = r.to_json()["predicted"]
    assert j["ratio"] == pytest.approx(ratio) and j["flagged"] is True
    assert j["predicted_step_time_s"] == pytest.approx(pred.step_time_s)
    assert set(j["breakdown_s"]) == set(pred.breakdown_s)
    assert j["track_record"]["architecture"] == architecture(ModelConfig.from_args(args))
    assert j["known_miss"] is None
    assert f"{100 * ratio:.0f} % of predicted MFU" in job_text(r)
    assert "vs predicted" in job_html(r, generated="now")


def test_job_faster_than_predicted_is_not_flagged(h100: Site, base_job: object) -> None:
    args, achieved = _log("megatron-2026-microseconds.log")
    ratio, _ = _independent(args, h100, achieved)
    r = build_job_report(_job(base_job, "dgx[0001-0008]", 8), spool_record=_record(achieved),
                         log_hints=LogHints("x.out", args=args), site=h100)
    assert r.predicted is not None and r.predicted.world == 64
    assert r.predicted.ratio == pytest.approx(ratio) and ratio > 1.0
    assert not r.predicted.flagged
    assert "below-predicted" not in [n.code for n in r.notes]
    assert "TP1 PP1 DP64 MBS2 GBS128" in job_text(r)


def test_job_far_faster_than_predicted_says_calibrate(h100: Site, base_job: object) -> None:
    """Beyond 1 / LOW_VS_PREDICTED the model, not the job, is off: an info note points at the
    site's own calibration; just under it, nothing."""
    args, _ = _log("megatron-2024-restart.log")
    _, pred = _independent(args, h100, 1.0)
    for speedup, noted in ((2.0, True), (0.99 * HIGH_VS_PREDICTED, False)):
        r = build_job_report(_job(base_job, "dgx0001", 1),
                             spool_record=_record(pred.step_time_s / speedup),
                             log_hints=LogHints("x.out", args=args), site=h100)
        assert r.predicted is not None and r.predicted.ratio == pytest.approx(speedup)
        notes = [n for n in r.notes if n.code == "above-predicted"]
        assert bool(notes) is noted and r.to_json()["predicted"]["above"] is noted
        assert not r.predicted.flagged
    assert notes == []
    assert abs(HIGH_VS_PREDICTED * LOW_VS_PREDICTED - 1.0) < 1e-12
    r = build_job_report(_job(base_job, "dgx0001", 1),
                         spool_record=_record(pred.step_time_s / 2.0),
                         log_hints=LogHints("x.out", args=args), site=h100)
    note = next(n for n in r.notes if n.code == "above-predicted")
    assert note.level == "info" and "200 % of its predicted speed" in note.text
    assert "slurmpod calibrate" in note.fix
    assert "beyond the model's error" in job_text(r)


def test_emulated_gpu_far_faster_is_explained_not_sent_to_calibrate() -> None:
    """The sandbox's emulated GPU: its factors are its measured peak, so no fit closes the gap;
    the note says why instead of pointing at `slurmpod calibrate`."""
    from slurmpod.perf.model import BREAKDOWN_KEYS
    from slurmpod.report.predicted import VsPredicted, above_note

    pred = Prediction(0.141, 3643.0, 0.0797, 0.36, dict.fromkeys(BREAKDOWN_KEYS, 0.0),
                      generation="emulated", efficiency_source="measured")
    v = VsPredicted(gpu="emu", world=16, achieved_step_s=0.0823, prediction=pred,
                    layout="TP2 PP2 DP4 MBS2 GBS32")
    assert v.above and not v.flagged
    note = above_note(v)
    assert note.code == "above-predicted" and note.fix == ""
    assert "171 % of its predicted speed" in note.text and "only the model's GEMMs" in note.text


def test_the_switches_the_prediction_counted_are_shown(h100: Site, base_job: object) -> None:
    """The dump's overlap and FP8 settings reach the prediction; the report names them, so a
    job far from its prediction can be checked against what the model assumed."""
    args, achieved = _log("megatron-2026-microseconds.log")
    on = args | {"overlap_grad_reduce": True, "fp8": "hybrid"}
    r = build_job_report(_job(base_job, "dgx[0001-0008]", 8), spool_record=_record(achieved),
                         log_hints=LogHints("x.out", args=on), site=h100)
    assert r.predicted is not None
    assert "fp8" in r.predicted.switches and "overlap_grad_reduce" in r.predicted.switches
    assert r.to_json()["predicted"]["switches"] == list(r.predicted.switches)
    assert ", counting fp8, " in job_text(r)
    plain = build_job_report(_job(base_job, "dgx[0001-0008]", 8), spool_record=_record(achieved),
                             log_hints=LogHints("x.out", args=args | {
                                 "overlap_grad_reduce": False, "fp8": None,
                                 "overlap_param_gather": False, "tp_comm_overlap": False,
                                 "grad_reduce_in_bf16": False}), site=h100)
    assert plain.predicted is not None and plain.predicted.switches == ()
    assert ", counting " not in job_text(plain)


def test_a_dumps_fsdp_sharding_is_named_and_a_forged_one_gives_no_prediction(
        h100: Site, base_job: object) -> None:
    """The dump is the job's text: Megatron-FSDP's strategy is shown only when it is one of
    Megatron's four; anything else leaves the report without a prediction, never its words."""
    args, achieved = _log("megatron-2026-microseconds.log")
    fsdp = args | {"use_megatron_fsdp": "True",
                   "data_parallel_sharding_strategy": "optim_grads_params"}
    r = build_job_report(_job(base_job, "dgx[0001-0008]", 8), spool_record=_record(achieved),
                         log_hints=LogHints("x.out", args=fsdp), site=h100)
    assert r.predicted is not None
    assert "use_megatron_fsdp=optim_grads_params" in r.predicted.switches
    forged = fsdp | {"data_parallel_sharding_strategy": "optim\x1b[31m\nFAKE job 1 OK"}
    r = build_job_report(_job(base_job, "dgx[0001-0008]", 8), spool_record=_record(achieved),
                         log_hints=LogHints("x.out", args=forged), site=h100)
    assert r.predicted is None
    assert "FAKE" not in job_text(r) and "\x1b" not in job_text(r)


def test_the_cli_reads_the_dump_from_the_log_head() -> None:
    head = (DATA / "megatron" / "megatron-2026-microseconds.log").read_bytes()
    args = megatron_args(head)
    assert args is not None and args["world_size"] == 64 and args["num_layers"] == 32
    assert megatron_args(b"no dump here\n") is None


def test_nothing_missing_is_an_error_only_no_prediction(h100: Site, base_job: object) -> None:
    args, achieved = _log("megatron-2024-restart.log")
    sandbox = load_site(resolve_site_path("sandbox"))
    rec = _record(achieved)

    def pred(job: object, a: dict | None, site: Site | None = h100) -> VsPredicted | None:
        hints = LogHints("x.out", args=a)
        return build_job_report(job, spool_record=rec, log_hints=hints, site=site).predicted

    one = _job(base_job, "dgx0001", 1)
    assert pred(one, None) is None  # no dump
    assert pred(one, args, None) is None  # no site
    assert pred(_job(base_job, "gpu001", 1), args, h100) is None  # node not in the site file
    assert pred(_job(base_job, "dgx0001", 1), args, sandbox) is None  # nor in this one
    assert pred(one, args | {"num_layers": 0}) is None  # check_dump_args refuses it
    assert pred(one, args | {"tensor_model_parallel_size": 3}) is None  # does not divide
    assert pred(one, args | {"world_size": 64}) is None  # more GPUs than the job held
    assert pred(one, args | {"hidden_size": "big"}) is None
    assert pred(_job(base_job, "dgx0001", 1, JobState.RUNNING), args) is None
    # Without a site the report is the same as before, notes included.
    r = build_job_report(one, spool_record=rec, log_hints=LogHints("x.out", args=args))
    assert r.predicted is None and r.to_json()["predicted"] is None
    assert "vs predicted" not in job_text(r)
    assert vs_predicted(args, float("nan"), site=h100, nodelist="dgx0001", gpus=8) is None


def _v(breakdown: dict[str, float], achieved: float = 2.0) -> VsPredicted:
    step = sum(v for k, v in breakdown.items() if k != "exposed_communication")
    return VsPredicted("h100", 64, achieved, Prediction(step, 1000.0, 400.0, 0.4, breakdown),
                       "TP2 PP4 DP8 MBS1 GBS512")


ZERO = dict.fromkeys(("compute", "tp", "cp", "pp_bubble", "pp_p2p", "dp", "ep", "optimizer",
                      "exposed_communication"), 0.0)


def test_the_cause_follows_the_breakdown_and_the_stability() -> None:
    comm = _v(ZERO | {"compute": 0.7, "dp": 0.2, "exposed_communication": 0.2,
                      "optimizer": 0.05})
    assert comm.ratio == pytest.approx(0.475) and comm.flagged
    n = cause_note(comm, None)
    assert "exposed communication" in n.text and "DP 0.2 s" in n.text
    assert "--overlap-grad-reduce" in n.fix
    bubble = _v(ZERO | {"compute": 0.7, "pp_bubble": 0.3})
    assert "pipeline bubble" in cause_note(bubble, None).text
    compute = _v(ZERO | {"compute": 0.95, "optimizer": 0.05})
    assert "compute-bound" in cause_note(compute, None).text
    # The FP8 MoE forward's wait on kernel launches, when it is the largest part after compute.
    host = _v(ZERO | {"compute": 0.6, "host": 0.25, "ep": 0.1, "exposed_communication": 0.1})
    n = cause_note(host, None)
    assert "likely the host" in n.text and "0.25 s" in n.text and "--cuda-graph-impl" in n.fix
    more_comm = _v(ZERO | {"compute": 0.6, "host": 0.15, "ep": 0.2, "exposed_communication": 0.2})
    assert "exposed communication" in cause_note(more_comm, None).text
    # Activation offload whose copies outlast the compute they run under.
    off = _v(ZERO | {"compute": 0.7, "offload": 0.2, "dp": 0.05, "exposed_communication": 0.05})
    n = cause_note(off, None)
    assert "likely the activation offload" in n.text and "0.2 s" in n.text
    assert "--cpu-offloading-num-layers" in n.fix
    # Uneven steady iterations come first, whatever the breakdown says.
    uneven = Stability(0, 2000.0, None, 0.3, 0, None)
    n = cause_note(comm, uneven)
    assert "stragglers" in n.text and "30 %" in n.text and "--exclude" in n.fix
    steady = Stability(10, 2000.0, 0.01, 0.02, 0, 1.01)
    assert "stragglers" not in cause_note(comm, steady).text


def test_uneven_slow_job_gets_the_straggler_note(h100: Site, base_job: object) -> None:
    args, achieved = _log("megatron-2024-restart.log")
    r = build_job_report(_job(base_job, "dgx0001", 1),
                         spool_record=_record(achieved, achieved * 0.9, achieved * 1.4),
                         log_hints=LogHints("x.out", args=args), site=h100)
    note = next(n for n in r.notes if n.code == "below-predicted")
    assert "stragglers" in note.text


def _timers_report(site: Site, base_job: object, log: str, nodes: str, n_nodes: int,
                   slow_rank: int) -> object:
    """The job report of `log` on `nodes` when the epilog's record holds Megatron's per-rank
    timer blocks (`--timing-log-level 2 --timing-log-option all`) appended to it: every rank's
    forward + backward compute 300 + 600 ms per iteration, `slow_rank`'s 1.4x."""
    args, achieved = _log(log)
    world = 8 * n_nodes
    blocks = ""
    for _ in range(3):
        blocks += "times across ranks (ms):\n"
        for timer, ms in (("forward-compute", 300.0), ("backward-compute", 600.0)):
            blocks += f"  {timer}:\n" + "".join(
                f"     rank {r:2d}: {ms * (1.4 if r == slow_rank else 1.0):.2f}\n"
                for r in range(world))
    raw = (DATA / "megatron" / log).read_bytes() + blocks.encode()
    summary = parse_log(io.BytesIO(raw))
    m = job_metrics(summary, None, 989.0, world, seq_length=None, flops_formula="none")
    rec = _record(achieved)
    rec["summary"]["metrics"]["rank_timers"] = m.to_json()["rank_timers"]
    return build_job_report(_job(base_job, nodes, n_nodes), spool_record=rec,
                            log_hints=LogHints("x.out", args=args), site=site)


def test_per_rank_timers_name_the_straggling_node_in_the_below_predicted_note(
        h100: Site, base_job: object) -> None:
    r = _timers_report(h100, base_job, "megatron-2024-restart.log", "dgx0001", 1, slow_rank=5)
    note = next(n for n in r.notes if n.code == "below-predicted")
    assert "per-rank timers" in note.text and "node dgx0001 (rank 5)" in note.text
    assert "1.40x" in note.text and "--exclude" in note.fix
    s = r.to_json()["stragglers"]
    assert [x["rank"] for x in s["stragglers"]] == [5] and s["ranks_judged"] == 8


def test_per_rank_stragglers_are_a_note_of_their_own_without_a_slow_prediction(
        h100: Site, base_job: object) -> None:
    r = _timers_report(h100, base_job, "megatron-2026-microseconds.log", "dgx[0001-0008]", 8,
                       slow_rank=43)
    assert r.predicted is not None and not r.predicted.flagged
    note = next(n for n in r.notes if n.code == "stragglers")
    assert "node dgx0006 (rank 43)" in note.text  # 43 // 8 ranks per node: the sixth node
    assert "below-predicted" not in [n.code for n in r.notes]


def test_a_gap_published_runs_of_the_architecture_share_is_said_to_be_the_models() -> None:
    """GPT-OSS 120B's published GB200 runs ran at 61-77 % of the model's prediction: a job of
    that architecture as slow is flagged with its likely cause and told the gap may be the
    model's; one slower than every published run, or of an architecture whose runs the model
    predicts well (Llama 3 70B), is not."""
    points = {p.id: p for p in load_published(DATA / "perf" / "published.toml")}
    cases = []
    for pid, gpu in (("bridge2604-gb200-gptoss120b-bf16", "gb200"),
                     ("bridge2602-h100-llama3-70b-fp8", "h100")):
        p = points[pid]
        assert p.config is not None and p.hardware is not None
        pred = predict(p.config, p.gpus, p.hardware, FITTED[p.generation], p.opts)
        assert pred is not None
        rec = track(p.config, gpu, load())
        lo = 1 + min(r.error for r in rec.on_gpu)
        cases.append((pred, rec, lo))
    (pred, rec, lo), (lpred, lrec, llo) = cases
    assert lo < LOW_VS_PREDICTED <= llo and rec.models == ("gpt-oss-120b",)

    def job(p: Prediction, r: object, ratio: float, gpu: str) -> VsPredicted:
        return VsPredicted(gpu=gpu, world=64, achieved_step_s=p.step_time_s / ratio,
                           prediction=p, track=r)

    v = job(pred, rec, lo + 0.02, "gb200")
    assert v.flagged
    known = v.known_miss()
    assert known is not None and "(gpt-oss-120b) on GB200 ran at 61-" in known, known
    note = cause_note(v, None)
    assert note.code == "below-predicted" and note.text.endswith(known)
    assert v.to_json()["known_miss"] == known
    assert v.to_json()["track_record"]["published_runs"] == len(rec.runs)
    own = job(pred, replace(rec, site_calibrated=True), lo + 0.02, "gb200")
    assert own.known_miss() is None  # the site's own factors replace the built-in fit
    slower = job(pred, rec, lo - 0.05, "gb200")
    assert slower.known_miss() is None and "published runs" not in cause_note(slower, None).text
    llama = job(lpred, lrec, 0.6, "h100")
    assert llama.flagged and llama.known_miss() is None
    assert "published runs" not in cause_note(llama, None).text
