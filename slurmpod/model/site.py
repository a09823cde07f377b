"""The site description: node types, racks, scalable units, fabric, partitions.

A site file is TOML validated by these strict structs (unknown keys are errors; see
`slurmpod.model.strict`). `Site.inventory` resolves it into the concrete node list every
generator, the sandbox and the planner share.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as dc_field
from functools import cached_property
from typing import Annotated, Literal

from msgspec.structs import force_setattr

from slurmpod.model.gpus import CATALOG, lookup
from slurmpod.model.hostlist import HostlistError, expand
from slurmpod.model.strict import (
    Meta,
    NonNegInt,
    PosFloat,
    PosInt,
    SlurmName,
    SlurmTime,
    Strict,
    field,
)

PciBusId = Annotated[str, Meta(pattern=r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")]


class Gpu(Strict, frozen=True, kw_only=True):
    model: Annotated[SlurmName, Meta(description="gres Type, e.g. h100, h200, b200, gb200, gb300")]
    name: Annotated[str, Meta(description="marketing name, e.g. 'H100 SXM5 80GB'")] = ""
    # A model in the GPU catalog (slurmpod.model.gpus: a100, h100, h200, b200, gb200, b300, gb300,
    # emu) fills in every figure left out here; a key set here overrides the catalog. 0 = not given.
    peak_tflops_bf16: Annotated[PosFloat, Meta(description="dense BF16 peak per GPU, TFLOP/s")] \
        = 0.0
    # FP8 runs report MFU against the BF16 peak (Megatron-Bridge's and most papers' convention)
    # and, labelled, against this one.
    peak_tflops_fp8: Annotated[PosFloat, Meta(description="dense FP8 peak per GPU, TFLOP/s")] \
        | None = None
    hbm_gib: Annotated[PosFloat, Meta(description="HBM per GPU, GiB")] = 0.0
    hbm_tb_per_s: Annotated[PosFloat, Meta(description="HBM bandwidth, TB/s")] | None = None
    nvlink_gb_per_s: Annotated[PosFloat, Meta(description="NVLink per GPU, one direction, GB/s")] \
        | None = None
    # The node's host side, per GPU (activation and optimizer offload): the GPU's link to host
    # memory, one direction, and its share of the host's memory bandwidth.
    host_link_gb_per_s: Annotated[PosFloat, Meta(
        description="GPU to host memory per GPU, one direction, GB/s (PCIe Gen5 x16: 64)")] \
        | None = None
    host_memory_gb_per_s: Annotated[PosFloat, Meta(
        description="host memory bandwidth per GPU, GB/s (all sockets over the node's GPUs)")] \
        | None = None
    # A sandbox GPU: `slurmpod sandbox up` sets peak_tflops_bf16 to this CPU's measured matmul
    # rate, so sandbox MFU figures mean something.
    emulated: bool = False

    def __post_init__(self) -> None:

        spec = lookup(self.model)
        for key in ("peak_tflops_bf16", "hbm_gib"):
            if getattr(self, key):
                continue
            if spec is None:
                raise ValueError(f"{key}: required for GPU model {self.model!r}, which is not in "
                                 f"the catalog ({', '.join(CATALOG)}); set it or use a catalog "
                                 "model")
            force_setattr(self, key, getattr(spec, key))
        if spec is not None:
            for key in ("peak_tflops_fp8", "hbm_tb_per_s", "nvlink_gb_per_s", "host_link_gb_per_s",
                        "host_memory_gb_per_s"):
                if getattr(self, key) is None:
                    force_setattr(self, key, getattr(spec, key))
            if not self.name:
                force_setattr(self, "name", spec.name)


class PciDevice(Strict, frozen=True, kw_only=True):
    bus_id: PciBusId
    numa: NonNegInt


class Hca(Strict, frozen=True, kw_only=True):
    device: Annotated[SlurmName, Meta(description="verbs device, e.g. mlx5_0")]
    rail: Annotated[int, Meta(ge=0, description="none for storage/management")] | None = None
    bus_id: PciBusId
    numa: NonNegInt
    netdev: Annotated[str, Meta(description="IPoIB / Ethernet interface, e.g. ibp24s0")] | None \
        = None
    role: Literal["compute", "storage", "management"] = "compute"

    def __post_init__(self) -> None:
        if self.role == "compute" and self.rail is None:
            raise ValueError("a compute HCA needs `rail`; set role = 'storage' to keep it apart")
        if self.role != "compute" and self.rail is not None:
            raise ValueError(f"a {self.role} HCA has no rail: remove `rail`")


class NodeType(Strict, frozen=True, kw_only=True):
    gpus: Annotated[int, Meta(ge=1, le=72)] = 8
    gpu: Gpu
    # GPUs sharing one NVLink domain; 0 means the node (8 on DGX, 72 on NVL72).
    nvlink_domain_gpus: NonNegInt = 0
    sockets: PosInt
    cores_per_socket: PosInt
    threads_per_core: Annotated[int, Meta(ge=1, le=8)] = 1
    memory_mib: Annotated[int, Meta(gt=0, description="RealMemory in MiB")]
    gpu_pci: list[PciDevice]
    hcas: list[Hca]
    gpu_device_path: Annotated[str, Meta(description="gres File= prefix; index appended")] = \
        "/dev/nvidia"
    # NUMA nodes per node; 0 means one per socket. Cores split evenly.
    numa_nodes: NonNegInt = 0
    cpu_arch: Literal["x86_64", "arm64"] = "x86_64"  # NCCL topology XML arch
    cpu_vendor: str = "GenuineIntel"  # NCCL topology XML vendor (GenuineIntel, AuthenticAMD, '')
    pcie_gen: Annotated[int, Meta(ge=3, le=6)] = 5  # of GPU and HCA links
    # Write nccl-topo/<type>.xml (off where GPUs hang off the CPU by C2C).
    nccl_topo_file: bool = True

    @property
    def domain_gpus(self) -> int:
        return self.nvlink_domain_gpus or self.gpus

    @property
    def compute_hcas(self) -> list[Hca]:
        return sorted((h for h in self.hcas if h.role == "compute"), key=lambda h: h.rail or 0)

    @property
    def cores(self) -> int:
        return self.sockets * self.cores_per_socket

    @property
    def numa_count(self) -> int:
        return self.numa_nodes or self.sockets

    def numa_cores(self, numa: int) -> range:
        """Slurm's logical core indices of a NUMA node (socket-major, as gres.conf Cores= wants)."""
        per = self.cores // self.numa_count
        return range(numa * per, (numa + 1) * per)

    def __post_init__(self) -> None:
        if len(self.gpu_pci) != self.gpus:
            raise ValueError(f"gpu_pci lists {len(self.gpu_pci)} GPUs but gpus = {self.gpus}")
        numas = {d.numa for d in self.gpu_pci} | {h.numa for h in self.hcas}
        if self.numa_nodes:
            if self.numa_nodes % self.sockets or self.cores % self.numa_nodes:
                raise ValueError(
                    f"numa_nodes: {self.numa_nodes} must be a multiple of sockets = {self.sockets}"
                    f" and divide the {self.cores} cores"
                )
            if max(numas, default=0) >= self.numa_nodes:
                raise ValueError(
                    f"numa_nodes: a GPU or HCA names NUMA node {max(numas)} but the node has "
                    f"{self.numa_nodes}; fix its `numa` or raise numa_nodes"
                )
        elif max(numas, default=0) >= self.sockets:
            raise ValueError(
                f"numa_nodes: a GPU or HCA names NUMA node {max(numas)} but numa_nodes defaults to "
                f"sockets = {self.sockets}; set numa_nodes (e.g. 8 for NPS4 on 2 sockets)"
            )
        buses = [d.bus_id.lower() for d in self.gpu_pci] + [h.bus_id.lower() for h in self.hcas]
        if len(set(buses)) != len(buses):
            raise ValueError("gpu_pci/hcas: PCI bus ids must be unique within a node type")
        if self.domain_gpus % self.gpus and self.gpus % self.domain_gpus:
            raise ValueError(
                f"nvlink_domain_gpus = {self.domain_gpus} must be a multiple of gpus = {self.gpus}"
            )
        names = [h.device for h in self.hcas]
        if len(set(names)) != len(names):
            raise ValueError("hcas: device names must be unique")


