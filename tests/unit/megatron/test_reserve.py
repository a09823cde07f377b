"""The runtime's HBM reserve (megatron/memory.py `runtime_reserve`): each part from its cited
figure, worked out by hand for Llama 3 70B on 64 H100 (TP4 PP8 DP2, the Megatron-Bridge FP8
recipe), and the published recipes still fit under it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from slurmpod.config import builtin_site_path, load_site
from slurmpod.megatron.memory import (
    GIB,
    MIB,
    NCCL_CONNECTION_BYTES,
    nccl_reserve_bytes,
    peak_memory,
    runtime_reserve,
)
from slurmpod.megatron.runspec import ModelConfig, load_run
from tests.helpers import DATA_DIR

RECIPES = DATA_DIR / "recipes"


def _cfg(name: str) -> ModelConfig:
    return ModelConfig.from_args(load_run(RECIPES / f"{name}.toml").megatron.values())


def test_nccl_connection_is_the_three_protocol_buffers() -> None:
    # Simple 4 MiB + LL128 4,915,200 B + LL 512 KiB (nccl src/init.cc)
    assert NCCL_CONNECTION_BYTES == 4 * MIB + 4_915_200 + 512 * 1024 == 9_633_792


def test_llama3_70b_on_h100_by_hand() -> None:
    c = _cfg("llama3-70b-h100-fp8cs-64gpu")
    assert (c.tp, c.pp, c.cp) == (4, 8, 1)
    r = runtime_reserve(c, 64, 80.0, gpus_per_node=8)
    assert r.not_visible_gib == pytest.approx(0.82)
    assert r.cuda_context_gib == 1.0
    assert r.workspaces_gib == pytest.approx(4 * 32 / 1024)
    # TP4 ring (32 channels) + NVLS (4 GPUs of one node); DP2 ring (2 per node: no NVLS);
    # PP sends and receives: 2 peers x 2 channels x 4 MiB
    nccl = 32 * 9_633_792 + 301_989_888 + 32 * 9_633_792 + 2 * 2 * 4 * MIB
    assert r.nccl_gib == pytest.approx(nccl / GIB)
    fixed = 0.82 + 1.0 + 0.125 + nccl / GIB
    assert r.fragmentation_gib == pytest.approx(0.04 * (80 - fixed))
    assert r.total_gib == pytest.approx(5.90, abs=0.01)
    assert set(r.breakdown()) == {"not_visible", "cuda_context", "workspaces", "nccl",
                                  "fragmentation", "total"}
    need = peak_memory(c, 64).bytes_per_gpu / GIB
    assert need <= 80 - r.total_gib  # the recipe ran on 80 GB: it must fit


def test_expert_all_to_all_grows_with_ep_and_a_single_gpu_has_no_nccl() -> None:
    c = _cfg("deepseek-v3-h100-fp8cs-1024gpu")
    small, big = (nccl_reserve_bytes(replace(c, ep=ep), 1024, 8) for ep in (8, 64))
    assert big - small == pytest.approx((63 - 7) * 2 * 4 * MIB)
    one = replace(_cfg("llama3-70b-h100-fp8cs-64gpu"), tp=1, pp=1, cp=1)
    assert nccl_reserve_bytes(one, 1, 8) == 0


def test_before_hopper_smaller_workspaces_and_no_nvls() -> None:
    c = _cfg("llama3-70b-h100-fp8cs-64gpu")
    old = runtime_reserve(c, 64, 80.0, gpus_per_node=8, hopper_or_later=False)
    new = runtime_reserve(c, 64, 80.0, gpus_per_node=8)
    assert old.workspaces_gib == pytest.approx(4 * 4 / 1024)
    assert new.nccl_gib - old.nccl_gib == pytest.approx(301_989_888 / GIB)


@pytest.mark.parametrize("recipe", sorted(RECIPES.glob("*.toml")), ids=lambda p: p.stem)
def test_every_published_recipe_fits_under_the_reserve(recipe: Path) -> None:
    site = load_site(builtin_site_path("gb200-nvl72" if "gb200" in recipe.name
                                       else "dgx-h100-superpod"))
    nt = next(iter(site.node_types.values()))
    c = ModelConfig.from_args(load_run(recipe).megatron.values())
    world = load_run(recipe).job.nodes * nt.gpus
    r = runtime_reserve(c, world, nt.gpu.hbm_gib, gpus_per_node=nt.gpus)
    assert 0 < r.total_gib < 0.1 * nt.gpu.hbm_gib
    assert peak_memory(c, world).bytes_per_gpu / GIB <= nt.gpu.hbm_gib - r.total_gib
