"""Process identity, stopping and port probing of the sandbox, on ordinary processes (no Slurm),
plus the CLI's answers when no sandbox or no Slurm is there."""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from pathlib import Path

import pytest

from slurmpod.errors import ConfigError
from slurmpod.sandbox import prereqs, procs

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def launcher(tmp_path: Path) -> procs.Launcher:
    return procs.Launcher(dict(os.environ), tmp_path)


def test_started_process_is_recognised(launcher: procs.Launcher, tmp_path: Path) -> None:
    rec = launcher.start("sleeper", SLEEPER, tmp_path / "s.out")
    try:
        assert procs.is_ours(rec) and launcher.running(rec)
        assert rec.argv == tuple(SLEEPER)
        assert procs.ProcRecord.from_dict(rec.to_dict()) == rec
    finally:
        procs.stop([rec], timeout_s=5)
    assert not procs.is_ours(rec)


def test_stop_leaves_mismatched_records_alone(launcher: procs.Launcher, tmp_path: Path) -> None:
    rec = launcher.start("sleeper", SLEEPER, tmp_path / "s.out")
    # Same PID, but not what was recorded: a recycled PID or somebody else's process.
    other_argv = dataclasses.replace(rec, argv=(*rec.argv, "x"))
    other_start = dataclasses.replace(rec, start_ticks=rec.start_ticks - 1)
    try:
        skipped = procs.stop([other_argv, other_start], timeout_s=1)
        assert skipped == ["sleeper", "sleeper"]
        assert launcher.running(rec), "stop() killed a process whose record did not match"
        assert procs.stop([rec], timeout_s=5, children=launcher.children) == []
        assert not procs.is_ours(rec)
        assert launcher.exit_code(rec) is not None
    finally:
        launcher.children[rec.pid].kill()
        launcher.children[rec.pid].wait()


def test_stop_escalates_to_sigkill(launcher: procs.Launcher, tmp_path: Path) -> None:
    stubborn = [sys.executable, "-c",
                "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('ready', flush=True); time.sleep(60)"]
    rec = launcher.start("stubborn", stubborn, tmp_path / "k.out")
    import time

    deadline = time.monotonic() + 10
    while "ready" not in procs.tail(tmp_path / "k.out") and time.monotonic() < deadline:
        time.sleep(0.02)
    procs.stop([rec], timeout_s=0.5, children=launcher.children)
    assert not procs.is_ours(rec)
    assert launcher.exit_code(rec) == -9


def test_port_probe_sees_a_listener() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert procs.port_in_use(port)
        assert procs.can_connect(port)
    assert not procs.port_in_use(port)


def test_tail_of_missing_file_is_empty(tmp_path: Path) -> None:
    assert procs.tail(tmp_path / "nope") == ""
    (tmp_path / "log").write_text("".join(f"line {i}\n" for i in range(30)))
    assert procs.tail(tmp_path / "log", 3) == "line 27\nline 28\nline 29"


def test_missing_programs_name_the_install_command(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        prereqs.find_tools(path=str(tmp_path))
    err = info.value
    assert err.exit_code == 3
    for prog in ("munged", "mariadbd", "slurmctld", "slurmd", "slurmdbd"):
        assert prog in err.message
    assert "apt-get install" in err.message and "\n" not in err.message


def test_unresolvable_host_name_names_the_hosts_line(monkeypatch: pytest.MonkeyPatch) -> None:
    prereqs.check_host_name("localhost")  # resolves everywhere

    def no_dns(host: str, *_: object) -> None:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    with pytest.raises(ConfigError) as info:
        prereqs.check_host_name("node-x")
    err = info.value
    assert err.exit_code == 3 and "'node-x' does not resolve" in err.message
    assert err.hint == "add the line '127.0.0.1 node-x' to /etc/hosts"


def test_cli_without_slurm_exits_3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    from slurmpod.cli.main import main

    monkeypatch.setattr(prereqs, "EXTRA_DIRS", ())
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SystemExit) as info:
        main(["sandbox", "up", "--state", str(tmp_path / "sb")])
    assert info.value.code == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("slurmpod: error: the sandbox needs ")
    assert "apt-get install" in err[0] and len(err) == 1


def test_cli_env_and_status_without_sandbox(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from slurmpod.cli.main import main

    with pytest.raises(SystemExit) as info:
        main(["sandbox", "status", "--state", str(tmp_path)])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"sandbox {tmp_path}: absent"
    with pytest.raises(SystemExit) as info:
        main(["sandbox", "env", "--state", str(tmp_path)])
    assert info.value.code == 4
    assert f"no sandbox in {tmp_path}" in capsys.readouterr().err
