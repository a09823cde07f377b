"""Megatron-LM's argument names per release, and the flag each destination name renders as.

One home for what slurmpod knows of Megatron's argparse: `data/megatron_args.json` lists the
destination names of each supported release (megatron/training/arguments.py, core_r0.12 to
main), the value-taking arguments whose flag differs from the dest (`fp8` is `--fp8-format`),
the `store_false` arguments (`add_bias_linear = false` is `--disable-bias-linear`) and slurmpod's
positive aliases of store_true `--no-…` flags. Loaded lazily, once per process.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

DATA_FILE = Path(__file__).resolve().parent / "data" / "megatron_args.json"


@cache
def _data() -> dict[str, Any]:
    return json.loads(DATA_FILE.read_text(encoding="utf-8"))


def releases() -> tuple[str, ...]:
    return tuple(_data()["releases"])


def default_release() -> str:
    return str(_data()["default"])


@cache
def names(release: str) -> frozenset[str]:
    """Every argument dest of `release` (a KeyError for a release not in the file)."""
    entry = _data()["releases"][release]
    base = names(entry["base"]) if entry.get("base") else frozenset()
    return (base | frozenset(entry.get("add", ()))) - frozenset(entry.get("remove", ()))


def store_false_flags() -> dict[str, str]:
    """dest (or slurmpod alias) -> the flag that sets it false; `true` renders nothing."""
    return {**_data()["store_false"], **_data()["aliases"]}


def flag_for(dest: str) -> str:
    """The flag of a value-taking (or store_true) dest: `fp8` -> `--fp8-format`."""
    special = _data()["flags"].get(dest)
    return special or "--" + dest.lstrip("-").replace("_", "-")


# Arguments whose list value Megatron parses from one string, not nargs='+'
# (megatron/training/arguments.py, core_r0.12 to main): `moe_freq_type` and `la_freq_type` take a
# Python list expression of digits, commas and brackets, no spaces (`_eval_pattern`:
# "[0,0,0,1]"); `tuple_type` takes comma-separated integers ("127,0").
PATTERN_ARGS = frozenset({"moe_layer_freq", "window_attn_skip_freq", "linear_attention_freq"})
TUPLE_ARGS = frozenset({"window_size"})

# Run-spec keys that name what Megatron computes rather than an argument it takes: the
# `[megatron]` key (the name in Megatron's arguments dump) -> the argument that sets it.
# `virtual_pipeline_model_parallel_size` has no flag in core_r0.12 .. main; validate_args sets
# it from --num-virtual-stages-per-pipeline-rank (megatron/training/arguments.py).
RENDERED_AS = {"virtual_pipeline_model_parallel_size": "num_virtual_stages_per_pipeline_rank"}

# `[megatron]` keys only slurmpod's performance model reads (perf/options.py RunOptions): Megatron
# has no argument for them, so they are never rendered onto its command line.
MODEL_ONLY = frozenset({"moe_imbalance"})


def unknown_key_warnings(keys: Iterable[str], release: str, file: str) -> list[str]:
    """One line per `[megatron]` key that `release` has no argument for, with the nearest
    name: a typo would otherwise reach the trainer, which rejects it only once the job runs."""
    known = names(release)
    aliases = _data()["aliases"]
    out = []
    for key in keys:
        if key in known or key in aliases or key in RENDERED_AS or key in MODEL_ONLY:
            continue
        close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]}?)" if close else ""
        out.append(f"{file}: megatron.{key} is not a Megatron-LM {release} argument{hint}")
    return out
