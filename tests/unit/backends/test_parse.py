"""Parsers over recorded Slurm 22.05 output and constructed 24.11 (data_parser v0.0.41) shapes."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmpod.backends.parse import (
    SACCT_FIELDS,
    exit_of,
    gpus_from_tres,
    num,
    parse_sacct_json,
    parse_sacct_parsable,
    parse_sbatch_parsable,
    parse_scontrol_kv,
    parse_scontrol_nodes,
    parse_squeue_json,
    sacct_delimiter,
    state_of,
)
from slurmpod.errors import SlurmError
from slurmpod.model.jobs import JobState
from tests.helpers import DATA_DIR

DATA = DATA_DIR / "slurm"
V2205 = DATA / "22.05"
V2411 = DATA / "24.11"


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def sacct_text() -> dict[str, object]:
    return {r.job_id: r for r in parse_sacct_parsable(read(V2205 / "sacct.parsable2.txt"))}


# -- recorded 22.05 --------------------------------------------------------------------------

def test_recorded_field_list_is_the_one_the_backend_asks_for() -> None:
    assert read(V2205 / "sacct.parsable2.fields").strip() == ",".join(SACCT_FIELDS)


def test_sacct_parsable_groups_steps_under_their_job(sacct_text) -> None:
    # Independent count: every line whose JobID has no dot is a job row (requeue adds one more).
    lines = read(V2205 / "sacct.parsable2.txt").split("\n")
    job_rows = [ln for ln in lines if re.match(r"\d+(_\d+)?\x1f", ln)]
    step_rows = [ln for ln in lines if re.match(r"\d+(_\d+)?\.\w+\x1f", ln)]
    assert len(sacct_text) == len(job_rows) - 1  # job 4 has two attempts
    # steps of job 4's first attempt are dropped with that attempt
    first_attempt = [ln for ln in step_rows if ln.startswith("4.")]
    assert sum(len(r.steps) for r in sacct_text.values()) == \
        len(step_rows) - (len(first_attempt) - len(sacct_text["4"].steps))
    train = sacct_text["9"]
    assert [s.step_id for s in train.steps] == ["batch", "0", "1"]
    assert train.n_gpus == 32 and train.n_nodes == 4 and train.nodes == "gpu[001-002,005-006]"
    assert [s.n_gpus if hasattr(s, "n_gpus") else None for s in train.steps] == [None] * 3
    # the job row's figures are its own, not a sum over steps
    assert train.steps[1].n_nodes == 4 and train.steps[0].n_nodes == 1


def test_sacct_parsable_exit_codes_and_signals(sacct_text) -> None:
    assert sacct_text["2"].state is JobState.FAILED and sacct_text["2"].exit_code == 3
    assert sacct_text["2"].step("batch").exit_code == 3
    killed = sacct_text["10"].step("0")
    assert killed.state is JobState.CANCELLED and killed.signal == 9
    assert sacct_text["11"].state is JobState.TIMEOUT
    assert sacct_text["3"].state is JobState.CANCELLED  # "CANCELLED by 0"


def test_sacct_parsable_restarts_from_duplicates(sacct_text) -> None:
    assert sacct_text["4"].restarts == 1
    assert sacct_text["4"].state is JobState.RUNNING
    assert all(r.restarts == 0 for k, r in sacct_text.items() if k != "4")


def test_sacct_parsable_free_text_comments_survive(sacct_text) -> None:
    assert json.loads(sacct_text["12"].comment) == {"note": "a|b", "x": 1}
    assert sacct_text["13"].comment == "line1\nline2|x"
    assert [s.step_id for s in sacct_text["13"].steps] == ["batch"]
    assert sacct_text["3"].name == "weird name; $(x)"
    assert sacct_text["3"].admin_comment == "drained by admin"


def test_sacct_parsable_arrays_and_pending(sacct_text) -> None:
    assert {"6_0", "6_1"} <= set(sacct_text)
    pending = sacct_text["14"]
    assert pending.state is JobState.PENDING and pending.nodes == "" and pending.start_time is None


def test_epoch_and_iso_times_agree_for_finished_jobs() -> None:
    # Both recordings were taken by the same machine in UTC; running jobs' elapsed moves on.
    a = {r.job_id: r for r in parse_sacct_parsable(read(V2205 / "sacct.parsable2.txt"))}
    b = {r.job_id: r for r in parse_sacct_parsable(read(V2205 / "sacct.parsable2.isotime.txt"))}
    assert a.keys() == b.keys()
    for jid, rec in a.items():
        if rec.state.is_terminal:
            assert rec == b[jid]
    assert a["2"].start_time == datetime(2026, 11, 29, 18, 29, 46, tzinfo=UTC)


def test_sacct_json_2205_matches_text_except_known_exit_code_bug(sacct_text) -> None:
    js = {r.job_id: r for r in parse_sacct_json(read(V2205 / "sacct.json"))}
    # job 15 (the sbatch_parsable.txt recording) was queued after sacct.json was taken
    assert js.keys() == sacct_text.keys() - {"15"}
    for jid, rec in js.items():
        txt = sacct_text[jid]
        assert (rec.name, rec.state, rec.nodes, rec.n_gpus, rec.restarts) == \
            (txt.name, txt.state, txt.nodes, txt.n_gpus, txt.restarts), jid
        assert [s.step_id for s in rec.steps] == [s.step_id for s in txt.steps], jid
    # Slurm 22.05 dbv0.0.38 says SUCCESS/0 for job 2, which exited 3 (text: "3:0").
    assert js["2"].exit_code == 0 and sacct_text["2"].exit_code == 3
    assert js["9"].comment == sacct_text["9"].comment == '{"run":"f","gpus":32}'


def test_squeue_json_2205() -> None:
    jobs = {s.job_id: s for s in parse_squeue_json(read(V2205 / "squeue.json"))}
    raw = json.loads(read(V2205 / "squeue.json"))["jobs"]
    assert len(jobs) == len(raw)
    assert jobs["4"].restarts == 1 and jobs["4"].state is JobState.RUNNING
    assert jobs["4"].end_time is None  # 22.05 reports start + 1 year for an unlimited job
    assert jobs["14"].state is JobState.PENDING and jobs["14"].reason == "PartitionNodeLimit"
    assert jobs["11"].time_limit_s == 60 and jobs["11"].state is JobState.TIMEOUT
    assert jobs["6_0"].nodes == "gpu001" and jobs["1"].n_gpus == 32
    assert jobs["3"].admin_comment == "drained by admin"


def test_sacct_json_reports_errors_as_slurm_error() -> None:
    with pytest.raises(SlurmError, match="Nothing found"):
        parse_sacct_json(read(V2205 / "sacct_unknown_job.json"))


def test_scontrol_nodes_2205() -> None:
    nodes = {n.name: n for n in parse_scontrol_nodes(read(V2205 / "scontrol_show_node.txt"))}
    assert len(nodes) == 16 and all(n.n_gpus == 8 and n.cpus == 32 for n in nodes.values())
    assert nodes["gpu005"].flags == ("DRAIN",) and not nodes["gpu005"].available
    assert nodes["gpu005"].reason.startswith("hca mlx5_3 down")
    assert nodes["gpu001"].available and nodes["gpu001"].partitions == ("batch",)


def test_sbatch_parsable() -> None:
    assert parse_sbatch_parsable(read(V2205 / "sbatch_parsable.txt")) == "15"
    assert parse_sbatch_parsable("123;cluster\n") == "123"
    with pytest.raises(SlurmError):
        parse_sbatch_parsable("Submitted batch job 5\n")
    with pytest.raises(SlurmError):
        parse_sbatch_parsable("")


# -- constructed 24.11 shapes ----------------------------------------------------------------

def test_squeue_json_2411_wrapped_numbers_and_state_lists() -> None:
    jobs = {s.job_id: s for s in parse_squeue_json(read(V2411 / "squeue.json"))}
    assert set(jobs) == {"21", "22_1", "24"}
    assert jobs["22_1"].state is JobState.PENDING and jobs["22_1"].restarts == 2
    assert jobs["22_1"].time_limit_s == 1800 and jobs["21"].time_limit_s is None
    assert jobs["24"].n_gpus == 16  # typed gres/gpu:h100=16 only


def test_sacct_json_2411() -> None:
    recs = {r.job_id: r for r in parse_sacct_json(read(V2411 / "sacct.json"))}
    assert recs["24"].exit_code == 3 and recs["24"].step("0").signal == 9
    assert [s.step_id for s in recs["21"].steps] == ["batch", "extern", "0"]
    assert [s.step_id for s in recs["21"].user_steps] == ["0"]
    assert recs["25"].restarts == 1 and recs["25"].state is JobState.RUNNING
    assert recs["22_1"].n_gpus == 8 and recs["21"].gpu_seconds == 32 * 10


# -- value helpers ---------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "expected"), [
    (5, 5), ({"set": True, "infinite": False, "number": 7}, 7), ({"set": False, "number": 7}, None),
    ({"set": True, "infinite": True, "number": 0}, None), (None, None), ("12", 12), (True, None),
])
def test_num(value, expected) -> None:
    assert num(value) == expected


@pytest.mark.parametrize(("value", "expected"), [
    ("RUNNING", JobState.RUNNING), (["PENDING", "REQUEUED"], JobState.PENDING),
    ({"current": ["COMPLETED"], "reason": "None"}, JobState.COMPLETED),
    ({"current": "FAILED"}, JobState.FAILED), ("CANCELLED by 1000", JobState.CANCELLED),
    ("CA", JobState.CANCELLED), ("bogus", JobState.UNKNOWN), (None, JobState.UNKNOWN),
])
def test_state_of(value, expected) -> None:
    assert state_of(value) is expected


def test_exit_of_shapes() -> None:
    assert exit_of("3:0") == (3, 0) and exit_of("0:9") == (0, 9)
    assert exit_of({"status": "SIGNALED", "return_code": None,
                    "signal": {"signal_id": 9, "name": "Killed"}}) == (0, 9)
    assert exit_of({"status": ["FAILED"], "return_code": {"set": True, "number": 2},
                    "signal": {"id": {"set": False, "number": 0}, "name": ""}}) == (2, 0)


@pytest.mark.parametrize(("tres", "gpus"), [
    ("cpu=128,mem=1000G,node=4,billing=128,gres/gpu=32", 32),
    ("cpu=1,gres/gpu:h100=8,gres/gpu=8", 8), ("gres/gpu:a=2,gres/gpu:b=3", 5), ("", 0),
])
def test_gpus_from_tres(tres, gpus) -> None:
    assert gpus_from_tres(tres) == gpus


def test_scontrol_kv_values_with_spaces() -> None:
    kv = parse_scontrol_kv("NodeName=a OS=Linux 6.1 #1 SMP Reason=bad ib [root@x] State=IDLE")
    assert kv == {"NodeName": "a", "OS": "Linux 6.1 #1 SMP", "Reason": "bad ib [root@x]",
                  "State": "IDLE"}


# Anything a job can store: sacct prints C strings (no NUL); \x1f, \r, \n, `|` included.
_free_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",),
                                            blacklist_characters="\x00"), max_size=40)


@settings(max_examples=150, deadline=None)
@given(comment=_free_text, admin=_free_text, name=_free_text)
def test_parsable_rows_round_trip_any_comment(comment: str, admin: str, name: str) -> None:
    row = {f: "" for f in SACCT_FIELDS}
    row.update(JobID="77", JobIDRaw="77", JobName=name, State="COMPLETED", ExitCode="0:0",
               NNodes="2", AllocTRES="gres/gpu=16", Comment=comment, AdminComment=admin)
    step = {**row, "JobID": "77.batch", "JobIDRaw": "77.batch", "Comment": "", "AdminComment": ""}
    delim = sacct_delimiter()
    text = "\n".join(delim.join(r[f] for f in SACCT_FIELDS) for r in (row, step))
    (rec,) = parse_sacct_parsable(text + "\n", delimiter=delim)
    assert (rec.comment, rec.admin_comment, rec.name) == (comment, admin, name)
    assert [s.step_id for s in rec.steps] == ["batch"] and rec.n_gpus == 16


def test_het_job_components_2205() -> None:
    text = {r.job_id: r for r in parse_sacct_parsable(read(V2205 / "sacct_hetjob.parsable2.txt"))}
    js = {r.job_id: r for r in parse_sacct_json(read(V2205 / "sacct_hetjob.json"))}
    for recs in (text, js):
        assert set(recs) == {"38+0", "38+1"}
        assert recs["38+0"].nodes == "gpu001" and recs["38+1"].nodes == "gpu002"
        assert [s.step_id for s in recs["38+0"].steps] == ["batch", "0"]
        assert [s.step_id for s in recs["38+1"].steps] == ["0"]
    live = {s.job_id for s in parse_squeue_json(read(V2205 / "squeue_hetjob.json"))}
    assert {"38+0", "38+1"} <= live
