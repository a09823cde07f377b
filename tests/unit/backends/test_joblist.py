"""SlurmBackend.jobs and steps-only signals: the CLI backend's argv and parsing, pyslurm's
mapping (a stub module), over canned output."""

from __future__ import annotations

import json

import pytest

from slurmpod.backends.joblist import LIST_FIELDS, list_argv, parse_job_list
from slurmpod.backends.parse import SACCT_DELIMITER
from slurmpod.model.jobs import JobState
from tests.unit.backends.test_cli import CannedRunner, cli

D = SACCT_DELIMITER


def row(job_id: str, name: str, state: str, work_dir: str, comment: str = "",
        submit: str = "1700000000") -> str:
    values = {"JobID": job_id, "JobName": name, "User": "alice", "Account": "a",
              "Partition": "batch", "State": state, "Submit": submit, "Start": "1700000010",
              "End": "Unknown", "NodeList": "gpu[001-002]", "NNodes": "2",
              "AllocTRES": "billing=1,gres/gpu=16,node=2", "WorkDir": work_dir,
              "Comment": comment, "JobIDRaw": job_id}
    return D.join(values[f] for f in LIST_FIELDS)


def test_list_argv() -> None:
    argv = list_argv(window_s=7 * 86400, name="llama")
    assert argv[:4] == ["sacct", "--noheader", "--parsable2", "--allocations"]
    assert "--starttime=now-604800seconds" in argv and "--name=llama" in argv
    assert "--allusers" not in argv and not any(a.startswith("--jobs") for a in argv)
    argv = list_argv(job_ids=["5", "5", "6_1"], name="a,b", all_users=True)
    assert "--jobs=5,6_1" in argv and "--allusers" in argv
    assert not any(a.startswith(("--name", "--starttime")) for a in argv)


def test_parse_keeps_a_multiline_comment_and_the_work_dir() -> None:
    text = "\n".join([row("5", "llama", "COMPLETED", "/runs/a b", comment='{"x":\n1}'),
                      row("6", "llama", "CANCELLED by 1000", "/runs/c")]) + "\n"
    a, b = parse_job_list(text)
    assert (a.job_id, a.work_dir, a.comment, a.n_gpus, a.n_nodes) == (
        "5", "/runs/a b", '{"x":\n1}', 16, 2)
    assert b.state is JobState.CANCELLED and b.submit_time is not None


def test_cli_jobs_takes_live_state_and_comment_from_squeue() -> None:
    live = {"jobs": [{"job_id": 7, "name": "llama", "job_state": "RUNNING",
                      "comment": '{"mfu":0.4}', "nodes": "gpu001",
                      "current_working_directory": "/runs/x"}]}
    text = "\n".join([row("7", "llama", "PENDING", "/runs/x", submit="1700000050"),
                      row("6", "llama", "COMPLETED", "/runs/y"),
                      row("8", "other", "COMPLETED", "/runs/z")]) + "\n"
    runner = CannedRunner({"sacct": [text], "squeue": [json.dumps(live)]})
    backend, _ = cli(runner)
    jobs = backend.jobs(window_s=3600, name="llama")
    assert [j.job_id for j in jobs] == ["6", "7"]  # oldest submission first, name filtered
    assert jobs[1].state is JobState.RUNNING and jobs[1].comment == '{"mfu":0.4}'
    assert jobs[1].work_dir == "/runs/x" and jobs[0].work_dir == "/runs/y"
    assert runner.calls[1][0][:2] == ["squeue", "--json"] and "--jobs=7" in runner.calls[1][0]


def test_cli_signal_to_steps_only_spares_the_batch_shell() -> None:
    runner = CannedRunner({"scancel": ["", ""]})
    backend, _ = cli(runner)
    backend.cancel(["5"], signal="TERM", steps_only=True)
    backend.cancel(["5"], signal="TERM")
    assert runner.calls[0][0] == ["scancel", "--signal=TERM", "5"]
    assert runner.calls[1][0] == ["scancel", "--signal=TERM", "--full", "5"]
    with pytest.raises(ValueError):
        backend.cancel(["5"], steps_only=True)


def test_pyslurm_steps_only_and_jobs() -> None:
    from slurmpod.backends.pyslurm_backend import PyslurmBackend
    from tests.unit.backends.test_pyslurm import stub_pyslurm

    mod = stub_pyslurm()
    filters: list[dict] = []
    dbjob = next(iter(mod.db.Jobs.load(mod.db.JobFilter(ids=[41])).values()))
    dbjob.working_directory = "/runs/p"

    class Filter:
        def __init__(self, **kw):
            filters.append(kw)

    class DbJobs:
        @staticmethod
        def load(flt):
            return {41: dbjob}

    mod.db.JobFilter, mod.db.Jobs = Filter, DbJobs
    b = PyslurmBackend("24.11.1", module=mod)
    b.cancel(["41"], signal="TERM", steps_only=True)
    assert ("signal", 41, "SIGTERM", "children") in mod.calls
    (job,) = b.jobs(window_s=60, name=dbjob.name)
    assert job.job_id == "41" and job.work_dir == "/runs/p"
    assert filters[0]["names"] == [dbjob.name] and "users" in filters[0]
    assert b.jobs(window_s=60, name="no-such-name") == []
