"""Per-job reports from sacct JSON in the recorded Slurm 22.05 shape (tests/data/report/
sacct-handmade-22.05.json: the recorded 22.05 job entries with AdminComments as sacctmgr stores
them, backticks for quotes). Every expected number below is worked out by hand in the comment
next to it from the figures in that file."""

from __future__ import annotations

import pytest

from slurmpod.config import load_site, resolve_site_path
from slurmpod.model.site import Inventory
from slurmpod.report.build import build_job_report
from slurmpod.report.model import (
    Figures,
    LogHints,
    figures_from_spool,
    split_loss,
    stability_of,
)
from slurmpod.report.placement import fewest, placement_of
from slurmpod.report.sacct import (
    jobs_from_text,
    parse_attempts,
    parse_exit_codes,
    parse_sacct_jobs,
    with_exit_codes,
)
from tests.helpers import DATA_DIR

DATA = DATA_DIR


@pytest.fixture(scope="module")
def inv() -> Inventory:
    return load_site(resolve_site_path("sandbox")).inventory


@pytest.fixture(scope="module")
def jobs() -> dict[str, object]:
    text = (DATA / "report" / "sacct-handmade-22.05.json").read_text()
    codes = parse_exit_codes((DATA / "report" / "exit-codes-handmade.txt").read_text())
    return {sj.record.job_id: sj for sj in with_exit_codes(parse_sacct_jobs(text), codes)}


def test_attempts_and_exit_codes_from_the_two_queries(jobs: dict) -> None:
    assert list(jobs) == ["101", "102", "103", "104", "105"]
    req = jobs["103"]
    assert [a.elapsed_s for a in req.attempts] == [600, 1200]
    assert [a.state for a in req.attempts] == ["REQUEUED", "COMPLETED"]
    assert req.record.restarts == 1 and req.allocated_s == 1800
    # 22.05's JSON says exit code 0 for the failed job; the text query says 3.
    assert jobs["102"].record.exit_code == 3 and str(jobs["102"].record.state) == "FAILED"


def test_text_queries_give_the_same_jobs_as_json(jobs: dict) -> None:
    text = jobs_from_text((DATA / "report" / "handmade.records.txt").read_text(),
                          (DATA / "report" / "handmade.attempts.txt").read_text())
    assert [sj.record.job_id for sj in text] == list(jobs)
    for sj in text:
        ref = jobs[sj.record.job_id]
        assert sj.attempts == ref.attempts
        for key in ("state", "exit_code", "user", "account", "partition", "nodes", "n_nodes",
                    "n_gpus", "elapsed_s", "start_time", "end_time", "admin_comment", "comment",
                    "restarts"):
            assert getattr(sj.record, key) == getattr(ref.record, key), key
    assert text[2].record.restarts == 1  # two attempt rows of job 103


def test_attempt_rows_skip_steps_and_unknown_times() -> None:
    got = parse_attempts("9|10|20|Unknown|5|RUNNING\n9.batch|10|20|Unknown|5|RUNNING\n"
                         "8|1|2|3|1|CANCELLED by 0\nbad line\n")
    assert list(got) == ["9", "8"] and got["9"][0].end_s is None
    assert got["8"][0].state == "CANCELLED"


def test_recorded_22_05_sacct_keeps_every_attempt() -> None:
    text = (DATA / "slurm" / "22.05" / "sacct.json").read_text()
    by = {sj.record.job_id: sj for sj in parse_sacct_jobs(text)}
    # Job 4 was requeued once: a REQUEUED attempt of 6 s, then the running one (36 s so far).
    assert [(a.state, a.elapsed_s) for a in by["4"].attempts] == [("REQUEUED", 6),
                                                                   ("RUNNING", 36)]
    assert by["6_0"].record.job_id == "6_0" and len(by["6_0"].attempts) == 1


