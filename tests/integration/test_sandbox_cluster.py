"""The sandbox is a real Slurm that accepted the generated site: topology, GPUs, placement,
task layout and accounting, checked through Slurm's own commands."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator

import pytest

from slurmpod.model.hostlist import expand

from .conftest import SandboxFixture


def _kv_lines(text: str, first_key: str) -> dict[str, dict[str, str]]:
    """`SwitchName=x Level=0 Nodes=...` lines -> {x: {key: value}}."""
    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line.startswith(f"{first_key}="):
            continue
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        out[fields[first_key]] = fields
    return out


def _tree(lines: dict[str, dict[str, str]]) -> dict[str, tuple[frozenset[str], frozenset[str]]]:
    """switch -> (all nodes below it, child switches), resolving nodes of upper switches."""
    children = {n: frozenset(expand(f["Switches"])) if f.get("Switches") else frozenset()
                for n, f in lines.items()}

    def nodes(name: str) -> frozenset[str]:
        own = frozenset(expand(lines[name]["Nodes"])) if lines[name].get("Nodes") else frozenset()
        return own.union(*(nodes(c) for c in children[name]))

    return {n: (nodes(n), children[n]) for n in lines}


def test_scontrol_topology_equals_generated_tree(sandbox: SandboxFixture) -> None:
    installed, files = sandbox.generated_topology()
    if installed == "topology-block.conf":
        pytest.skip("this Slurm got a block topology; see test_sandbox_block.py")
    # What Slurm reads is the generator's file for this release, untouched.
    installed_as = "topology.yaml" if installed == "topology.yaml" else "topology.conf"
    assert sandbox.etc(installed_as) == files[installed]
    generated = _kv_lines(files["topology.conf"], "SwitchName")
    assert generated
    shown = _kv_lines(sandbox.run(["scontrol", "show", "topology"]).stdout, "SwitchName")
    assert _tree(shown) == _tree(generated)
    # And the generated leaves are the site's SUs (independent of the generator).
    inv = sandbox.inventory
    leaves = {n: nodes for n, (nodes, kids) in _tree(generated).items() if not kids}
    assert leaves == {inv.su_names[i]: frozenset(n.name for n in inv.nodes_in_su(i))
                      for i in range(len(inv.su_names))}


def test_every_node_has_eight_gpus(sandbox: SandboxFixture) -> None:
    out = sandbox.run(["scontrol", "-o", "show", "node"]).stdout
    gres = dict(re.findall(r"NodeName=(\S+) .*?\bGres=(\S+)", out))
    assert sorted(gres) == sorted(n.name for n in sandbox.inventory.nodes)
    for node, value in gres.items():
        m = re.fullmatch(r"gpu:(?:[A-Za-z0-9_.-]+:)?(\d+)(?:\(.*\))?", value)
        assert m and int(m.group(1)) == 8, f"{node}: Gres={value}"
    # Usable (other tests may hold some nodes), never down, drained or invalid.
    states = sandbox.run(["sinfo", "-h", "-N", "-o", "%T"]).stdout.split()
    assert set(states) <= {"idle", "allocated", "mixed", "completing"}, states


def _su_of(sandbox: SandboxFixture, nodes: list[str]) -> set[int]:
    by_name = sandbox.inventory.by_name
    return {by_name[n].su for n in nodes}


@pytest.fixture(scope="module")
def blockers(sandbox: SandboxFixture) -> Iterator[list[str]]:
    """Occupy the first node of SU 1 and SU 2, so first-fit placement would straddle SUs."""
    inv = sandbox.inventory
    taken = [inv.nodes_in_su(0)[0].name, inv.nodes_in_su(1)[0].name]
    job = sandbox.sbatch("-N", "2", "-w", ",".join(taken), "--exclusive", "-J", "blocker",
                         "--time=5", "--wrap", "sleep 300")
    sandbox.wait_running(job)
    yield taken
    sandbox.cancel(job)


def _free_per_su(sandbox: SandboxFixture, taken: list[str]) -> list[int]:
    inv = sandbox.inventory
    return [sum(n.name not in taken for n in inv.nodes_in_su(i)) for i in range(len(inv.su_names))]


def test_switches_one_lands_inside_one_su(sandbox: SandboxFixture, blockers: list[str]) -> None:
    free = _free_per_su(sandbox, blockers)
    assert max(free) >= 4, "the sandbox site needs an SU with 4 free nodes for this test"
    job = sandbox.sbatch("--exclusive", "--switches=1", "-N", "4", "--gpus-per-node=8",
                         "-J", "one-su", "--wrap", "srun hostname")
    rec = sandbox.wait_job(job)
    nodes = expand(rec["nodes"])
    assert len(nodes) == 4 and not set(nodes) & set(blockers)
    assert len(_su_of(sandbox, nodes)) == 1, nodes


def test_job_bigger_than_an_su_spans_fewest_sus(sandbox: SandboxFixture,
                                                blockers: list[str]) -> None:
    inv = sandbox.inventory
    n_nodes = 2 * max(len(inv.nodes_in_su(i)) for i in range(len(inv.su_names)))
    # Fewest SUs that can hold the job: fill the emptiest SUs first.
    free = sorted(_free_per_su(sandbox, blockers), reverse=True)
    fewest = next(k for k in range(1, len(free) + 1) if sum(free[:k]) >= n_nodes)
    # First-fit in name order would need more: the test can tell the difference.
    first_fit = [n.name for n in inv.nodes if n.name not in blockers][:n_nodes]
    assert len(_su_of(sandbox, first_fit)) > fewest
    job = sandbox.sbatch("--exclusive", "-N", str(n_nodes), "--gpus-per-node=8", "-J", "big",
                         "--wrap", "true")
    rec = sandbox.wait_job(job)
    nodes = expand(rec["nodes"])
    assert len(nodes) == n_nodes
    assert len(_su_of(sandbox, nodes)) == fewest, nodes


def test_srun_runs_eight_tasks_per_node(sandbox: SandboxFixture) -> None:
    cp = sandbox.run(["srun", "-N", "2", "--ntasks-per-node=8", "--exclusive", "-J", "tasks",
                      "--gpus-per-node=8", "sh", "-c",
                      'echo "$SLURMD_NODENAME $SLURM_LOCALID $SLURM_PROCID"'], timeout_s=90)
    rows = [line.split() for line in cp.stdout.splitlines() if line.strip()]
    per_node = Counter(r[0] for r in rows)
    assert len(per_node) == 2 and set(per_node.values()) == {8}, per_node
    for node in per_node:
        assert sorted(int(r[1]) for r in rows if r[0] == node) == list(range(8))
    assert sorted(int(r[2]) for r in rows) == list(range(16))


def test_sacct_json_has_comment_and_gpu_count(sandbox: SandboxFixture) -> None:
    comment = '{"tag":"it-sacct","n":2}'
    job = sandbox.sbatch("--exclusive", "-N", "2", "--gpus-per-node=8", "-J", "acct",
                         f"--comment={comment}", "--wrap", "srun true")
    rec = sandbox.wait_job(job)
    assert str(rec["job_id"]) == job
    got_comment = rec["comment"]["job"] if isinstance(rec["comment"], dict) else rec["comment"]
    assert got_comment == comment
    gpus = [t["count"] for t in rec["tres"]["allocated"]
            if t.get("type") == "gres" and t.get("name") == "gpu"]
    assert gpus == [2 * 8]
    assert len(expand(rec["nodes"])) == 2


def test_second_up_reports_running(sandbox: SandboxFixture) -> None:
    from slurmpod.sandbox.cluster import Sandbox

    before = [(p.name, p.pid) for p in sandbox.sb.status().processes]
    again = Sandbox(sandbox.sb.state_dir).up()
    assert again.already_running and again.nodes == len(sandbox.inventory.nodes)
    assert [(p.name, p.pid) for p in sandbox.sb.status().processes] == before
    cli = sandbox.run([*_slurmpod(), "sandbox", "up", "--state", str(sandbox.sb.state_dir)])
    assert "already running" in cli.stdout
    # Asking the live directory for another site is refused, and changes nothing.
    other = sandbox.run([*_slurmpod(), "sandbox", "up", "dgx-h100-superpod", "--state",
                         str(sandbox.sb.state_dir)], check=False)
    assert other.returncode == 4 and "already runs site" in other.stderr
    assert [(p.name, p.pid) for p in sandbox.sb.status().processes] == before


def _slurmpod() -> list[str]:
    import sys

    return [sys.executable, "-m", "slurmpod"]


def test_status_and_env_commands(sandbox: SandboxFixture) -> None:
    import json

    st = json.loads(sandbox.run([*_slurmpod(), "sandbox", "status", "--json", "--state",
                                 str(sandbox.sb.state_dir)]).stdout)
    assert st["state"] == "running"
    assert sum(st["nodes"].values()) == len(sandbox.inventory.nodes)
    assert len(st["processes"]) == len(sandbox.inventory.nodes) + 4
    env = sandbox.run([*_slurmpod(), "sandbox", "env", "--state",
                       str(sandbox.sb.state_dir)]).stdout
    assert f"export SLURM_CONF={sandbox.sb.slurm_conf}" in env.splitlines()
