"""The pyslurm backend refuses a missing or mismatched pyslurm with one clear SlurmError."""

from __future__ import annotations

import sys
import types

import pytest

from slurmpod.backends.pyslurm_backend import PyslurmBackend, load_pyslurm
from slurmpod.errors import SlurmError


def fake_module(version: str) -> types.ModuleType:
    mod = types.ModuleType("pyslurm")
    mod.__version__ = version  # type: ignore[attr-defined]
    return mod


def test_missing_pyslurm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", None)  # import raises ImportError
    with pytest.raises(SlurmError, match="needs the pyslurm package") as exc:
        load_pyslurm("22.05.8")
    assert "--backend cli" in exc.value.hint and exc.value.exit_code == 4


@pytest.mark.parametrize("have", ["25.11.2", "23.2.0", "garbage"])
def test_version_mismatch(monkeypatch: pytest.MonkeyPatch, have: str) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", fake_module(have))
    with pytest.raises(SlurmError, match=f"pyslurm {have} does not match the running Slurm"):
        load_pyslurm("22.05.8")


@pytest.mark.parametrize("have", ["22.5.3", "17.11.0.1"])
def test_old_pyslurm_api_refused(monkeypatch: pytest.MonkeyPatch, have: str) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", fake_module(have))
    with pytest.raises(SlurmError, match="predates the object API"):
        load_pyslurm("22.05.8")


def test_matching_version_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = fake_module("24.11.0")
    monkeypatch.setitem(sys.modules, "pyslurm", mod)
    assert load_pyslurm("24.11.1") is mod
    assert PyslurmBackend("24.11.1").version() == "24.11.1"


def test_submit_refuses_extra_args() -> None:
    backend = PyslurmBackend("24.11.1", module=fake_module("24.11.0"))
    with pytest.raises(SlurmError, match="#SBATCH"):
        backend.submit("#!/bin/bash\n", args=["-N", "2"])


class _Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def stub_pyslurm() -> types.ModuleType:
    """Just enough of pyslurm's object API (23.2+ attribute names) to drive the mapping."""
    mod = fake_module("24.11.0")
    calls: list[tuple] = []
    job = _Obj(id=41, name="train", state="RUNNING", state_reason="None", user_name="alice",
               account="ml", partition="batch", allocated_nodes="gpu[001-002]", num_nodes=2,
               gres_per_node={"gpu": 8}, comment='{"a": 1}', admin_comment="", requeue_count=1,
               submit_time=1795976985, start_time=1795976986, end_time=1827512986,
               time_limit=30, array_id=None, array_task_id=None)
    step = _Obj(id="41.batch", name="batch", state="COMPLETED", exit_code=3, elapsed_time=9,
                nodelist="gpu001", num_nodes=1, num_tasks=1)
    dbjob = _Obj(id=41, name="train", user_name="alice", account="ml", partition="batch",
                 state="FAILED", exit_code=3, submit_time=1795976985, start_time=1795976986,
                 end_time=1795976995, elapsed_time=9, nodelist="gpu[001-002]", num_nodes=2,
                 comment="", admin_comment="", steps={"batch": step},
                 tres_alloc_str="cpu=64,gres/gpu=16,node=2")

    class Jobs:
        @staticmethod
        def load():
            return {41: job}

    class JobSubmitDescription:
        def __init__(self, **kw):
            self.kw = kw

        def load_sbatch_options(self):
            calls.append(("load_sbatch_options", self.kw.get("script")))

        def submit(self):
            calls.append(("submit",))
            return 42

    class Job:
        def __init__(self, jid):
            self.jid = jid

        def cancel(self):
            calls.append(("cancel", self.jid))

        def requeue(self, hold=False):
            calls.append(("requeue", self.jid, hold))

        def modify(self, desc):
            calls.append(("modify", self.jid, desc.kw))

    class DbJobs:
        @staticmethod
        def load(flt):
            calls.append(("db", flt.ids))
            return {41: dbjob}

    mod.Jobs, mod.Job, mod.JobSubmitDescription = Jobs, Job, JobSubmitDescription
    mod.db = _Obj(Jobs=DbJobs, JobFilter=lambda ids: _Obj(ids=ids))
    mod.calls = calls
    return mod


def test_mapping_through_the_object_api() -> None:
    from slurmpod.model.jobs import JobState

    mod = stub_pyslurm()
    b = PyslurmBackend("24.11.1", module=mod)
    assert b.submit("#!/bin/bash\n#SBATCH -N 2\ntrue\n") == "42"
    st = b.status(["41", "99"])["41"]
    assert (st.state, st.nodes, st.n_gpus, st.restarts, st.time_limit_s, st.end_time) == (
        JobState.RUNNING, "gpu[001-002]", 16, 1, 1800, None)
    rec = b.accounting(["41"])["41"]
    assert rec.state is JobState.FAILED and rec.exit_code == 3 and rec.n_gpus == 16
    assert [s.step_id for s in rec.steps] == ["batch"] and rec.steps[0].exit_code == 3
    b.cancel(["41"])
    b.requeue("41", hold=True)
    b.update_comment("41", "x y")
    assert mod.calls[0] == ("load_sbatch_options", "#!/bin/bash\n#SBATCH -N 2\ntrue\n")
    assert ("cancel", 41) in mod.calls and ("requeue", 41, True) in mod.calls
    assert ("modify", 41, {"comment": "x y"}) in mod.calls and ("db", [41]) in mod.calls
