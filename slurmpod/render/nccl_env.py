"""The job's NCCL/CUDA environment: layered presets by fabric, site overrides, version gates.

Layers apply in order, later ones replacing earlier values: `base` (every Megatron job) ->
the fabric preset (`infiniband`, `roce` or `efa`) -> `sharp` (only where the fabric has SHARP)
-> `memory` (PyTorch's allocator, as the run's arguments allow) -> `site` overrides -> `run`
overrides -> `debug` (only when asked). An override whose value is
None removes the variable. Every variable carries the layer it came from and why it is set, so
the rendered script and `docs/nccl-env.md` can say both. Pure: no files, no environment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from slurmpod.errors import ConfigError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

NcclVersion = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class EnvVar:
    name: str
    value: str
    layer: str
    why: str


@dataclass(frozen=True, slots=True)
class FabricFacts:
    """What the presets need to know about the nodes a job runs on."""

    kind: str  # infiniband | roce | efa
    sharp: bool = False
    hcas_in_rail_order: tuple[str, ...] = ()
    socket_ifnames: tuple[str, ...] = ()
    topo_file: str | None = None
    nccl_version: NcclVersion | None = None


@dataclass(frozen=True, slots=True)
class RunFacts:
    """What the `memory` layer needs to know about the run's Megatron arguments."""

    cuda_graphs: bool = False  # any CUDA graph capture (cuda_graph_impl, enable/external)
    nccl_ub: bool = False  # NCCL user-buffer registration (`--nccl-ub`)


@dataclass(frozen=True, slots=True)
class _Var:
    name: str
    value: str
    why: str
    # Version gate: set only when min <= NCCL version < below. Unknown version: set it anyway
    # (the conservative choice: the variable is what older NCCL needs and newer NCCL tolerates).
    nccl_min: NcclVersion | None = None
    nccl_below: NcclVersion | None = None


@dataclass(frozen=True)
class EnvPlan:
    """The final ordered environment plus what was dropped by version gates."""

    variables: tuple[EnvVar, ...]
    gated_out: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, str]:
        return {v.name: v.value for v in self.variables}


def parse_nccl_version(text: str | None) -> NcclVersion | None:
    """`2.21.5` -> (2, 21, 5); None or '' -> None; anything else is a usage problem."""
    if not text:
        return None
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if not m:
        raise ConfigError(f"NCCL version {text!r} is not MAJOR.MINOR[.PATCH]; e.g. 2.21.5",
                          key="nccl_version")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def _base(f: FabricFacts) -> list[_Var]:
    out = [
        _Var("CUDA_DEVICE_MAX_CONNECTIONS", "1",
             "one hardware work queue so Megatron's TP/SP communication kernels are scheduled "
             "before the GEMMs they overlap with (Megatron asserts it with sequence parallel)"),
        _Var("TORCH_NCCL_AVOID_RECORD_STREAMS", "1",
             "PyTorch >= 2.2: free collective buffers without record_stream, lowering peak "
             "memory under async TP/DP overlap"),
    ]
    if f.socket_ifnames:
        out.append(_Var("NCCL_SOCKET_IFNAME", "=" + ",".join(f.socket_ifnames),
                        "bootstrap and socket traffic on the named interface(s); `=` asks for an "
                        "exact match so ib0 does not also select ib01"))
    if f.topo_file:
        out.append(_Var("NCCL_TOPO_FILE", f.topo_file,
                        "the node's PCI/NUMA tree generated from the site file: NCCL pairs each "
                        "GPU with the HCA behind the same PCIe switch even in VMs or containers "
                        "that hide the real topology"))
    return out


def _ib_hca(f: FabricFacts, why_extra: str = "") -> list[_Var]:
    if not f.hcas_in_rail_order:
        return []
    return [_Var("NCCL_IB_HCA", "=" + ",".join(f.hcas_in_rail_order),
                 "compute HCAs in rail order (rail 0 first), `=` for exact names so mlx5_1 does "
                 "not also match mlx5_10; storage/management HCAs stay out of collectives"
                 + why_extra)]


def _infiniband(f: FabricFacts) -> list[_Var]:
    return _ib_hca(f)


def _roce(f: FabricFacts) -> list[_Var]:
    return [
        *_ib_hca(f, " (RoCE HCAs are driven through the same verbs path)"),
        _Var("NCCL_IB_GID_INDEX", "3",
             "RoCE v2 over IPv4 is GID index 3 on a default ConnectX setup; NCCL >= 2.21 picks "
             "the GID itself", nccl_below=(2, 21, 0)),
        _Var("NCCL_IB_TC", "106",
             "traffic class 106 = DSCP 26 with ECN capable transport: the lossless (PFC) class of "
             "the usual RoCE QoS profile; set the site's value if it differs"),
        _Var("NCCL_IB_SL", "3",
             "priority 3: the PFC-protected priority DSCP 26 maps to on a trust-DSCP switch"),
        _Var("NCCL_IB_QPS_PER_CONNECTION", "4",
             "several queue pairs per connection spread a flow over ECMP paths of the Ethernet "
             "fabric (one QP hashes onto one path)"),
    ]


