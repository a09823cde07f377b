"""Slurm-facing artefacts: topology.conf, topology-block.conf, topology.yaml, gres.conf, nodes.conf.

Pure: builds the lines (hostlists compressed exactly as `scontrol show hostlist` would) and renders
them through the templates in templates/topology/. Key names and syntax follow slurm.conf(5),
gres.conf(5), topology.conf(5) and topology.yaml(5).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slurmpod.model.hostlist import compress
from slurmpod.topology.layout import BlockLayout, TreeSwitch

if TYPE_CHECKING:
    from slurmpod.model.site import NodeType, Site


# Slurm 25.11 sets the job's IMEX channel up in the batch and interactive steps too (before:
# srun steps only) and adds --network=unique-channel-per-segment (RELEASE_NOTES 25.11).
IMEX_PER_SEGMENT_MIN = (25, 11)


@dataclass(frozen=True)
class SlurmContext:
    """What the Slurm files need beyond the site: the target version and sandbox overrides."""

    version: tuple[int, int]
    plugin: str  # "tree" | "block"
    gres_file_prefix: str | None = None
    localhost_base_port: int | None = None
    include_path: str = "/etc/slurm/nodes.conf"
    imex: bool = False  # SwitchType=switch/nvidia_imex (see generate.imex_enabled)


def _tree_rows(switches: Sequence[TreeSwitch]) -> list[dict[str, str]]:
    return [
        {"name": sw.name, "nodes": compress(sw.nodes) if sw.nodes else "",
         "switches": compress(sw.switches) if sw.switches else ""}
        for sw in switches
    ]


def topology_conf(env: Any, header: str, site: Site, switches: Sequence[TreeSwitch]) -> str:
    return env.get_template("topology/topology.conf.j2").render(
        header=header, site=site.site.name, rail_optimised=site.fabric.rail_optimised,
        rails=site.fabric.rails, leaf_unit="SU" if site.fabric.rail_optimised else "rack",
        switches=_tree_rows(switches),
    )


def _block_rows(layout: BlockLayout) -> list[dict[str, str]]:
    # An empty placeholder (Slurm >= 25.05) has no Nodes= at all.
    return [{"name": b.name, "nodes": compress(b.nodes) if b.nodes else ""}
            for b in layout.blocks]


def topology_block_conf(env: Any, header: str, site: Site, layout: BlockLayout) -> str:
    return env.get_template("topology/topology-block.conf.j2").render(
        header=header, site=site.site.name,
        unit_text="NVLink domain" if layout.unit == "nvlink-domain" else "scalable unit",
        placeholders=layout.placeholders, pad=_su_pad(site, layout),
        future=bool(layout.future_nodes),
        blocks=_block_rows(layout), block_sizes=",".join(map(str, layout.block_sizes)),
    )


def _su_pad(site: Site, layout: BlockLayout) -> int:
    """Blocks per SU after padding (for the comment)."""
    per_su: dict[int, int] = {}
    node_su = {n.name: n.su for n in site.inventory.nodes}
    for b in layout.blocks:
        if not b.placeholder:
            su = node_su[b.nodes[0]]
            per_su[su] = per_su.get(su, 0) + 1
    return 1 << (max(per_su.values()) - 1).bit_length() if per_su else 1


def topology_yaml(env: Any, header: str, ctx: SlurmContext, switches: Sequence[TreeSwitch],
                  layout: BlockLayout) -> str:
    return env.get_template("topology/topology.yaml.j2").render(
        header=header, default=ctx.plugin, switches=_tree_rows(switches),
        block_sizes=layout.block_sizes, blocks=_block_rows(layout),
    )


def gpu_order(nt: NodeType) -> list[int]:
    """Positions in `gpu_pci` sorted by PCI bus id: element i is the GPU behind /dev/nvidia<i>
    (the NVIDIA driver numbers minor devices in PCI bus order)."""
    return sorted(range(len(nt.gpu_pci)), key=lambda i: nt.gpu_pci[i].bus_id.lower())


def gres_lines(site: Site, ctx: SlurmContext) -> list[dict[str, str]]:
    """One line per (node type, NUMA node) over all nodes of that type."""
    lines = []
    for type_name, nodes in _nodes_by_type(site).items():
        nt = site.node_types[type_name]
        prefix = ctx.gres_file_prefix or nt.gpu_device_path
        by_numa: dict[int, list[int]] = {}
        for index, pos in enumerate(gpu_order(nt)):
            by_numa.setdefault(nt.gpu_pci[pos].numa, []).append(index)
        hosts = compress(nodes)
        for numa, indices in sorted(by_numa.items(), key=lambda kv: kv[1][0]):
            cores = nt.numa_cores(numa)
            lines.append({
                "nodes": hosts, "type": nt.gpu.model,
                "files": compress(f"{prefix}{i}" for i in indices),
                "cores": f"{cores.start}-{cores.stop - 1}" if len(cores) > 1 else str(cores.start),
            })
    return lines


def gres_conf(env: Any, header: str, site: Site, ctx: SlurmContext) -> str:
    return env.get_template("topology/gres.conf.j2").render(
        header=header, lines=gres_lines(site, ctx))


def _nodes_by_type(site: Site) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for node in site.inventory.nodes:
        out.setdefault(node.node_type, []).append(node.name)
    return out


def su_packing_weights(site: Site) -> dict[str, int]:
    """Node -> Weight that orders the SUs: every node of SU k (0-based) weighs k + 1.

    Slurm ranks nodes by weight before topology (topology/tree: eval_nodes_tree.c,
    select/cons_tres job_test.c _eval_nodes_topo on 22.05; topology/block: eval_nodes_block.c):
    it takes weight groups in ascending order and puts *every* usable node of a lower group into
    the allocation before it looks at the next group. A weight that is constant within an SU
    keeps that rule from mixing SUs for a job that fits in the lowest-weight SU with room, so
    small jobs fill SU 1 first, then SU 2, ...; docs/admin-guide.md ("Packing") has what it does
    to jobs of a whole SU on each plugin, measured."""
    return {n.name: n.su + 1 for n in site.inventory.nodes}


def node_lines(site: Site, ctx: SlurmContext) -> list[str]:
    """NodeName= bodies: consecutive nodes with identical attributes share one hostlist line."""
    inv = site.inventory
    weights = site.slurm.node_weights
    groups: list[tuple[tuple[Any, ...], int, int]] = []  # (attrs, first index, last index)
    for node in inv.nodes:
        nt = site.node_types[node.node_type]
        nvl = nt.domain_gpus > nt.gpus
        feats = [inv.rack_names[node.rack], inv.su_names[node.su]]
        if nvl:
            feats.append(inv.domain_names[node.domain])
        feats.append(nt.gpu.model)
        attrs = (node.node_type, ",".join(dict.fromkeys(feats)), weights.get(node.node_type))
        if groups and groups[-1][0] == attrs and groups[-1][2] == node.index - 1:
            groups[-1] = (attrs, groups[-1][1], node.index)
        else:
            groups.append((attrs, node.index, node.index))
    out = []
    for (type_name, feats, weight), first, last in groups:
        nt = site.node_types[type_name]
        hosts = compress(n.name for n in inv.nodes[first:last + 1])
        parts = [
            hosts, f"Sockets={nt.sockets}", f"CoresPerSocket={nt.cores_per_socket}",
            f"ThreadsPerCore={nt.threads_per_core}", f"RealMemory={nt.memory_mib}",
            f"Gres=gpu:{nt.gpu.model}:{nt.gpus}", f"Features={feats}",
        ]
        if weight is not None:
            parts.append(f"Weight={weight}")
        if ctx.localhost_base_port is not None:
            lo = ctx.localhost_base_port + first
            hi = ctx.localhost_base_port + last
            ports = f"[{lo}-{hi}]" if hi > lo else str(lo)
            parts += ["NodeHostname=localhost", "NodeAddr=127.0.0.1", f"Port={ports}"]
        out.append(" ".join(parts))
    return out


def partition_lines(site: Site) -> list[str]:
    inv = site.inventory
    parts = site.partitions
    if not parts:
        from slurmpod.model.site import Partition  # lazy: start-up

        parts = [Partition(name="batch", default=True)]
    out = []
    for p in parts:
        if p.sus == "all":
            hosts = [n.name for n in inv.nodes]
        else:
            wanted = {s - 1 for s in p.sus}
            hosts = [n.name for n in inv.nodes if n.su in wanted]
        opts = {
            "Nodes": compress(hosts), "Default": "YES" if p.default else "NO",
            "MaxTime": p.max_time, "State": "UP",
            # Whole 8-GPU nodes: one job per node keeps NVLink and the HCAs to that job.
            "OverSubscribe": "EXCLUSIVE",
        }
        for key, value in p.extra.items():
            opts[_canonical_key(key, opts)] = value
        out.append(" ".join([p.name, *(f"{k}={v}" for k, v in opts.items())]))
    return out


def _canonical_key(key: str, opts: dict[str, str]) -> str:
    # Slurm keys are case-insensitive: an extra `maxtime` replaces MaxTime, not adds a second.
    for k in opts:
        if k.lower() == key.lower():
            return k
    return key


def nodes_conf(env: Any, header: str, site: Site, ctx: SlurmContext, layout: BlockLayout | None,
               warnings: Sequence[str]) -> str:
    nvl = site.rack_scale_nvlink
    # Declared whenever topology-block.conf refers to them, so switching plugins needs no rerun.
    future = layout.future_nodes if layout is not None else ()
    return env.get_template("topology/nodes.conf.j2").render(
        header=header, include_path=ctx.include_path, plugin_line=f"topology/{ctx.plugin}",
        nvl=nvl, imex=ctx.imex, imex_per_segment=ctx.version >= IMEX_PER_SEGMENT_MIN,
        domain_example=", ".join(site.inventory.domain_names[:2]),
        warnings=list(warnings), node_lines=node_lines(site, ctx),
        future_nodes=compress(future) if future else "", partition_lines=partition_lines(site),
    )