# IB ports per front-panel cage by switch model: Quantum-2 QM9700/QM9790 have 32 OSFP cages of
# two NDR ports (64 ports); Quantum-X800 Q3400 has 72 cages of two XDR ports (144 ports);
# Quantum QM8700/QM8790 (HDR) have one port per QSFP56 cage.
BLOCK_MIN = (23, 11)  # topology/block appeared in Slurm 23.11

SWITCH_CAGE_PORTS = {"QM9700": 2, "QM9790": 2, "Q3400": 2, "Q3400-RA": 2, "QM8700": 1,
                     "QM8790": 1}


class Fabric(Strict, frozen=True, kw_only=True):
    kind: Literal["infiniband", "roce"] = "infiniband"
    rails: Annotated[int, Meta(ge=1, le=16)] = 8
    link_gbps: Annotated[int, Meta(gt=0)] = 400
    sharp: bool = False
    rail_optimised: bool = True
    leaf_radix: Annotated[int, Meta(ge=4)] = 64
    spine_radix: Annotated[int, Meta(ge=4)] = 64
    oversubscription: Annotated[float, Meta(ge=1.0, description="leaf downlinks per uplink")] \
        = 1.0
    # shared: the rails' leaves meet on one spine layer, one subnet (NVIDIA's DGX SuperPOD H100
    # reference architecture); per_rail: rail-k leaves meet on rail-k spines only, each rail a
    # plane of its own (often its own subnet, one ibnetdiscover dump per rail).
    spine_groups: Literal["per_rail", "shared"] = "per_rail"
    switch_prefix: str = ""  # prefix for generated switch names
    # Cabling conventions. QM9700/QM9790 (NDR) and Q3400 (XDR) switches carry two IB ports per
    # OSFP cage; findings then name the cage as well as the port. `ports_per_cage` = 0 takes the
    # switch model's default (1 when the model is unknown); 4 for NDR ports split in two.
    switch_model: str = ""  # e.g. "QM9700": sets ports_per_cage by default
    ports_per_cage: Annotated[int, Meta(ge=0, le=8)] = 0
    # How the plan cables a leaf's uplinks: "spread" round-robins single links over the spines;
    # "cage" keeps both ports of a cage on one spine (one twin-port transceiver per spine). The
    # check judges leaf<->spine links by how many a leaf has to each spine, whatever ports.
    uplink_cabling: Literal["spread", "cage"] = "spread"
    # Saved ibnetdiscover outputs `topo check` reads when no --ibnetdiscover is given: one per
    # subnet (per_rail planes are often separate subnets), paths relative to the site file.
    ibnetdiscover: list[str] = field(default_factory=list)

    @property
    def cage_ports(self) -> int:
        """IB ports per switch cage (1: no cages)."""
        if self.ports_per_cage:
            return self.ports_per_cage
        return SWITCH_CAGE_PORTS.get(self.switch_model.upper(), 1)

    def __post_init__(self) -> None:
        if self.uplink_cabling == "cage" and self.cage_ports < 2:
            raise ValueError(
                "uplink_cabling: 'cage' needs twin-port cages; set switch_model (e.g. 'QM9700') "
                "or ports_per_cage = 2"
            )
        if self.leaf_radix % self.cage_ports or self.spine_radix % self.cage_ports:
            raise ValueError(
                f"ports_per_cage: {self.cage_ports} does not divide leaf_radix = "
                f"{self.leaf_radix} and spine_radix = {self.spine_radix}"
            )
        # SHARP aggregation runs in Quantum InfiniBand switches under the SHARP aggregation
        # manager (an IB subnet service); an Ethernet fabric has none, and NCCL's CollNet init
        # would fail on every job.
        if self.sharp and self.kind != "infiniband":
            raise ValueError(
                f"sharp: SHARP needs an InfiniBand fabric but kind = {self.kind!r}; "
                "set sharp = false"
            )


