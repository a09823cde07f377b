"""Slurm hostlist syntax: expand `dgx[0001-0004,0007]` and compress back, as scontrol does.

Compression follows Slurm's `hostlist_ranged_string` (src/common/hostlist.c): hosts are grouped
by prefix, consecutive numeric suffixes of equal zero-padded width become ranges, and order is
kept (scontrol does not sort). A range `n[9-10]` is fine because neither number is zero-padded.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import product

_SUFFIX = re.compile(r"^(.*?)(\d+)$")


class HostlistError(ValueError):
    """Malformed hostlist expression."""


@dataclass
class _Range:
    prefix: str
    lo: int
    hi: int
    width: int  # digits incl. leading zeros; 0 for a host without a numeric suffix

    def render_inner(self) -> str:
        if self.lo == self.hi:
            return f"{self.lo:0{self.width}d}"
        return f"{self.lo:0{self.width}d}-{self.hi:0{self.width}d}"


def _padded(num: int, width: int) -> bool:
    return width > len(str(num))


def _split(host: str) -> tuple[str, int | None, int]:
    m = _SUFFIX.match(host)
    if not m:
        return host, None, 0
    digits = m.group(2)
    return m.group(1), int(digits), len(digits)


def compress(hosts: Iterable[str]) -> str:
    """Compress host names into Slurm's ranged form, keeping their order."""
    ranges: list[_Range | str] = []
    for host in hosts:
        prefix, num, width = _split(host)
        last = ranges[-1] if ranges else None
        if num is None:
            ranges.append(host)
            continue
        if (
            isinstance(last, _Range) and last.prefix == prefix and num == last.hi + 1
            and (width == last.width
                 or not (_padded(num, width) or _padded(last.lo, last.width)))
        ):
            last.hi = num
            last.width = min(last.width, width) if not _padded(last.lo, last.width) else width
            continue
        ranges.append(_Range(prefix, num, num, width))
    # Merge adjacent ranges with the same prefix into one bracket: p[1-3,7].
    out: list[str] = []
    i = 0
    while i < len(ranges):
        r = ranges[i]
        if isinstance(r, str):
            out.append(r)
            i += 1
            continue
        group = [r]
        j = i + 1
        while j < len(ranges):
            nxt = ranges[j]
            if isinstance(nxt, _Range) and nxt.prefix == r.prefix:
                group.append(nxt)
                j += 1
            else:
                break
        if len(group) == 1 and r.lo == r.hi:
            out.append(f"{r.prefix}{r.render_inner()}")
        else:
            out.append(f"{r.prefix}[{','.join(g.render_inner() for g in group)}]")
        i = j
    return ",".join(out)


def _split_top(expr: str) -> Iterator[str]:
    depth = 0
    start = 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested '[' in hostlist {expr!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in hostlist {expr!r}")
        elif ch == "," and depth == 0:
            yield expr[start:i]
            start = i + 1
    if depth != 0:
        raise HostlistError(f"unbalanced '[' in hostlist {expr!r}")
    yield expr[start:]


def _expand_brackets(body: str, expr: str) -> list[str]:
    values: list[str] = []
    for part in body.split(","):
        if not part:
            raise HostlistError(f"empty range in hostlist {expr!r}")
        if "-" in part:
            lo_s, _, hi_s = part.partition("-")
            if not (lo_s.isdigit() and hi_s.isdigit()):
                raise HostlistError(f"bad range {part!r} in hostlist {expr!r}")
            lo, hi = int(lo_s), int(hi_s)
            if hi < lo:
                raise HostlistError(f"descending range {part!r} in hostlist {expr!r}")
            width = len(lo_s) if lo_s.startswith("0") or len(lo_s) == len(hi_s) else 0
            values.extend(f"{n:0{width}d}" for n in range(lo, hi + 1))
        else:
            if not part.isdigit():
                raise HostlistError(f"bad number {part!r} in hostlist {expr!r}")
            values.append(part)
    return values


def expand(expr: str) -> list[str]:
    """Expand a Slurm hostlist expression into host names, in order (duplicates kept)."""
    expr = expr.strip()
    if not expr:
        return []
    hosts: list[str] = []
    for item in _split_top(expr):
        item = item.strip()
        if not item:
            continue
        pieces = re.split(r"(\[[^\]]*\])", item)
        choices: list[list[str]] = []
        for piece in pieces:
            if piece.startswith("["):
                choices.append(_expand_brackets(piece[1:-1], expr))
            elif piece:
                choices.append([piece])
        hosts.extend("".join(combo) for combo in product(*choices))
    return hosts
