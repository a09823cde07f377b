"""Slurm's logical view of a site: the switch tree (topology/tree) and blocks (topology/block).

Pure. Both views are derived from the site and its fabric plan and are rendered by `slurm_files`
into topology.conf, topology-block.conf and topology.yaml.

Tree (rail-optimised fabric): all rail leaves of an SU see the same nodes, so they are merged into
one logical leaf named after the SU (NVIDIA topograph merges switches with identical child sets the
same way). Above it: one logical `spine` for a two-tier fabric; for three tiers one switch per
spine block (`spineblock<b>`, the SUs whose leaves share that block's spines) under one `core`.
Not rail-optimised: racks are the leaves. Slurm's topology guide advises listing leaves plus the
levels that matter; a full switch graph only slows scheduling.

Blocks (topology/block, Slurm >= 23.11): one block per NVLink domain on rack-scale systems
(GB200 NVL72: a rack), else one per SU. Slurm builds higher-level blocks from 2^k *consecutive*
base blocks, indexed from the first (src/plugins/topology/block/block_record.c), so when an SU holds
a number of blocks that is not a power of two, each SU is padded with placeholder blocks up to the
next power of two: aggregates then never straddle an SU boundary. What a placeholder block is
depends on the target Slurm (src/plugins/topology/block/block_record.c, block_record_validate):

* 23.11 - 24.11: a block without `Nodes=` is fatal ("lacks children") and so is one with fewer
  nodes than the first block ("children count lower than bblock_node_cnt"), so a placeholder
  lists `State=FUTURE` nodes that nodes.conf declares and that never run jobs.
* >= 25.05: a `BlockName=` without `Nodes=` is an empty block (SchedMD commit 700ca4f8
  "Support for topology/block with gaps in the block definitions", made the default without an
  option by 8f59f086 before 25.05.0; CHANGELOG 25.05.0rc1: "Allow topology/block Block
  definitions to have fewer nodes than the minimum BlockSize"; unchanged in 25.11), so
  placeholders are empty blocks and no FUTURE node exists.

A site whose SUs hold a power-of-two number of blocks (GB200 SuperPOD: 8 racks per SU) needs no
placeholder on any version. Trailing placeholders after the last SU are left out. BlockSizes = base
· 2^i for i = 0..floor(log2(blocks)), base = the smallest block's node count (the default of NVIDIA
topograph, which Slurm accepts: each size is a power-of-two multiple of the base).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slurmpod.model.site import Site
    from slurmpod.topology.fabric_plan import FabricPlan


@dataclass(frozen=True, slots=True)
class TreeSwitch:
    """One `SwitchName=` line: either `nodes` (a leaf) or `switches` (above the leaves)."""

    name: str
    nodes: tuple[str, ...] = ()
    switches: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Block:
    name: str
    nodes: tuple[str, ...]
    placeholder: bool = False


@dataclass(frozen=True)
class BlockLayout:
    blocks: tuple[Block, ...]
    block_sizes: tuple[int, ...]
    unit: str  # "nvlink-domain" | "su"
    future_nodes: tuple[str, ...]  # State=FUTURE nodes behind placeholder blocks (< 25.05)

    @property
    def placeholders(self) -> int:
        return sum(b.placeholder for b in self.blocks)


def tree_switches(site: Site, plan: FabricPlan) -> list[TreeSwitch]:
    """The logical switch tree, leaves first, root last."""
    inv = site.inventory
    prefix = site.fabric.switch_prefix
    if site.fabric.rail_optimised:
        leaf_names = list(inv.su_names)
        members: list[list[str]] = [[] for _ in leaf_names]
        for node in inv.nodes:
            members[node.su].append(node.name)
        # Block of each logical leaf: the block of its physical leaves (all rails share it).
        leaf_block = {sw.su: sw.block for sw in plan.leaves}
    else:
        leaf_names = list(inv.rack_names)
        members = [[] for _ in leaf_names]
        for node in inv.nodes:
            members[node.rack].append(node.name)
        leaf_block = {sw.rack: sw.block for sw in plan.leaves}
    out = [TreeSwitch(name, nodes=tuple(m)) for name, m in zip(leaf_names, members, strict=True)]
    if plan.tiers == 1 or len(out) == 1:
        return out
    if plan.tiers == 2:
        out.append(TreeSwitch(f"{prefix}spine", switches=tuple(leaf_names)))
    else:
        by_block: dict[int, list[str]] = {}
        for i, name in enumerate(leaf_names):
            by_block.setdefault(leaf_block[i] or 0, []).append(name)
        block_names = [f"{prefix}spineblock{b + 1}" for b in sorted(by_block)]
        out.extend(TreeSwitch(bn, switches=tuple(by_block[b]))
                   for bn, b in zip(block_names, sorted(by_block), strict=True))
        out.append(TreeSwitch(f"{prefix}core", switches=tuple(block_names)))
    taken = set(inv.by_name)
    for sw in out:
        if sw.name in taken:
            raise ValueError(
                f"fabric.switch_prefix: switch name {sw.name!r} clashes with a host, SU or rack "
                "name; set fabric.switch_prefix or rename the SUs/racks"
            )
        taken.add(sw.name)
    return out


# Slurm 25.05 accepts a BlockName without Nodes (an empty gap block); before, it is fatal.
EMPTY_BLOCK_MIN = (25, 5)


def block_layout(site: Site, version: tuple[int, int] = (24, 11)) -> BlockLayout:
    """Blocks for topology/block on Slurm `version` (see the module docstring for the rules)."""
    inv = site.inventory
    nvl = site.rack_scale_nvlink
    members: dict[int, list[str]] = {}
    su_of: dict[int, int] = {}
    names: list[str] = []
    if nvl:
        for node in inv.nodes:
            members.setdefault(node.domain, []).append(node.name)
            su_of.setdefault(node.domain, node.su)
        names = [inv.domain_names[d] for d in sorted(members)]
        unit = "nvlink-domain"
    else:
        for node in inv.nodes:
            members.setdefault(node.su, []).append(node.name)
            su_of.setdefault(node.su, node.su)
        names = [inv.su_names[s] for s in sorted(members)]
        unit = "su"
    keys = sorted(members)
    name_of = dict(zip(keys, names, strict=True))
    base = min(len(members[k]) for k in keys)
    per_su: dict[int, list[int]] = {}
    for k in keys:
        per_su.setdefault(su_of[k], []).append(k)
    pad_to = max(_next_pow2(len(v)) for v in per_su.values())
    blocks: list[Block] = []
    future: list[str] = []
    ph = 0
    last_su = max(per_su)
    taken = set(inv.by_name) | set(names)
    for su in sorted(per_su):
        for k in per_su[su]:
            blocks.append(Block(name_of[k], tuple(members[k])))
        if su == last_su:
            break
        for _ in range(pad_to - len(per_su[su])):
            ph += 1
            name = f"{site.slurm.cluster_name}-ph{ph:03d}"
            if name in taken:
                raise ValueError(f"slurm.cluster_name: placeholder block {name!r} clashes with "
                                 "a host or block name; choose another cluster_name")
            if version >= EMPTY_BLOCK_MIN:
                blocks.append(Block(name, (), placeholder=True))
                continue
            fake = tuple(f"{name}n{i + 1:03d}" for i in range(base))
            for f in fake:
                if f in taken:
                    raise ValueError(f"slurm.cluster_name: placeholder node {f!r} clashes with "
                                     "a host name; choose another cluster_name")
            future.extend(fake)
            blocks.append(Block(name, fake, placeholder=True))
    levels = len(blocks).bit_length() - 1  # floor(log2(blocks))
    sizes = tuple(base << i for i in range(levels + 1))
    return BlockLayout(tuple(blocks), sizes, unit, tuple(future))


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()
