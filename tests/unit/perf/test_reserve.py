"""The runtime memory reserve a site's jobs measured (`perf.reserve`), how it is stored beside
the site file and how it replaces the published parts of `megatron.memory.runtime_reserve`."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmpod.megatron.memory import MeasuredReserve, runtime_reserve
from slurmpod.megatron.runspec import ModelConfig, load_run, preset_path
from slurmpod.perf.fitted import FITTED
from slurmpod.perf.reserve import fit_reserve, memory_point
from slurmpod.perf.store import (
    load_site_efficiency,
    load_site_reserve,
    save,
    save_reserve,
    store_path,
)


def mem(alloc: float, reserved: float, used: float | None = None) -> dict[str, object]:
    return {"rank": 0, "max_allocated_mib": alloc, "max_reserved_mib": reserved,
            "device_used_mib": used}


def test_a_point_from_a_record() -> None:
    p = memory_point("7", mem(61440.0, 64512.0, 66560.0), "h100", 80.0, "h100")
    assert not isinstance(p, str)
    assert (p.max_allocated_gib, p.cached_gib, p.outside_torch_gib) == (60.0, 3.0, 2.0)
    assert memory_point("7", mem(61440.0, 64512.0), "h100", 80, "h100").outside_torch_gib is None  # type: ignore[union-attr]


@pytest.mark.parametrize("memory,why", [
    (None, "no-memory-report"),
    ("61440", "no-memory-report"),
    (mem(61440.0, 90000.0), "bad-memory-report"),  # above the GPU's 80 GiB
    (mem(61440.0, 64512.0, 90000.0), "bad-memory-report"),
    (mem(70000.0, 64512.0), "bad-memory-report"),  # allocated above reserved
    (mem(-1.0, 64512.0), "bad-memory-report"),
    (mem(float("nan"), 64512.0), "bad-memory-report"),
    ({"max_allocated_mib": True, "max_reserved_mib": 1.0}, "bad-memory-report"),
    ({"max_reserved_mib": 1.0}, "bad-memory-report"),
    (mem(1.0, 2.0, "3"), "bad-memory-report"),  # type: ignore[arg-type]
    (mem(1.0, 2.0) | {"rank": -1}, "bad-memory-report"),
    (mem(1.0, 2.0) | {"rank": True}, "bad-memory-report"),
])
def test_what_is_no_point(memory: object, why: str) -> None:
    assert memory_point("7", memory, "h100", 80.0, "h100") == why


def test_another_gpu_is_not_this_fit() -> None:
    assert memory_point("7", mem(1.0, 2.0), "h200", 141.0, "h100") == "other-gpu"


def test_upper_quartile_resists_one_job() -> None:
    """One job's log claims a huge cache; the upper quartile of 8 jobs does not follow it."""
    pts = [memory_point(str(i), mem(60000.0, 60000.0 + 1024 * c, None), "h100", 80.0, "h100")
           for i, c in enumerate([1.0, 1.5, 2.0, 2.0, 2.5, 3.0, 3.0, 19.0])]
    r = fit_reserve([p for p in pts if not isinstance(p, str)])
    assert r.cached_gib == pytest.approx(3.0) and r.outside_torch_gib is None
    assert (r.jobs, r.jobs_outside, r.gpu_model, r.hbm_gib) == (8, 0, "h100", 80.0)
    with pytest.raises(ValueError):
        fit_reserve([])


def test_measured_parts_replace_published_ones() -> None:
    c = ModelConfig.from_args(load_run(preset_path("llama3-70b")).megatron.values())
    pub = runtime_reserve(c, 64, 80.0, gpus_per_node=8)
    assert pub.measured == ""
    cache_only = MeasuredReserve("h100", 80.0, 1.5, None, 4, 0)
    r = runtime_reserve(c, 64, 80.0, gpus_per_node=8, measured=cache_only)
    assert r.fragmentation_gib == 1.5 and r.nccl_gib == pub.nccl_gib
    assert r.measured == "cache measured on 4 job(s)"
    both = MeasuredReserve("h100", 80.0, 1.5, 2.25, 4, 3)
    r = runtime_reserve(c, 64, 80.0, gpus_per_node=8, measured=both)
    assert r.total_gib == pytest.approx(pub.not_visible_gib + 2.25 + 1.5)
    # measured on another HBM size: not this GPU's
    assert runtime_reserve(c, 64, 141.0, gpus_per_node=8, measured=both).measured == ""


def test_stored_beside_the_site_with_the_efficiency(tmp_path: Path) -> None:
    site = tmp_path / "lab.toml"
    path = store_path(site)
    r = MeasuredReserve("h100", 80.0, 1.5, 2.25, 4, 3)
    save_reserve(path, r)
    save(path, "hopper", FITTED["hopper"], 5)  # the factors keep the reserve ...
    assert load_site_reserve(site, "h100") == r
    save_reserve(path, MeasuredReserve("h100", 80.0, 1.0, None, 2, 0))  # ... and vice versa
    eff = load_site_efficiency(site, "hopper")
    assert eff is not None and eff.gemm == FITTED["hopper"].gemm
    assert load_site_reserve(site, "h100") == MeasuredReserve("h100", 80.0, 1.0, None, 2, 0)
    assert load_site_reserve(site, "h200") is None
    assert load_site_reserve(None, "h100") is None


def test_a_site_fitted_host_figure_is_stored_and_read_back(tmp_path: Path) -> None:
    """Kept only when the site's jobs fitted one; a hand-edited absurd value is no calibration."""
    import dataclasses

    site = tmp_path / "lab.toml"
    path = store_path(site)
    save(path, "hopper", FITTED["hopper"], 5)
    assert "moe_fp8_host_forward_s" not in path.read_text()
    own = dataclasses.replace(FITTED["hopper"], moe_fp8_host_forward_s=0.0071)
    save(path, "hopper", own, 5)
    eff = load_site_efficiency(site, "hopper")
    assert eff is not None and eff.moe_fp8_host_forward_s == 0.0071
    path.write_text(path.read_text().replace("0.0071", "3600"))
    assert load_site_efficiency(site, "hopper") is None


@pytest.mark.parametrize("body", [
    '[memory]\ngpu = "h100"\nhbm_gib = 80\ncached_gib = -1\n',
    '[memory]\ngpu = "h100"\nhbm_gib = 80\ncached_gib = "2"\n',
    '[memory]\ngpu = "h100"\ncached_gib = 2\n',
    'memory = 3\n',
    'not toml [',
])
def test_a_broken_store_is_no_reserve(tmp_path: Path, body: str) -> None:
    store_path(tmp_path / "lab.toml").write_text(body)
    assert load_site_reserve(tmp_path / "lab.toml", "h100") is None
