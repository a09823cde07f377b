"""Check multi-node NVLink domains (GB200/GB300 NVL72) from `nvidia-smi -q` captured per node.

Since driver R550, `nvidia-smi -q` prints for each GPU of a multi-node NVLink system a `Fabric`
section (also alone with `nvidia-smi -q -d FABRIC`):

    GPU 00000008:01:00.0
        ...
        Fabric
            State                             : Completed
            Status                            : Success
            CliqueId                          : 32766
            ClusterUUID                       : 5f0c2e4c-7b1d-4c0e-9a55-3e9d2f41c0aa
            Health
                Bandwidth                     : Full

`State` is Not Supported / Not Started / In Progress / Completed (the GPU's registration with
the NVLink fabric manager); `ClusterUUID` names the NVLink domain the GPU belongs to and
`CliqueId` its NVLink partition inside it (NVIDIA MNNVL user guide; IMEX guide). GPUs can reach
each other over NVLink exactly when both are Completed with the same (ClusterUUID, CliqueId).

The site says which nodes form each NVLink domain (`Inventory.domain`: one NVL72 rack). The
check takes each domain's majority (ClusterUUID, CliqueId) as what the rack really is and
reports every node, GPU or domain that disagrees, one finding each (the `Finding` of
`fabric.check`, `node` set): kinds in `NVLINK_FINDING_KINDS`.

Input: a directory with one file per node (`<host>`, `<host>.txt`, `<host>.log`; the name up to
its first dot is the host), or one file of `host: line` prefixed output as pdsh and
`clush` without -b write it. Pure apart from `read_nvlink_input`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from slurmpod.errors import UsageError
from slurmpod.fabric.check import CheckReport, Finding

if TYPE_CHECKING:
    from slurmpod.model.site import Site

NVLINK_FINDING_KINDS: dict[str, str] = {
    "nvlink-not-ready": "a GPU has not joined the NVLink fabric (State not Completed, or an "
                        "error Status)",
    "nvlink-degraded": "a GPU's NVLink fabric bandwidth health is not Full",
    "nvlink-split-node": "the GPUs of one node are in different NVLink cliques",
    "nvlink-wrong-domain": "a node is in the NVLink domain of another rack of the site",
    "nvlink-partitioned": "a node is in another NVLink clique (partition) than the rest of its "
                          "rack",
    "nvlink-merged-domains": "two racks of the site report one NVLink domain and clique",
    "nvlink-gpu-count": "a node reports fewer GPUs than its node type has",
    "nvlink-node-missing": "no nvidia-smi output for a node of the site",
    "nvlink-unknown-node": "nvidia-smi output for a host the site does not have",
}

READY_FIX = ("on the NVLink switch trays, check the NVLink fabric manager (NMX-Controller or "
             "nvidia-fabricmanager) and the tray's NVLink cabling; on the node, "
             "`nvidia-smi -q -d FABRIC` must show State Completed, Status Success; then restart "
             "nvidia-imex")


@dataclass
class GpuFabric:
    bus_id: str
    state: str = ""
    status: str = ""
    clique: str = ""
    cluster_uuid: str = ""
    bandwidth: str = ""

    @property
    def ready(self) -> bool:
        return self.state == "Completed" and self.status in ("Success", "")

    @property
    def key(self) -> tuple[str, str]:
        return self.cluster_uuid, self.clique


@dataclass
class NodeFabric:
    host: str
    gpus: list[GpuFabric] = field(default_factory=list)


_GPU = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_KV = re.compile(r"^(\s*)([^:]+?)\s*:\s*(.*?)\s*$")
_PREFIX = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*): ?(.*)$")
_KEYS = {"State": "state", "Status": "status", "CliqueId": "clique",
         "ClusterUUID": "cluster_uuid", "Bandwidth": "bandwidth"}


def parse_nvidia_smi(text: str, host: str) -> NodeFabric:
    """The Fabric section of every GPU in one node's `nvidia-smi -q` output."""
    node = NodeFabric(host)
    gpu: GpuFabric | None = None
    fabric_indent: int | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        m = _GPU.match(line)
        if m:
            gpu = GpuFabric(m.group(1).lower()[-12:])  # 00000008:01:00.0 -> 0008:01:00.0
            node.gpus.append(gpu)
            fabric_indent = None
            continue
        if gpu is None or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if line.strip() == "Fabric":
            fabric_indent = indent
            continue
        if fabric_indent is None:
            continue
        if indent <= fabric_indent:  # the next section of this GPU
            fabric_indent = None
            continue
        kv = _KV.match(line)
        if kv and kv.group(2) in _KEYS and not getattr(gpu, _KEYS[kv.group(2)]):
            setattr(gpu, _KEYS[kv.group(2)], kv.group(3))
    return node


