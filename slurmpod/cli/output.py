"""Shared output helpers: the `--json` convention and table printing."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import click


def emit_json(data: Any) -> None:
    """Print one JSON document on stdout (the `--json` convention of every command)."""
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=_default))


def _default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(obj)
    return str(obj)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain left-aligned text table."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
