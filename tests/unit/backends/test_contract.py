"""Backend contract: the same tests run against FakeBackend here and the real CLI backend on the
sandbox (tests/integration/test_backend_contract.py), so the fake cannot drift from Slurm."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import PurePath

import pytest

from slurmpod.backends.fake import FakeBackend
from slurmpod.errors import SlurmError
from slurmpod.model.jobs import JobRecord, JobState, JobStatus

HOSTILE_COMMENT = 'a "b" \'c\' $(touch /tmp/pwned) ; `x` | y & z=1 {"k": [1, 2]}'


def batch_script(*body: str, name: str = "contract", opts: Iterable[str] = ()) -> str:
    lines = ["#!/bin/bash", f"#SBATCH --job-name={name}", "#SBATCH --nodes=1",
             "#SBATCH --gpus-per-node=8", "#SBATCH --output=/dev/null",
             *(f"#SBATCH {o}" for o in opts), *body]
    return "\n".join(lines) + "\n"


class BackendContract:
    """Subclasses provide fixtures `backend` and `place_script` (text -> PurePath there)."""

    timeout_s = 60.0
    poll_s = 0.5

    def wait_status(self, backend, job_id: str, done: Callable[[JobStatus], bool]) -> JobStatus:
        deadline = time.monotonic() + self.timeout_s
        while True:
            st = backend.status([job_id]).get(job_id)
            if st is not None and done(st):
                return st
            if time.monotonic() > deadline:
                pytest.fail(f"job {job_id} did not reach the expected state: {st}")
            time.sleep(self.poll_s)

    def wait_record(self, backend, job_id: str, name: str = "contract") -> JobRecord:
        """Accounting lags the controller by a few seconds on a real Slurm, and Slurm 22.05's
        slurmdbd briefly shows a finished batch job as JobName=allocation before the real name
        arrives: wait for the settled record."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            rec = backend.accounting([job_id]).get(job_id)
            if rec is not None and rec.state.is_terminal and rec.step("batch") is not None \
                    and rec.name == name:
                return rec
            if time.monotonic() > deadline:
                pytest.fail(f"no final accounting record for job {job_id}: {rec}")
            time.sleep(self.poll_s)

    def test_submit_returns_distinct_numeric_ids(self, backend) -> None:
        a = backend.submit(batch_script("true"))
        b = backend.submit(batch_script("true"))
        assert a.isdigit() and b.isdigit() and a != b

    def test_status_of_many_jobs_in_one_call(self, backend) -> None:
        ids = [backend.submit(batch_script("sleep 2", name=f"many{i}")) for i in range(3)]
        got = backend.status([*ids, "999999"])
        assert set(got) == set(ids)
        assert {got[i].name for i in ids} == {"many0", "many1", "many2"}
        for i in ids:
            self.wait_status(backend, i, lambda s: s.state.is_terminal)

    def test_unknown_job_is_absent_not_an_error(self, backend) -> None:
        assert backend.status(["999999"]) == {}
        assert backend.accounting(["999998"]) == {}
        assert backend.status([]) == {} and backend.accounting([]) == {}

    def test_running_job_reports_nodes_and_gpus(self, backend) -> None:
        jid = backend.submit(batch_script("sleep 30"))
        st = self.wait_status(backend, jid, lambda s: s.state is JobState.RUNNING)
        assert st.nodes and st.n_nodes == 1 and st.n_gpus == 8
        backend.cancel([jid])
        st = self.wait_status(backend, jid, lambda s: s.state.is_terminal)
        assert st.state is JobState.CANCELLED

    def test_update_comment_keeps_hostile_text_verbatim(self, backend) -> None:
        jid = backend.submit(batch_script("sleep 30", opts=["--comment=first"]))
        assert self.wait_status(backend, jid, lambda s: True).comment == "first"
        backend.update_comment(jid, HOSTILE_COMMENT)
        assert backend.status([jid])[jid].comment == HOSTILE_COMMENT
        backend.cancel([jid])

    def test_failed_job_accounting_has_exit_code_and_steps(self, backend) -> None:
        jid = backend.submit(batch_script("exit 3", name="fails"))
        rec = self.wait_record(backend, jid, name="fails")
        assert rec.state is JobState.FAILED and rec.exit_code == 3
        assert rec.n_nodes == 1 and rec.n_gpus == 8
        batch = rec.step("batch")
        assert batch is not None and batch.exit_code == 3 and not batch.is_user_step

    def test_completed_job_accounting(self, backend) -> None:
        # JSON with quotes and spaces goes through argv, never through a shell or #SBATCH parsing
        jid = backend.submit(batch_script("true"), args=['--comment={"run": "ok"}'])
        rec = self.wait_record(backend, jid)
        assert rec.state is JobState.COMPLETED and rec.exit_code == 0
        assert rec.comment == '{"run": "ok"}' and rec.restarts == 0
        assert rec.start_time is not None and rec.end_time is not None
        assert rec.end_time >= rec.start_time and rec.elapsed_s >= 0

    def test_submit_script_path(self, backend, place_script) -> None:
        path = place_script(batch_script("true", name="from-file"))
        assert isinstance(path, PurePath)
        jid = backend.submit(path)
        assert backend.status([jid])[jid].name == "from-file"

    def test_args_override_script_options(self, backend) -> None:
        jid = backend.submit(batch_script("true", name="inscript"), args=["--job-name=fromargs"])
        assert backend.status([jid])[jid].name == "fromargs"

    def test_rejected_submission_raises(self, backend) -> None:
        with pytest.raises(SlurmError, match=r"(?i)partition"):
            backend.submit(batch_script("true", name="rejected",
                                        opts=["--partition=no_such_partition"]))
        with pytest.raises(SlurmError):
            backend.submit("echo no shebang\n")

    def test_requeue_counts_a_restart(self, backend) -> None:
        jid = backend.submit(batch_script("sleep 60", opts=["--requeue"]))
        self.wait_status(backend, jid, lambda s: s.state is JobState.RUNNING)
        backend.requeue(jid)
        st = self.wait_status(backend, jid, lambda s: s.restarts == 1)
        assert st.state in (JobState.PENDING, JobState.RUNNING, JobState.REQUEUED,
                            JobState.COMPLETING)
        backend.cancel([jid])

    def test_signal_to_steps_only_spares_the_batch_script(self, backend) -> None:
        # `slurmpod cancel --save`: SIGTERM reaches the steps, the batch shell goes on
        jid = backend.submit(batch_script("sleep 30"))
        self.wait_status(backend, jid, lambda s: s.state is JobState.RUNNING)
        backend.cancel([jid], signal="TERM", steps_only=True)
        time.sleep(4 * self.poll_s)
        assert backend.status([jid])[jid].state is JobState.RUNNING
        backend.cancel([jid])
        assert self.wait_status(backend, jid, lambda s: s.state.is_terminal).state \
            is JobState.CANCELLED

    def test_jobs_lists_my_jobs_with_their_work_dir(self, backend) -> None:
        jid = backend.submit(batch_script("sleep 30", name="listed", opts=["--chdir=/tmp"]))
        deadline = time.monotonic() + self.timeout_s
        while True:  # sacct learns of a new job a few seconds after submission
            listed = {j.job_id: j for j in backend.jobs(window_s=3600, name="listed")}
            if jid in listed or time.monotonic() > deadline:
                break
            time.sleep(self.poll_s)
        assert listed[jid].work_dir == "/tmp" and listed[jid].name == "listed"
        assert all(j.name == "listed" for j in listed.values())
        assert [j.job_id for j in backend.jobs(job_ids=[jid])] == [jid]
        backend.cancel([jid])

    def test_queued_finds_held_jobs_by_name_with_their_comment(self, backend) -> None:
        # submit's lookup right after sbatch: the controller's jobs under one name, not sacct's
        mine = backend.submit(batch_script("sleep 30", name="queued-x"),
                              args=['--comment={"token":"t1"}'])
        other = backend.submit(batch_script("sleep 30", name="queued-y"))
        held = {j.job_id: j for j in backend.queued("queued-x")}
        assert list(held) == [mine] and held[mine].comment == '{"token":"t1"}'
        assert backend.queued("queued") == []  # exact names only
        backend.cancel([mine, other])
        self.wait_status(backend, mine, lambda s: s.state.is_terminal)
        assert backend.queued("queued-x") == []  # an ended job is not held for queueing

    def test_partition_max_time(self, backend) -> None:
        # The sandbox's slurm.conf: batch (Default=YES, MaxTime=01:00:00), preemptible
        # (MaxTime=INFINITE); the fake is set up the same.
        assert backend.partition_max_time(None) == 60
        assert backend.partition_max_time("batch") == 60
        assert backend.partition_max_time("preemptible") is None
        assert backend.partition_max_time("no-such-partition") is None

    def test_nodes(self, backend) -> None:
        nodes = backend.nodes()
        assert nodes and all(n.n_gpus == 8 for n in nodes)
        first = nodes[0].name
        assert [n.name for n in backend.nodes(first)] == [first]


