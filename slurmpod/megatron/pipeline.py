"""Which layers each pipeline rank holds: Megatron's four ways of splitting the model.

megatron-core places transformer layers on (pipeline rank, virtual stage) chunks in one of four
ways (megatron/core/transformer/transformer_block.py `get_num_layers_to_build` and
transformer_config.py `__post_init__`, core_v0.13 to core_v0.19 / main):

- even: `L / PP` layers per rank, `/ VPP` per chunk;
- `decoder_first/last_pipeline_num_layers`: fixed counts on the first/last rank, the rest even;
- `account_for_embedding/loss_in_pipeline_split`: the embedding and the loss each take one layer
  slot, so `L + 1 + 1` is split evenly and the first (last) chunk builds one layer fewer
  (Llama 3.1 405B's 126 layers at PP=8 x VPP=8: 128 slots, 2 per chunk);
- `pipeline_model_parallel_layout`: every chunk spelled out (`"Et*3|(tt|)*29,m|L"`, grammar of
  core's PipelineParallelLayerLayout: E embedding, t decoder, m MTP, L loss, `|` between chunks
  in layer order, `(...)*n` and `x*n` repeats, commas cosmetic); chunk i sits on rank i % PP,
  virtual stage i // PP (DeepSeek-V3's 61 layers at PP=4 x VPP=4).

slurmpod's own code, written from those rules; every rule Megatron asserts is returned as an
error line so `plan` refuses what Megatron would refuse and accepts what it runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol


class ModelConfig(Protocol):
    """What the split reads of a model (runspec.ModelConfig has it): named here, not imported,
    because runspec calls the split."""

    @property
    def num_layers(self) -> int: ...
    @property
    def mtp_num_layers(self) -> int: ...
    @property
    def pp(self) -> int: ...
    @property
    def vpp(self) -> int | None: ...
    @property
    def vpp_given(self) -> int | None: ...
    @property
    def first_stage_layers(self) -> int | None: ...
    @property
    def last_stage_layers(self) -> int | None: ...
    @property
    def account_for_embedding(self) -> bool: ...
    @property
    def account_for_loss(self) -> bool: ...
    @property
    def pipeline_layout(self) -> str | None: ...


LAYOUT_KEY = "pipeline_model_parallel_layout"
# A layout longer than this (after unrolling repeats) is refused before it is built.
MAX_LAYOUT_CHARS = 100_000


@dataclass(frozen=True, slots=True)
class Chunk:
    """One model chunk: the layers one pipeline rank builds for one virtual stage."""

    decoder: int  # transformer layers
    first_layer: int  # index of its first transformer layer in the model
    embedding: bool = False
    loss: bool = False  # the output layer and the loss
    mtp: int = 0  # multi-token-prediction layers


@dataclass(frozen=True, slots=True)
class Split:
    """Chunks as [pp_rank][vpp_rank], or the reasons Megatron would refuse the split."""

    chunks: tuple[tuple[Chunk, ...], ...]
    errors: tuple[tuple[str, str], ...] = ()

    def rank_layers(self, rank: int) -> int:
        return sum(ch.decoder for ch in self.chunks[rank])


class LayoutError(ValueError):
    pass


def _unroll(text: str) -> str:
    s = text.replace(",", "").replace(" ", "")
    # Innermost parentheses first, then single-character repeats (Megatron unrolls `(..)*n`
    # then `x*n`); bounded so a hostile `(t*9999)*9999` is an error, not a hang.
    paren = re.compile(r"\(([^()]*)\)\*(\d+)")
    single = re.compile(r"([^()|*\d])\*(\d+)")
    for pat in (paren, single):
        while True:
            m = pat.search(s)
            if m is None:
                break
            n = int(m.group(2))
            if len(s) + len(m.group(1)) * n > MAX_LAYOUT_CHARS:
                raise LayoutError(f"unrolls to more than {MAX_LAYOUT_CHARS} characters")
            s = s[: m.start()] + m.group(1) * n + s[m.end():]
    return s


@lru_cache(maxsize=64)
def parse_layout(text: str) -> tuple[str, ...]:
    """The chunks of a layout string in layer order, each as its letters (`"Ett"`)."""
    flat = _unroll(text)
    if "(" in flat or ")" in flat or "*" in flat:
        raise LayoutError("unbalanced parentheses or a repeat without a count")
    stages = tuple(flat.split("|"))
    for st in stages:
        bad = set(st) - set("ELtm")
        if bad:
            raise LayoutError(f"unknown layer letter {sorted(bad)[0]!r} (known: E embedding, "
                              "t transformer, m MTP, L loss)")
    return stages


def layout_vpp(text: str, pp: int) -> int | None:
    """The virtual pipeline size a layout implies (None for 1 or an unreadable layout)."""
    try:
        n = len(parse_layout(text))
    except LayoutError:
        return None
    return n // pp if pp and n % pp == 0 and n // pp > 1 else None


def _even_chunks(per_chunk: list[list[int]], c: ModelConfig, emb: bool, loss: bool,
                 mtp_last: bool) -> tuple[tuple[Chunk, ...], ...]:
    """Chunks from per-[rank][vstage] decoder counts; layer ids run vstage-major."""
    pp, v = len(per_chunk), len(per_chunk[0])
    first: dict[tuple[int, int], int] = {}
    n = 0
    for vs in range(v):
        for r in range(pp):
            first[(r, vs)] = n
            n += per_chunk[r][vs]
    return tuple(
        tuple(Chunk(decoder=per_chunk[r][vs], first_layer=first[(r, vs)],
                    embedding=emb and r == 0 and vs == 0,
                    loss=loss and r == pp - 1 and vs == v - 1,
                    mtp=c.mtp_num_layers if mtp_last and r == pp - 1 and vs == v - 1 else 0)
              for vs in range(v))
        for r in range(pp))


def split(c: ModelConfig) -> Split:
    """How `c`'s layers land on its pipeline ranks, with Megatron's refusals."""
    pp, L = c.pp, c.num_layers
    v = c.vpp or 1
    errs: list[tuple[str, str]] = []
    first_last = c.first_stage_layers is not None or c.last_stage_layers is not None
    acct = c.account_for_embedding or c.account_for_loss
    if c.pipeline_layout is not None:
        if first_last or acct:
            errs.append((LAYOUT_KEY, "pipeline_model_parallel_layout excludes "
                                     "decoder_first/last_pipeline_num_layers and "
                                     "account_for_embedding/loss_in_pipeline_split"))
        return _layout_split(c, errs)
    if first_last and acct:
        errs.append(("account_for_embedding_in_pipeline_split",
                     "decoder_first/last_pipeline_num_layers exclude "
                     "account_for_embedding/loss_in_pipeline_split"))
    if first_last:
        fixed = {0: c.first_stage_layers, pp - 1: c.last_stage_layers}
        rest_layers, rest_ranks = L, pp
        for key, n in (("decoder_first_pipeline_num_layers", c.first_stage_layers),
                       ("decoder_last_pipeline_num_layers", c.last_stage_layers)):
            if n is None:
                continue
            if n <= 0:
                errs.append((key, f"{key} must be at least 1"))
            elif n % v:
                errs.append((key, f"{key}={n} is not divisible by VPP={v}"))
            rest_layers -= n
            rest_ranks -= 1
        if pp == 1 and c.first_stage_layers is not None and c.last_stage_layers is not None:
            rest_ranks += 1  # one rank is both first and last
        if (rest_layers > 0) != (rest_ranks > 0) or rest_layers < 0:
            errs.append(("num_layers", f"with decoder_first/last_pipeline_num_layers the other "
                                       f"{rest_layers} layers do not fit {rest_ranks} middle "
                                       "stages"))
        elif rest_ranks and rest_layers % rest_ranks:
            errs.append(("num_layers", f"with decoder_first/last_pipeline_num_layers the other "
                                       f"{rest_layers} layers do not split evenly over "
                                       f"{rest_ranks} stages"))
        elif rest_ranks and (rest_layers // rest_ranks) % v:
            errs.append(("num_layers", f"{rest_layers // rest_ranks} layers per middle stage are "
                                       f"not divisible by VPP={v}"))
        mid = rest_layers // rest_ranks if rest_ranks > 0 and rest_layers >= 0 else 0
        per_rank = [fixed.get(r) if fixed.get(r) is not None else mid for r in range(pp)]
        per = [[max(0, int(n or 0)) // v] * v for n in per_rank]
        if errs:
            return Split(_even_chunks(per, c, True, True, True), tuple(errs))
        return Split(_even_chunks(per, c, True, True, True))
    slots = L + int(c.account_for_embedding) + int(c.account_for_loss)
    what = ("num_layers" if not acct else
            f"num_layers + {int(c.account_for_embedding) + int(c.account_for_loss)} "
            "(account_for_embedding/loss_in_pipeline_split)")
    if slots % pp:
        errs.append(("num_layers", f"{what} = {slots} is not divisible by PP={pp}"))
    elif (slots // pp) % v:
        errs.append(("num_layers", f"{what} = {slots} is not divisible by PP×VPP = {pp}×{v}"))
    per_chunk = slots // (pp * v) if not errs else 0
    per = [[per_chunk] * v for _ in range(pp)]
    if not errs:
        if c.account_for_embedding:
            per[0][0] -= 1
        if c.account_for_loss:
            per[pp - 1][v - 1] -= 1
        if min(per[0][0], per[pp - 1][v - 1]) < 0:
            errs.append(("num_layers", "not enough layers for the embedding/loss chunks"))
    if errs:  # an approximate even split, so memory still has numbers next to the error
        base = L / (pp * v)
        return Split(tuple(tuple(Chunk(decoder=round(base), first_layer=0,
                                       embedding=r == 0 and vs == 0,
                                       loss=r == pp - 1 and vs == v - 1,
                                       mtp=c.mtp_num_layers if (r == pp - 1 and vs == v - 1)
                                       else 0)
                                 for vs in range(v)) for r in range(pp)), tuple(errs))
    return Split(_even_chunks(per, c, True, True, True))


def _layout_split(c: ModelConfig, errs: list[tuple[str, str]]) -> Split:
    pp = c.pp
    text = c.pipeline_layout or ""
    try:
        stages = parse_layout(text)
    except LayoutError as exc:
        return _fallback(c, [*errs, (LAYOUT_KEY, f"pipeline_model_parallel_layout: {exc}")])
    if len(stages) % pp:
        return _fallback(c, [*errs, (LAYOUT_KEY, f"pipeline_model_parallel_layout has "
                                                 f"{len(stages)} stages, not a multiple of "
                                                 f"PP={pp}")])
    v = len(stages) // pp
    if c.vpp_given is not None and (c.vpp_given or 1) != v:
        errs.append((LAYOUT_KEY, f"pipeline_model_parallel_layout has {v} virtual stages per "
                                 f"rank but VPP={c.vpp_given}"))
    flat = "".join(stages)
    if not flat.startswith("E") or not flat.endswith("L"):
        errs.append((LAYOUT_KEY, "pipeline_model_parallel_layout must start with E (embedding) "
                                 "and end with L (loss)"))
    if flat.count("E") != 1 or flat.count("L") != 1:
        errs.append((LAYOUT_KEY, "pipeline_model_parallel_layout holds E and L exactly once"))
    if flat.count("t") != c.num_layers:
        errs.append((LAYOUT_KEY, f"pipeline_model_parallel_layout has {flat.count('t')} "
                                 f"transformer layers (t) but num_layers={c.num_layers}"))
    if flat.count("m") != c.mtp_num_layers:
        errs.append((LAYOUT_KEY, f"pipeline_model_parallel_layout has {flat.count('m')} MTP "
                                 f"layers (m) but mtp_num_layers={c.mtp_num_layers}"))
    if "m" in flat and "t" in flat[flat.index("m"):]:
        errs.append((LAYOUT_KEY, "transformer layers (t) must come before MTP layers (m)"))
    grid = [[stages[vs * pp + r] for vs in range(v)] for r in range(pp)]
    for r in range(pp):
        if any("m" in st for st in grid[r][:-1]):
            errs.append((LAYOUT_KEY, "MTP layers (m) must sit in a rank's last virtual stage"))
            break
    holding = [st for row in grid for st in row if "m" in st]
    if len(holding) > 1:
        errs.append((LAYOUT_KEY, "all MTP layers (m) must sit in one stage"))
    first: dict[tuple[int, int], int] = {}
    n = 0
    for vs in range(v):
        for r in range(pp):
            first[(r, vs)] = n
            n += grid[r][vs].count("t")
    chunks = tuple(
        tuple(Chunk(decoder=grid[r][vs].count("t"), first_layer=first[(r, vs)],
                    embedding="E" in grid[r][vs], loss="L" in grid[r][vs],
                    mtp=grid[r][vs].count("m"))
              for vs in range(v))
        for r in range(pp))
    return Split(chunks, tuple(errs))


def _fallback(c: ModelConfig, errs: list[tuple[str, str]]) -> Split:
    pp = c.pp
    base = c.num_layers // pp
    per = [[base + (1 if r < c.num_layers % pp else 0)] for r in range(pp)]
    return Split(_even_chunks(per, c, True, True, True), tuple(errs))


def balanced_layout(num_layers: int, pp: int, vpp: int, mtp: int = 0) -> str | None:
    """A `pipeline_model_parallel_layout` that Megatron accepts for any layer count: the
    embedding, the loss and each MTP layer take one slot like a transformer layer, and the
    slots spread as evenly as they go over PP x VPP chunks (spare slots in the middle)."""
    n = pp * vpp
    slots = num_layers + 2 + mtp
    if n < 2 or slots < n + 1:
        return None
    base, extra = divmod(slots, n)
    middle = list(range(1, n - 1))
    bonus = set(middle[len(middle) // 2 - extra // 2:][:extra]) if extra <= len(middle) else None
    if bonus is None:
        return None
    stages = []
    for i in range(n):
        size = base + (1 if i in bonus else 0)
        head = "E" if i == 0 else ""
        tail = ("m" * mtp + "L") if i == n - 1 else ""
        d = size - len(head) - len(tail)
        if d < 0:
            return None
        stages.append((head, d, tail))
    # Compress runs of equal chunks: "(t*4|)*14".
    def fmt(st: tuple[str, int, str]) -> str:
        head, d, tail = st
        body = "t" * d if d <= 2 else f"t*{d}"
        return head + body + tail
    out: list[str] = []
    i = 0
    while i < n:
        j = i
        while j + 1 < n and stages[j + 1] == stages[i]:
            j += 1
        run = j - i + 1
        last = j == n - 1
        if run == 1:
            out.append(fmt(stages[i]) + ("" if last else "|"))
        elif last:
            out.append(f"({fmt(stages[i])}|)*{run - 1}{fmt(stages[i])}")
        else:
            out.append(f"({fmt(stages[i])}|)*{run}")
        i = j + 1
    return "".join(out)