class SuGroup(Strict, frozen=True, kw_only=True):
    node_type: str
    sus: Annotated[PosInt, Meta(description="scalable units of this shape")]
    nodes_per_su: PosInt
    nodes_per_rack: PosInt
    # Host names as a Slurm hostlist, SU by SU, each SU in leaf-port order: for sites whose
    # names follow no one pattern (`topo discover` writes the names it saw). Overrides
    # naming.hostname for this group.
    hosts: str = ""

    @property
    def racks_per_su(self) -> int:
        return self.nodes_per_su // self.nodes_per_rack


class Naming(Strict, frozen=True, kw_only=True):
    hostname: str = "node{n:04d}"  # format with n, rack, slot, su (1-based)
    rack: str = "rack{rack:03d}"
    su: str = "su{su}"
    domain: str = "nvl{domain}"  # NVLink domain name (feature, block), 1-based
    first_node: NonNegInt = 1


# PartitionName options of slurm.conf(5) (Slurm 22.05 - 25.05) accepted in `partitions.extra`.
PARTITION_KEYS = (
    "AllocNodes", "AllowAccounts", "AllowGroups", "AllowQos", "Alternate", "CpuBind",
    "DefCpuPerGPU", "DefMemPerCPU", "DefMemPerGPU", "DefMemPerNode", "DefaultTime",
    "DenyAccounts", "DenyQos", "DisableRootJobs", "ExclusiveTopo", "ExclusiveUser", "GraceTime",
    "Hidden", "LLN", "MaxCPUsPerNode", "MaxCPUsPerSocket", "MaxMemPerCPU", "MaxMemPerNode",
    "MaxNodes", "MinNodes", "OverSubscribe", "OverTimeLimit", "PowerDownOnIdle", "PreemptMode",
    "PriorityJobFactor", "PriorityTier", "QOS", "ReqResv", "ResumeTimeout", "RootOnly",
    "SelectTypeParameters", "State", "SuspendTime", "SuspendTimeout", "TRESBillingWeights",
    "Topology",
)


