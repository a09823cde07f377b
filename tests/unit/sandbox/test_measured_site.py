"""The sandbox's measured site: emulated GPUs get the measured peak, nothing else changes."""

from pathlib import Path

from slurmpod.config import builtin_site_path, load_site, read_toml, resolve_site_path
from slurmpod.sandbox.measured_site import with_measured_peak, write_measured_site


def test_only_emulated_gpus_get_the_measured_peak(tmp_path: Path) -> None:
    data = read_toml(builtin_site_path("sandbox"))
    out = with_measured_peak(data, 0.0123456789)
    assert out is not None
    (nt,) = out["node_types"].values()
    assert nt["gpu"]["peak_tflops_bf16"] == 0.01235
    assert data["node_types"]["emu8"]["gpu"]["peak_tflops_bf16"] == 0.05  # input untouched
    assert {k: v for k, v in out.items() if k != "node_types"} == {
        k: v for k, v in data.items() if k != "node_types"}


def test_real_sites_are_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "site.toml"
    target.write_text("stale")
    assert write_measured_site(builtin_site_path("dgx-h100-superpod"), target,
                               measure=lambda: 1 / 0) is None  # never measured
    assert not target.exists()


def test_written_site_loads_with_the_measured_peak(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "site.toml"
    peak = write_measured_site(builtin_site_path("sandbox"), target, measure=lambda: 0.0421)
    assert peak == 0.0421
    site = load_site(target)
    assert site.node_types["emu8"].gpu.peak_tflops_bf16 == 0.0421
    assert [n.name for n in site.inventory.nodes] == [
        n.name for n in load_site(builtin_site_path("sandbox")).inventory.nodes]
    monkeypatch.setenv("SLURMPOD_SITE", str(target))
    assert resolve_site_path(None) == target
    monkeypatch.delenv("SLURMPOD_SITE")
    assert resolve_site_path(None) == builtin_site_path("dgx-h100-superpod")


def test_up_measures_a_peak_robust_to_load(monkeypatch) -> None:
    # `up` keeps the robust statistic of samples spread over time, not one quick burst.
    from slurmpod.sandbox import measured_site
    from slurmpod.sandbox.workload import calibrate

    seen: dict[str, object] = {}

    def fake_sample_peak(**kw: object) -> calibrate.PeakEstimate:
        seen.update(kw)
        samples = (0.26, 0.11, 0.259, 0.13, 0.2, 0.05)  # mostly loaded, two quiet
        return calibrate.PeakEstimate(calibrate.robust_peak(samples), 0.13, samples, 1024, 0.7)

    monkeypatch.setattr(calibrate, "sample_peak", fake_sample_peak)
    assert measured_site.measure_peak() == 0.259 and seen == {}  # sample_peak's defaults
