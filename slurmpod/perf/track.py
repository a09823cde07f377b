"""The performance model's track record: how far its prediction was from published runs of the
same model architecture, as `slurmpod plan` reports it beside a prediction (docs/perf-model.md).

`track_record.json` beside this module holds every validation row of the published table
(tests/data/perf/published.toml) with its error, predicted / published - 1. It is written by
`benchmarks/plan_search.py --write` and held current by tests/unit/perf/test_validation.py, so
`plan` reads it without running the table. Calibration rows are left out: they are fitted.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slurmpod.megatron.runspec import ModelConfig

TRACK_PATH = Path(__file__).resolve().parent / "track_record.json"


def architecture(c: ModelConfig) -> str:
    """The shape the model's terms read, without sequence length, vocabulary or MTP (which a
    recipe changes between runs of one model): layers, hidden, heads, query groups, head
    dim, FFN, and the experts (count x size, top-k, shared size) or MLA."""
    key = f"L{c.num_layers} h{c.hidden_size} a{c.num_attention_heads} g{c.num_query_groups}"
    if not c.multi_latent_attention:
        key += f" d{c.kv_channels}"
    key += f" f{c.ffn_hidden_size}"
    if c.num_experts:
        key += (f" e{c.num_experts}x{c.moe_ffn_hidden_size} k{c.moe_router_topk}"
                f" s{c.moe_shared_expert_intermediate_size}")
    if c.multi_latent_attention:
        key += (f" mla{c.q_lora_rank or 0}/{c.kv_lora_rank}"
                f" d{c.qk_head_dim}+{c.qk_pos_emb_head_dim}/{c.v_head_dim}")
    return key


# What the submit Comment records of the architecture (`pred.arch`, architecture_id): 12 hex
# digits of its SHA-256, short enough for the Comment's 1,024 bytes, and all the fleet report
# accepts of that job-written key (a word of any other shape selects nothing).
ARCHITECTURE_ID = re.compile(r"[0-9a-f]{12}")


@functools.lru_cache(maxsize=256)
def architecture_id(key: str) -> str:
    """The short id of an architecture key (`architecture`) the submit Comment records, so the
    fleet report, which reads no log, can find the architecture's published runs."""
    import hashlib  # lazy: its OpenSSL binding costs start-up ~10 ms; only submit and reports

    return hashlib.sha256(key.encode()).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class Run:
    """One validation row: its id, model name, GPU, precision and error."""

    id: str
    model: str
    architecture: str
    gpu: str
    precision: str
    error: float  # predicted / published - 1


def dumps(runs: Iterable[Run]) -> str:
    """`track_record.json`'s text: one run per line (errors to 0.01 %), so a change to the
    model shows in a diff as the rows it moved."""
    rows = [json.dumps({"id": r.id, "model": r.model, "architecture": r.architecture,
                        "gpu": r.gpu, "precision": r.precision, "error": round(r.error, 4)})
            for r in runs]
    return '{"runs": [\n' + ",\n".join(rows) + "\n]}\n"


