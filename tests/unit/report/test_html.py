"""The HTML job and fleet reports as a person reads them: headline first, people's numbers,
no internal wording, plots as inline SVG, the attempt record and GPU telemetry shown.

The job is a 32-node Llama-3-70B-like run on the built-in DGX H100 SuperPOD site (dgx0029-0060:
two SUs), requeued once after a node failure; its spool record is written the way the epilog
writes one (summary, series downsampled to 512 points, two launch segments), its log head holds
a Megatron-LM argument dump in Megatron's own format (`_print_args`: `  name ..... value`), and
its attempt record is the job script's (docs/runs.md)."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from slurmpod.config import load_site, resolve_site_path
from slurmpod.report.build import build_job_report
from slurmpod.report.extras import (
    JobExtras,
    extras_from,
    job_extras,
    layout_of,
    telemetry_of,
    typical_band,
)
from slurmpod.report.fleet import build_fleet
from slurmpod.report.html import (
    duration,
    energy,
    fleet_html,
    human,
    job_html,
    per_token,
    verdict_of,
)
from slurmpod.report.model import Note
from slurmpod.report.plots import nice_ticks, tick_label
from slurmpod.report.sacct import Attempt as SacctAttempt
from slurmpod.report.sacct import SacctJob, parse_sacct_jobs
from slurmpod.runs.attempts import Attempt
from tests.helpers import DATA_DIR

DATA = DATA_DIR
T0 = 1_764_000_000  # submission, epoch seconds
NODES = "dgx[0029-0060]"
GPUS = 256

ARGS_DUMP = """------------------------ arguments ------------------------
  bf16 ............................................ True
  context_parallel_size ........................... 1
  data_parallel_size .............................. 8
  expert_model_parallel_size ...................... 1
  ffn_hidden_size ................................. 28672
  fp8 ............................................. None
  global_batch_size ............................... 512
  hidden_size ..................................... 8192
  micro_batch_size ................................ 1
  num_attention_heads ............................. 64
  num_layers ...................................... 80
  num_query_groups ................................ 8
  pipeline_model_parallel_size .................... 4
  seq_length ...................................... 8192
  tensor_model_parallel_size ...................... 8
  virtual_pipeline_model_parallel_size ............ None
