"""Packed record columns (logrecords.PackedColumn / ColumnBuilder): lossless bit for bit for
any int64/float64 values, a few bytes per record for what Megatron prints, and the same
columns whether a log is read whole, in pieces, or snapshotted while it grows."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmpod.accounting import logrecords
from slurmpod.accounting.logparse import LogParser, parse_log
from slurmpod.accounting.logrecords import (
    BLOCK,
    COLUMNS,
    ColumnBuilder,
    IterationTable,
    PackedColumn,
)

ROOT = Path(__file__).resolve().parent.parent.parent.parent
LOGS = sorted((ROOT / "tests" / "data" / "megatron").glob("*.log")) + sorted(
    (ROOT / "tests" / "data" / "logs").glob("*.log"))


def _bits(a: np.ndarray) -> list[int]:
    return np.ascontiguousarray(a).view(np.int64).tolist()


def _roundtrip(values: np.ndarray, pieces: int = 1) -> PackedColumn:
    b = ColumnBuilder(values.dtype.type)
    for part in np.array_split(values, pieces):
        b.extend(part)
    col = b.column(closed=True)
    assert len(col) == values.shape[0]
    assert _bits(col.array()) == _bits(values)
    assert _bits(np.concatenate(list(col.pieces()) or [values[:0]])) == _bits(values)
    return col


def _rng() -> np.random.Generator:
    return np.random.default_rng(20261201)


def test_megatron_numbers_pack_small_and_exact() -> None:
    rng = _rng()
    n = 3 * BLOCK + 123
    it = np.arange(1, n + 1, dtype=np.int64)  # a counter: no bytes at all
    assert _roundtrip(it).nbytes < 100
    offs = np.cumsum(rng.integers(400, 420, n))  # line starts: 2-byte steps
    assert _roundtrip(offs).nbytes <= 2 * n + 100
    # `elapsed time per iteration (ms): 5361.6` read as float() reads it
    ms = np.array([float(f"{x:.1f}") for x in rng.uniform(5300, 5800, n)])
    assert _roundtrip(ms).nbytes <= 2 * n + 100
    tf = np.array([float(f"{x:.1f}") for x in rng.uniform(228, 242, n)])
    assert _roundtrip(tf).nbytes <= n + 100
    # whole-second timestamps (2024-2025 releases) and microseconds (2026)
    t = 1.7e9 + np.cumsum(rng.integers(5, 7, n)).astype(np.float64)
    assert _roundtrip(t).nbytes <= n + 100
    tus = np.array([float(f"{x:.6f}") for x in 1.7e9 + np.cumsum(rng.uniform(5, 6, n))])
    assert _roundtrip(tus).nbytes <= 4 * n + 100
    loss = np.array([float(f"{x:.6E}") for x in 2.0 / (1 + np.arange(n) / 1000)])
    assert _roundtrip(loss).nbytes <= 4 * n + 100


@pytest.mark.parametrize("values", [
    np.array([0.0, -0.0, 0.0, -0.0]),  # the sign of zero is kept
    np.array([1.0, math.nan, 2.5, math.inf, -math.inf]),
    np.array([0.1 + 0.2, 1 / 3, 5e-324, 1.7976931348623157e308, -2.2250738585072014e-308]),
    np.array([5361.599999999999, 5361.6, 1e16, 1e-16]),
    np.array([2 ** 53 + 2.0, 2 ** 53, -(2 ** 60.0)]),
    np.frombuffer(np.array([0x7FF8000000000001, 0x7FF8000000000000], dtype=np.int64).tobytes(),
                  dtype=np.float64),  # NaN payloads
    np.array([-(2 ** 63), 2 ** 63 - 1, 0, -1], dtype=np.int64),
    np.array([7, 7, 7], dtype=np.int64),
    np.array([-1, 5, -1, 10 ** 18], dtype=np.int64),
])
def test_odd_values_survive_bit_for_bit(values: np.ndarray) -> None:
    _roundtrip(np.tile(values, BLOCK // len(values) + 3), pieces=5)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                          st.decimals(places=2, min_value=-10 ** 6, max_value=10 ** 6,
                                      allow_nan=False).map(float)),
                min_size=1, max_size=300),
       st.integers(min_value=1, max_value=7))
def test_any_floats_survive(vals: list[float], pieces: int) -> None:
    _roundtrip(np.array(vals * (BLOCK // len(vals) + 2), dtype=np.float64), pieces)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1), min_size=1,
                max_size=300))
def test_any_ints_survive(vals: list[int]) -> None:
    _roundtrip(np.array(vals * (BLOCK // len(vals) + 2), dtype=np.int64), pieces=3)


def test_one_value_is_a_free_broadcast_and_constant() -> None:
    b = ColumnBuilder(np.float64)
    b.fill(math.nan, 3 * BLOCK + 5)
    col = b.column(closed=True)
    assert col.nbytes < 100 and math.isnan(col.constant())
    arr = col.array()
    assert arr.strides == (0,) and arr.shape == (3 * BLOCK + 5,) and not arr.flags.writeable
    b.extend(np.array([1.0]))
    assert b.column(closed=True).constant() is None


def test_snapshot_stays_as_it_was() -> None:
    b = ColumnBuilder(np.int64)
    b.extend(np.arange(BLOCK + 10))
    snap = b.column(closed=False)
    b.extend(np.arange(BLOCK))
    b.fill(-1, 7)
    assert snap.array().tolist() == list(range(BLOCK + 10))
    assert len(b.column(closed=True)) == 2 * BLOCK + 17


def test_table_blocks_line_up_and_decode_once() -> None:
    n = 2 * BLOCK + 3
    cols = {k: np.arange(n, dtype=np.int64) if k in ("iteration", "offset")
            else np.full(n, 1.5) for k in COLUMNS}
    tab = IterationTable(**cols)
    assert tab.iteration is tab.iteration  # decoded once, kept
    starts, sizes = [], []
    for a, (it, t) in tab.blocks("iteration", "time_s"):
        starts.append(a)
        sizes.append(it.shape[0])
        assert it.tolist() == list(range(a, a + it.shape[0])) and t.shape == it.shape
    assert starts == [0, BLOCK, 2 * BLOCK] and sizes == [BLOCK, BLOCK, 3]
    with pytest.raises(AttributeError):
        _ = tab.no_such_column
    with pytest.raises(TypeError):
        IterationTable(iteration=cols["iteration"])


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.name)
def test_logs_read_the_same_with_tiny_blocks(path: Path, monkeypatch: pytest.MonkeyPatch,
                                             ) -> None:
    """Blocks of 8 records (every encoding, every boundary) give the columns of one block."""
    ref = parse_log(path.open("rb")).iterations
    monkeypatch.setattr(logrecords, "BLOCK", 8)
    p = LogParser()
    data = path.read_bytes()
    for k in range(0, len(data), 777):
        p.feed(data[k:k + 777])
    small = p.close().iterations
    assert len(small) == len(ref)
    for k in COLUMNS:
        assert _bits(getattr(small, k)) == _bits(getattr(ref, k)), k


def test_a_long_log_costs_a_few_bytes_per_record() -> None:
    """Iteration lines only, --log-interval 1 (benchmarks/log_parse.py's layout): the records
    take under 12 bytes each (they took 64 as one 8-byte array per varying column)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("log_parse", ROOT / "benchmarks" /
                                                  "log_parse.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    data = bench.iteration_lines(3 * BLOCK + 77)
    tab = parse_log([data]).iterations
    assert len(tab) == 3 * BLOCK + 77
    assert tab.nbytes / len(tab) < 12
    assert tab.elapsed_ms.tolist() == [float(line.split(b"(ms): ")[1].split(b" ")[0])
                                       for line in data.splitlines()]


def test_columns_left_out_read_as_unknown_and_cost_nothing() -> None:
    from slurmpod.accounting.metrics import COLUMNS_READ

    path = ROOT / "tests" / "data" / "megatron" / "megatron-2024-restart.log"
    full = parse_log(path.open("rb")).iterations
    lean = parse_log(path.open("rb"), COLUMNS_READ).iterations
    assert len(lean) == len(full) > 0
    for k in COLUMNS:
        if k in COLUMNS_READ:
            assert _bits(getattr(lean, k)) == _bits(getattr(full, k)), k
        else:
            assert lean.column(k).nbytes < 16
            unknown = getattr(lean, k)
            assert (unknown == -1).all() if unknown.dtype.kind == "i" else np.isnan(unknown).all()
    assert not np.isnan(full.lm_loss).all()
    with pytest.raises(ValueError, match="no such record column: loss"):
        parse_log([], ["loss"])


def test_columns_left_out_line_up_in_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logrecords, "BLOCK", 8)
    path = ROOT / "tests" / "data" / "megatron" / "megatron-2024-restart.log"
    tab = parse_log(path.open("rb"), ["iteration", "segment"]).iterations
    got = [(a, it.shape[0], ls.shape[0]) for a, (it, ls) in tab.blocks("iteration", "lm_loss")]
    assert sum(k for _, k, _ in got) == len(tab) and all(k == m for _, k, m in got)