class TestFakeBackendContract(BackendContract):
    timeout_s = 5.0
    poll_s = 0.05

    @pytest.fixture
    def backend(self) -> FakeBackend:
        return FakeBackend(partitions=("batch", "preemptible"), max_time_min={"batch": 60})

    @pytest.fixture
    def place_script(self, backend: FakeBackend) -> Callable[[str], PurePath]:
        def place(text: str) -> PurePath:
            path = PurePath("/cluster/runs/job.sbatch")
            backend.add_file(str(path), text)
            return path

        return place


def test_fake_schedules_fifo_on_whole_nodes() -> None:
    now = [1000.0]
    fake = FakeBackend(nodes="n[1-4]", clock=lambda: now[0])
    big = fake.submit(batch_script("sleep 10", opts=["--nodes=3"]))
    second = fake.submit(batch_script("sleep 10", opts=["--nodes=2"]))
    st = fake.status([big, second])
    assert st[big].state is JobState.RUNNING and st[big].nodes == "n[1-3]"
    assert st[second].state is JobState.PENDING
    now[0] += 10
    st = fake.status([big, second])
    assert st[big].state is JobState.COMPLETED and st[second].state is JobState.RUNNING
    rec = fake.accounting([big])[big]
    assert rec.elapsed_s == 10 and rec.n_gpus == 3 * 8