def test_no_matching_job_is_an_empty_list_not_an_error() -> None:
    text = (DATA / "slurm" / "22.05" / "sacct_unknown_job.json").read_text()
    assert parse_sacct_jobs(text) == []


def test_exit_code_text_ignores_steps_and_keeps_the_last_attempt() -> None:
    assert parse_exit_codes("7|0:0\n7.batch|2:0\n8|0:9\n7|1:0\n") == {"7": (1, 0), "8": (0, 9)}


def test_completed_job_hand_checked(jobs: dict, inv: Inventory) -> None:
    r = build_job_report(jobs["101"], inventory=inv)
    assert r.status == "complete" and r.figures.source == "admin_comment"
    f = r.figures
    assert (f.mfu.median, f.mfu.p10, f.mfu.p90) == (0.4, 0.38, 0.42)
    # TFLOP/s p10/p90 = MFU p10/p90 × peak 0.05
    assert f.tflops.p10 == pytest.approx(0.019) and f.tflops.p90 == pytest.approx(0.021)
    # 32 GPUs × 3600 s = 32 GPU-h; productive 0.9 × 3600 s × 32 = 28.8 GPU-h; lost 3.2 GPU-h =
    # start-up 180 s (1.6) + checkpoints 60 s (0.5333) + other 120 s (1.0667)
    g = r.to_json()["gpu_time"]
    assert g["allocated_gpu_hours"] == pytest.approx(32.0)
    assert g["productive_gpu_hours"] == pytest.approx(28.8)
    assert g["goodput"] == pytest.approx(0.9)
    lost = g["lost_gpu_hours_by_cause"]
    assert lost == pytest.approx({"startup": 1.6, "checkpoint": 60 * 32 / 3600,
                                  "restarts": 0.0, "other": 120 * 32 / 3600})
    assert r.queue_s == 120
    # 0.02 TFLOP/s × 32 GPUs / (6 × 5000 tokens/s) = 2.13e7 parameters
    assert r.params_b == pytest.approx(0.02e12 * 32 / 30000 / 1e9)
    p = r.placement
    assert p.sus == ("su1",) and p.min_sus == 1 and p.racks == ("rack1", "rack2")
    assert p.min_racks == 2 and p.wider_than_needed == []
    assert [n.code for n in r.notes] == []


def test_failed_wide_slow_job_gets_its_notes(jobs: dict, inv: Inventory) -> None:
    r = build_job_report(jobs["102"], inventory=inv)
    codes = [n.code for n in r.notes]
    # gpu004 is the last node of su1/rack2, gpu005 the first of su2/rack3: 2 nodes fit one SU
    # and one rack (racks hold 2 nodes in the sandbox).
    assert r.placement.sus == ("su1", "su2") and r.placement.min_sus == 1
    assert r.placement.racks == ("rack2", "rack3") and r.placement.min_racks == 1
    assert codes == ["ended-badly", "low-mfu", "placement-wide-sus", "placement-wide-racks",
                     "slow-startup", "low-goodput"]
    assert "exit code 3" in r.notes[0].text
    # MFU 10 % < 0.6 × 35 % (default typical); start-up 600 s of 1800 s = 33.3 %
    assert "10.0 %" in r.notes[1].text and "33.3 %" in r.notes[4].text
    # 16 GPUs × 1800 s = 8 GPU-h, productive 0.5 × 8 = 4, start-up 600 s × 16 = 2.667, other 1.333
    lost = r.loss.by_cause_gpu_s
    assert lost["startup"] / 3600 == pytest.approx(600 * 16 / 3600)
    assert lost["other"] / 3600 == pytest.approx(300 * 16 / 3600)
    assert r.loss.goodput == pytest.approx(0.5)


def test_typical_mfu_from_the_fleet_changes_the_low_mfu_rule(jobs: dict) -> None:
    r = build_job_report(jobs["102"], typical_mfu={"<1B": 0.15})
    assert "low-mfu" not in [n.code for n in r.notes]  # 10 % ≥ 0.6 × 15 %
    r = build_job_report(jobs["102"], typical_mfu={"<1B": 0.5})
    (note,) = [n for n in r.notes if n.code == "low-mfu"]
    assert "typical 50.0 % for <1B models" in note.text


