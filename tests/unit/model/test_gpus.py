"""The GPU catalog fills a site's `gpu` figures by model; explicit keys override."""

from __future__ import annotations

import pytest

from slurmpod.config import load_site, resolve_site_path, validate
from slurmpod.errors import ConfigError
from slurmpod.model.gpus import CATALOG, lookup
from slurmpod.model.site import Gpu


def test_catalog_dense_peaks_are_half_the_sparse_data_sheet_figures() -> None:
    assert CATALOG["h100"].peak_tflops_bf16 == 989 and CATALOG["h100"].peak_tflops_fp8 == 1979
    assert CATALOG["b200"].peak_tflops_bf16 == 2250
    # GB200 NVL72: 360 PFLOPS BF16 with sparsity over 72 GPUs = 2.5 PFLOP/s dense per GPU.
    assert CATALOG["gb200"].peak_tflops_bf16 == 2500 and CATALOG["gb200"].peak_tflops_fp8 == 5000
    assert CATALOG["a100"].peak_tflops_fp8 is None
    assert CATALOG["gb200"].nvlink_domain_gpus == 72
    assert all(g.source for g in CATALOG.values())
    assert lookup("H100") is CATALOG["h100"] and lookup("mi300x") is None


def test_blackwell_ultra_has_blackwells_dense_peaks_and_gb300_its_own_fitted_factors() -> None:
    """GB300 NVL72: BF16 360 / FP8 720 PFLOPS with sparsity over 72 GPUs; DGX B300: 72 PFLOPS
    FP8 with sparsity over 8 GPUs. 288 GB of HBM3e each (12-high stacks), 8 TB/s."""
    gb300, b300 = CATALOG["gb300"], CATALOG["b300"]
    assert (gb300.peak_tflops_bf16, gb300.peak_tflops_fp8) == (360_000 / 72 / 2, 720_000 / 72 / 2)
    assert b300.peak_tflops_fp8 == 72_000 / 8 / 2 and b300.peak_tflops_bf16 == 2250
    assert gb300.hbm_gib == b300.hbm_gib == 288 and gb300.hbm_tb_per_s == 576 / 72
    assert (gb300.nvlink_domain_gpus, b300.nvlink_domain_gpus) == (72, 8)
    # GB300 (1,400 W): GB200's peaks, not its speed: factors of its own. The HGX B300 (1,100 W)
    # runs as B200 does per peak: Blackwell's.
    assert gb300.generation == "gb300" != CATALOG["gb200"].generation
    assert b300.generation == CATALOG["b200"].generation == "blackwell"
    # Grace as on GB200 (14.3 TB/s of LPDDR5X over 72 GPUs); DGX B300: 2 Xeon 6776P, each 8
    # channels of DDR5-6400, over 8 GPUs, on the Xeon's PCIe Gen5.
    assert gb300.host_link_gb_per_s == CATALOG["gb200"].host_link_gb_per_s
    assert gb300.host_memory_gb_per_s == pytest.approx(14_300 / 72, abs=0.05)
    assert b300.host_memory_gb_per_s == pytest.approx(2 * 8 * 51.2 / 8)
    assert b300.host_link_gb_per_s == 64
    g = validate(Gpu, {"model": "GB300"}, "site.toml")
    assert g.peak_tflops_fp8 == 5000 and g.hbm_gib == 288


def test_model_alone_takes_every_figure_from_the_catalog() -> None:
    g = validate(Gpu, {"model": "h200"}, "site.toml")
    assert (g.peak_tflops_bf16, g.peak_tflops_fp8, g.hbm_gib) == (989, 1979, 140)
    assert g.hbm_tb_per_s == 4.8 and g.nvlink_gb_per_s == 450 and g.name.startswith("H200")
    # The DGX H200's host: PCIe Gen5 x16, and 2 x 8 channels of DDR5-4800 over 8 GPUs.
    assert g.host_link_gb_per_s == 64 and g.host_memory_gb_per_s == pytest.approx(2 * 8 * 38.4 / 8)


def test_explicit_keys_override_the_catalog() -> None:
    g = validate(Gpu, {"model": "h100", "peak_tflops_bf16": 900, "hbm_gib": 94}, "site.toml")
    assert g.peak_tflops_bf16 == 900 and g.hbm_gib == 94 and g.peak_tflops_fp8 == 1979


def test_host_figures_are_each_reference_systems_share_per_gpu() -> None:
    """Per GPU, one direction: a PCIe x16 link (Gen4 on A100, Gen5 after), or on GB200 half
    of Grace's NVLink-C2C (900 GB/s both ways, two GPUs); host memory over the node's GPUs."""
    assert CATALOG["a100"].host_link_gb_per_s == 32
    assert {CATALOG[m].host_link_gb_per_s for m in ("h100", "h200", "b200")} == {64}
    assert CATALOG["gb200"].host_link_gb_per_s == 900 / 2 / 2
    assert CATALOG["gb200"].host_memory_gb_per_s == pytest.approx(18_400 / 72, abs=0.05)
    assert CATALOG["b200"].host_memory_gb_per_s == pytest.approx(2 * 8 * 44.8 / 8)
    g = validate(Gpu, {"model": "h100", "host_link_gb_per_s": 32}, "site.toml")
    assert g.host_link_gb_per_s == 32
    assert g.host_memory_gb_per_s == CATALOG["h100"].host_memory_gb_per_s


@pytest.mark.parametrize("key", ["host_link_gb_per_s", "host_memory_gb_per_s"])
@pytest.mark.parametrize("bad", [-5, 0, "fast", float("nan")])
def test_a_bad_host_figure_is_one_config_line(key: str, bad: object) -> None:
    with pytest.raises(ConfigError) as exc:
        validate(Gpu, {"model": "h100", key: bad}, "site.toml")
    msg = str(exc.value)
    assert key in msg and "site.toml" in msg and "\n" not in msg


def test_unknown_model_without_figures_is_one_config_line() -> None:
    with pytest.raises(ConfigError) as exc:
        validate(Gpu, {"model": "mi300x"}, "site.toml")
    msg = str(exc.value)
    assert "peak_tflops_bf16" in msg and "catalog" in msg and "\n" not in msg


def test_builtin_sites_still_load() -> None:
    for name in ("dgx-h100-superpod", "gb200-nvl72", "h200-roce", "sandbox"):
        site = load_site(resolve_site_path(name))
        assert all(nt.gpu.peak_tflops_bf16 > 0 for nt in site.node_types.values())