def test_fake_time_limit_caps_duration() -> None:
    now = [0.0]
    fake = FakeBackend(clock=lambda: now[0])
    jid = fake.submit(batch_script("sleep 600", opts=["--time=1"]))
    now[0] += 61
    assert fake.accounting([jid])[jid].elapsed_s == 60


@pytest.mark.parametrize(("limit", "capped_s"), [
    ("1-00:00:00", 86400), ("1-02", 93600), ("0-00:02:30", 180), ("2:30", 180),
    ("03:00:00", 10800), ("UNLIMITED", 200000)])
def test_fake_reads_every_time_limit_form(limit: str, capped_s: int) -> None:
    """`D-HH:MM:SS` used to crash the fake (int("1-00")); seconds round up as in Slurm."""
    now = [0.0]
    fake = FakeBackend(clock=lambda: now[0])
    jid = fake.submit(batch_script("sleep 200000", opts=[f"--time={limit}"]))
    now[0] += 200001
    assert fake.accounting([jid])[jid].elapsed_s == capped_s


def test_fake_refuses_a_bad_time_limit_as_sbatch_does() -> None:
    with pytest.raises(SlurmError, match="Invalid --time specification"):
        FakeBackend().submit(batch_script("sleep 1", opts=["--time=1:2:3:4"]))