def test_requeued_job_counts_every_attempt(jobs: dict) -> None:
    r = build_job_report(jobs["103"])
    # allocated (600 + 1200) s × 8 = 4 GPU-h; the hook's goodput 0.75 is over the last attempt:
    # productive 0.75 × 1200 s = 900 s → 2 GPU-h, goodput 900 / 1800 = 0.5. The start-up figure
    # is negative (first iteration in the appended log predates this attempt): not counted.
    # Lost 900 s: checkpoints 30 s, restarts 870 s.
    assert r.loss.allocated_gpu_s == 1800 * 8
    assert r.loss.productive_gpu_s == pytest.approx(900 * 8)
    assert r.loss.goodput == pytest.approx(0.5)
    assert r.loss.by_cause_gpu_s == pytest.approx({"startup": 0.0, "checkpoint": 240.0,
                                                   "restarts": 870 * 8, "other": 0.0})
    js = r.to_json()["job"]
    assert js["restarts"] == 1 and [a["elapsed_s"] for a in js["attempts"]] == [600, 1200]
    assert r.queue_s == 10  # the first attempt's wait, not the requeue delay
    assert "restarts" in [n.code for n in r.notes]


def test_job_without_training_log_is_said_clearly(jobs: dict, inv: Inventory) -> None:
    r = build_job_report(jobs["104"], inventory=inv)
    assert r.status == "no-training-log"
    assert r.status_text == ("no training log figures for this job (no-iterations): identity "
                             "and placement only")
    assert r.loss.productive_gpu_s is None and r.stability is None
    assert r.placement.sus == ("su3",)
    assert [n.code for n in r.notes] == ["no-training-log"]


def test_running_job_is_partial_with_live_figures(jobs: dict) -> None:
    r = build_job_report(jobs["105"])
    assert r.status == "running" and r.figures.source == "live_comment"
    assert r.figures.mfu.median == 0.3 and r.figures.last_iter == 500
    assert "partial report" in r.status_text and "live figures" in r.status_text


def test_spool_record_beats_admin_comment_and_gives_stability(jobs: dict) -> None:
    series = {"iter": list(range(1, 21)), "segment": [0] * 20, "t": [float(i) for i in range(20)],
              "iter_ms": [100.0] * 14 + [400.0] + [100.0] * 5, "steady": [False] * 10 + [True] * 10}
    record = {"v": 1, "summary": {
        "iters": 20, "last_iter": 20, "mfu": 0.2, "tflops": 0.01, "peak": 0.05, "gpus": 32,
        "ttfi_s": 100, "ckpt_s": 5, "goodput": 0.5, "restarts": 0,
        "metrics": {"mfu": {"n": 10, "median": 0.2, "p10": 0.1, "p90": 0.3, "mean": 0.2},
                    "tflops_per_gpu": {"n": 10, "median": 0.01, "p10": 0.005, "p90": 0.015},
                    "iter_time_ms": {"median": 100.0, "p10": 100.0, "p90": 130.0},
                    "productive_s": 2700.0, "lost_s": 0.0, "checkpoint_stall_s": 5.0,
                    "checkpoint_stalls": [{"iteration": 10, "duration_s": 5.0}]}},
        "series": series}
    r = build_job_report(jobs["101"], spool_record=record)
    assert r.figures.source == "spool" and r.figures.mfu.p90 == 0.3
    assert r.figures.checkpoints == ((10, 5.0),)
    # productive 2700 s of 3600 s (not the AdminComment's 0.9)
    assert r.loss.goodput == pytest.approx(0.75)
    # start-up: 100 s to the first line minus that line's own 100 ms iteration, × 32 GPUs
    assert r.figures.first_record_s == pytest.approx(0.1)
    assert r.loss.by_cause_gpu_s["startup"] == pytest.approx(99.9 * 32)
    s = r.stability
    # steady: ten records, one of 400 ms among 100 ms: median 100, one spike of 4×
    assert (s.n, s.median_ms, s.spikes, s.max_ratio, s.spike_iters) == (10, 100.0, 1, 4.0, (15,))
    # std/mean: mean 130, std sqrt((9·30² + 270²)/10) = 90
    assert s.cv == pytest.approx(90 / 130)
    assert {"iteration-spikes", "unstable-iterations"} <= {n.code for n in r.notes}
    assert r.to_json(series=True)["series"]["iter_ms"][14] == 400.0