-------------------- end of arguments ---------------------
"""


def _series() -> dict[str, list[Any]]:
    """512 points: launch 1 to iteration 3,000, launch 2 resumed from the checkpoint at 2,500."""
    it = [round(k * 3000 / 255) for k in range(256)] + [2500 + round(k * 2500 / 255)
                                                       for k in range(256)]
    seg = [0] * 256 + [1] * 256
    ms = [4200.0 + 90 * math.sin(k / 7) + (2600.0 if k in (40, 300) else 0.0)
          for k in range(512)]
    ms[0] = ms[256] = 31000.0  # first iteration of each launch: compilation, warm-up
    return {"iter": it, "segment": seg, "t": [k * 20.0 for k in range(512)], "iter_ms": ms,
            "steady": [k not in (0, 256) for k in range(512)],
            "mfu": [round(0.41 * 4200.0 / v, 5) for v in ms],
            "tflops": [round(0.41 * 989 * 4200.0 / v, 2) for v in ms]}


def _gpu_part() -> dict[str, Any]:
    """`record["gpu"]` as slurmpod.telemetry.schema stores it: more GPUs than MAX_SERIES_KEYS,
    so one key per node (the mean over its GPUs), 60 one-minute samples."""
    keys = [f"dgx{n:04d}" for n in range(29, 61)]
    return {"series": {"t": [T0 + 9910 + 60.0 * k for k in range(60)], "keys": keys,
                       "util": [[0.0 if k < 3 else 97.0 - (n % 5) for k in range(60)]
                                for n in range(29, 61)],
                       "power_w": [[110.0 if k < 3 else 640.0 + n for k in range(60)]
                                   for n in range(29, 61)]}}


GPU_SUMMARY = {"v": 1, "src": "dcgm", "trust": "site", "n": GPUS, "span_s": 23400.0,
               "util": 94.1, "util_min": 92.0, "idle_gpus": 0, "sm": 71.5, "tensor": 38.2,
               "mem_gib": 71.3, "mem_total_gib": 80.0, "power_w": 651.0, "power_max_w": 699.0,
               "energy_j": 3.9e9, "energy_src": "dcgm", "temp_max_c": 79, "sm_mhz": 1980,
               "xid": 0}


def record() -> dict[str, Any]:
    return {
        "v": 1,
        "job": {"job_id": "103", "uid": 1000, "user": "alice", "name": "llama3-70b"},
        "comment": {"slurmpod": "0.1.0", "run": "llama3-70b-pretrain", "flops_per_iter": 1.0},
        "log": {"path": "/nonexistent/logs/llama3-70b-103.out"},
        "summary": {"iters": 5000, "last_iter": 5000, "peak": 989.0, "gpus": GPUS,
                    "mfu": 0.41, "mfu_p10": 0.39, "mfu_p90": 0.42, "tflops": 405.5,
                    "tokens_per_s": 247000.0, "iter_ms": 4200.0, "ttfi_s": 180.0,
                    "fv": "megatron-core-0.12", "restarts": 1,
                    "metrics": {"productive_s": 21000.0, "lost_s": 2100.0,
                                "checkpoint_stall_s": 240.0,
                                "mfu": {"median": 0.41, "p10": 0.39, "p90": 0.42},
                                "checkpoint_stalls": [{"iteration": 2500, "duration_s": 40.0}]},
                    "gpu": GPU_SUMMARY},
        "series": _series(),
        "gpu": _gpu_part(),
    }


def sacct_job() -> SacctJob:
    text = (DATA / "report" / "sacct-handmade-22.05.json").read_text()
    sj = next(s for s in parse_sacct_jobs(text) if s.record.job_id == "103")
    rec = replace(sj.record, name="llama3-70b", user="alice", account="ml-pretrain",
                  partition="batch", nodes=NODES, n_nodes=32, n_gpus=GPUS, elapsed_s=14400,
                  submit_time=datetime.fromtimestamp(T0, UTC),
                  start_time=datetime.fromtimestamp(T0 + 9900, UTC),
                  end_time=datetime.fromtimestamp(T0 + 9900 + 14400, UTC))
    atts = (SacctAttempt(T0, T0 + 600, T0 + 600 + 9000, 9000, "REQUEUED"),
            SacctAttempt(T0 + 9600, T0 + 9900, T0 + 9900 + 14400, 14400, "COMPLETED"))
    return SacctJob(rec, atts)


def script_attempts() -> tuple[Attempt, ...]:
    log = "/nonexistent/logs/llama3-70b-103.out"
    nodes = tuple(f"dgx{n:04d}" for n in range(29, 61))
    return (Attempt("103", 1, restart=0, start_s=T0 + 610, end_s=T0 + 9590, nodes=nodes,
                    log=log, end="node_fail", rc=1, iteration=2500),
            Attempt("103", 2, restart=1, start_s=T0 + 9910, end_s=T0 + 24290, nodes=nodes,
                    log=log, end="completed", rc=0, iteration=5000))


def extras() -> JobExtras:
    return extras_from(record(), log_head=ARGS_DUMP.encode(), script_attempts=script_attempts(),
                       gpus=GPUS)


def job_report() -> Any:
    inv = load_site(resolve_site_path("dgx-h100-superpod")).inventory
    return build_job_report(sacct_job(), spool_record=record(), inventory=inv)


def page() -> str:
    return job_html(job_report(), generated="2026-11-25 10:00:00 UTC", extras=extras())


class _Text(HTMLParser):
    """The text a reader sees (outside <style>, <title> of SVGs included) and the section
    order."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.ids: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "style":
            self._skip += 1
        d = dict(attrs)
        if tag in ("section", "svg") and d.get("id"):
            self.ids.append(str(d["id"]))

    def handle_endtag(self, tag: str) -> None:
        if tag == "style":
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.text.append(data)


def _read(html: str) -> _Text:
    p = _Text()
    p.feed(html)
    return p


SCI = re.compile(r"\d\.?\d*[eE][+-]?\d")