def split_prefixed(text: str, source: str) -> dict[str, str]:
    """`host: line` output (pdsh, clush) -> host -> its own lines."""
    out: dict[str, list[str]] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        m = _PREFIX.match(line)
        if not m:
            raise UsageError(f"--nvlink {source}:{lineno}: expected 'host: line' (pdsh/clush "
                             "output) or a directory of one nvidia-smi -q file per node")
        out.setdefault(m.group(1).split(".", 1)[0], []).append(m.group(2))
    return {h: "\n".join(lines) for h, lines in out.items()}


def read_nvlink_input(path: Path) -> dict[str, NodeFabric]:
    """Host -> its GPUs' fabric state, from a directory of per-node files or one prefixed file."""
    texts: dict[str, str] = {}
    try:
        if path.is_dir():
            for f in sorted(p for p in path.iterdir() if p.is_file()):
                host = f.name.split(".", 1)[0]
                if host in texts:
                    raise UsageError(f"--nvlink {path}: two files for host {host!r}")
                texts[host] = f.read_text(errors="replace")
        else:
            texts = split_prefixed(path.read_text(errors="replace"), str(path))
    except OSError as exc:
        raise UsageError(f"--nvlink {path}: {exc.strerror or exc}") from None
    nodes = {h: parse_nvidia_smi(t, h) for h, t in texts.items()}
    if not any(n.gpus for n in nodes.values()):
        raise UsageError(f"--nvlink {path}: no GPU sections of `nvidia-smi -q` output found",
                         hint="capture with: pdsh -w <nodes> nvidia-smi -q > nvsmi.txt")
    return nodes


_Key = tuple[str, str]  # (ClusterUUID, CliqueId): one NVLink partition


def check_nvlink(site: Site, nodes: dict[str, NodeFabric], source: str) -> CheckReport:
    """Every disagreement between the site's NVLink domains and what the GPUs report."""
    inv = site.inventory
    if not any(nt.domain_gpus > nt.gpus for nt in site.node_types.values()):
        raise UsageError(f"--nvlink: site {site.site.name} has no NVLink domain larger than a "
                         "node; nothing to check")
    report = CheckReport(site=site.site.name, source=source)
    add = report.findings.append
    members = _domain_members(site)
    # Per node: its one clique key, or None (no ready GPU / split).
    node_key: dict[str, _Key | None] = {}
    for host in sorted(nodes):
        if host not in inv.by_name:
            add(Finding("nvlink-unknown-node", "warning", host,
                        f"{host} reports NVLink fabric state but is not in site "
                        f"{site.site.name}", "add the node to the site file, or leave its "
                        "output out", node=host))
            continue
        node_key[host] = _judge_node(site, host, nodes[host], add)
    # Per domain: the majority key is what the rack is; who disagrees.
    domain_key: dict[int, _Key] = {}
    for dom, names in sorted(members.items()):
        votes = Counter(k for h in names if (k := node_key.get(h)) is not None)
        if votes:
            domain_key[dom] = votes.most_common(1)[0][0]
    owner = _judge_merged_domains(site, domain_key, add)
    _judge_domain_members(site, members, nodes, node_key, domain_key, owner, add)
    report.stats = {
        "nodes_planned": sum(len(v) for v in members.values()),
        "nodes_seen": sum(1 for h in nodes if h in inv.by_name),
        "gpus_seen": sum(len(n.gpus) for n in nodes.values()),
        "gpus_ready": sum(g.ready for n in nodes.values() for g in n.gpus),
        "domains_planned": len(members),
        "domains_seen": len(domain_key),
    }
    return report


def _domain_members(site: Site) -> dict[int, list[str]]:
    """NVLink domain -> its nodes, for node types whose domain spans more than a node."""
    members: dict[int, list[str]] = {}
    for n in site.inventory.nodes:
        if site.node_types[n.node_type].domain_gpus > site.node_types[n.node_type].gpus:
            members.setdefault(n.domain, []).append(n.name)
    return members


