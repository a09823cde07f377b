"""A site's own calibration, kept beside its site file (`<site>.perf.toml`): the efficiency
factors `slurmpod calibrate` fitted on the site's jobs (`save`, `load_site_efficiency`) and the
runtime memory reserve they measured (`save_reserve`, `load_site_reserve`). `plan` reads it on
every run, so this module stays small: the fitting lives in `perf.calibrate`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from slurmpod.megatron.memory import MeasuredReserve
from slurmpod.perf.fitted import FITTED, MOE_FP8_HOST_FORWARD_S, Efficiency


def store_path(site_path: Path) -> Path:
    """Where a site's calibration lives: beside its site file."""
    return site_path.with_name(site_path.stem + ".perf.toml")


def _stored(path: Path) -> dict[str, Any]:
    """What the calibration file holds now ({} when there is none or it does not read)."""
    import tomllib  # lazy: start-up

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(path: Path, body: Mapping[str, Any]) -> None:
    import tomli_w  # lazy: start-up (tomli_w only when used)

    from slurmpod.fsutil import write_atomic  # lazy: start-up

    write_atomic(path, "# slurmpod calibrate: the performance model's efficiency factors and "
                 "the memory reserve, measured on this site's jobs\n" + tomli_w.dumps(body))


def save(path: Path, generation: str, eff: Efficiency, n_jobs: int) -> None:
    """Store the efficiency factors (and the host's FP8 MoE forward when this site's jobs
    fitted one), keeping a memory reserve the file already holds."""
    body = {k: v for k, v in _stored(path).items() if k == "memory"}
    host = ({"moe_fp8_host_forward_s": eff.moe_fp8_host_forward_s}
            if eff.moe_fp8_host_forward_s != MOE_FP8_HOST_FORWARD_S else {})
    _write(path, {"generation": generation, "gemm": eff.gemm, "fp8": eff.fp8} | host
           | {"jobs": n_jobs} | body)


def save_reserve(path: Path, r: MeasuredReserve) -> None:
    """Store the measured memory reserve as `[memory]`, keeping the file's other keys."""
    mem: dict[str, Any] = {"gpu": r.gpu_model, "hbm_gib": r.hbm_gib, "cached_gib": r.cached_gib,
                           "jobs": r.jobs}
    if r.outside_torch_gib is not None:
        mem |= {"outside_torch_gib": r.outside_torch_gib, "jobs_outside": r.jobs_outside}
    _write(path, {k: v for k, v in _stored(path).items() if k != "memory"} | {"memory": mem})


def _site_store(site_path: Path | None) -> tuple[str, dict[str, Any]]:
    """The calibration file beside the site: its name and what it holds ({} when none)."""
    if site_path is None:
        return "", {}
    path = store_path(site_path)
    return path.name, _stored(path) if path.is_file() else {}


def load_site_efficiency(site_path: Path | None, generation: str) -> Efficiency | None:
    """The site's calibrated factors, when `slurmpod calibrate` stored some for `generation`."""
    name, data = _site_store(site_path)
    try:
        if data.get("generation") != generation:
            return None
        host = float(data.get("moe_fp8_host_forward_s", MOE_FP8_HOST_FORWARD_S))
        if not 0 < host < 1:  # a hand-edited file: seconds, never a second or more
            return None
        return replace(FITTED.get(generation, FITTED["hopper"]), gemm=float(data["gemm"]),
                       fp8=float(data["fp8"]), moe_fp8_host_forward_s=host,
                       fitted_on=f"{name}: {int(data.get('jobs', 0))} jobs of this site")
    except (ValueError, KeyError, TypeError):
        return None


def _gib(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not (0 <= v < 1 << 20):
        raise ValueError(v)
    return float(v)


def load_site_reserve(site_path: Path | None, gpu_model: str) -> MeasuredReserve | None:
    """The memory reserve `slurmpod calibrate` measured on this site's `gpu_model` GPUs."""
    mem = _site_store(site_path)[1].get("memory")
    if not isinstance(mem, dict) or mem.get("gpu") != gpu_model:
        return None
    try:
        outside = mem.get("outside_torch_gib")
        return MeasuredReserve(gpu_model, _gib(mem["hbm_gib"]), _gib(mem["cached_gib"]),
                               None if outside is None else _gib(outside),
                               int(mem.get("jobs", 0)), int(mem.get("jobs_outside", 0)))
    except (ValueError, KeyError, TypeError):
        return None