def test_job_page_reads_top_down() -> None:
    html = page()
    p = _read(html)
    sections = [i for i in p.ids if not i.startswith("plot-")]
    assert sections[:5] == ["headline", "model", "placement", "attempts", "plots"]
    assert sections.index("notes") > sections.index("plots")
    # Plots where they belong: placement map under placement, the run under performance.
    order = p.ids
    assert order.index("plot-placement") < order.index("attempts") < order.index("plot-attempts")
    assert order.index("plots") < order.index("plot-mfu") < order.index("plot-step")
    assert {"plot-gpu-util", "plot-gpu-power", "plot-hist"} <= set(order)


def test_headline_has_the_figures_people_ask_for() -> None:
    p = _read(page())
    text = " ".join(" ".join(p.text).split())
    head = text[text.index("MFU"):text.index("Model and layout")]
    assert "41.0 %" in head and "p10 39.0 % · p90 42.0 %" in head
    # goodput: productive 21,000 s per GPU over 9,000 + 14,400 s allocated = 89.7 %
    assert "89.7 %" in head
    assert "965" in head  # 247,000 tokens/s / 256 GPUs = 964.8
    assert "247,000 tokens/s on 256 GPUs" in head
    # energy per token: 3.9e9 J / (247,000 tokens/s x 21,000 s) = 0.752 J/token; 1,083 kWh
    assert "Energy per token 0.752 J 1.08 MWh in all" in head  # DCGM's energy
    assert "GPU-hours 1,664" in head  # 256 GPUs x 23,400 s = 1,664 GPU-h
    assert "thing" in head or "Healthy" in head  # the verdict is in the card


def test_no_scientific_notation_nor_internal_wording() -> None:
    html = page()
    text = " ".join(_read(html).text)
    assert not SCI.search(text), SCI.search(text)
    for internal in ("spool", "admin_comment", "live_comment", "figures from the"):
        assert internal not in text.lower(), internal
    assert "<script" not in html and "http://" not in html and "https://" not in html


def test_model_layout_and_attempts_shown() -> None:
    text = " ".join(" ".join(_read(page()).text).split())
    assert "llama3-70b-pretrain" in text
    for cell in ("TP 8", "PP 4", "DP 8", "layers 80", "hidden size 8,192",
                 "sequence length 8,192", "global batch 512", "precision BF16",
                 "about 70 billion parameters"):
        assert cell in text, cell
    assert "VPP" not in text and "CP 1" not in text  # unset / 1: not worth a row
    assert "1 2025-11-24 16:00:00 UTC" in text and "node failure (exit code 1)" in text
    assert "2 2025-11-24 18:40:00 UTC" in text and "completed" in text
    assert "attempt 1: node failure" in text  # the timeline's tooltip
    assert "2,500" in text  # checkpointed iteration after attempt 1
    assert "2 h 29 min" in text  # attempt 1 ran 8,980 s
    assert "node_fail" not in text  # the record's words are shown as sentences


def test_mfu_plot_has_peak_line_and_band() -> None:
    html = page()
    svg = html[html.index('<svg id="plot-mfu"'):]
    svg = svg[:svg.index("</svg>")]
    assert 'class="peak"' in svg and "100 % = peak 989 TFLOP/s per GPU" in svg
    assert 'class="band"' in svg and "typical large runs 30–50 %" in svg
    assert svg.count("<path") == 2  # one line per launch
    assert "restart" in svg


def test_telemetry_missing_means_no_gpu_section_and_not_measured() -> None:
    rec = record()
    del rec["gpu"]
    del rec["summary"]["gpu"]
    inv = load_site(resolve_site_path("dgx-h100-superpod")).inventory
    r = build_job_report(sacct_job(), spool_record=rec, inventory=inv)
    html = job_html(r, generated="now", extras=extras_from(rec, log_head=b"", gpus=GPUS))
    assert "plot-gpu-util" not in html and "gpu-telemetry" not in html
    text = " ".join(" ".join(_read(html).text).split())
    assert "Energy per token – not measured" in text
    assert "GPU utilisation not measured" in text and "energy not measured" in text
    assert "not in the log" in text  # no argument dump: the layout says where it would be


def test_resource_use_from_telemetry() -> None:
    text = " ".join(" ".join(_read(page()).text).split())
    sec = text[text.index("Resource use"):text.index("Where the GPU time went")]
    for cell in ("GPU utilisation 94.1 % (from dcgm)", "SM activity 71.5 %",
                 "tensor-core activity 38.2 %", "GPU memory, peak 71.3 GiB of 80 GiB",
                 "GPU power 651 W mean per GPU, 699 W highest", "XID errors 0",
                 "energy 1.08 MWh"):
        assert cell in sec, cell
    assert "Measured by DCGM job statistics." in text