class Partition(Strict, frozen=True, kw_only=True):
    name: SlurmName
    default: bool = False
    max_time: SlurmTime = "INFINITE"
    sus: list[int] | Literal["all"] = "all"
    extra: dict[str, str] = field(default_factory=dict)  # more PartitionName options

    def __post_init__(self) -> None:
        known = {k.lower(): k for k in PARTITION_KEYS}
        for key, value in self.extra.items():
            if key.lower() in ("nodes", "partitionname", "default", "maxtime"):
                raise ValueError(
                    f"extra: set {key!r} through the partition's own keys (sus, default, "
                    "max_time), not extra"
                )
            if key.lower() not in known:
                raise ValueError(f"extra: {key!r} is not a PartitionName option of slurm.conf(5)")
            if not value or re.search(r"[\s#=]", value):
                raise ValueError(f"extra.{key}: {value!r} must be one word without '#' or '='")


class SlurmTarget(Strict, frozen=True, kw_only=True):
    version: Annotated[str, Meta(pattern=r"^\d{2}\.\d{2}$")] = "24.11"
    cluster_name: SlurmName = "cluster"
    # auto: block for NVL72-class sites (domain > node), tree otherwise.
    topology: Literal["tree", "block", "auto"] = "auto"
    # node type -> Weight; warned: overrides topology.
    node_weights: dict[str, int] = field(default_factory=dict)
    # IMEX channels through SwitchType=switch/nvidia_imex (Slurm >= 24.05): "auto" = on for
    # rack-scale NVLink sites (domain > node, e.g. GB200 NVL72) when the target Slurm has it.
    imex: bool | Literal["auto"] = "auto"

    @property
    def version_tuple(self) -> tuple[int, int]:
        major, minor = self.version.split(".")
        return int(major), int(minor)


class Software(Strict, frozen=True, kw_only=True):
    # The Megatron-LM release jobs run (a branch of NVIDIA/Megatron-LM); `[megatron]` keys it
    # has no argument for get a warning. The names are slurmpod/megatron/data/megatron_args.json's.
    megatron: Literal["core_r0.12", "core_r0.13", "core_r0.14", "main"] = "core_r0.14"


class Storage(Strict, frozen=True, kw_only=True):
    # Sustained write bandwidth of the checkpoint filesystem for one job, GB/s: it sets how long
    # before the time limit a job is told to save (render/launch.py signal_lead). 20 GB/s is a
    # conservative figure for one job on a parallel filesystem (Lustre/GPFS/VAST class).
    checkpoint_write_gb_per_s: Annotated[float, Meta(gt=0, le=100_000)] = 20.0


class Reliability(Strict, frozen=True, kw_only=True):
    # Mean hours between interruptions of one node (any cause that ends a synchronous job on
    # it), used when slurmpod has no attempt history to measure it (docs/resilience.md). 6,300:
    # Meta's Llama 3 405B run saw 419 unexpected interruptions in 54 days on 16,384 H100 GPUs
    # (2,048 nodes): 2,048 x 54 x 24 / 419 = 6,335 node-hours ("The Llama 3 Herd of Models",
    # arXiv:2407.21783, section 3.3.4).
    node_mtbf_hours: Annotated[float, Meta(gt=0, le=10_000_000)] = 6300.0


