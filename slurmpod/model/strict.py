"""The base of slurmpod's input models (site file, run spec): strict, frozen msgspec structs.

msgspec rather than pydantic because every `slurmpod submit` of a new or edited run spec is a
fresh process on a login node that validates a site and a run spec: msgspec imports in ~25 ms
and validates a site in well under a millisecond, where pydantic 2 cost ~0.25 s of CPU for the
same (import, model classes, validator build). Validation stays declarative: types, `Literal`s
and `Meta` constraints on the fields, cross-field checks in `__post_init__` (msgspec turns a
ValueError raised there into a ValidationError at that object's path).
`slurmpod.config.validate` turns any ValidationError into one ConfigError line.
"""

from __future__ import annotations

import sys
from typing import Annotated

import msgspec
from msgspec import Meta, field

from slurmpod.model.slurm_time import TIME_PATTERN

__all__ = [
    "Meta",
    "NonNegInt",
    "PosFloat",
    "PosInt",
    "SlurmName",
    "SlurmTime",
    "Strict",
    "field",
]

PosInt = Annotated[int, Meta(ge=1)]
NonNegInt = Annotated[int, Meta(ge=0)]
# Finite: TOML has `inf` and `nan`, and a site with `peak_tflops_bf16 = inf` would otherwise
# generate every artefact and divide MFU by infinity.
PosFloat = Annotated[float, Meta(gt=0, le=sys.float_info.max)]
SlurmName = Annotated[str, Meta(pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$")]
# A Slurm time limit as sbatch --time and PartitionName MaxTime accept it (model/slurm_time.py
# parses and formats them).
SlurmTime = Annotated[str, Meta(pattern=TIME_PATTERN)]


class Strict(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Unknown keys are errors; instances are immutable. (msgspec applies `kw_only` only to the
    fields of the class that sets it: subclasses set it themselves, so that defaults and
    required fields may mix in any order. `frozen` is inherited at run time, but each subclass
    repeats it so that type checkers, which read it per class, see the fields as read-only.)"""