def test_a_non_training_gpu_job_gets_seff_tiles() -> None:
    rec = {"v": 1, "summary": {"iters": 0, "err": "no-iterations", "gpus": GPUS,
                               "gpu": GPU_SUMMARY}, "gpu": _gpu_part()}
    r = build_job_report(sacct_job(), spool_record=rec)
    html = job_html(r, generated="now", extras=extras_from(rec, gpus=GPUS))
    text = " ".join(" ".join(_read(html).text).split())
    head = text[:text.index("Model and layout")]
    assert "GPU utilisation 94.1 %" in head and "CPU efficiency" in head
    assert "Energy 1.08 MWh" in head and "MFU" not in head
    assert "plot-gpu-util" in html and "plot-mfu" not in html


def test_a_bare_report_without_extras_renders() -> None:
    sj = sacct_job()
    r = build_job_report(sj)  # no spool, no site: identity and Slurm's figures only
    html = job_html(r, generated="now")
    text = " ".join(" ".join(_read(html).text).split())
    assert "attempt 1" in text and "requeued (Slurm: REQUEUED)" in text
    assert "completed (Slurm: COMPLETED)" in text
    assert not SCI.search(text)


def test_verdicts() -> None:
    r = job_report()
    assert verdict_of(replace(r, notes=())).tone == "good"
    warn = replace(r, notes=(Note("warn", "low-mfu", "MFU 12 % is far below typical"),))
    v = verdict_of(warn)
    assert v.tone == "warn" and v.title == "1 thing to look at" and "12 %" in v.text
    bad = replace(r, implausible=("mfu-over-1",))
    assert verdict_of(bad).tone == "bad"


def test_telemetry_series_is_range_checked_and_grouped_per_node() -> None:
    doc = {"series": {"t": [T0, T0 + 60, T0 + 120], "keys": ["n1:0", "n1:1", "n2:0", "n2:1"],
                      "util": [[50, 250, 40], [70, -5, 60], [10, 10, 10], [30, 30, None]],
                      "power_w": [[700, 9000, 650]] * 4}}
    t = telemetry_of(doc, {"src": "nvidia-smi"})
    assert t is not None and t.rows == ("n1", "n2") and t.t == (0.0, 60.0, 120.0)
    assert t.util[0] == (60.0, None, 50.0)  # 250 % and -5 % are not measurements
    assert t.util[1] == (20.0, 20.0, 10.0)
    assert t.power[0][1] is None  # 9 kW for one GPU is not either
    assert t.source == "nvidia-smi, sampled in the job"
    one = telemetry_of({"series": {"t": [T0], "keys": ["n1:0", "n1:1"], "util": [[5], [7]]}})
    assert one is not None and one.rows == ("n1:0", "n1:1")  # one node: a row per GPU
    assert telemetry_of("garbage") is None and telemetry_of({"series": {"t": "x"}}) is None


def test_layout_derives_dp_and_cuts_long_values() -> None:
    lay, model, prec = layout_of({"tensor_model_parallel_size": 8,
                                  "pipeline_model_parallel_size": 4,
                                  "num_layers": "x" * 500, "fp8": "hybrid"}, gpus=512)
    assert ("DP", "16") in lay
    assert len(dict(model)["layers"]) <= 80 and prec == "FP8 (hybrid)"


def test_job_extras_reads_nothing_it_may_not(tmp_path: Path) -> None:
    rec = record()
    link = tmp_path / "logs" / "job.out"
    link.parent.mkdir()
    target = tmp_path / "secret"
    target.write_text(ARGS_DUMP)
    link.symlink_to(target)
    rec["log"] = {"path": str(link)}
    import os

    rec["job"]["uid"] = os.getuid()
    x = job_extras(rec, gpus=GPUS)
    assert x.layout == ()  # a symlink is not followed
    link.unlink()
    link.write_text(ARGS_DUMP)
    assert dict(job_extras(rec, gpus=GPUS).layout)["TP"] == "8"


