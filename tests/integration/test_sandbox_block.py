"""Block topology (Slurm >= 23.11, e.g. 24.11 on Debian 13) in its own 4-node sandbox: two blocks
of 2 nodes. On older Slurm the test skips: topology/block does not exist there (22.05 on
Debian 12 runs the tree tests instead)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmpod.config import load_site
from slurmpod.model.hostlist import expand

from .conftest import (
    SandboxFixture,
    finish_sandbox,
    new_state_dir,
    require_sandbox_tools,
    sandbox_site_variant,
    start_sandbox,
)


def _block_site(where: Path) -> Path:
    return sandbox_site_variant(where, "blocks", [('topology = "tree"', 'topology = "block"'),
                                                  ("sus = 4", "sus = 2"),
                                                  ("nodes_per_su = 4", "nodes_per_su = 2")])


@pytest.fixture(scope="module")
def blocks() -> Iterator[SandboxFixture]:
    require_sandbox_tools()
    from slurmpod.sandbox.prereqs import find_tools, release_string, slurm_version

    version = slurm_version(find_tools()["slurmd"])
    if version[:2] < (23, 11):
        pytest.skip(f"topology/block needs Slurm >= 23.11; this is {release_string(version)}")
    state = new_state_dir("slurmpod-it-block-")
    site = _block_site(state)
    sb = start_sandbox(state, site, accounting=False)
    scratch = state / "work"
    scratch.mkdir()
    try:
        yield SandboxFixture(sb, load_site(site), scratch)
    finally:
        finish_sandbox(sb)


def _blocks(text: str) -> dict[str, frozenset[str]]:
    out = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("BlockName="):
            fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
            out[fields["BlockName"]] = frozenset(expand(fields.get("Nodes", "")))
    return out


def test_scontrol_shows_the_generated_blocks(blocks: SandboxFixture) -> None:
    installed, files = blocks.generated_topology()
    assert installed in ("topology-block.conf", "topology.yaml"), installed
    installed_as = "topology.yaml" if installed == "topology.yaml" else "topology.conf"
    assert blocks.etc(installed_as) == files[installed], "the sandbox did not install it"
    generated = _blocks(files["topology-block.conf"])
    assert generated
    inv = blocks.inventory
    assert generated == {inv.su_names[i]: frozenset(n.name for n in inv.nodes_in_su(i))
                         for i in range(len(inv.su_names))}
    shown = _blocks(blocks.run(["scontrol", "show", "topology"]).stdout)
    assert {k: v for k, v in shown.items() if k in generated} == generated


def test_job_stays_inside_one_block(blocks: SandboxFixture) -> None:
    inv = blocks.inventory
    first = inv.nodes_in_su(0)[0].name
    blocker = blocks.sbatch("-N", "1", "-w", first, "--exclusive", "--time=5",
                            "--wrap", "sleep 300")
    try:
        blocks.wait_running(blocker)
        job = blocks.sbatch("-N", "2", "--exclusive", "--gpus-per-node=8", "--wrap", "sleep 2")
        blocks.wait_running(job)
        nodes = blocks.nodes_of(job)
        # First-fit would take the free node of block 1 and one of block 2.
        assert {inv.by_name[n].su for n in nodes} == {1}, nodes
        blocks.cancel(job)
    finally:
        blocks.cancel(blocker)
