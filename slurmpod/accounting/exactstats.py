"""numpy's own statistics of a long float64 sequence, bit for bit, without holding it whole.

`slurmpod mfu` on a log of millions of iteration records must print exactly the figures that
numpy gives over the whole per-record arrays (`np.percentile(v, [10, 50, 90])`, `v.mean()`,
`np.median`, `np.sum`), in bounded memory. The sequence is produced again on each pass (the
caller decodes its packed records block by block), and:

- `PairwiseSum(n)`: numpy sums a contiguous float64 array by pairwise summation (split at
  n/2 rounded down to a multiple of 8, blocks of up to 128 summed with 8 accumulators), so the
  sum depends on n and the order. Fed in order, the nodes of that same tree of up to `LEAF`
  values are summed by numpy itself and combined as numpy would: the same double.
- `Exact`: order statistics by rank. A pass counts and finds the range; the next histograms
  the values by an order-preserving integer key of their bits (65,536 buckets over the range)
  and keeps only the buckets holding a wanted rank; a bucket of at most `LIMIT` values is
  collected and sorted, a larger one histogrammed again (16 bits narrower each pass). Memory:
  one histogram and at most LIMIT values per wanted rank; usually three passes.
- `percentiles(m, at)` / `median(m, at)`: numpy's formulas (`linear` method; the mean of the
  middle one or two) from the order statistics.

Only finite values may be fed (what `Stats.of` keeps); the tests compare against numpy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

LEAF = 1 << 16  # values summed by numpy at once (a node of numpy's own tree)
LIMIT = 1 << 16  # values of one histogram bucket collected and sorted (512 KiB)
_SIGN = 1 << 63
_MASK64 = (1 << 64) - 1
_PCT = (10, 50, 90)


def _tree(n: int, out: list[int]) -> None:
    """numpy's pairwise-summation tree over n values, as a postfix program: a leaf length
    (> 0), or 0 for "add the two results on top"."""
    if n <= LEAF:
        out.append(n)
        return
    n2 = n // 2
    n2 -= n2 % 8
    _tree(n2, out)
    _tree(n - n2, out)
    out.append(0)


class PairwiseSum:
    """`np.add.reduce` of n float64 values fed in order, in pieces of any size."""

    __slots__ = ("_buf", "_have", "_pc", "_prog", "_stack", "n")

    def __init__(self, n: int) -> None:
        self.n = n
        self._prog: list[int] = []
        if n > 0:
            _tree(n, self._prog)
        self._pc = 0
        self._stack: list[float] = []
        self._buf: list[np.ndarray] = []
        self._have = 0

    def add(self, x: np.ndarray) -> None:
        while x.shape[0]:
            need = self._prog[self._pc] - self._have
            part = x[:need]
            self._buf.append(part)
            self._have += part.shape[0]
            x = x[need:]
            if self._have < self._prog[self._pc]:
                return
            leaf = self._buf[0] if len(self._buf) == 1 else np.concatenate(self._buf)
            self._stack.append(float(leaf.sum()))  # numpy's pairwise add.reduce
            self._buf, self._have = [], 0
            self._pc += 1
            while self._pc < len(self._prog) and self._prog[self._pc] == 0:
                right = self._stack.pop()
                self._stack.append(self._stack.pop() + right)
                self._pc += 1

    def result(self) -> float:
        if self.n == 0:
            return 0.0
        if self._pc != len(self._prog):
            raise ValueError(f"PairwiseSum: fed fewer than {self.n} values")
        return self._stack[0]


def keys(v: np.ndarray) -> np.ndarray:
    """uint64 keys in the order of the float64 values (-0.0 just below +0.0)."""
    b = v.view(np.int64)
    return (b ^ ((b >> 63) | np.int64(-_SIGN))).view(np.uint64)


def unkey(u: int) -> float:
    b = u ^ _SIGN if u >= _SIGN else ~u & _MASK64
    return float(np.array([b], dtype=np.uint64).view(np.float64)[0])


class _Query:
    """Wanted ranks among the values whose keys lie in [lo, hi] (`count` of them)."""

    __slots__ = ("count", "hi", "hist", "lo", "ranks", "shift", "vals")

    def __init__(self, lo: int, hi: int, count: int, ranks: list[tuple[int, int]]) -> None:
        self.lo, self.hi, self.count, self.ranks = lo, hi, count, ranks
        self.vals: list[np.ndarray] = []
        self.shift = -1  # collect
        self.hist: np.ndarray | None = None
        if count > LIMIT:
            self.shift = max(0, (hi - lo).bit_length() - 16)
            self.hist = np.zeros(((hi - lo) >> self.shift) + 1, dtype=np.int64)

    def feed(self, v: np.ndarray, u: np.ndarray, whole: bool) -> None:
        if not whole:
            sel = (u >= np.uint64(self.lo)) & (u <= np.uint64(self.hi))
            v, u = v[sel], u[sel]
        if self.hist is None:
            self.vals.append(v.copy())
            return
        b = ((u - np.uint64(self.lo)) >> np.uint64(self.shift)).astype(np.intp)
        self.hist += np.bincount(b, minlength=self.hist.shape[0])

    def resolve(self, at: dict[int, float]) -> list[_Query]:
        """After a pass: answers into `at`; the narrower queries still to do."""
        if self.hist is None:
            arr = np.concatenate(self.vals) if self.vals else np.empty(0)
            if arr.shape[0] != self.count:
                raise RuntimeError("exactstats: the sequence changed between passes")
            arr.sort()
            for r, k in self.ranks:
                at[r] = float(arr[k])
            return []
        cum = np.cumsum(self.hist)
        groups: dict[int, list[tuple[int, int]]] = {}
        for r, k in self.ranks:
            b = int(np.searchsorted(cum, k, side="right"))
            groups.setdefault(b, []).append((r, k - (int(cum[b - 1]) if b else 0)))
        out = []
        for b, rk in groups.items():
            lo = self.lo + (b << self.shift)
            hi = min(self.hi, lo + (1 << self.shift) - 1)
            if lo == hi:  # one key: one value
                for r, _ in rk:
                    at[r] = unkey(lo)
            else:
                out.append(_Query(lo, hi, int(self.hist[b]), rk))
        return out


class Exact:
    """Count, numpy's sum and order statistics of a finite float64 sequence, in passes:
    `feed()` every value of the sequence in order, then `end_pass()`; again while it returns
    True. The first pass counts; `want(ranks)` (0-based, ascending order) before the second."""

    __slots__ = ("_counting", "_hi", "_lo", "_queries", "_ranks", "_sum", "_summing", "at",
                 "m", "total")

    def __init__(self, total: bool = True) -> None:
        self.m = 0
        self._lo = _MASK64
        self._hi = 0
        self._counting = True
        self._summing = total
        self._sum: PairwiseSum | None = None
        self._ranks: set[int] = set()
        self._queries: list[_Query] = []
        self.at: dict[int, float] = {}  # rank -> value
        self.total: float | None = None  # np.add.reduce of the whole sequence

    def want(self, ranks: Iterable[int]) -> None:
        self._ranks.update(ranks)

    @property
    def active(self) -> bool:
        """Another pass will read values."""
        return self._counting or self._sum is not None or bool(self._queries)

    def feed(self, v: np.ndarray) -> None:
        if not v.shape[0]:
            return
        if self._counting:
            self.m += v.shape[0]
            u = keys(v)
            self._lo = min(self._lo, int(u.min()))
            self._hi = max(self._hi, int(u.max()))
            return
        if self._sum is not None:
            self._sum.add(v)
        if self._queries:
            u = keys(v)
            for q in self._queries:
                q.feed(v, u, q.count == self.m)

    def end_pass(self) -> bool:
        """True while another pass is needed."""
        if self._counting:
            self._counting = False
            if self.m == 0:
                self.total = 0.0
                return False
            if self._summing:
                self._sum = PairwiseSum(self.m)
            ranks = sorted(r for r in self._ranks if 0 <= r < self.m)
            if ranks and self._lo == self._hi:
                self.at.update((r, unkey(self._lo)) for r in ranks)
            elif ranks:
                self._queries = [_Query(self._lo, self._hi, self.m, [(r, r) for r in ranks])]
            return self.active
        if self._sum is not None:
            self.total = self._sum.result()
            self._sum = None
        self._queries = [c for q in self._queries for c in q.resolve(self.at)]
        return self.active


def _virtual(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """numpy's `linear` quantile indexes of the 10th, 50th and 90th percentile of m values
    (numpy/lib/_function_base_impl.py `_quantile`, `_get_indexes`)."""
    q = np.true_divide(np.asanyarray(_PCT), 100)
    virtual = (m - 1) * q
    prev = np.floor(virtual)
    nxt = prev + 1
    above = virtual >= m - 1
    prev[above] = -1
    nxt[above] = -1
    return virtual, prev.astype(np.intp), nxt.astype(np.intp)


def percentile_ranks(m: int) -> set[int]:
    if m <= 0:
        return set()
    _, prev, nxt = _virtual(m)
    return {int(i) % m for i in (*prev.tolist(), *nxt.tolist())}


def percentiles(m: int, at: Mapping[int, float]) -> tuple[float, float, float]:
    """np.percentile(v, [10, 50, 90]) of m values from their order statistics."""
    virtual, prev, nxt = _virtual(m)
    a = np.array([at[i % m] for i in prev.tolist()], dtype=np.float64)
    b = np.array([at[i % m] for i in nxt.tolist()], dtype=np.float64)
    gamma = np.asanyarray(virtual - prev)
    diff = b - a
    res = np.add(a, diff * gamma)
    np.subtract(b, diff * (1 - gamma), out=res, where=gamma >= 0.5, casting="unsafe",
                dtype=np.float64)
    return float(res[0]), float(res[1]), float(res[2])


def median_ranks(m: int) -> set[int]:
    if m <= 0:
        return set()
    return {m // 2} if m % 2 else {m // 2 - 1, m // 2}


def median(m: int, at: Mapping[int, float]) -> np.float64:
    """np.median of m values from their order statistics: numpy's mean of the middle one or
    two, done by numpy on those."""
    mid = [at[m // 2]] if m % 2 else [at[m // 2 - 1], at[m // 2]]
    return np.median(np.array(mid, dtype=np.float64))


__all__ = ["LEAF", "LIMIT", "Exact", "PairwiseSum", "keys", "median", "median_ranks",
           "percentile_ranks", "percentiles", "unkey"]