def test_typical_band_is_weighted_quartiles() -> None:
    class Row:
        def __init__(self, mfu: float, h: float) -> None:
            self.mfu, self.gpu_hours, self.implausible, self.size_class = mfu, h, (), "1-10B"

    rows = [Row(0.2, 1), Row(0.3, 1), Row(0.4, 1), Row(0.5, 1), Row(0.6, 1)]
    assert typical_band(rows, "1-10B") == (0.3, 0.5)
    assert typical_band(rows[:4], "1-10B") is None
    assert typical_band(rows, "<1B") is None


@pytest.mark.parametrize(("x", "want"), [
    (64730, "64,730"), (1234567, "1.23 M"), (3.14159, "3.14"), (0.000123, "0.000123"),
    (999.96, "1,000"), (2.5e12, "2.5 T"), (0, "0"), (None, "–"), (float("nan"), "–"),
    (-42.0, "-42"), (1e21, "1,000,000 P"),
])
def test_human_numbers(x: Any, want: str) -> None:
    assert human(x) == want


def test_units() -> None:
    assert duration(3725) == "1 h 02 min" and duration(75) == "1 min 15 s"
    assert duration(200000) == "2 d 7 h" and duration(None) == "–"
    assert energy(3.6e6) == "1 kWh" and energy(7.2e9) == "2 MWh" and energy(1800) == "0.5 Wh"
    assert per_token(0.42) == "0.42 J" and per_token(0.004) == "4 mJ"
    assert [tick_label(v) for v in (0, 0.25, 1500, 64000, 2.5e6, 1e13)] == [
        "0", "0.25", "1,500", "64k", "2.5M", "10,000G"]
    assert nice_ticks(0, 105, 5) == [0, 25, 50, 75, 100]
    assert nice_ticks(0, 0.9, 4) == [0, 0.25, 0.5, 0.75]


def fleet_page(n: int = 40) -> str:
    from slurmpod.report.build import build_job_report

    sj = sacct_job()
    reports = []
    for k in range(n):
        rec = replace(sj.record, job_id=str(1000 + k), user=f"user{k % 7}",
                      account=f"acct{k % 3}", partition="batch" if k % 4 else "long",
                      name="=cmd|' /C calc'!A0" if k == 3 else f"job-{k}")
        spool = record()
        spool["summary"] = dict(spool["summary"], mfu=0.2 + 0.01 * k)
        spool["summary"]["metrics"] = dict(spool["summary"]["metrics"],
                                           mfu={"median": 0.2 + 0.01 * k})
        reports.append(build_job_report(SacctJob(rec, sj.attempts), spool_record=spool,
                                        with_series=False, with_notes=False))
    return fleet_html(build_fleet(reports, window="7d"), generated="now")


def test_fleet_page_tables_and_ranking() -> None:
    html = fleet_page()
    p = _read(html)
    sections = [i for i in p.ids if not i.startswith("plot-")]
    assert sections[:2] == ["headline", "plots"]
    for s in ("wasted", "chargeback", "by-user", "by-account", "by-partition"):
        assert s in sections, s
    text = " ".join(" ".join(p.text).split())
    assert not SCI.search(text)
    assert "66,560" in text  # 40 jobs x 1,664 GPU-h
    # Every row carries the record's DCGM energy (3.9e9 J): 40 x 3.9e9 J = 43.3 MWh.
    assert "Energy 43.3 MWh measured on 40 jobs" in text
    assert "long" in text and "batch" in text  # partitions
    assert "spool" not in text.lower()
    assert "<svg id=\"plot-fleet-mfu\"" in html


def test_fleet_energy_column_when_rows_carry_it() -> None:
    from slurmpod.report.html import chargeback

    class Row:
        def __init__(self, acct: str, e: float | None) -> None:
            self.account, self.energy_j, self.implausible = acct, e, ()
            self.gpu_hours, self.productive_gpu_hours, self.lost_gpu_hours = 10.0, 8.0, 2.0

    got = chargeback([Row("a", 3.6e9), Row("a", None), Row("b", None)])  # type: ignore[list-item]
    a, b = got
    assert (a.key, a.energy_j, a.energy_jobs, a.gpu_hours) == ("a", 3.6e9, 1, 20.0)
    assert b.energy_jobs == 0
