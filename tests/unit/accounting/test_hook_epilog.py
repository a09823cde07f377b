"""The epilog hook end to end on files, with Slurm replaced by a recording delivery function."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmpod.accounting.epilog import run_epilog, slurm_deliver
from slurmpod.accounting.spool import DeliveryError, Spool
from slurmpod.cli.hook import hook
from slurmpod.cli.main import main
from slurmpod.model.comment import decode_field, validate_admin_comment
from tests.unit.accounting.test_hook_figures import iteration_line

ME = os.getuid()


class Slurm:
    def __init__(self, up: bool = True) -> None:
        self.up = up
        self.admin: dict[str, str] = {}
        self.calls = 0

    def __call__(self, job_id: str, kind: str, value: str) -> None:
        self.calls += 1
        if not self.up:
            raise DeliveryError("sacctmgr exited 1: Problem talking to the database")
        assert kind == "admin_comment"
        self.admin[job_id] = value


def scontrol_line(job_id: str = "42", name: str = "train", *, gpus: int = 16, restarts: int = 0,
                  nodes: str = "gpu[001-002]", comment: str = "") -> str:
    """`scontrol --oneliner show job` of Slurm 22.05 (SLURM_TIME_FORMAT=%s), as the epilog sees
    it: the job is COMPLETING."""
    return (f"JobId={job_id} JobName={name} UserId=u({ME}) GroupId=u({ME}) MCS_label=N/A "
            f"Priority=1 Nice=0 Account=a QOS=normal JobState=COMPLETING Reason=None "
            f"Dependency=(null) Requeue=1 Restarts={restarts} BatchFlag=1 Reboot=0 ExitCode=0:0 "
            f"RunTime=00:01:40 TimeLimit=01:00:00 TimeMin=N/A SubmitTime=1699999800 "
            f"EligibleTime=1699999800 AccrueTime=1699999800 StartTime=1699999900 "
            f"EndTime=1700000000 Deadline=N/A Partition=batch AllocNode:Sid=login:1 "
            f"ReqNodeList=(null) ExcNodeList=(null) NodeList={nodes} BatchHost=gpu001 NumNodes=2 "
            f"NumCPUs=64 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:* "
            f"TRES=cpu=64,mem=500G,node=2,billing=64,gres/gpu={gpus} Socks/Node=* "
            f"Features=(null) DelayBoot=00:00:00 OverSubscribe=NO Command=/w/run.sh "
            f"WorkDir=/w Comment={comment} StdErr=/w/o StdIn=/dev/null StdOut=/w/o\n")


def job_env(tmp_path: Path, job_id: str = "42", stdout: str | None = None) -> dict[str, str]:
    comment = json.dumps({"slurmpod": "0.1.0", "fmt": 1, "run": "t", "flops_per_iter": 8e15,
                          "peak_tflops": 1000.0, "gpus": 16, "formula": "f1", "v": 1,
                          "mfu": 0.2, "iter": 3})
    return {"SLURM_JOB_ID": job_id, "SLURM_JOB_UID": str(ME), "SLURM_JOB_USER": "u",
            "SLURM_JOB_NAME": "train", "SLURM_JOB_NODELIST": "gpu[001-002]",
            "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_RESTART_COUNT": "0",
            "SLURM_JOB_EXIT_CODE2": "0:0", "SLURM_JOB_DERIVED_EC": "0",
            "SLURM_JOB_COMMENT": comment, "SLURM_JOB_WORK_DIR": str(tmp_path / "work"),
            "SLURM_JOB_STDOUT": stdout if stdout is not None else "logs/%x-%j.out"}


def write_log(tmp_path: Path, name: str = "logs/train-42.out") -> Path:
    path = tmp_path / "work" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    times = [9000.0, 7000.0, 2000.0, 2000.0, 2000.0]
    path.write_text("".join(iteration_line(i + 1, 100, ms) for i, ms in enumerate(times)))
    return path


def test_epilog_writes_record_and_admin_comment(tmp_path: Path) -> None:
    write_log(tmp_path)
    slurm = Slurm()
    spool_dir = tmp_path / "spool"
    assert run_epilog(job_env(tmp_path), spool_dir, deliver=slurm, now=lambda: 1.7e9,
                      peak_tflops=1000.0, show_job=lambda jid: scontrol_line(jid)) == 0
    admin = decode_field(slurm.admin["42"])
    assert admin is not None and validate_admin_comment(admin) == []
    # 8e15 FLOPs / 2 s / 16 GPUs (Slurm's gres/gpu) = 250 TFLOP/s; / 1000 peak = 0.25
    assert admin["mfu"] == 0.25 and admin["tflops"] == 250.0 and admin["iters"] == 5
    assert admin["peak"] == 1000.0 and admin["fv"] == "f1" and admin["src"] == "comment"
    assert admin["gpus"] == 16 and admin["gsrc"] == "slurm" and admin["attempt"] == 0
    rec = Spool(spool_dir).read_record("42", 0)
    assert rec["v"] == 1 and rec["admin_comment"] == slurm.admin["42"]
    assert rec["job"]["job_id"] == "42" and rec["job"]["nodelist"] == "gpu[001-002]"
    assert rec["log"]["path"] == str(tmp_path / "work" / "logs" / "train-42.out")
    assert rec["series"]["iter"] == [1, 2, 3, 4, 5] and rec["written"] == 1700000000
    assert rec["comment"]["run"] == "t"
    assert Spool(spool_dir).list_pending() == []
    assert "admin comment delivered" in (spool_dir / "hook.log").read_text()


def test_symlinked_log_is_refused_logged_and_not_read(tmp_path: Path) -> None:
    real = write_log(tmp_path, "elsewhere/secret.log")
    link = tmp_path / "work" / "logs" / "train-42.out"
    link.parent.mkdir(parents=True)
    link.symlink_to(real)
    slurm = Slurm()
    run_epilog(job_env(tmp_path), tmp_path / "spool", deliver=slurm)
    admin = decode_field(slurm.admin["42"])
    assert admin == {"v": 1, "attempt": 0, "err": "symlink"}
    rec = Spool(tmp_path / "spool").read_record("42")
    assert rec["log"] == {"path": str(link), "refused": "symlink"} and rec["series"] == {}
    text = (tmp_path / "spool" / "hook.log").read_text()
    assert "refused (symlink)" in text and "no data read" in text


def test_log_of_another_uid_is_refused(tmp_path: Path) -> None:
    write_log(tmp_path)
    env = job_env(tmp_path)
    env["SLURM_JOB_UID"] = str(ME + 1000)
    slurm = Slurm()
    run_epilog(env, tmp_path / "spool", deliver=slurm)
    assert decode_field(slurm.admin["42"]) == {"v": 1, "attempt": 0, "err": "owner"}


def test_slurmdbd_down_spools_then_next_epilog_delivers(tmp_path: Path) -> None:
    write_log(tmp_path)
    spool_dir = tmp_path / "spool"
    slurm = Slurm(up=False)
    assert run_epilog(job_env(tmp_path), spool_dir, deliver=slurm, peak_tflops=1000.0,
                      show_job=scontrol_line) == 0
    pending = Spool(spool_dir).list_pending()
    assert [(d["job_id"], d["kind"]) for d in pending] == [("42", "admin_comment")]
    assert "Problem talking to the database" in pending[0]["last_error"]
    assert "42" not in slurm.admin
    # slurmdbd is back; the next job's epilog delivers its own summary and the queued one
    slurm.up = True
    write_log(tmp_path, "logs/train-43.out")
    run_epilog(job_env(tmp_path, "43"), spool_dir, deliver=slurm, peak_tflops=1000.0,
               show_job=scontrol_line)
    assert set(slurm.admin) == {"42", "43"}
    assert decode_field(slurm.admin["42"])["mfu"] == 0.25
    assert Spool(spool_dir).list_pending() == []


def test_flush_command_delivers_pending(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = Spool(tmp_path)
    spool.put("7", "admin_comment", '{"v":1}')
    calls: list[list[str]] = []

    def fake_run(argv: list[str], timeout_s: float) -> tuple[int, str, str]:
        calls.append(argv)
        return 0, " Modified jobs...\n  7 submitted at 2026-11-29T18:00:00\n", ""

    monkeypatch.setattr("slurmpod.accounting.epilog.local_run", fake_run)
    res = CliRunner().invoke(hook, ["flush", "--spool", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["delivered"] == ["7.admin_comment"]
    assert calls == [["sacctmgr", "-i", "modify", "job", "where", "JobID=7", "set",
                      'AdminComment={"v":1}']]


def test_flush_command_reports_still_pending(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    Spool(tmp_path).put("7", "admin_comment", '{"v":1}')
    monkeypatch.setattr("slurmpod.accounting.epilog.local_run",
                        lambda argv, t: (1, "", "sacctmgr: error: Connection refused"))
    with pytest.raises(SystemExit) as exc:
        main(["hook", "flush", "--spool", str(tmp_path)])
    assert exc.value.code == 4  # SlurmError: something is still pending
    out, err = capsys.readouterr()
    assert "pending 1" in out and "slurmpod: error: 1 update(s) still pending" in err
    listed = CliRunner().invoke(hook, ["flush", "--spool", str(tmp_path), "--list", "--json"])
    assert json.loads(listed.output)[0]["attempts"] == 1


@pytest.mark.parametrize(
    ("rc", "out", "err", "ok"),
    [
        (0, " Modified jobs...\n  5 submitted at x\n", "", True),
        (1, " Nothing modified\n", "", False),  # not in slurmdbd yet: keep it
        (1, "", "sacctmgr: error: Problem talking to the database: Connection refused", False),
        (124, "", "timed out", False),
    ],
)
def test_slurm_deliver_reads_sacctmgr_outcome(rc: int, out: str, err: str, ok: bool) -> None:
    deliver = slurm_deliver(lambda argv, t: (rc, out, err))
    if ok:
        deliver("5", "admin_comment", "{}")
    else:
        with pytest.raises(DeliveryError):
            deliver("5", "admin_comment", "{}")


def test_job_not_yet_in_slurmdbd_is_retried_before_spooling(tmp_path: Path) -> None:
    """The epilog can run before slurmdbd has the job; sacctmgr then changes nothing, in the
    words of 22.05 (the first two) or 25.11 (the third)."""
    write_log(tmp_path)
    answers = iter([(1, "", "sacctmgr: error: Request didn't affect anything"),
                    (1, " Nothing modified\n", ""),
                    (1, " Modified jobs...\n", " Error with request: Data has not changed since "
                     "time specified\n"),
                    (0, " Modified jobs...\n", "")])
    calls: list[list[str]] = []

    def run(argv: list[str], timeout_s: float) -> tuple[int, str, str]:
        calls.append(argv)
        return next(answers)

    waits: list[float] = []
    run_epilog(job_env(tmp_path), tmp_path / "spool", deliver=slurm_deliver(run),
               sleep=waits.append)
    assert len(calls) == 4 and waits == [1.0, 2.0, 4.0]
    assert Spool(tmp_path / "spool").list_pending() == []


def test_slurmdbd_down_is_spooled_without_waiting(tmp_path: Path) -> None:
    write_log(tmp_path)
    waits: list[float] = []
    run_epilog(job_env(tmp_path), tmp_path / "spool", deliver=Slurm(up=False), sleep=waits.append)
    assert waits == [] and len(Spool(tmp_path / "spool").list_pending()) == 1


def test_epilog_never_fails(tmp_path: Path) -> None:
    # no job id, no uid, a crashing summariser, an unwritable spool: always 0
    assert run_epilog({}, tmp_path / "s1", deliver=Slurm()) == 0
    env = job_env(tmp_path)
    del env["SLURM_JOB_UID"]
    slurm = Slurm()
    assert run_epilog(env, tmp_path / "s2", deliver=slurm) == 0
    assert decode_field(slurm.admin["42"]) == {"v": 1, "attempt": 0, "err": "no-uid"}
    write_log(tmp_path)

    def boom(*a: object, **k: object) -> tuple[dict, dict]:
        raise RuntimeError("parser bug")

    assert run_epilog(job_env(tmp_path), tmp_path / "s3", deliver=slurm, summarise=boom) == 0
    assert decode_field(slurm.admin["42"]) == {"v": 1, "attempt": 0, "err": "summary-runtimeerror"}
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert run_epilog(job_env(tmp_path), blocker / "spool", deliver=slurm) == 0


def test_epilog_cli_always_exits_zero(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "not-a-job"}
    res = CliRunner().invoke(hook, ["epilog", "--spool", str(tmp_path / "sp"),
                                    "--head-mb", "lots", "--bogus"], env=env)
    assert res.exit_code == 0, res.output
    assert "no usable SLURM_JOB_ID" in (tmp_path / "sp" / "hook.log").read_text()


def fake_proc(root: Path, pid: int, ppid: int, argv: list[str], env: dict[str, str]) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0")
    (d / "stat").write_text(f"{pid} ({argv[0][:15]}) S {ppid} 1 1 0 -1\n")


def test_slurmctld_conf_found_in_ancestors(tmp_path: Path) -> None:
    from slurmpod.accounting.epilog import slurmctld_conf

    # wrapper sh (30) -> slurmscriptd (20, inherits slurmctld's environment) -> slurmctld (10)
    fake_proc(tmp_path, 10, 1, ["/usr/sbin/slurmctld", "-D", "-f", "/etc/x/slurm.conf"], {})
    fake_proc(tmp_path, 20, 10, ["slurmctld: slurmscriptd"], {"SLURM_CONF": "/sb/slurm.conf"})
    fake_proc(tmp_path, 30, 20, ["/bin/sh", "/sb/hooks/epilog"], {"SLURM_CONF": "/evil"})
    assert slurmctld_conf(tmp_path, 30) == "/sb/slurm.conf"  # the job-side env is not trusted
    (tmp_path / "20" / "environ").write_bytes(b"PATH=/bin\0")
    assert slurmctld_conf(tmp_path, 30) == "/etc/x/slurm.conf"  # slurmctld -f
    (tmp_path / "10" / "cmdline").write_bytes(b"/usr/sbin/slurmctld\0-D\0")
    assert slurmctld_conf(tmp_path, 30) is None  # default configuration
    assert slurmctld_conf(tmp_path, 99) is None  # no such process


def test_untracked_job_without_iterations_is_left_alone(tmp_path: Path) -> None:
    env = job_env(tmp_path)
    env["SLURM_JOB_COMMENT"] = "someone else's note"
    log = tmp_path / "work" / "logs" / "train-42.out"
    log.parent.mkdir(parents=True)
    log.write_text("hello from a non-Megatron job\n")
    slurm = Slurm()
    run_epilog(env, tmp_path / "spool", deliver=slurm)
    assert slurm.admin == {} and not list((tmp_path / "spool" / "records").iterdir())
    # ...unless it printed Megatron iterations, or the site asks for every job
    write_log(tmp_path)
    run_epilog(env, tmp_path / "spool", deliver=slurm)
    assert decode_field(slurm.admin["42"])["iters"] == 5
    assert "mfu" not in decode_field(slurm.admin["42"])  # no FLOPs without Comment or arguments
    log.write_text("hello again\n")
    run_epilog(env, tmp_path / "spool2", deliver=slurm, track_all=True)
    assert decode_field(slurm.admin["42"]) == {"v": 1, "iters": 0, "restarts": 0, "src": "none",
                                               "attempt": 0, "err": "no-iterations"}


def test_scontrol_job_asks_for_one_job_with_a_timeout() -> None:
    from slurmpod.accounting.epilog import COMMAND_TIMEOUT_S, scontrol_job

    seen: list[tuple[list[str], float]] = []

    def run(argv: list[str], t: float) -> tuple[int, str, str]:
        seen.append((argv, t))
        return 0, scontrol_line("3"), ""

    assert scontrol_job(run, "3") == scontrol_line("3")
    assert seen == [(["scontrol", "--oneliner", "show", "job", "3"], COMMAND_TIMEOUT_S)]
    assert scontrol_job(lambda a, t: (1, "", "Invalid job id"), "3") is None


_HOSTILE = st.one_of(
    st.text(max_size=80),
    st.sampled_from(["/etc/shadow", "/dev/zero", "/proc/self/environ", "../../etc/passwd",
                     "%", "%99999999j", "/tmp/%u/%x/%N/%A_%a", "\x00", "/" * 300, "~root/x"]),
)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stdout=_HOSTILE, comment=st.text(max_size=200),
       uid=st.sampled_from(["0", "1000", "x", ""]))
def test_epilog_survives_hostile_environment(tmp_path: Path, stdout: str, comment: str,
                                             uid: str) -> None:
    env = {"SLURM_JOB_ID": "5", "SLURM_JOB_UID": uid, "SLURM_JOB_STDOUT": stdout,
           "SLURM_JOB_COMMENT": comment, "SLURM_JOB_WORK_DIR": str(tmp_path),
           "SLURM_JOB_NODELIST": "gpu[001-00"}
    slurm = Slurm()
    assert run_epilog(env, tmp_path / "spool", deliver=slurm) == 0
    for value in slurm.admin.values():
        doc = decode_field(value)
        assert doc is not None and validate_admin_comment(doc) == []
        assert "iters" not in doc or doc["iters"] == 0  # none of those paths holds a real log
