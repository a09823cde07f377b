"""Sandbox faults on a second, 2-node sandbox: `down` stops exactly its own processes, a stale
directory is recovered, a taken port is reported by number, a daemon dying during start-up fails
`up` with its log. The session's shared sandbox is not touched."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmpod.errors import SlurmpodError

from .conftest import (
    finish_sandbox,
    new_state_dir,
    require_sandbox_tools,
    sandbox_site_variant,
    start_sandbox,
)


def tiny_site(where: Path) -> Path:
    """The built-in sandbox site cut down to one SU of 2 nodes."""
    return sandbox_site_variant(where, "tiny", [("sus = 4", "sus = 1"),
                                                ("nodes_per_su = 4", "nodes_per_su = 2")])


def _pid_gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2] in "ZX"


def _procs_mentioning(text: str) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmd and not _pid_gone(int(entry.name)):
                out.append(int(entry.name))
    return out


def _slurmpod(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurmpod", *args], capture_output=True,
                          text=True, timeout=120, env=env, check=False)


@pytest.fixture(scope="module")
def tiny() -> Iterator[tuple[Path, Path]]:
    require_sandbox_tools()
    state = new_state_dir("slurmpod-it-tiny-")
    site = tiny_site(state)
    yield state, site
    from slurmpod.sandbox.cluster import Sandbox

    finish_sandbox(Sandbox(state, site))


def test_down_stops_only_its_own_processes(tiny: tuple[Path, Path]) -> None:
    state, site = tiny
    sb = start_sandbox(state, site)
    recorded = [p.pid for p in sb.status().processes]
    assert len(recorded) == 2 + 4 and all(not _pid_gone(p) for p in recorded)
    # A process of someone else, looking like one of ours by name, is left alone.
    decoy = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", str(state)],
                             start_new_session=True)
    try:
        cp = _slurmpod("sandbox", "down", "--state", str(state))
        assert cp.returncode == 0, cp.stderr
        assert "stopped 6 daemon(s)" in cp.stdout
        assert [p for p in recorded if not _pid_gone(p)] == []
        assert decoy.poll() is None, "down killed a process it did not start"
        assert _procs_mentioning(str(state)) == [decoy.pid]
        assert sb.status().state == "stopped"
    finally:
        decoy.kill()
        decoy.wait()


def test_stale_directory_is_recovered(tiny: tuple[Path, Path]) -> None:
    state, site = tiny
    sb = start_sandbox(state, site)
    old = [p.pid for p in sb.status().processes]
    for pid in old:  # a crash: every daemon gone without `down`
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(_pid_gone(p) for p in old):
        time.sleep(0.05)
    assert sb.status().state == "stopped"
    from slurmpod.sandbox.cluster import Sandbox

    res = Sandbox(state, site).up()
    assert res.recovered and not res.already_running and res.nodes == 2
    st = sb.status()
    assert st.state == "running" and st.nodes == {"idle": 2}
    assert not set(old) & {p.pid for p in st.processes}
    sb.down()


def test_port_in_use_is_reported_by_number(tiny: tuple[Path, Path]) -> None:
    state, site = tiny
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        # The slurmctld port is base + number of nodes (2): make it the taken one. A neighbour
        # another program holds is named too, so the message names this port whatever else runs.
        cp = _slurmpod("sandbox", "up", str(site), "--state", str(state), "--base-port",
                       str(port - 2))
    assert cp.returncode == 4, cp.stderr
    assert f"port {port} on 127.0.0.1 (slurmctld) is in use" in cp.stderr
    assert "Traceback" not in cp.stderr
    assert _procs_mentioning(f"{state}/") == []


def test_daemon_dying_during_startup_fails_up_with_its_log(
        tiny: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state, site = tiny
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    fake = fake_bin / "slurmctld"
    fake.write_text("#!/bin/sh\necho 'slurmctld: fatal: emulated start-up failure' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}{os.pathsep}{os.environ.get('PATH', '')}")
    from slurmpod.sandbox.cluster import Sandbox

    sb = Sandbox(state, site, accounting=False)
    with pytest.raises(SlurmpodError) as info:
        sb.up()
    msg = info.value.message
    assert "slurmctld exited during start-up (exit code 1)" in msg
    assert "emulated start-up failure" in msg
    # What it had started (munged) is stopped again.
    doc = json.loads((state / "sandbox.json").read_text())
    assert doc["processes"] == []
    assert _procs_mentioning(f"{state}/") == []
