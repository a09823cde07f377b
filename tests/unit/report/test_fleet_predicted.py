"""Achieved vs predicted in the fleet report, over the hand-made 22.05-shape jobs of
tests/data/report/ with submit Comments that record a prediction for some of them (as
`slurmpod.model.comment.submit_comment(prediction=prediction_keys(...))` writes it) and
AdminComments that give their median iteration time:

- 101: 1.0 s per iteration (32 GPUs), predicted 0.8 s -> 80 %, not flagged;
- 102: 2.0 s, predicted 1.0 s with 0.3 s exposed communication -> 50 %, flagged (communication);
- 103: 0.5 s, predicted 0.3 s, compute-bound -> 60 %, flagged (compute);
- 104: a prediction but no iterations -> none; 105 running -> not a row.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json

import pytest

from slurmpod.model.comment import build_comment, prediction_keys, submit_comment
from slurmpod.report.build import build_job_report
from slurmpod.report.fleet import CSV_COLUMNS, build_fleet
from slurmpod.report.html import fleet_html
from slurmpod.report.predicted import (
    LOW_VS_PREDICTED,
    recorded_prediction,
    recorded_vs_predicted,
)
from slurmpod.report.sacct import parse_exit_codes, parse_sacct_jobs, with_exit_codes
from slurmpod.report.text import fleet_text
from tests.helpers import DATA_DIR, promtool_check

DATA = DATA_DIR / "report"


def submitted(step_s: float, mfu: float, parts: dict[str, float], layout: str) -> str:
    return submit_comment(version="0.1", run="r", flops_per_iter=1e15, peak_tflops=989.0,
                          gpus=8, formula="mlm-core-0.14", token="t0",
                          prediction=prediction_keys(step_time_s=step_s, mfu=mfu,
                                                     tokens_per_s_per_gpu=1000.0,
                                                     breakdown_s=parts, gpu="h100",
                                                     layout=layout))


PRED = {
    "101": submitted(0.8, 0.40, {"compute": 0.7, "exposed_communication": 0.05, "tp": 0.05},
                     "TP4 PP1 DP8 MBS1 GBS256"),
    "102": submitted(1.0, 0.45, {"compute": 0.6, "exposed_communication": 0.3, "dp": 0.2,
                                 "tp": 0.1, "pp_bubble": 0.1}, "TP2 PP2 DP4 MBS1 GBS128"),
    "103": submitted(0.3, 0.50, {"compute": 0.29, "pp_bubble": 0.01}, "TP8 PP1 DP1 MBS2 GBS64"),
    "104": submitted(1.0, 0.40, {"compute": 1.0}, "TP8 PP1 DP1 MBS1 GBS8"),
}
ITER_MS = {"102": 2000.0, "103": 500.0}  # 101's AdminComment already has 1000 ms


def _jobs(pred: dict[str, str]) -> list:
    doc = json.loads((DATA / "sacct-handmade-22.05.json").read_text())
    for j in doc["jobs"]:
        jid = str(j["job_id"])
        if jid in pred:
            j["comment"]["job"] = pred[jid]
        admin = j["comment"]["administrator"]
        if jid in ITER_MS and admin:
            j["comment"]["administrator"] = admin.replace(
                "`iters`", f"`iter_ms`:{ITER_MS[jid]},`iters`")
    return with_exit_codes(parse_sacct_jobs(json.dumps(doc)),
                           parse_exit_codes((DATA / "exit-codes-handmade.txt").read_text()))


def _fleet(pred: dict[str, str], implausible: str = ""):
    reports = [build_job_report(sj, with_series=False, with_notes=False)
               for sj in _jobs(pred)]
    reports = [dataclasses.replace(r, implausible=("mfu-over-100",))
               if r.job.job_id == implausible else r for r in reports]
    return build_fleet(reports, window="7d")


@pytest.fixture(scope="module")
def fleet():
    return _fleet(PRED)


def test_rows_carry_the_ratio_where_a_prediction_was_recorded(fleet) -> None:
    ratio = {r.job_id: r.vs_predicted for r in fleet.rows}
    assert ratio["101"] == pytest.approx(0.8)
    assert ratio["102"] == pytest.approx(0.5)
    assert ratio["103"] == pytest.approx(0.6)
    assert ratio["104"] is None  # no iterations: nothing achieved to compare
    assert fleet.jobs_with_prediction == 3
    assert fleet.vs_predicted_median == pytest.approx(0.6)


def test_jobs_without_a_prediction_have_none() -> None:
    fl = _fleet({"101": PRED["101"]})
    assert {r.job_id: r.vs_predicted for r in fl.rows} == {
        "101": pytest.approx(0.8), "102": None, "103": None, "104": None}
    assert fl.jobs_with_prediction == 1 and fl.below_predicted == []
    assert "vs predicted: median 80 %" in fleet_text(fl)
    plain = _fleet({})
    assert plain.jobs_with_prediction == 0 and plain.vs_predicted_median is None
    assert "vs predicted" not in fleet_text(plain) and "Below their prediction" not in (
        fleet_text(plain))


def test_flagged_with_the_job_reports_cause_wording(fleet) -> None:
    assert [r.job_id for r in fleet.below_predicted] == ["102", "103"]  # lowest first
    comm, compute = (r.predicted_note for r in fleet.below_predicted)
    assert comm is not None and compute is not None
    assert comm.code == compute.code == "below-predicted"
    assert comm.text.startswith("the job ran at 50 % of its predicted speed (2 s per iteration "
                                "against 1 s predicted for TP2 PP2 DP4 MBS1 GBS128 on 16 H100")
    assert "likely exposed communication" in comm.text and "DP 0.2 s" in comm.text
    assert "--overlap-grad-reduce" in comm.fix
    assert "compute-bound" in compute.text and "nvidia-smi" in compute.fix
    assert not any(r.predicted_note for r in fleet.rows if r.job_id == "101")


def test_implausible_job_gets_no_ratio_and_stays_out() -> None:
    fl = _fleet(PRED, implausible="102")
    assert next(r for r in fl.rows if r.job_id == "102").vs_predicted is None
    assert fl.jobs_with_prediction == 2
    assert fl.vs_predicted_median == pytest.approx(0.7)  # (0.8 + 0.6) / 2
    assert [r.job_id for r in fl.below_predicted] == ["103"]


def test_json_csv_text_and_html(fleet) -> None:
    doc = json.loads(json.dumps(fleet.to_json(jobs=True)))
    assert doc["vs_predicted"]["jobs"] == 3
    assert doc["vs_predicted"]["median"] == pytest.approx(0.6)
    assert doc["vs_predicted"]["threshold"] == LOW_VS_PREDICTED
    below = doc["vs_predicted"]["below"]
    assert [b["job_id"] for b in below] == ["102", "103"]
    assert "likely exposed communication" in below[0]["text"] and below[0]["fix"]
    rows = {r["job_id"]: r for r in doc["job_rows"]}
    assert rows["101"]["vs_predicted"] == pytest.approx(0.8)
    assert rows["104"]["vs_predicted"] is None

    table = list(csv.reader(io.StringIO(fleet.to_csv())))
    assert tuple(table[0]) == CSV_COLUMNS and CSV_COLUMNS[-1] == "implausible"
    col = CSV_COLUMNS.index("vs_predicted")
    got = {row[0]: row[col] for row in table[1:]}
    assert float(got["102"]) == pytest.approx(0.5) and got["104"] == ""

    text = fleet_text(fleet)
    assert ("vs predicted: median 60 % of predicted MFU over 3 jobs with a prediction, "
            "2 under 70 %") in text
    assert "slurmpod calibrate" not in text
    assert "Below their prediction (under 70 % of the predicted speed)" in text
    assert "  102: the job ran at 50 % of its predicted speed" in text
    top = text[text.index("Top jobs by lost GPU-hours"):]
    assert "vs pred" in top.splitlines()[1]

    page = fleet_html(fleet, generated="2025-01-01 00:00 UTC")
    assert '<th class="n">vs predicted</th>' in page and "50 %" in page


def test_a_fleet_far_faster_than_predicted_is_told_to_calibrate() -> None:
    # Every prediction a third of the achieved time: median 300 %, beyond the model's error.
    fast = {"101": submitted(3.0, 0.40, {"compute": 3.0}, "TP4 PP1 DP8 MBS1 GBS256"),
            "102": submitted(6.0, 0.45, {"compute": 6.0}, "TP2 PP2 DP4 MBS1 GBS128"),
            "103": submitted(1.5, 0.50, {"compute": 1.5}, "TP8 PP1 DP1 MBS2 GBS64")}
    fl = _fleet(fast)
    assert fl.vs_predicted_median == pytest.approx(3.0) and not fl.below_predicted
    assert "beyond the model's error: fit the site's own factors with `slurmpod calibrate " \
        "--since 7d`" in fleet_text(fl)
    assert fl.to_json()["vs_predicted"]["calibrate_above"] == pytest.approx(1 / 0.7)


def test_prediction_keys_survive_the_monitor_and_fit_the_comment() -> None:
    text = build_comment(PRED["102"], {"mfu": 0.3, "tflops": 300.0, "iter": 10,
                                       "tokens_per_s": 1e5, "peak": 989.0}, now_s=1.0)
    assert len(text.encode()) <= 1024
    v = recorded_vs_predicted(text, 2.0, 16)
    assert v is not None and v.ratio == pytest.approx(0.5) and v.flagged
    assert v.layout == "TP2 PP2 DP4 MBS1 GBS128" and v.gpu == "h100" and v.world == 16
    assert v.prediction.breakdown_s["exposed_communication"] == pytest.approx(0.3)


def test_a_recorded_host_wait_is_kept_and_names_the_cause() -> None:
    """`pred.b.host` (FP8 MoE layers' forward waiting on kernel launches) survives the
    Comment; a job far below such a prediction gets the host as its likely cause."""
    from slurmpod.report.predicted import cause_note

    pred = recorded_prediction({"pred": {"s": 2.0, "mfu": 0.3, "b": {
        "compute": 1.4, "host": 0.5, "exposed_communication": 0.1, "ep": 0.1}}})
    assert pred is not None and pred.breakdown_s["host"] == pytest.approx(0.5)
    v = recorded_vs_predicted(json.dumps({"pred": {"s": 2.0, "mfu": 0.3, "b": {
        "compute": 1.4, "host": 0.5}, "gpu": "h100", "layout": "TP1 EP8"}}), 4.0, 8)
    assert v is not None and v.flagged
    assert "likely the host" in cause_note(v, None).text
    # The activation offload's exposed copies survive it the same way.
    v = recorded_vs_predicted(json.dumps({"pred": {"s": 2.0, "mfu": 0.3, "b": {
        "compute": 1.5, "offload": 0.5}, "gpu": "gb200", "layout": "TP1 DP64"}}), 4.0, 64)
    assert v is not None and v.prediction.breakdown_s["offload"] == pytest.approx(0.5)
    assert "likely the activation offload" in cause_note(v, None).text


@pytest.mark.parametrize("pred", [
    {"s": 0, "mfu": 0.4}, {"s": -1.0, "mfu": 0.4}, {"s": 1.0, "mfu": 1.5},
    {"s": 1.0, "mfu": 0.4, "b": {"host": 1.5}},
    {"s": 1.0, "mfu": 0.4, "b": {"offload": 1.5}}, {"s": 1.0, "mfu": 0.4, "b": {"offload": -0.1}},
    {"s": float("nan"), "mfu": 0.4}, {"s": 1.0, "mfu": True}, {"s": "1", "mfu": 0.4},
    {"s": 1.0, "mfu": 0.4, "b": {"compute": 2.0}}, {"s": 1.0, "mfu": 0.4, "b": {"evil": 0.1}},
    {"s": 1.0, "mfu": 0.4, "b": [1]}, {"s": 1e9, "mfu": 0.4}, "x", None])
def test_recorded_prediction_out_of_range_is_none(pred) -> None:
    assert recorded_prediction({"pred": pred}) is None


def test_job_text_words_are_taken_only_when_plain() -> None:
    comment = json.dumps({"pred": {"s": 1.0, "mfu": 0.4, "gpu": "h100\x1b[2J",
                                   "layout": "TP1\nslurmpod: error"}})
    v = recorded_vs_predicted(comment, 2.0, 8)
    assert v is not None and v.gpu == "unknown" and v.layout == "the planned layout"
    assert recorded_vs_predicted(comment, 2.0, 0) is None
    assert recorded_vs_predicted(comment, float("inf"), 8) is None
    assert recorded_vs_predicted('{"run":"predict"}', 2.0, 8) is None


def test_prometheus_carries_the_fleet_comparison(fleet) -> None:
    from slurmpod.report.prom import fleet_exposition

    text = fleet_exposition(fleet)
    w = f'{{window="{fleet.window}"}}'
    assert f"slurmpod_fleet_predicted_jobs{w} 3" in text
    assert f"slurmpod_fleet_vs_predicted_median_ratio{w} 0.6" in text
    assert f"slurmpod_fleet_below_predicted_jobs{w} 2" in text
    plain = _fleet({})  # no job recorded a prediction: a count of 0, no median sample
    ptext = fleet_exposition(plain)
    assert "slurmpod_fleet_predicted_jobs{" in ptext and "_median_ratio{" not in ptext
    promtool_check(text)


def test_a_recorded_architecture_words_a_gap_published_runs_share() -> None:
    """The Comment's `pred.arch` (the id `slurmpod submit` records): a GPT-OSS 120B job on
    GB200 at 65 % of its prediction, where the published GB200 runs of that architecture ran
    at 61-77 %, is flagged with the job report's clause that the gap may be the model's; the
    same job without the id, or with an id of no published architecture, is flagged without
    it; and an unflagged job's note is not looked up at all."""
    from slurmpod.perf.calibrate import load_published
    from slurmpod.perf.track import architecture, architecture_id
    from slurmpod.report.predicted import cause_note

    p = next(q for q in load_published(DATA_DIR / "perf" / "published.toml")
             if q.id == "bridge2604-gb200-gptoss120b-bf16")
    assert p.config is not None
    arch = architecture_id(architecture(p.config))

    def comment(arch_id: object) -> str:
        keys = prediction_keys(step_time_s=1.3, mfu=0.3, tokens_per_s_per_gpu=1000.0,
                               breakdown_s={"compute": 1.2, "exposed_communication": 0.1,
                                            "ep": 0.1}, gpu="gb200", layout="TP1 EP64 DP64")
        return submit_comment(version="0.1", run="r", flops_per_iter=1e15, peak_tflops=2500.0,
                              gpus=64, formula="mlm-core-0.14", token="t0",
                              prediction=keys | {"arch": arch_id})

    v = recorded_vs_predicted(comment(arch), 2.0, 64)
    assert v is not None and v.flagged and v.track is not None
    assert v.track.models == ("gpt-oss-120b",)
    note = cause_note(v, None).text
    assert "published runs of this architecture (gpt-oss-120b) on GB200 ran at 61-" in note, note
    for other in ("000000000000", "6D33BB61C0DB", arch + "0", 12, None):
        w = recorded_vs_predicted(comment(other), 2.0, 64)
        assert w is not None and w.flagged and w.track is None
        assert "published runs" not in cause_note(w, None).text
    fast = recorded_vs_predicted(comment(arch), 1.4, 64)
    assert fast is not None and not fast.flagged and fast.track is None
    # The id costs the Comment 20 bytes and survives the monitor's merge.
    merged = build_comment(comment(arch), {"mfu": 0.3, "tflops": 700.0, "iter": 10,
                                           "tokens_per_s": 1e5, "peak": 2500.0}, now_s=1.0)
    assert len(merged.encode()) <= 1024
    again = recorded_vs_predicted(merged, 2.0, 64)
    assert again is not None and again.known_miss() == v.known_miss()


def test_the_fleet_text_carries_the_clause() -> None:
    """Through the fleet report: job 102 recorded as a GPT-OSS 120B run on GB200, at 65 % of
    its prediction."""
    from slurmpod.perf.calibrate import load_published
    from slurmpod.perf.track import architecture, architecture_id

    p = next(q for q in load_published(DATA_DIR / "perf" / "published.toml")
             if q.id == "bridge2604-gb200-gptoss120b-bf16")
    assert p.config is not None
    keys = prediction_keys(step_time_s=1.3, mfu=0.3, tokens_per_s_per_gpu=1000.0,
                           breakdown_s={"compute": 1.3}, gpu="gb200", layout="TP1 EP64 DP64",
                           arch=architecture_id(architecture(p.config)))
    pred = dict(PRED) | {"102": submit_comment(
        version="0.1", run="r", flops_per_iter=1e15, peak_tflops=2500.0, gpus=64,
        formula="mlm-core-0.14", token="t0", prediction=keys)}
    text = fleet_text(_fleet(pred))
    assert "(gpt-oss-120b) on GB200 ran at 61-" in text, text
