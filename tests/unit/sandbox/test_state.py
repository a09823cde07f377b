"""`status` and `down` read the state file: states from the recorded processes, and `down` stops
exactly the recorded ones. Ordinary processes stand in for the daemons (no Slurm needed)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from slurmpod.sandbox import procs
from slurmpod.sandbox.cluster import Sandbox
from slurmpod.sandbox.layout import Ports

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def _write_state(root: Path, recs: list[procs.ProcRecord]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    doc = {"format": 1, "site": "x.toml", "ports": Ports.from_base(20000, 2).to_dict(),
           "processes": [r.to_dict() for r in recs]}
    (root / "sandbox.json").write_text(json.dumps(doc))


def test_status_follows_the_recorded_processes(tmp_path: Path) -> None:
    root = tmp_path / "sb"
    sb = Sandbox(root)
    assert sb.status().state == "absent"
    launcher = procs.Launcher(dict(os.environ), tmp_path)
    a = launcher.start("munged", SLEEPER, tmp_path / "a.out")
    b = launcher.start("mariadbd", SLEEPER, tmp_path / "b.out")
    try:
        _write_state(root, [a, b])
        st = sb.status()
        assert st.state == "running" and [p.alive for p in st.processes] == [True, True]
        assert st.ports["slurmctld"] == 20002
        procs.stop([b], timeout_s=5, children=launcher.children)
        assert sb.status().state == "degraded"
        procs.stop([a], timeout_s=5, children=launcher.children)
        assert sb.status().state == "stopped"
    finally:
        procs.stop([a, b], timeout_s=5, children=launcher.children)


def test_down_stops_recorded_processes_only(tmp_path: Path) -> None:
    root = tmp_path / "sb"
    launcher = procs.Launcher(dict(os.environ), tmp_path)
    ours = launcher.start("munged", SLEEPER, tmp_path / "a.out")
    theirs = launcher.start("other", SLEEPER, tmp_path / "b.out")
    # A record pointing at someone else's PID with a different command line (a recycled PID).
    impostor = procs.ProcRecord("slurmd:gpu001", theirs.pid, ("/usr/sbin/slurmd", "-D"),
                                theirs.start_ticks)
    try:
        _write_state(root, [ours, impostor])
        assert Sandbox(root).down() == ["munged"]
        launcher.children[ours.pid].wait(timeout=5)
        assert launcher.running(theirs)
        doc = json.loads((root / "sandbox.json").read_text())
        assert doc["processes"] == [] and doc["ports"]["slurmd_base"] == 20000
        assert Sandbox(root).down() == []
    finally:
        procs.stop([ours, theirs], timeout_s=5, children=launcher.children)


def test_every_taken_port_is_named(tmp_path: Path, monkeypatch) -> None:
    # A neighbour taken by another program must not hide the port the user asked about.
    import pytest

    from slurmpod.errors import SlurmpodError

    taken = {40001, 40003}
    monkeypatch.setattr(procs, "port_in_use", lambda port: port in taken)
    sb = Sandbox(tmp_path / "sb", base_port=40000)
    with pytest.raises(SlurmpodError) as info:
        sb._choose_ports(2, None)
    msg = info.value.message
    assert "port 40001 on 127.0.0.1 (slurmd #2) is in use" in msg
    assert "port 40003 on 127.0.0.1 (slurmdbd) is in use" in msg
    assert "40000" not in msg.replace("40000-", "")