def _efa(f: FabricFacts) -> list[_Var]:
    return [
        _Var("FI_PROVIDER", "efa", "libfabric uses the EFA provider (aws-ofi-nccl plugin)"),
        _Var("FI_EFA_USE_DEVICE_RDMA", "1",
             "GPUDirect RDMA over EFA on p4d/p5 instances"),
    ]


def _sharp(f: FabricFacts) -> list[_Var]:
    return [
        _Var("NCCL_COLLNET_ENABLE", "1",
             "all-reduce through SHARP in-network aggregation via the HPC-X SHARP (CollNet) "
             "plugin; set only where fabric.sharp is true, because without aggregation managers "
             "CollNet init fails"),
        _Var("SHARP_COLL_ENABLE_SAT", "1",
             "streaming aggregation trees (SAT) for large messages: the mode that helps "
             "data-parallel gradient all-reduce"),
        _Var("SHARP_COLL_ENABLE_PCI_RELAXED_ORDERING", "1",
             "relaxed PCIe ordering for SHARP buffers, needed for full SAT bandwidth"),
        _Var("NCCL_IB_PCI_RELAXED_ORDERING", "1",
             "relaxed PCIe ordering for NCCL's IB buffers (where the platform enables it)"),
        _Var("SHARP_COLL_LOCK_ON_COMM_INIT", "1",
             "take the SHARP resource lock at communicator init so concurrent communicators do "
             "not fail SAT setup"),
    ]


def _memory(r: RunFacts) -> list[_Var]:
    # The usable HBM `plan` counts leaves 4 % for the allocator's fragmentation
    # (megatron.memory.FRAGMENTATION_FRACTION). Without expandable segments a Llama 3 70B FP8
    # run on 32 H100 ran out of memory at a 58.8 GB peak, from fragmentation alone
    # (Megatron-Bridge skills/nemo-mbridge-perf-memory-tuning, "Measured Results").
    if r.nccl_ub:
        # Megatron refuses expandable segments with NCCL user buffers (torch.cuda.MemPool;
        # DistributedDataParallelConfig, core 0.15-main, before PyTorch 2.11).
        return []
    out = [_Var("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True",
                "PyTorch's allocator grows mapped segments instead of caching fixed blocks, "
                "so fragmentation stays within the share of HBM `plan` keeps for it; "
                "Megatron-Bridge's performance runs set it too")]
    if r.cuda_graphs:
        out.append(_Var("NCCL_GRAPH_REGISTER", "0",
                        "CUDA graphs with expandable segments need NCCL's graph buffer "
                        "registration off (illegal memory access otherwise; Megatron asserts it, "
                        "core 0.15-main transformer/cuda_graphs.py)"))
    return out


FABRIC_PRESETS = {"infiniband": _infiniband, "roce": _roce, "efa": _efa}


def debug_vars(debug: bool, algo: str | None = None, proto: str | None = None) -> dict[str, str]:
    """Debugging knobs, only when asked: they change NCCL's choices or flood the log."""
    out: dict[str, str] = {}
    if debug:
        out["NCCL_DEBUG"] = "INFO"
        out["NCCL_DEBUG_SUBSYS"] = "INIT,NET,GRAPH,ENV"
    if algo:
        out["NCCL_ALGO"] = algo
    if proto:
        out["NCCL_PROTO"] = proto
    return out


def _gate_ok(v: _Var, version: NcclVersion | None) -> bool:
    if version is None:
        return True
    if v.nccl_min is not None and version < v.nccl_min:
        return False
    return not (v.nccl_below is not None and version >= v.nccl_below)


def check_names(overrides: Mapping[str, object], where: str) -> None:
    for name in overrides:
        if not _NAME.match(name):
            raise ConfigError(f"{name!r} is not a valid environment variable name; use letters, "
                              "digits and _ (not starting with a digit)", key=where)


def build_env(
    facts: FabricFacts,
    *,
    site_overrides: Mapping[str, str | None] | None = None,
    run_overrides: Mapping[str, str | None] | None = None,
    debug: Mapping[str, str] | None = None,
    run: RunFacts | None = None,
) -> EnvPlan:
    """Resolve the layers into one ordered environment (first-set order is kept)."""
    preset = FABRIC_PRESETS.get(facts.kind)
    if preset is None:
        raise ConfigError(f"no NCCL preset for fabric kind {facts.kind!r}; known: "
                          f"{', '.join(sorted(FABRIC_PRESETS))}", key="fabric.kind")
    layers: list[tuple[str, Sequence[_Var]]] = [("base", _base(facts)), (facts.kind, preset(facts))]
    if facts.sharp:
        layers.append(("sharp", _sharp(facts)))
    layers.append(("memory", _memory(run or RunFacts())))
    env: dict[str, EnvVar] = {}
    gated: list[str] = []
    for layer, variables in layers:
        for v in variables:
            if _gate_ok(v, facts.nccl_version):
                env[v.name] = EnvVar(v.name, v.value, layer, v.why)
            else:
                gated.append(v.name)
    for layer, overrides, why in (
        ("site", site_overrides, "site override"),
        ("run", run_overrides, "run override"),
        ("debug", debug, "debugging knob, asked for explicitly"),
    ):
        if not overrides:
            continue
        check_names(overrides, layer)
        for name, value in overrides.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = EnvVar(name, str(value), layer, why)
    return EnvPlan(tuple(env.values()), tuple(gated))