class SiteInfo(Strict, frozen=True, kw_only=True):
    name: SlurmName
    description: str = ""


# dict=True: room for the cached inventory.
class Site(Strict, frozen=True, kw_only=True, dict=True):
    site: SiteInfo
    slurm: SlurmTarget = field(default_factory=SlurmTarget)
    node_types: dict[str, NodeType]
    fabric: Fabric = field(default_factory=Fabric)
    su_groups: Annotated[list[SuGroup], Meta(min_length=1)]
    naming: Naming = field(default_factory=Naming)
    partitions: list[Partition] = field(default_factory=list)
    software: Software = field(default_factory=Software)
    storage: Storage = field(default_factory=Storage)
    reliability: Reliability = field(default_factory=Reliability)

    def __post_init__(self) -> None:
        for i, grp in enumerate(self.su_groups):
            where = f"su_groups[{i}]"
            nt = self.node_types.get(grp.node_type)
            if nt is None:
                raise ValueError(
                    f"{where}.node_type: unknown node type {grp.node_type!r}; "
                    f"defined: {', '.join(sorted(self.node_types)) or 'none'}"
                )
            if grp.nodes_per_su % grp.nodes_per_rack:
                raise ValueError(
                    f"{where}: nodes_per_su = {grp.nodes_per_su} is not a whole number of racks of "
                    f"{grp.nodes_per_rack}; make nodes_per_su a multiple of nodes_per_rack"
                )
            rack_gpus = grp.nodes_per_rack * nt.gpus
            if nt.domain_gpus > nt.gpus and rack_gpus % nt.domain_gpus:
                raise ValueError(
                    f"{where}.nodes_per_rack: the NVLink domain of {nt.domain_gpus} GPUs does not "
                    f"divide a rack of {rack_gpus} GPUs; set nodes_per_rack to a multiple of "
                    f"{nt.domain_gpus // nt.gpus}"
                )
            if self.fabric.rail_optimised and len(nt.compute_hcas) != self.fabric.rails:
                raise ValueError(
                    f"node_types.{grp.node_type}.hcas: {len(nt.compute_hcas)} compute HCAs but "
                    f"fabric.rails = {self.fabric.rails}; give one compute HCA per rail"
                )
            rails = sorted(h.rail for h in nt.compute_hcas if h.rail is not None)
            if self.fabric.rail_optimised and rails != list(range(self.fabric.rails)):
                raise ValueError(
                    f"node_types.{grp.node_type}.hcas: rails {rails} must be "
                    f"0..{self.fabric.rails - 1}, each once"
                )
            down = self.leaf_downlinks
            if self.fabric.rail_optimised and grp.nodes_per_su > down:
                raise ValueError(
                    f"{where}.nodes_per_su: {grp.nodes_per_su} exceeds the {down} downlink ports "
                    "of a leaf (fabric.leaf_radix / oversubscription); use smaller SUs"
                )
            rack_ports = grp.nodes_per_rack * len(nt.compute_hcas)
            if not self.fabric.rail_optimised and rack_ports > down:
                raise ValueError(
                    f"{where}.nodes_per_rack: {grp.nodes_per_rack} nodes x "
                    f"{len(nt.compute_hcas)} compute HCAs need {rack_ports} ports but a rack leaf "
                    f"has {down} downlinks; use smaller racks or a larger fabric.leaf_radix"
                )
        _check_pattern("naming.hostname", self.naming.hostname, {"n", "rack", "slot", "su"})
        _check_pattern("naming.rack", self.naming.rack, {"rack", "su"})
        _check_pattern("naming.su", self.naming.su, {"su"})
        _check_pattern("naming.domain", self.naming.domain, {"domain"})
        n_sus = sum(g.sus for g in self.su_groups)
        self._check_fabric_size(n_sus)
        for j, part in enumerate(self.partitions):
            if part.sus != "all":
                bad = [s for s in part.sus if not 1 <= s <= n_sus]
                if bad:
                    raise ValueError(f"partitions[{j}].sus: {bad} outside 1..{n_sus}")
        if sum(p.default for p in self.partitions) > 1:
            raise ValueError("partitions: more than one has default = true")
        for name in self.slurm.node_weights:
            if name not in self.node_types:
                raise ValueError(f"slurm.node_weights: unknown node type {name!r}")

    def _check_fabric_size(self, n_sus: int) -> None:
        # Leaves per spine group against what three tiers of spine_radix switches can hold
        # (the rule of slurmpod.topology.fabric_plan: blocks of spine_radix/2 leaves, at most
        # spine_radix blocks per core plane).
        fab = self.fabric
        if fab.rail_optimised:
            per_group = n_sus if fab.spine_groups == "per_rail" else n_sus * fab.rails
            unit = 1 if fab.spine_groups == "per_rail" else fab.rails
        else:
            per_group = sum(g.sus * g.racks_per_su for g in self.su_groups)
            unit = 1
        half = fab.spine_radix // 2
        block = half - half % unit
        if per_group > fab.spine_radix and (block < 1 or per_group > block * fab.spine_radix):
            raise ValueError(
                f"fabric.spine_radix: {per_group} leaves per spine group need more than three "
                f"tiers of {fab.spine_radix}-port switches; use larger spines"
                + (" or spine_groups = 'per_rail'" if unit > 1 else "")
            )

    @property
    def leaf_downlinks(self) -> int:
        return int(self.fabric.leaf_radix * self.fabric.oversubscription
                   / (1 + self.fabric.oversubscription))

    @property
    def rack_scale_nvlink(self) -> bool:
        """NVLink domains larger than a node (GB200/GB300 NVL72): what blocks and IMEX are for."""
        return any(nt.domain_gpus > nt.gpus for nt in self.node_types.values())

    def topology_plugin_for(self, version: tuple[int, int]) -> Literal["tree", "block"]:
        """"auto" = block on rack-scale sites when the target Slurm has topology/block."""
        if self.slurm.topology != "auto":
            return self.slurm.topology
        return "block" if self.rack_scale_nvlink and version >= BLOCK_MIN else "tree"

    @property
    def topology_plugin(self) -> Literal["tree", "block"]:
        return self.topology_plugin_for(self.slurm.version_tuple)

    @cached_property
    def inventory(self) -> Inventory:
        return build_inventory(self)


