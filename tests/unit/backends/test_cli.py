"""CliBackend over a canned runner: the argv it builds, retries, errors, and client-side filters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import PurePath

import pytest

from slurmpod.backends import make_backend
from slurmpod.backends.cli import CliBackend
from slurmpod.backends.parse import SACCT_DELIMITER, SACCT_FIELDS
from slurmpod.errors import CommandError, SlurmError, UsageError
from slurmpod.model.jobs import JobState
from slurmpod.transport.base import CommandResult, CommandTimeoutError
from slurmpod.transport.local import LocalRunner
from tests.helpers import DATA_DIR

DATA = DATA_DIR / "slurm" / "22.05"


class CannedRunner:
    """Answers each command from a queue of (stdout | exception) per program name."""

    where = "canned"

    def __init__(self, answers: Mapping[str, list[str | Exception]]) -> None:
        self.answers = {k: list(v) for k, v in answers.items()}
        self.calls: list[tuple[list[str], str | None, Mapping[str, str] | None]] = []

    def run(self, argv: Sequence[str], *, input_text=None, timeout_s=None, env=None, cwd=None,
            check=True) -> CommandResult:
        self.calls.append((list(argv), input_text, env))
        answer = self.answers[argv[0]].pop(0)
        if isinstance(answer, Exception):
            raise answer
        delim = next((a.partition("=")[2] for a in argv if a.startswith("--delimiter=")), None)
        if delim:  # recorded with the unit separator; sacct prints the query's own delimiter
            answer = answer.replace(SACCT_DELIMITER, delim)
        return CommandResult(tuple(argv), 0, answer, "", 0.01)

    def write_text(self, path, text, mode=0o644):  # pragma: no cover - unused here
        raise NotImplementedError

    def upload(self, local_path, remote_dir, name=None):  # pragma: no cover
        raise NotImplementedError

    def close(self) -> None:
        pass


def cli(runner: CannedRunner) -> tuple[CliBackend, list[float]]:
    slept: list[float] = []
    return CliBackend(runner, retries=2, retry_delay_s=1.0, sleep=slept.append), slept


def transient(argv0: str) -> CommandError:
    return CommandError([argv0], 1, f"{argv0}: error: Unable to contact slurm controller "
                        "(connect failure)")


def test_submit_text_goes_to_stdin_and_path_as_argument() -> None:
    runner = CannedRunner({"sbatch": ["41\n", "42;cluster\n"]})
    backend, _ = cli(runner)
    assert backend.submit("#!/bin/bash\ntrue\n", args=["--comment=x y"]) == "41"
    argv, stdin, _ = runner.calls[0]
    assert argv == ["sbatch", "--parsable", "--comment=x y"] and stdin.startswith("#!/bin/bash")
    assert backend.submit(PurePath("/runs/a b/job.sbatch")) == "42"
    assert runner.calls[1][0] == ["sbatch", "--parsable", "/runs/a b/job.sbatch"]
    assert runner.calls[1][1] is None


def test_sbatch_is_never_retried() -> None:
    runner = CannedRunner({"sbatch": [transient("sbatch"), "7\n"]})
    backend, slept = cli(runner)
    with pytest.raises(CommandError, match="sbatch rejected the job") as exc:
        backend.submit("#!/bin/bash\n")
    assert exc.value.exit_code == 4 and exc.value.argv[0] == "sbatch"
    assert len(runner.calls) == 1 and slept == []


def test_sbatch_timeout_warns_about_duplicates() -> None:
    runner = CannedRunner({"sbatch": [CommandTimeoutError(["sbatch"], 60.0)]})
    backend, _ = cli(runner)
    with pytest.raises(SlurmError, match="may or may not have been queued") as exc:
        backend.submit("#!/bin/bash\n")
    assert "duplicate" in exc.value.hint


def test_sbatch_rejection_message_is_the_last_stderr_line() -> None:
    stderr = (DATA / "sbatch_error_bad_partition.stderr").read_text()
    runner = CannedRunner({"sbatch": [CommandError(["sbatch", "--parsable"], 1, stderr)]})
    backend, _ = cli(runner)
    with pytest.raises(CommandError) as exc:
        backend.submit("#!/bin/bash\n")
    assert exc.value.message == ("sbatch rejected the job: sbatch: error: Batch job submission "
                                 "failed: Invalid partition name specified")
    assert exc.value.stderr == stderr


def test_queries_retry_transient_failures_a_bounded_number_of_times() -> None:
    squeue = (DATA / "squeue.json").read_text()
    runner = CannedRunner({"squeue": [transient("squeue"), transient("squeue"), squeue]})
    backend, slept = cli(runner)
    assert set(backend.status(["1"])) == {"1"}
    assert slept == [1.0, 2.0]
    runner = CannedRunner({"squeue": [transient("squeue")] * 3})
    backend, slept = cli(runner)
    with pytest.raises(CommandError, match="Unable to contact") as exc:
        backend.status(["1"])
    assert len(runner.calls) == 3 and "slurmctld" in exc.value.hint


def test_non_transient_query_failure_is_not_retried() -> None:
    runner = CannedRunner({"sacct": [CommandError(["sacct"], 1, "sacct: error: Invalid field")]})
    backend, slept = cli(runner)
    with pytest.raises(CommandError):
        backend.accounting(["1"])
    assert slept == [] and len(runner.calls) == 1


def test_queued_filters_squeue_by_exact_name_and_live_state() -> None:
    # 22.05's squeue --json prints every job whatever --name says: run-e is RUNNING, train-a
    # (COMPLETED) has ended, and no job is named "run".
    squeue = (DATA / "squeue.json").read_text()
    runner = CannedRunner({"squeue": [squeue, squeue, squeue]})
    backend, _ = cli(runner)
    got = backend.queued("run-e")
    assert [j.job_id for j in got] == ["7"] and got[0].comment == '{"run":"e"}'
    assert runner.calls[0][0] == ["squeue", "--json", "--name=run-e"]
    assert backend.queued("train-a") == [] and backend.queued("run") == []


def test_status_filters_squeue_and_falls_back_to_sacct() -> None:
    # 22.05's squeue --json prints every job whatever --jobs says; ids gone from the
    # controller are looked up in accounting, once, for all of them.
    runner = CannedRunner({"squeue": [(DATA / "squeue.json").read_text()],
                           "sacct": [(DATA / "sacct.parsable2.txt").read_text()]})
    backend, _ = cli(runner)
    got = backend.status(["2", "6", "15"])
    assert set(got) == {"2", "6_0", "6_1", "15"}
    assert got["15"].state is JobState.COMPLETED  # from sacct
    squeue_argv = runner.calls[0][0]
    assert squeue_argv[:2] == ["squeue", "--json"] and "--jobs=2,6,15" in squeue_argv
    sacct_argv, _, env = runner.calls[1]
    assert "--jobs=15" in sacct_argv and env == {"SLURM_TIME_FORMAT": "%s"}


def test_status_of_ids_the_controller_no_longer_knows_comes_from_sacct() -> None:
    # Slurm 25.11's squeue exits 1 when none of the ids is known: that is "no jobs", not an error.
    gone = CommandError(["squeue"], 1, "slurm_load_jobs error: Invalid job id specified")
    runner = CannedRunner({"squeue": [gone], "sacct": [(DATA / "sacct.parsable2.txt").read_text()]})
    backend, slept = cli(runner)
    got = backend.status(["15"])
    assert set(got) == {"15"} and got["15"].state is JobState.COMPLETED
    assert slept == []
    other = CommandError(["squeue"], 1, "squeue: error: Invalid user: nobody")
    backend, _ = cli(CannedRunner({"squeue": [other]}))
    with pytest.raises(CommandError, match="Invalid user"):
        backend.status(["15"])


def test_accounting_argv() -> None:
    runner = CannedRunner({"sacct": [(DATA / "sacct.parsable2.txt").read_text()]})
    backend, _ = cli(runner)
    recs = backend.accounting(["2", "4", "2"])
    assert set(recs) == {"2", "4"} and recs["4"].restarts == 1
    argv = runner.calls[0][0]
    delim = next(a.partition("=")[2] for a in argv if a.startswith("--delimiter="))
    assert delim.startswith(SACCT_DELIMITER) and len(delim) == 17 and "--duplicates" in argv
    runner.answers["sacct"].append((DATA / "sacct.parsable2.txt").read_text())
    assert set(backend.accounting(["2"])) == {"2"}
    again = next(a for a in runner.calls[1][0] if a.startswith("--delimiter="))
    assert again != f"--delimiter={delim}"  # a fresh one per query
    assert f"--format={','.join(SACCT_FIELDS)}" in argv and "--jobs=2,4" in argv


def test_actions_argv() -> None:
    runner = CannedRunner({"scontrol": ["", "", "", (DATA / "scontrol_show_node.txt").read_text()],
                           "scancel": ["", ""]})
    backend, _ = cli(runner)
    backend.update_comment("5", 'x "y"; $(z)')
    backend.requeue("5")
    backend.requeue("5", hold=True)
    backend.cancel(["5", "6"])
    backend.cancel(["5"], signal="TERM")
    backend.cancel([])
    assert [c[0] for c in runner.calls[:3]] == [
        ["scontrol", "update", "JobId=5", 'Comment=x "y"; $(z)'],
        ["scontrol", "requeue", "5"], ["scontrol", "requeuehold", "5"]]
    assert runner.calls[3][0] == ["scancel", "5", "6"]
    assert runner.calls[4][0] == ["scancel", "--signal=TERM", "--full", "5"]
    assert len(backend.nodes("gpu[001-016]")) == 16
    assert runner.calls[5][0] == ["scontrol", "--oneliner", "show", "node", "gpu[001-016]"]


def test_make_backend() -> None:
    assert isinstance(make_backend("cli", LocalRunner()), CliBackend)
    with pytest.raises(UsageError, match="unknown Slurm backend"):
        make_backend("rest", LocalRunner())
    with pytest.raises(UsageError, match="over SSH"):
        make_backend("pyslurm", CannedRunner({}))


def test_parent_ids_select_array_tasks_and_het_components() -> None:
    from slurmpod.backends.base import parent_id, wanted

    assert parent_id("6_1") == "6" and parent_id("38+1") == "38" and parent_id("7") == "7"
    assert wanted("38+1", ["38"]) and wanted("6_0", ["6"]) and not wanted("60", ["6"])
    runner = CannedRunner({"squeue": [(DATA / "squeue_hetjob.json").read_text()]})
    backend, _ = cli(runner)
    assert set(backend.status(["38"])) == {"38+0", "38+1"}
    assert len(runner.calls) == 1  # found in squeue: no accounting fallback
