"""Per-node artefacts: the GPU ↔ HCA pairing, rails.csv, cabling.csv, NCCL topology XML and
the IMEX node list of each NVLink domain.

Pure. GPU i (in PCI bus order, i.e. /dev/nvidia<i>) is paired with the compute HCA of rail
i·rails/gpus — one rail per GPU on DGX/HGX (GPU k shares a PCIe switch with the HCA of rail k),
several GPUs per HCA where a node has fewer rails than GPUs. The NCCL XML puts each such pair
under one PCIe switch below the CPU of the GPU's NUMA node, the schema NCCL reads from
NCCL_TOPO_FILE (src/graph/xml.cc; NCCL skips XML comments, which carry the header).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slurmpod.topology.fabric_plan import FabricPlan, iter_cables
from slurmpod.topology.slurm_files import gpu_order

if TYPE_CHECKING:
    from slurmpod.model.site import Hca, NodeType, PciDevice, Site

PCIE_SPEED = {3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe", 6: "64.0 GT/s PCIe"}
GPU_CLASS = "0x030200"  # 3D controller
NIC_CLASS = {"infiniband": "0x020700", "roce": "0x020000"}  # InfiniBand / Ethernet controller
BRIDGE_CLASS = "0x060400"


@dataclass(frozen=True, slots=True)
class GpuPair:
    index: int  # /dev/nvidia<index>
    gpu: PciDevice
    hca: Hca


def gpu_pairs(nt: NodeType) -> list[GpuPair]:
    """GPU -> compute HCA, in GPU index order."""
    hcas = nt.compute_hcas
    out = []
    for index, pos in enumerate(gpu_order(nt)):
        hca = hcas[index * len(hcas) // nt.gpus] if hcas else None
        if hca is not None:
            out.append(GpuPair(index, nt.gpu_pci[pos], hca))
    return out


RAILS_HEADER = "node,gpu,gpu_bus_id,hca,hca_bus_id,rail,leaf,leaf_port"
CABLING_HEADER = "link,from,from_port,to,to_port,rail"


def rails_csv(header: str, site: Site, plan: FabricPlan) -> str:
    """One row per (node, GPU): the HCA it uses and where that HCA is cabled."""
    pairs = {t: gpu_pairs(nt) for t, nt in site.node_types.items()}
    ports = plan.node_port
    rows = [header, RAILS_HEADER]
    for node in site.inventory.nodes:
        name = node.name
        for p in pairs[node.node_type]:
            link = ports.get((name, p.hca.device))
            leaf, port = (link.leaf, link.port) if link else ("", 0)
            rail = "" if p.hca.rail is None else p.hca.rail
            rows.append(f"{name},{p.index},{p.gpu.bus_id},{p.hca.device},{p.hca.bus_id},{rail},"
                        f"{leaf},{port or ''}")
    return "\n".join(rows) + "\n"


def cabling_csv(header: str, plan: FabricPlan) -> str:
    """Every cable: node HCA -> leaf port, leaf uplink -> spine port, spine uplink -> core port."""
    rows = [header, CABLING_HEADER]
    rows.extend(",".join(row) for row in iter_cables(plan))
    return "\n".join(rows) + "\n"


def cpu_affinity(nt: NodeType, numa: int) -> str:
    """Linux cpumap of a NUMA node's CPUs (`/sys/devices/system/node/nodeN/cpumap` format).

    Assumes the usual Linux numbering: cores 0..C-1 socket-major, then their hyperthread
    siblings C..2C-1, and so on per thread.
    """
    total_cores = nt.cores
    mask = 0
    for t in range(nt.threads_per_core):
        for core in nt.numa_cores(numa):
            mask |= 1 << (core + t * total_cores)
    n_cpus = total_cores * nt.threads_per_core
    words = -(-n_cpus // 32)
    hex_words = [f"{(mask >> (32 * w)) & 0xFFFFFFFF:08x}" for w in reversed(range(words))]
    return ",".join(hex_words)


def _bridge_bus(dev_buses: list[str], used: set[str]) -> str:
    """A bus id for the PCIe switch above a GPU/NIC pair: just below the lower of the two."""
    domain = dev_buses[0][:4]
    bus = min(int(b[5:7], 16) for b in dev_buses) - 1
    while bus > 0 and f"{domain}:{bus:02x}:00.0" in used:
        bus -= 1
    busid = f"{domain}:{max(bus, 0):02x}:00.0"
    used.add(busid)
    return busid


def nccl_topology_context(site: Site, type_name: str) -> dict[str, Any]:
    nt = site.node_types[type_name]
    used = {d.bus_id.lower() for d in nt.gpu_pci} | {h.bus_id.lower() for h in nt.hcas}
    nic_class = NIC_CLASS[site.fabric.kind]
    switches: dict[str, dict[str, Any]] = {}  # hca device -> switch
    numa_of: dict[str, int] = {}
    for p in gpu_pairs(nt):
        sw = switches.get(p.hca.device)
        if sw is None:
            sw = {"devices": [{"busid": p.hca.bus_id.lower(), "cls": nic_class}]}
            switches[p.hca.device] = sw
            numa_of[p.hca.device] = p.gpu.numa
        sw["devices"].insert(len(sw["devices"]) - 1, {"busid": p.gpu.bus_id.lower(),
                                                      "cls": GPU_CLASS})
    for sw in switches.values():
        sw["busid"] = _bridge_bus([d["busid"] for d in sw["devices"]], used)
    cpus = []
    for numa in sorted(set(numa_of.values())):
        cpus.append({
            "numa": numa, "affinity": cpu_affinity(nt, numa), "arch": nt.cpu_arch,
            "vendor": nt.cpu_vendor if nt.cpu_arch == "x86_64" else "",
            "switches": [sw for dev, sw in switches.items() if numa_of[dev] == numa],
        })
    return {"cpus": cpus, "link_speed": PCIE_SPEED[nt.pcie_gen]}


def nccl_topology_xml(env: Any, header: str, site: Site, type_name: str) -> str:
    # One line, and no "--" (not allowed inside an XML comment).
    safe = " ".join(header.split()).replace("--", "- -")
    return env.get_template("topology/nccl-topo.xml.j2").render(
        header=safe, **nccl_topology_context(site, type_name))


def imex_nodes_configs(site: Site, hosts: Mapping[str, str] | None) -> dict[str, str]:
    """`imex/<domain>/nodes_config.cfg` for every NVLink domain: the domain's nodes, one per line.

    nvidia-imex reads IMEX_NODE_CONFIG_FILE (default /etc/nvidia-imex/nodes_config.cfg) at start;
    every node of an IMEX domain must list the same nodes in the same order, since the service
    compares its map with its peers' and fails on a mismatch (NVIDIA IMEX guide, "Deployment
    Models": NVLink-domain-wide deployment lists every compute node of the domain). Addresses
    come from `hosts` where known, else the host name is written (and generate warns).
    """
    inv = site.inventory
    by_domain: dict[int, list[str]] = {}
    for node in inv.nodes:
        by_domain.setdefault(node.domain, []).append(node.name)
    hosts = hosts or {}
    out = {}
    for domain, names in sorted(by_domain.items()):
        lines = [hosts.get(name, name) for name in names]
        out[f"imex/{inv.domain_names[domain]}/nodes_config.cfg"] = "\n".join(lines) + "\n"
    return out