def test_nccl_topology_notes_come_from_log_evidence_only(jobs: dict) -> None:
    sj = jobs["101"]
    warn = build_job_report(sj, log_hints=LogHints("x.out", nccl_topo_warning=True))
    assert "nccl-topo-missing" in [n.code for n in warn.notes]
    unset = build_job_report(sj, log_hints=LogHints("x.out", nccl_info=True))
    assert "nccl-topo-unset" in [n.code for n in unset.notes]
    loaded = build_job_report(sj, log_hints=LogHints("x.out", nccl_info=True,
                                                      nccl_topo_loaded=True))
    assert not any(n.code.startswith("nccl") for n in loaded.notes)
    silent = build_job_report(sj, log_hints=LogHints("x.out"))
    assert not any(n.code.startswith("nccl") for n in silent.notes)


def test_loss_causes_always_add_up() -> None:
    # productive above the allocation (clock skew) is capped; causes never go negative
    loss = split_loss(8, [100], Figures("x", productive_s=150.0, ttfi_s=50.0, checkpoint_s=9.0))
    assert loss.productive_gpu_s == 800 and sum(loss.by_cause_gpu_s.values()) == 0
    loss = split_loss(8, [100], Figures("x", productive_s=40.0, ttfi_s=50.0, checkpoint_s=20.0))
    assert loss.by_cause_gpu_s == {"startup": 400.0, "checkpoint": 80.0, "restarts": 0.0,
                                   "other": 0.0}
    assert split_loss(8, [100], Figures("x")).productive_gpu_s is None


def test_spool_figures_without_peak_have_no_mfu() -> None:
    f = figures_from_spool({"summary": {"iters": 5, "tflops": 1.0,
                                        "metrics": {"mfu": {"median": 9.0}}}})
    assert f.mfu is None and f.tflops.median == 1.0


def test_stability_without_series_uses_the_percentiles() -> None:
    from slurmpod.report.model import Dist

    s = stability_of({}, Figures("x", iter_ms=Dist(200.0, 180.0, 260.0)))
    assert s.spread == pytest.approx(0.4) and s.n == 0


def test_fewest_units_largest_first() -> None:
    assert fewest([32, 32, 32], 40) == 2
    assert fewest([4, 8], 8) == 1 and fewest([4, 8], 9) == 2
    assert fewest([4], 5) is None and fewest([4], 0) == 0


def test_placement_with_unknown_nodes_is_partial(inv: Inventory) -> None:
    p = placement_of("gpu[001,016],login1", inv)
    assert p.unknown == ("login1",) and p.sus == ("su1", "su4")
    assert p.wider_than_needed == []  # not judged when nodes are unknown
    assert p.min_sus == 1 and p.n_nodes == 3


def test_attempt_ends_become_a_note(jobs: dict) -> None:
    from slurmpod.report.model import LogHints

    hints = LogHints(path="/r/logs/x.out", attempt_ends=("timelimit", "preempted", "completed"))
    r = build_job_report(jobs["102"], log_hints=hints)
    (note,) = [n for n in r.notes if n.code == "attempt-ends"]
    assert "3 attempts ended: timelimit, preempted, completed" in note.text
    one = build_job_report(jobs["102"], log_hints=LogHints(path="/x", attempt_ends=("completed",)))
    assert "attempt-ends" not in [n.code for n in one.notes]