@functools.lru_cache(maxsize=4)
def load(path: Path = TRACK_PATH) -> tuple[Run, ...]:
    """The record's runs (read once per process: a report of many jobs asks for each); none
    when the file is missing or unreadable, so `plan` and reports go on without the line."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return tuple(Run(**r) for r in raw["runs"])
    except (OSError, ValueError, KeyError, TypeError):
        return ()


def _median(xs: Sequence[float]) -> float:
    """The median (not `statistics.median`: its import costs `plan`'s start-up ~5 ms)."""
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def _errors(runs: Sequence[Run]) -> dict[str, float] | None:
    if not runs:
        return None
    e = [r.error for r in runs]
    return {"min": min(e), "median": _median(e), "max": max(e)}


# An architecture the built-in model is known to miss: the median error of its published runs
# beyond KNOWN_MISS_MEDIAN, over at least KNOWN_MISS_RUNS of them (GPT-OSS 120B: 26 % fast over
# 19; the next, GPT-3 175B, 13 % over 13 runs, most of 2023-2024 software). `slurmpod
# calibrate` fits a site's factors without its jobs: their gap is the model's, not the site's
# GPUs'.
KNOWN_MISS_MEDIAN = 0.15
KNOWN_MISS_RUNS = 3


@dataclass(frozen=True, slots=True)
class Track:
    """The runs of one architecture, all of them and those on the site's GPU; and the whole
    table's median and max |error| for an architecture no published run has."""

    architecture: str
    models: tuple[str, ...]
    runs: tuple[Run, ...]
    on_gpu: tuple[Run, ...]
    gpu: str
    table_runs: int
    table_median_abs: float
    table_max_abs: float
    # The prediction uses the site's own factors (`slurmpod calibrate`), not the built-in fit
    # these errors are of
    site_calibrated: bool = False

    @property
    def missed(self) -> bool:
        """The built-in model is known to miss this architecture (KNOWN_MISS_MEDIAN)."""
        return (len(self.runs) >= KNOWN_MISS_RUNS
                and abs(_median([r.error for r in self.runs])) > KNOWN_MISS_MEDIAN)

    def to_json(self) -> dict[str, Any]:
        return {"architecture": self.architecture, "models": list(self.models),
                "published_runs": len(self.runs), "error": _errors(self.runs),
                "on_gpu": {"gpu": self.gpu, "published_runs": len(self.on_gpu),
                           "error": _errors(self.on_gpu)},
                "table": {"published_runs": self.table_runs,
                          "median_abs_error": self.table_median_abs,
                          "max_abs_error": self.table_max_abs},
                "site_calibrated": self.site_calibrated}


def track(c: ModelConfig, gpu: str, runs: Sequence[Run], site_calibrated: bool = False
          ) -> Track:
    return _track(architecture(c), gpu, runs, site_calibrated)


def recorded_track(arch_id: object, gpu: str, runs: Sequence[Run]) -> Track | None:
    """The track record of the architecture a submit Comment names by id (`pred.arch`), for
    the fleet report; None for anything but an id of an architecture with published runs.
    The Comment is the job's own text: the id only selects which published rows are quoted."""
    if not isinstance(arch_id, str) or not ARCHITECTURE_ID.fullmatch(arch_id):
        return None
    held = _RECORDED.get(id(runs))
    if held is None or held[0] is not runs:
        held = (runs, {architecture_id(r.architecture): r.architecture for r in runs}, {})
        _RECORDED.clear()
        _RECORDED[id(runs)] = held
    arch = held[1].get(arch_id)
    if arch is None:
        return None
    tracks = held[2]
    t = tracks.get((arch, gpu))
    if t is None:
        t = _track(arch, gpu, runs)
        if len(tracks) < 4096:  # the GPU word is the job's: a bound on what it can add
            tracks[arch, gpu] = t
    return t


# Per record (by identity; `load` returns one per process): its architectures by id, and the
# tracks a fleet report has asked for, so 100,000 flagged jobs look each up once.
_RECORDED: dict[int, tuple[Sequence[Run], dict[str, str], dict[tuple[str, str], Track]]] = {}


def _track(arch: str, gpu: str, runs: Sequence[Run], site_calibrated: bool = False) -> Track:
    mine = tuple(r for r in runs if r.architecture == arch)
    table = [abs(r.error) for r in runs] or [0.0]
    return Track(arch, tuple(sorted({r.model for r in mine})), mine,
                 tuple(r for r in mine if r.gpu == gpu), gpu, len(runs),
                 _median(table), max(table), site_calibrated)


def _off(e: float) -> str:
    """An error in words: the prediction `e` fast or slow against the run."""
    return f"{abs(e):.0%} " + ("fast" if e < 0 else "slow")


def _span(err: Mapping[str, float]) -> str:
    if round(err["min"], 2) == round(err["max"], 2):
        return _off(err["min"])
    return f"{_off(err['min'])} to {_off(err['max'])}, median {_off(err['median'])}"


def track_line(t: Track) -> str:
    """`plan`'s line: how the prediction did on published runs of this architecture."""
    line = _record_words(t)
    if t.site_calibrated:
        line += " (with the built-in factors; this prediction uses the site's own calibration)"
    return line


def _record_words(t: Track) -> str:
    if not t.runs:
        return (f"no published run of this architecture is in the model's validation table; "
                f"over its {t.table_runs} runs the prediction is off by {t.table_median_abs:.0%} "
                f"(median), {t.table_max_abs:.0%} at most")
    n = len(t.runs)
    err = _errors(t.runs)
    assert err is not None
    line = (f"{n} published run{'s' if n > 1 else ''} of this architecture "
            f"({', '.join(t.models)}): predicted {_span(err)}")
    on = _errors(t.on_gpu)
    if on is None:
        return line + f"; none on {t.gpu}"
    if len(t.on_gpu) < n:
        return line + f"; {len(t.on_gpu)} on {t.gpu}: {_span(on)}"
    return line + f"; all on {t.gpu}"
