"""`Sandbox.kill_slurmd` / `start_slurmd`: one node's daemon killed and started again, the state
file following, so `down` still stops exactly what runs. A sleeper stands in for slurmd."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from slurmpod.sandbox import procs
from slurmpod.sandbox.cluster import Sandbox, SandboxError
from slurmpod.sandbox.layout import Ports

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)", "slurmd-stand-in"]


def test_kill_then_start_one_slurmd_keeps_the_record(tmp_path: Path) -> None:
    root = tmp_path / "sb"
    root.mkdir()
    launcher = procs.Launcher(dict(os.environ), tmp_path)
    node = launcher.start("slurmd:gpu002", SLEEPER, tmp_path / "d.out")
    other = launcher.start("slurmd:gpu001", SLEEPER, tmp_path / "e.out")
    doc = {"format": 1, "site": "x.toml", "ports": Ports.from_base(20000, 2).to_dict(),
           "processes": [other.to_dict(), node.to_dict()]}
    (root / "sandbox.json").write_text(json.dumps(doc))
    sb = Sandbox(root)
    started: list[procs.ProcRecord] = []
    try:
        assert sb.kill_slurmd("gpu002")
        launcher.children[node.pid].wait(timeout=5)
        assert not procs.is_ours(node) and procs.is_ours(other)
        assert not sb.kill_slurmd("gpu002")  # already gone: nothing to do
        assert sb.start_slurmd("gpu002")
        recs = [procs.ProcRecord.from_dict(d)
                for d in json.loads((root / "sandbox.json").read_text())["processes"]]
        started = [r for r in recs if r.name == "slurmd:gpu002"]
        assert len(recs) == 2 and started[0].pid != node.pid and procs.is_ours(started[0])
        assert started[0].argv[-1] == "slurmd-stand-in"
        assert not sb.start_slurmd("gpu002")  # running: not started twice
        assert sorted(sb.down()) == ["slurmd:gpu001", "slurmd:gpu002"]
        assert not procs.is_ours(started[0])
    finally:
        procs.stop([node, other, *started], timeout_s=5, children=launcher.children)


def test_unknown_node_is_one_error(tmp_path: Path) -> None:
    root = tmp_path / "sb"
    root.mkdir()
    (root / "sandbox.json").write_text(json.dumps({"format": 1, "processes": []}))
    sb = Sandbox(root)
    assert not sb.kill_slurmd("gpu009")
    with pytest.raises(SandboxError, match="gpu009"):
        sb.start_slurmd("gpu009")