def test_a_resize_is_not_a_restart_and_each_phase_counts_its_gpus() -> None:
    """A 3-node job (24 GPUs, one spare) training on 16 GPUs: a node goes down after 600 s,
    Slurm removes it (the first record ends RESIZING, 24 GPUs) and the job finishes on the
    other two (16 GPUs) after 400 s more. Worked by hand:
    allocated = 600 × 24 + 400 × 16 = 20,800 GPU-s; the trained 16 GPUs: wall 1,000 s,
    productive 900 s -> 14,400 GPU-s; lost = startup 30 s + checkpoint 20 s + the rest
    50 s ("restarts": the log shows one relaunch) = 100 s × 16 = 1,600 GPU-s; the spare's 8 GPUs
    for 600 s = 4,800 GPU-s held, not trained on -> "other"."""
    from dataclasses import replace as dc_replace

    from slurmpod.report.model import JobReport
    from slurmpod.report.sacct import Attempt, restarts_of

    phases = (Attempt(1, 2, 602, 600, "RESIZING", gpus=24),
              Attempt(1, 602, 1002, 400, "COMPLETED", gpus=16))
    fig = Figures("x", gpus=16, productive_s=900.0, ttfi_s=30.0, checkpoint_s=20.0,
                  log_restarts=1)
    loss = split_loss(16, [600, 400], fig, phases)
    assert loss.allocated_gpu_s == 20_800 and loss.productive_gpu_s == 14_400
    assert loss.by_cause_gpu_s == {"startup": 480.0, "checkpoint": 320.0, "restarts": 800.0,
                                   "other": 4_800.0}
    assert loss.allocated_gpu_s == loss.productive_gpu_s + sum(loss.by_cause_gpu_s.values())
    assert restarts_of(phases) == 0
    # Without the relaunch in the log nothing restarted: the rest is "other" too.
    quiet = split_loss(16, [600, 400], dc_replace(fig, log_restarts=0), phases)
    assert quiet.by_cause_gpu_s["restarts"] == 0 and quiet.by_cause_gpu_s["other"] == 5_600
    # A requeue is a restart; records without their GPUs fall back to the job's GPUs.
    requeued = (dc_replace(phases[0], state="REQUEUED"), phases[1])
    assert restarts_of(requeued) == 1
    old = tuple(dc_replace(a, gpus=None) for a in phases)
    assert split_loss(16, [600, 400], fig, old).allocated_gpu_s == 16_000
    # The report's JSON: no restart, one resize, the GPUs of each phase.
    sj = parse_sacct_jobs((DATA / "report" / "sacct-handmade-22.05.json").read_text())[0]
    r = build_job_report(dc_replace(sj, attempts=phases), with_notes=False)
    assert isinstance(r, JobReport)
    js = r.to_json()["job"]
    assert (js["restarts"], js["resizes"]) == (0, 1)
    assert [(a["gpus"], a["resize"]) for a in js["attempts"]] == [(24, True), (16, False)]


def test_text_report_shows_the_phases_of_a_resized_job() -> None:
    from dataclasses import replace as dc_replace

    from slurmpod.report.sacct import Attempt
    from slurmpod.report.text import job_text

    phases = (Attempt(1, 2, 602, 600, "RESIZING", gpus=24),
              Attempt(1, 602, 1002, 400, "COMPLETED", gpus=16))
    sj = parse_sacct_jobs((DATA / "report" / "sacct-handmade-22.05.json").read_text())[0]
    text = job_text(build_job_report(dc_replace(sj, attempts=phases), with_notes=False))
    assert "restarts 0" in text and "over 2 attempts" not in text
    assert "phases 10:00 on 24 GPUs (resized), 6:40 on 16 GPUs" in text
