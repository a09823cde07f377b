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


def test_submit_refuses_what_pyslurm_cannot_carry() -> None:
    backend = PyslurmBackend("24.11.1", module=fake_module("24.11.0"))
    with pytest.raises(SlurmError, match="script arguments"):
        backend.submit("#!/bin/bash\n", args=["-N", "2", "extra-arg"])
    with pytest.raises(SlurmError, match="--hint=nomultithread is not supported"):
        backend.submit("#!/bin/bash\n#SBATCH --hint=nomultithread\ntrue\n")
    with pytest.raises(SlurmError, match="cannot submit --switches=1@5:00") as exc:
        backend.submit("#!/bin/bash\n", args=["--switches=1@5:00"])
    assert "--backend cli" in exc.value.hint


def test_sbatch_lines_are_tokenized_like_sbatch() -> None:
    from slurmpod.backends.pyslurm_backend import sbatch_arguments, script_arguments
    from slurmpod.render.sbatch import sbatch_line

    hostile = 'a "b" \'c\' $(x) # y {"k": [1, 2]}'
    line = sbatch_line("comment", hostile)
    assert line is not None
    assert sbatch_arguments(line[len("#SBATCH"):]) == [f"--comment={hostile}"]
    assert sbatch_arguments(" -N 2  --x='a b' # comment") == ["-N", "2", "--x=a b"]
    assert sbatch_arguments(r" --x=a\ b#c") == ["--x=a b"]
    text = "#!/bin/bash\n#SBATCH -N 2\n# note\n\n#SBATCH --job-name=a\necho\n#SBATCH -p late\n"
    assert script_arguments(text) == ["-N", "2", "--job-name=a"]
    with pytest.raises(SlurmError, match="unmatched"):
        sbatch_arguments(' --comment="open')


def test_options_become_submit_fields_args_first() -> None:
    from slurmpod.backends.pyslurm_backend import _parse_argv, submit_fields

    opts = _parse_argv(["--job-name=fromargs", "-p", "batch", "--exclusive", "--requeue",
                        "--gpus-per-node=8", "--gres=nvme:1", "--signal=B:TERM@120",
                        "-N2", "--job-name", "ignored", "--no-kill", "--mem=0"])
    assert submit_fields(opts) == {
        "name": "fromargs", "partitions": "batch", "resource_sharing": "no",
        "is_requeueable": True, "gres_per_node": "gpu:8,nvme:1",
        "signal": "B:SIGTERM@120", "nodes": "2", "kill_on_node_fail": False,
        "memory_per_node": "0"}
    assert submit_fields(_parse_argv(["-N", "4", "--ntasks-per-node=8"])) == {
        "nodes": "4", "ntasks_per_node": "8", "ntasks": 32}
    assert "ntasks" not in submit_fields(_parse_argv(["-N", "2-4", "--ntasks-per-node=8"]))
    assert submit_fields(_parse_argv(["--gpus-per-node=h100:4", "-H", "-t", "30",
                                      "--time-min=1:00:00"])) == {
        "gres_per_node": "gpu:h100:4", "priority": 0, "time_limit": 30,
        "time_limit_min": 60}


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

        def submit(self):
            calls.append(("submit", self.kw))
            return 42

    class Job:
        def __init__(self, jid):
            self.jid = jid

        def cancel(self):
            calls.append(("cancel", self.jid))

        def send_signal(self, sig, steps="children"):
            calls.append(("signal", self.jid, sig, steps))

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
    script = "#!/bin/bash\n#SBATCH -N 2\n#SBATCH --job-name=inscript\ntrue\n"
    assert b.submit(script, args=["--job-name=fromargs"], cwd="/runs/a", env={"K": "v"}) == "42"
    st = b.status(["41", "99"])["41"]
    assert (st.state, st.nodes, st.n_gpus, st.restarts, st.time_limit_s, st.end_time) == (
        JobState.RUNNING, "gpu[001-002]", 16, 1, 1800, None)
    rec = b.accounting(["41"])["41"]
    assert rec.state is JobState.FAILED and rec.exit_code == 3 and rec.n_gpus == 16
    assert [s.step_id for s in rec.steps] == ["batch"] and rec.steps[0].exit_code == 3
    b.cancel(["41"])
    b.cancel(["41_3"], signal="USR2")
    b.requeue("41", hold=True)
    b.update_comment("41", "x y")
    kw = mod.calls[0][1]
    assert kw["script"] == script and kw["name"] == "fromargs" and kw["nodes"] == "2"
    assert kw["working_directory"] == "/runs/a" and kw["environment"]["K"] == "v"
    assert ("signal", 41, "SIGUSR2", "all") in mod.calls
    assert ("cancel", 41) in mod.calls and ("requeue", 41, True) in mod.calls
    assert ("modify", 41, {"comment": "x y"}) in mod.calls and ("db", [41]) in mod.calls