def _check_pattern(key: str, pattern: str, allowed: set[str]) -> None:
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(pattern) if f is not None}
    except ValueError as exc:
        raise ValueError(f"{key}: bad format string {pattern!r}: {exc}") from None
    unknown = fields - allowed
    if unknown:
        raise ValueError(
            f"{key}: unknown field(s) {sorted(unknown)} in {pattern!r}; use {sorted(allowed)}"
        )


@dataclass(frozen=True, slots=True)
class Node:
    """One concrete node of the site. Indices are 0-based; names come from `naming`."""

    name: str
    index: int
    node_type: str
    su: int  # 0-based SU index across all groups
    rack: int  # 0-based rack index across the site
    slot: int  # 0-based position in the rack
    su_slot: int  # 0-based position in the SU (leaf downlink port = su_slot + 1)
    domain: int  # 0-based NVLink domain index across the site


@dataclass(frozen=True)
class Inventory:
    nodes: tuple[Node, ...]
    su_names: tuple[str, ...]
    rack_names: tuple[str, ...]
    su_node_type: tuple[str, ...]
    domain_names: tuple[str, ...] = ()  # NVLink domains (one per node on 8-GPU systems)
    # node type -> its GPU's dense BF16 peak (TFLOP/s): reports recompute MFU with the site's
    # peak, never a job's claim.
    node_type_peak: Mapping[str, float] = dc_field(default_factory=dict, hash=False,
                                                    compare=False)

    def peak_of(self, hosts: Iterable[str]) -> float | None:
        """The one GPU peak of these nodes; None if any is unknown or their types differ."""
        by_name = self.by_name
        peaks = set()
        for h in hosts:
            node = by_name.get(h)
            if node is None or node.node_type not in self.node_type_peak:
                return None
            peaks.add(self.node_type_peak[node.node_type])
        return peaks.pop() if len(peaks) == 1 else None

    def nodes_in_su(self, su: int) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.su == su)

    @cached_property
    def by_name(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}


_WIDTH = re.compile(r"\{n:0?(\d+)d\}")