def _judge_node(site: Site, host: str, node: NodeFabric,
                add: Callable[[Finding], None]) -> _Key | None:
    """One node's GPU count and GPUs' fabric state; its one clique key, or None (no ready
    GPU, or its GPUs split over cliques)."""
    nt = site.node_types[site.inventory.by_name[host].node_type]
    if len(node.gpus) < nt.gpus:
        add(Finding("nvlink-gpu-count", "error", host,
                    f"{host} reports {len(node.gpus)} GPU(s), its node type has {nt.gpus}",
                    "check that every GPU is visible (nvidia-smi -L, dmesg for Xid/fallen "
                    "off the bus) and capture nvidia-smi -q again", node=host))
    keys: Counter[_Key] = Counter()  # (ClusterUUID, CliqueId) -> GPUs
    for g in node.gpus:
        subject = f"{host} GPU {g.bus_id}"
        if not g.ready:
            add(Finding("nvlink-not-ready", "error", subject,
                        f"{subject}: NVLink fabric State {g.state or 'missing'}, Status "
                        f"{g.status or 'missing'}: the GPU cannot use multi-node NVLink",
                        READY_FIX, node=host))
            continue
        if g.bandwidth and g.bandwidth != "Full":
            add(Finding("nvlink-degraded", "warning", subject,
                        f"{subject}: NVLink fabric bandwidth {g.bandwidth} (not Full)",
                        "check the tray's NVLink cartridge/cable connection and the NVLink "
                        "switch trays' port state; reseat or replace, then re-run",
                        node=host))
        keys[g.key] += 1
    if len(keys) > 1:
        detail = ", ".join(f"clique {c} of {u} ({k} GPU)" for (u, c), k in keys.items())
        add(Finding("nvlink-split-node", "error", host,
                    f"{host}: its GPUs are in {len(keys)} NVLink cliques: {detail}",
                    "one node's GPUs belong in one partition: fix the NVLink partition "
                    "(NMX-Manager) so the tray's GPUs are together", node=host))
        return None
    return next(iter(keys)) if keys else None


def _judge_merged_domains(site: Site, domain_key: dict[int, _Key],
                          add: Callable[[Finding], None]) -> dict[_Key, int]:
    """Two racks in one NVLink partition; returns each partition's (first) domain."""
    inv = site.inventory
    owner: dict[_Key, int] = {}
    for dom, dkey in domain_key.items():
        if dkey in owner:
            a, b = inv.domain_names[owner[dkey]], inv.domain_names[dom]
            add(Finding("nvlink-merged-domains", "error", f"{a}+{b}",
                        f"racks {a} and {b} report one NVLink domain {dkey[0]} clique {dkey[1]}: "
                        "the site has them as two NVLink domains",
                        "check the site's rack layout (nodes_per_rack, naming.hostname) against "
                        "the racks, or the node names of the trays", node=None))
        else:
            owner[dkey] = dom
    return owner


def _judge_domain_members(site: Site, members: dict[int, list[str]],
                          nodes: dict[str, NodeFabric], node_key: dict[str, _Key | None],
                          domain_key: dict[int, _Key], owner: dict[_Key, int],
                          add: Callable[[Finding], None]) -> None:
    """Each domain's nodes: missing output, or GPUs in another rack's or another partition."""
    inv = site.inventory
    for dom, names in sorted(members.items()):
        dname = inv.domain_names[dom]
        for host in names:
            if host not in nodes:
                add(Finding("nvlink-node-missing", "error", host,
                            f"{host} ({dname}): no nvidia-smi output",
                            f"capture it: ssh {host} nvidia-smi -q, or check that the node is up",
                            node=host))
                continue
            key = node_key.get(host)
            if key is None or dom not in domain_key or key == domain_key[dom]:
                continue
            other = owner.get(key)
            if other is not None and other != dom:
                oname = inv.domain_names[other]
                add(Finding("nvlink-wrong-domain", "error", host,
                            f"{host} is named as a tray of {dname} but its GPUs are in the "
                            f"NVLink domain of {oname} (ClusterUUID {key[0]})",
                            f"the tray sits in {oname}'s rack: move it, or rename the node to "
                            f"its slot in {oname} (the site's naming)", node=host))
            else:
                add(Finding("nvlink-partitioned", "error", host,
                            f"{host} ({dname}): its GPUs are in clique {key[1]} of "
                            f"{key[0]}, the rest of {dname} in clique {domain_key[dom][1]} of "
                            f"{domain_key[dom][0]}",
                            "put the tray back in the rack's default NVLink partition "
                            "(NMX-Manager), or check its NVLink cabling to the switch trays",
                            node=host))


def merge_nvlink(site: Site, path: Path, ib_report: CheckReport) -> None:
    """Add the NVLink check's findings and stats (`nvlink_*`) to an IB/LLDP report, so one
    report (and one `--drain` list) covers every input."""
    nv = check_nvlink(site, read_nvlink_input(path), str(path))
    ib_report.findings.extend(nv.findings)
    ib_report.stats.update({f"nvlink_{k}": v for k, v in nv.stats.items()})
    ib_report.source = f"{ib_report.source} + {path}"

