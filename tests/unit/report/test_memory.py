"""A job report's GPU memory (report/memory.py): Megatron's report of the rank that held the
most, against the HBM of the job's nodes and slurmpod's estimate for the dump's layout."""

from __future__ import annotations

from typing import Any

import pytest

from slurmpod.config import builtin_site_path, load_site
from slurmpod.megatron.memory import GIB, peak_memory
from slurmpod.megatron.runspec import ModelConfig
from slurmpod.report.memory import job_memory
from tests.unit.cli.test_calibrate import DUMP as CALIBRATE_DUMP

SITE = load_site(builtin_site_path("sandbox"))  # emulated 8-GPU nodes gpu001..., 80 GiB
DUMP = {**CALIBRATE_DUMP, "world_size": 16}


def record(**memory: Any) -> dict[str, Any]:
    base = {"ranks": 2, "rank": 3, "max_allocated_mib": 61440.0, "max_reserved_mib": 64512.0,
            "device_used_mib": None}
    return {"summary": {"metrics": {"memory": base | memory}}}


def test_measured_against_the_hbm_and_the_estimate() -> None:
    m = job_memory(record(), DUMP, site=SITE, nodelist="gpu[001-002]", gpus=16)
    assert m is not None and (m.rank, m.hbm_gib) == (3, 80.0)
    assert (m.max_allocated_gib, m.max_reserved_gib, m.device_used_gib) == (60.0, 63.0, None)
    est = peak_memory(ModelConfig.from_args(DUMP), 16).bytes_per_gpu / GIB
    assert m.estimate_gib == pytest.approx(est)
    assert m.vs_estimate == pytest.approx(60.0 / est)
    assert m.line().startswith("rank 3 peak 60.0 GiB allocated, 63.0 GiB reserved by PyTorch, "
                               "of 80 GiB (79%); slurmpod's estimate")
    doc = m.to_json()
    assert doc["held_fraction"] == pytest.approx(63 / 80) and doc["estimate_gib"] == m.estimate_gib


def test_device_memory_is_what_the_rank_held() -> None:
    m = job_memory(record(device_used_mib=66560.0), None, site=SITE, nodelist="gpu001", gpus=8)
    assert m is not None and m.held_gib == 65.0 and m.estimate_gib is None
    assert ", 65.0 GiB on the device, of 80 GiB (81%)" in m.line()


@pytest.mark.parametrize("rec,nodes", [
    (record(max_reserved_mib=90000.0), "gpu001"),  # above the GPU's 80 GiB
    (record(device_used_mib=90000.0), "gpu001"),
    (record(max_allocated_mib=70000.0), "gpu001"),  # allocated above reserved
    (record(rank=-1), "gpu001"),
    (record(rank=True), "gpu001"),
    (record(max_allocated_mib="1"), "gpu001"),
    (record(), "dgx0001"),  # nodes the site file does not place
    ({"summary": {"metrics": {}}}, "gpu001"),
    (None, "gpu001"),
])
def test_what_is_not_shown(rec: Any, nodes: str) -> None:
    assert job_memory(rec, DUMP, site=SITE, nodelist=nodes, gpus=8) is None


def test_a_dump_of_more_gpus_than_slurm_gave_has_no_estimate() -> None:
    m = job_memory(record(), DUMP, site=SITE, nodelist="gpu001", gpus=8)
    assert m is not None and m.estimate_gib is None


def test_allocator_retries_say_the_run_was_at_its_limit() -> None:
    m = job_memory(record(alloc_retries=3), None, site=SITE, nodelist="gpu001", gpus=8)
    assert m is not None and m.alloc_retries == 3 and m.to_json()["alloc_retries"] == 3
    assert m.line().endswith("; 3 allocator retries (cudaMalloc failed, PyTorch freed its "
                             "cache and retried: at the memory limit)")
    for bad in (-1, True, "3", 2.5):
        m = job_memory(record(alloc_retries=bad), None, site=SITE, nodelist="gpu001", gpus=8)
        assert m is not None and m.alloc_retries is None


def test_a_job_report_shows_it_and_retries_give_the_memory_limit_note() -> None:
    """Through build_job_report on the H100 site's node (80 GiB), with Megatron-Bridge's
    retries: text line, JSON, HTML tile and the `memory-limit` note."""
    from dataclasses import replace

    from slurmpod.config import resolve_site_path
    from slurmpod.report.build import build_job_report
    from slurmpod.report.html import job_html
    from slurmpod.report.sacct import parse_sacct_jobs
    from slurmpod.report.text import job_text
    from tests.helpers import DATA_DIR

    h100 = load_site(resolve_site_path("dgx-h100-superpod"))
    text = (DATA_DIR / "report" / "sacct-handmade-22.05.json").read_text()
    base = next(sj for sj in parse_sacct_jobs(text) if sj.record.job_id == "101")
    sj = replace(base, record=replace(base.record, nodes="dgx0001", n_nodes=1, n_gpus=8))
    rec = record(alloc_retries=4)
    rec["v"] = 1
    rec["summary"] |= {"iters": 20, "last_iter": 20}
    rec["summary"]["metrics"]["iter_time_ms"] = {"median": 1000.0, "p10": 1000.0,
                                                 "p90": 1000.0}
    r = build_job_report(sj, spool_record=rec, site=h100)
    assert r.memory is not None and r.memory.alloc_retries == 4 and r.memory.hbm_gib == 80
    note = next(n for n in r.notes if n.code == "memory-limit")
    assert "retried 4 cudaMalloc call(s)" in note.text and "expandable_segments" in note.fix
    assert r.to_json()["memory"]["alloc_retries"] == 4
    assert "  memory       rank 3 peak 60.0 GiB allocated" in job_text(r)
    assert "GPU memory" in job_html(r, generated="now")
    quiet = build_job_report(sj, spool_record=rec | {"summary": rec["summary"] | {
        "metrics": rec["summary"]["metrics"] | {"memory": record()["summary"]["metrics"][
            "memory"]}}}, site=h100)
    assert quiet.memory is not None and not any(n.code == "memory-limit" for n in quiet.notes)


def test_small_figures_keep_their_digits() -> None:
    """A sandbox's emulated GPU holds MiB: 3 significant digits, not 0.0 GiB."""
    m = job_memory(record(max_allocated_mib=44.0, max_reserved_mib=52.0), None, site=SITE,
                   nodelist="gpu001", gpus=8)
    assert m is not None
    assert m.line().startswith("rank 3 peak 0.043 GiB allocated, 0.0508 GiB reserved by PyTorch")