def build_inventory(site: Site) -> Inventory:
    """Resolve SU groups and naming patterns into concrete nodes; reject clashing names."""
    nodes: list[Node] = []
    su_names: list[str] = []
    rack_names: list[str] = []
    su_types: list[str] = []
    seen: dict[str, int] = {}
    width_m = _WIDTH.search(site.naming.hostname)
    width = int(width_m.group(1)) if width_m else None
    n = site.naming.first_node
    su = rack = domain_base = 0
    for g_idx, grp in enumerate(site.su_groups):
        nt = site.node_types[grp.node_type]
        nodes_per_domain = max(1, nt.domain_gpus // nt.gpus)
        listed = _listed_hosts(grp, g_idx)
        g_pos = 0
        for _ in range(grp.sus):
            su_names.append(site.naming.su.format(su=su + 1))
            su_types.append(grp.node_type)
            for su_slot in range(grp.nodes_per_su):
                slot = su_slot % grp.nodes_per_rack
                if slot == 0:
                    rack_names.append(site.naming.rack.format(rack=len(rack_names) + 1, su=su + 1))
                    rack = len(rack_names) - 1
                if listed is not None:
                    name = listed[g_pos]
                    g_pos += 1
                else:
                    name = site.naming.hostname.format(n=n, rack=rack + 1, slot=slot + 1,
                                                       su=su + 1)
                if listed is None and width is not None and len(str(n)) > width:
                    raise ValueError(
                        f"naming.hostname: node number {n} overflows {site.naming.hostname!r}; "
                        f"widen the number field (e.g. {{n:0{len(str(n))}d}})"
                    )
                if name in seen:
                    raise ValueError(
                        f"naming.hostname: {site.naming.hostname!r} gives {name!r} twice; "
                        "include {n} or {slot} so names are unique"
                    )
                if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
                    raise ValueError(f"naming.hostname: {name!r} is not a valid host name")
                seen[name] = n
                nodes.append(
                    Node(name, len(nodes), grp.node_type, su, rack, slot, su_slot,
                         domain_base + su_slot // nodes_per_domain)
                )
                n += 1
            domain_base += -(-grp.nodes_per_su // nodes_per_domain)
            su += 1
    domain_names = [site.naming.domain.format(domain=d + 1) for d in range(domain_base)]
    nvl = any(nt.domain_gpus > nt.gpus for nt in site.node_types.values())
    # SU, rack and (rack-scale) domain names share one namespace: node features and switch or
    # block names. Each must be unique and not reuse another kind's or a host's name.
    taken: dict[str, int] = dict(seen)
    for key, pattern, names in (("naming.su", site.naming.su, su_names),
                                ("naming.rack", site.naming.rack, rack_names),
                                ("naming.domain", site.naming.domain, domain_names if nvl else [])):
        _check_unique(key, pattern, names, taken)
        taken.update(dict.fromkeys(names, 0))
    return Inventory(tuple(nodes), tuple(su_names), tuple(rack_names), tuple(su_types),
                     tuple(domain_names),
                     {name: nt.gpu.peak_tflops_bf16 for name, nt in site.node_types.items()})


def _listed_hosts(grp: SuGroup, index: int) -> list[str] | None:
    """The group's `hosts` hostlist expanded, checked against its size; None when not set."""
    if not grp.hosts:
        return None

    try:
        names = expand(grp.hosts)
    except HostlistError as exc:
        raise ValueError(f"su_groups[{index}].hosts: {exc}") from None
    want = grp.sus * grp.nodes_per_su
    if len(names) != want:
        raise ValueError(
            f"su_groups[{index}].hosts: lists {len(names)} hosts but sus x nodes_per_su = "
            f"{want}; list every node of the group once"
        )
    return names


def _check_unique(key: str, pattern: str, names: list[str], hosts: dict[str, int]) -> None:
    """SU, rack and domain names become Slurm switch/block names and node features: they must be
    unique, valid Slurm names, and distinct from host names."""
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise ValueError(f"{key}: {pattern!r} gives {name!r} twice; include its number field")
        if name in hosts:
            raise ValueError(
                f"{key}: {name!r} is also a host, SU or rack name; choose a distinct pattern"
            )
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]*", name):
            raise ValueError(f"{key}: {name!r} is not a valid Slurm name (start with a letter)")
        seen.add(name)
