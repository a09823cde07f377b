"""Shared output helpers: the `--json` convention and table printing."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import click

from slurmpod.textfmt import table  # the commands' tables and the reports' are one layout


def emit_json(data: Any) -> None:
    """Print one JSON document on stdout (the `--json` convention of every command)."""
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=_default))


def _default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "__dataclass_fields__"):

        return dataclasses.asdict(obj)
    return str(obj)


__all__ = ["emit_json", "table"]
