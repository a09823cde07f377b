"""NCCL environment layers: fabric presets, SHARP only where the fabric has it, version gates,
site/run overrides and debug knobs only on request."""

from __future__ import annotations

import tomllib

import pytest

from slurmpod.config import builtin_site_path
from slurmpod.errors import ConfigError
from slurmpod.render.nccl_env import (
    FabricFacts,
    RunFacts,
    build_env,
    debug_vars,
    parse_nccl_version,
)

DEBUG_KNOBS = {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_ALGO", "NCCL_PROTO"}
SHARP_VARS = {"NCCL_COLLNET_ENABLE", "SHARP_COLL_ENABLE_SAT"}


def _rail_ordered_hcas(site: str) -> tuple[str, ...]:
    # Independent of the site model: straight from the TOML, compute HCAs sorted by rail.
    raw = tomllib.loads(builtin_site_path(site).read_text())
    (nt,) = raw["node_types"].values()
    compute = [h for h in nt["hcas"] if h.get("role", "compute") == "compute"]
    return tuple(h["device"] for h in sorted(compute, key=lambda h: h["rail"]))


def test_superpod_hca_list_is_rail_ordered_exact_match() -> None:
    hcas = _rail_ordered_hcas("dgx-h100-superpod")
    assert hcas[:2] == ("mlx5_0", "mlx5_3")  # rail 1 is mlx5_3 on a DGX H100, not mlx5_1
    env = build_env(FabricFacts("infiniband", hcas_in_rail_order=hcas)).as_dict()
    assert env["NCCL_IB_HCA"] == "=" + ",".join(hcas)
    assert "mlx5_7" not in env["NCCL_IB_HCA"].split(",")  # storage HCA stays out
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert env["TORCH_NCCL_AVOID_RECORD_STREAMS"] == "1"


def test_sharp_vars_only_with_sharp() -> None:
    plain = build_env(FabricFacts("infiniband", sharp=False)).as_dict()
    sharp = build_env(FabricFacts("infiniband", sharp=True)).as_dict()
    assert not SHARP_VARS & set(plain)
    assert set(sharp) >= SHARP_VARS
    assert sharp["NCCL_COLLNET_ENABLE"] == "1"


def test_no_debug_knobs_unless_asked() -> None:
    for kind in ("infiniband", "roce", "efa"):
        env = build_env(FabricFacts(kind, sharp=kind == "infiniband")).as_dict()
        assert not DEBUG_KNOBS & set(env), kind
    asked = build_env(FabricFacts("roce"), debug=debug_vars(True, "Ring", "Simple")).as_dict()
    assert asked["NCCL_DEBUG"] == "INFO"
    assert (asked["NCCL_ALGO"], asked["NCCL_PROTO"]) == ("Ring", "Simple")


@pytest.mark.parametrize(("version", "has_gid"), [
    (None, True), ("2.18.3", True), ("2.20.5", True), ("2.21.0", False), ("2.23", False),
])
def test_roce_gid_index_gated_by_nccl_version(version: str | None, has_gid: bool) -> None:
    plan = build_env(FabricFacts("roce", hcas_in_rail_order=("mlx5_0",),
                                 nccl_version=parse_nccl_version(version)))
    env = plan.as_dict()
    assert ("NCCL_IB_GID_INDEX" in env) is has_gid
    assert ("NCCL_IB_GID_INDEX" in plan.gated_out) is not has_gid
    assert env["NCCL_IB_TC"] and env["NCCL_IB_SL"]


def test_efa_uses_libfabric_not_verbs_hca_list() -> None:
    env = build_env(FabricFacts("efa", hcas_in_rail_order=("mlx5_0",))).as_dict()
    assert env["FI_PROVIDER"] == "efa"
    assert "NCCL_IB_HCA" not in env


def test_layers_override_in_order_and_none_removes() -> None:
    facts = FabricFacts("infiniband", hcas_in_rail_order=("mlx5_0",), topo_file="/t.xml")
    plan = build_env(facts, site_overrides={"NCCL_TOPO_FILE": None, "NCCL_IB_TIMEOUT": "23"},
                     run_overrides={"NCCL_IB_TIMEOUT": "20", "MY_VAR": "x y"})
    env = plan.as_dict()
    assert "NCCL_TOPO_FILE" not in env
    assert env["NCCL_IB_TIMEOUT"] == "20"
    layers = {v.name: v.layer for v in plan.variables}
    assert layers["NCCL_IB_TIMEOUT"] == "run" and layers["NCCL_IB_HCA"] == "infiniband"


@pytest.mark.parametrize("bad", ["1ABC", "A-B", "A B", "A=B", "", "X$(id)"])
def test_bad_variable_names_are_config_errors(bad: str) -> None:
    with pytest.raises(ConfigError):
        build_env(FabricFacts("infiniband"), run_overrides={bad: "1"})


def test_unknown_fabric_and_bad_version() -> None:
    with pytest.raises(ConfigError, match=r"fabric\.kind"):
        build_env(FabricFacts("omnipath"))
    with pytest.raises(ConfigError):
        parse_nccl_version("two.21")


ALL_SHARP_VARS = {"NCCL_COLLNET_ENABLE", "SHARP_COLL_ENABLE_SAT",
                  "SHARP_COLL_ENABLE_PCI_RELAXED_ORDERING", "SHARP_COLL_LOCK_ON_COMM_INIT"}


@pytest.mark.parametrize("kind", ["infiniband", "roce", "efa"])
@pytest.mark.parametrize("version", [None, "2.18.3", "2.27.3"])
def test_gid_index_only_on_roce_and_sharp_only_when_asked(kind: str, version: str | None) -> None:
    # GID index means RoCE (an IB port has no IPv4 GIDs); CollNet without SHARP aggregation
    # managers fails communicator init, so neither may leak into another fabric's preset.
    env = build_env(FabricFacts(kind, hcas_in_rail_order=("mlx5_0",),
                                nccl_version=parse_nccl_version(version))).as_dict()
    # NCCL >= 2.21 picks the RoCE GID itself; older or unknown versions get index 3.
    assert ("NCCL_IB_GID_INDEX" in env) is (kind == "roce" and version != "2.27.3")
    assert not ALL_SHARP_VARS & set(env)


@pytest.mark.parametrize("site_name", ["sandbox", "dgx-h100-superpod", "h200-roce",
                                       "gb200-nvl72"])
def test_rendered_example_sites_follow_their_fabric(site_name: str) -> None:
    from slurmpod.config import load_site
    from slurmpod.render.sbatch import RenderOptions, build_context
    from tests.unit.render.test_sbatch import facts, run_spec

    site = load_site(builtin_site_path(site_name))
    gpn = site.node_types[site.su_groups[0].node_type].gpus
    ctx = build_context(run_spec({"nodes": 2}, tensor_model_parallel_size=gpn), site,
                        facts(2, gpn=gpn), RenderOptions(run_dir="/r"))
    names = {v.name for v in ctx.env}
    assert ("NCCL_IB_GID_INDEX" in names) is (site.fabric.kind == "roce")
    assert (names >= ALL_SHARP_VARS) is site.fabric.sharp
    assert not (ALL_SHARP_VARS & names) or site.fabric.sharp


@pytest.mark.parametrize(("run", "alloc", "graph_register"), [
    (None, "expandable_segments:True", None),
    (RunFacts(), "expandable_segments:True", None),
    (RunFacts(cuda_graphs=True), "expandable_segments:True", "0"),
    (RunFacts(nccl_ub=True), None, None),  # Megatron refuses both together
    (RunFacts(cuda_graphs=True, nccl_ub=True), None, None),
])
def test_the_allocator_layer_follows_the_run(run: RunFacts | None, alloc: str | None,
                                             graph_register: str | None) -> None:
    """Expandable segments keep fragmentation within the share `plan` leaves for it; Megatron
    asserts NCCL_GRAPH_REGISTER=0 with CUDA graphs and refuses them with NCCL user buffers."""
    plan = build_env(FabricFacts("infiniband"), run=run)
    env = plan.as_dict()
    assert env.get("PYTORCH_CUDA_ALLOC_CONF") == alloc
    assert env.get("NCCL_GRAPH_REGISTER") == graph_register
    assert all(v.layer == "memory" for v in plan.variables
               if v.name in ("PYTORCH_CUDA_ALLOC_CONF", "NCCL_GRAPH_REGISTER"))


def test_site_and_run_overrides_win_over_the_allocator_layer() -> None:
    site = build_env(FabricFacts("infiniband"),
                     site_overrides={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"})
    assert site.as_dict()["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:512"
    removed = build_env(FabricFacts("infiniband"), run_overrides={"PYTORCH_CUDA_ALLOC_CONF": None})
    assert "PYTORCH_CUDA_ALLOC_CONF" not in removed.as_dict()
