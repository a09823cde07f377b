"""More log formats (Megatron-DeepSpeed in seconds, NeMo 1.x/2.x, launcher prefixes, terminal
escapes, carriage returns, --log-energy), and the bulk reader: it must give exactly what the
careful line-by-line path gives, for real lines and for any damage to them."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmpod.accounting.logparse import LogParser, parse_log
from slurmpod.accounting.logrecords import COLUMNS
from tests.helpers import DATA_DIR

DATA = DATA_DIR
LOGS = DATA / "logs"
MEGATRON = [DATA / "megatron" / n for n in (
    "mixtral-8x7b-h100x16.log", "megatron-2023-no-timestamp.log", "megatron-2024-restart.log",
    "megatron-2026-microseconds.log", "megatron-deepspeed.log")]
ALL = MEGATRON + sorted(LOGS.glob("*.log"))


def _parse(data: bytes, *, bulk: bool, chunks: list[int] | None = None) -> object:
    p = LogParser()
    p.bulk = bulk
    p.bulk_min_bytes = 0  # the bulk reader on the smallest pieces too
    pos = 0
    for size in chunks or []:
        p.feed(data[pos:pos + size])
        pos += size
    p.feed(data[pos:])
    return p.close()


def _same(a: object, b: object) -> None:
    ta, tb = a.iterations, b.iterations  # type: ignore[attr-defined]
    for k in COLUMNS:
        x, y = getattr(ta, k), getattr(tb, k)
        assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=True), k
    for k in ("segments", "checkpoints", "progress", "n_rejected", "n_duplicates",
              "first_time_s", "last_time_s", "n_bytes", "rank_timers"):
        assert getattr(a, k) == getattr(b, k), k


def test_megatron_deepspeed_seconds_with_torchrun_prefixes() -> None:
    s = parse_log((LOGS / "megatron-deepspeed-seconds-torchrun.log").open("rb"))
    it = s.iterations
    assert it.iteration.tolist() == [10, 20, 30, 40] and s.n_rejected == 0
    assert it.elapsed_ms.tolist() == [7231.0, 5355.1, 5349.8, 5360.2]  # (s) × 1000
    assert it.tflops_reported.tolist() == [101.54, 137.11, 137.25, 136.98]
    assert it.global_batch_size.tolist() == [96] * 4 and np.isnan(it.time_s).all()


def test_megatron_2026_energy_rank_prefix_and_ansi_colour() -> None:
    s = parse_log((LOGS / "megatron-2026-energy-torchrun-ansi.log").open("rb"))
    it = s.iterations
    assert it.iteration.tolist() == [10, 20, 30, 40] and s.n_rejected == 0
    assert it.energy_j.tolist() == [1992.5, 1979.1, 1981.0, 1984.4]
    assert it.power_w.tolist() == [647.8, 651.6, 651.5, 652.4]
    assert it.tflops_reported.tolist() == [478.0, 484.0, 483.4, 483.3]
    assert it.time_s[0] % 60 == 2.918469 or abs(it.time_s[0] % 60 - 2.918469) < 1e-6
    rec = it.record(2)  # the coloured line
    assert rec.elapsed_ms == 3040.9 and rec.power_w == 651.5


def test_nemo1_progress_bar_redrawn_with_carriage_returns() -> None:
    s = parse_log((LOGS / "nemo1-lightning-progress.log").open("rb"))
    it = s.iterations
    # global_step=117.0 is printed while step 118 runs: Megatron's count is global_step + 1
    assert it.iteration.tolist() == [118, 119, 120, 121]
    assert it.elapsed_ms.tolist() == [1250.0, 1020.0, 1030.0, 1010.0]
    assert it.consumed_samples.tolist() == [118 * 128, 119 * 128, 120 * 128, 121 * 128]
    assert it.lm_loss.tolist() == [5.61, 5.43, 5.40, 5.37]
    assert it.global_batch_size.tolist() == [-1] * 4 and it.train_iters.tolist() == [-1] * 4
    assert s.n_duplicates == 1  # the same step drawn twice
    assert s.n_rejected == 1  # the first draw, before any metric was logged (empty values)
    assert len(s.segments) == 1


def test_nemo2_and_megatron_bridge_progress_lines() -> None:
    s = parse_log((LOGS / "nemo2-progress.log").open("rb"))
    it = s.iterations
    assert it.iteration.tolist() == [1, 2, 3, 4, 5, 6]  # 0-based index + 1
    assert it.elapsed_ms.tolist() == [14820.0, 2315.0, 2298.0, 2301.0, 2304.0, 2297.0]
    assert it.global_batch_size.tolist() == [128] * 6
    assert it.consumed_samples.tolist() == [128 * k for k in range(1, 7)]
    assert s.n_rejected == 1  # `train_step_timing in s: oops`


def test_a_nemo_line_cut_or_with_a_bad_value_is_rejected() -> None:
    good = (b"Training epoch 0, iteration 3/9 | global_step: 3 | train_step_timing in s: 2.5 | "
            b"consumed_samples: 512")
    assert len(parse_log([good]).iterations) == 1
    for bad in (good.replace(b"2.5", b""), good.replace(b"3 |", b"3.5 |", 1),
                good.replace(b"global_step: 3 |", b"global_step 3 |"),
                b"Epoch 0: :  12%|# | 120/1000 [02:03<15:00, global_step=119.0, "
                b"train_step_timing in s=1.02",  # cut: no closing bracket
                b"Epoch 0: :  12%|# | 120/1000 [02:03<15:00, global_step=11x, "
                b"train_step_timing in s=1.02]"):
        s = parse_log([bad])
        assert len(s.iterations) == 0 and s.n_rejected == 1, bad


def test_carriage_return_line_ends_keep_offsets() -> None:
    lines = (DATA / "megatron" / "mixtral-8x7b-h100x16.log").read_bytes().splitlines()
    crlf = b"".join(x + b"\r\n" for x in lines)
    s = parse_log([crlf])
    assert s.iterations.iteration.tolist() == [71, 72, 73]
    assert s.iterations.offset.tolist() == [0, len(lines[0]) + 2, len(lines[0] + lines[1]) + 4]


def test_every_fixture_reads_the_same_in_bulk_and_carefully() -> None:
    for path in ALL:
        data = path.read_bytes()
        for cut in (64, 700, 1500):  # a first chunk teaches the layout, the rest goes in bulk
            _same(_parse(data, bulk=True, chunks=[cut]), _parse(data, bulk=False, chunks=[cut]))
        _same(_parse(data * 3, bulk=True, chunks=[len(data)]), _parse(data * 3, bulk=False))


def _benchmark_like(n: int) -> bytes:
    import sys

    sys.path.insert(0, str(DATA.parent.parent))
    from benchmarks.log_parse import iteration_lines

    return iteration_lines(n)


def test_bulk_lines_really_go_in_bulk() -> None:
    """Guards the speed: after the first chunk, iteration lines of one layout are taken by the
    layout regex, not line by line."""
    data = _benchmark_like(3000)
    p = LogParser()
    p.feed(data[:4096])
    assert len(p._layouts) == 1
    calls = 0
    orig = p._iteration

    def counting(*a: object) -> None:
        nonlocal calls
        calls += 1
        orig(*a)  # type: ignore[arg-type]

    p._iteration = counting  # type: ignore[method-assign]
    p.feed(data[4096:])
    s = p.close()
    assert len(s.iterations) == 3000 and calls <= 1  # at most the line cut by the first chunk


BASE = _benchmark_like(40)
LINES = BASE.splitlines(keepends=True)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
JUNK = st.sampled_from([b"", b"x", b"|", b" ", b"9", b"0", b".", b"e", b"-", b":", b"/", b"\r",
                        b"\n", b"\x1b[0m", b"\t", b"\x00", b"\xff", b"[", b"]", b"  ", b"E+",
                        b"nan", b"1e999", b"99999999999999999999", b"iteration 5/ 9 |"])


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(LINES) - 1), st.integers(0, 460), st.integers(0, 4),
                          JUNK), min_size=1, max_size=20),
       st.integers(1, 5000))
def test_damaged_lines_read_the_same_in_bulk_and_carefully(edits: list, chunk: int) -> None:
    lines = list(LINES)
    for idx, pos, width, junk in edits:
        line = lines[idx]
        lines[idx] = line[:pos] + junk + line[pos + width:]
    data = LINES[0] + b"".join(lines)  # the first line teaches the layout
    bulk = _parse(data, bulk=True, chunks=[len(LINES[0])] + [chunk] * (len(data) // chunk))
    careful = _parse(data, bulk=False, chunks=[len(LINES[0])] + [chunk] * (len(data) // chunk))
    _same(bulk, careful)


SAMPLES = [x for path in ALL for x in path.read_bytes().replace(b"\r", b"\n").split(b"\n")
           if x.strip()]


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(SAMPLES), st.integers(0, 500), JUNK), max_size=12),
       st.integers(1, 997))
def test_no_line_of_any_format_crashes_the_parser(pieces: list, chunk: int) -> None:
    data = b"".join(line[:cut] + junk + line[cut:] + b"\n" for line, cut, junk in pieces)
    for bulk in (True, False):
        p = LogParser()
        p.bulk = bulk
        p.bulk_min_bytes = 0
        p.feed(SAMPLES[0] + b"\n")
        for k in range(0, len(data), chunk):
            p.feed(data[k:k + chunk])
        s = p.close()
        assert len(s.iterations) <= len(pieces) + 1
        assert bool(np.all(s.iterations.elapsed_ms > 0))


def test_lines_the_checks_reject_are_rejected_in_bulk_too() -> None:
    """Lines of the learnt layout that the regex takes but the checks refuse, and restarts and
    duplicates inside one bulk chunk: the same records, rejections and segments as carefully."""
    ln = LINES[5]
    variants = [
        ln.replace(b"/10000000 |", b"/       5 |"),  # past train_iters
        ln.replace(b"elapsed time per iteration (ms): ", b"elapsed time per iteration (ms): 0"
                   b"*").replace(b"0*", b"0 | x: ", 1),  # a field more: another layout
        ln.replace(b"global batch size:   128", b"global batch size:     0"),
        ln[:5] + b"2024-02-30" + ln[15:],  # no such date
        ln[:18] + b"9" + ln[19:],  # hour 29 or so
        ln[:21] + b"61" + ln[23:],  # second 61
        ln.replace(b"(TFLOP/s/GPU): ", b"(TFLOP/s/GPU): 99999999"),  # implausible: dropped
        LINES[3], LINES[3], LINES[1],  # a duplicate, then a restart
    ]
    data = LINES[0] + b"".join(LINES[1:5]) + b"".join(variants) + b"".join(LINES[6:])
    a = _parse(data, bulk=True, chunks=[len(LINES[0])])
    _same(a, _parse(data, bulk=False, chunks=[len(LINES[0])]))
    assert a.n_duplicates >= 1 and len(a.segments) >= 3  # type: ignore[attr-defined]
    assert a.n_rejected >= 4  # type: ignore[attr-defined]


_NUMBER = st.from_regex(rb"\A[-+]?(?:\d{1,20}\.?\d{0,20}|\.\d{1,20})(?:[eE][-+]?\d{1,5})?\Z")
_FLOAT_KEYS = (b"elapsed time per iteration (ms)", b"throughput per GPU (TFLOP/s/GPU)",
               b"lm loss", b"loss scale", b"grad norm")


@FUZZ
@given(st.lists(st.tuples(st.integers(1, 39), st.sampled_from(_FLOAT_KEYS), _NUMBER),
                min_size=1, max_size=30),
       st.lists(st.tuples(st.integers(1, 39), st.integers(0, 9), st.integers(0, 999999999)),
                max_size=10))
def test_numbers_of_any_shape_convert_exactly_in_bulk(values: list, fractions: list) -> None:
    """The bulk reader reads numbers from digit sums (mantissa / 10**k); any spelling float()
    takes must give float()'s double, timestamps with 1-9 fraction digits too."""
    lines = list(LINES)
    for idx, key, num in values:
        a = lines[idx].index(key + b": ") + len(key) + 2
        lines[idx] = lines[idx][:a] + num + b" " + lines[idx][lines[idx].index(b"|", a):]
    for idx, width, frac in fractions:  # `[2024-04-06 03:02:12.123456]` (2026 releases)
        if width:
            lines[idx] = lines[idx][:21] + b"." + b"%0*d" % (width, frac % 10 ** width) \
                + lines[idx][21:]
    data = b"".join(lines)
    for chunks in ([len(LINES[0])], [len(LINES[0]) + len(LINES[1])]):
        _same(_parse(data, bulk=True, chunks=chunks), _parse(data, bulk=False, chunks=chunks))


def test_columns_of_one_value_cost_nothing_and_stay_exact() -> None:
    """A column whose values are all the same is kept as one value (a zero-stride view); the
    first different value turns it into an array with every earlier value intact."""
    s = parse_log(_benchmark_like(3000).splitlines(keepends=True))
    it = s.iterations
    assert it.train_iters.strides == (0,) and it.train_iters.tolist() == [10_000_000] * 3000
    assert it.grad_norm.strides == (0,) and np.isnan(it.energy_j).all()
    assert it.iteration.strides == (8,) and it.iteration.tolist() == list(range(1, 3001))
    # -0.0 == 0.0, but a column of 0.0 that meets -0.0 is no longer one value (bit for bit)
    lines = [x.replace(b"loss scale: 1.0 |", b"loss scale: 0.0 |") for x in LINES]
    lines[30] = lines[30].replace(b"loss scale: 0.0 |", b"loss scale: -0.0 |")
    for bulk in (True, False):
        scale = _parse(b"".join(lines), bulk=bulk, chunks=[len(LINES[0])]).iterations.loss_scale
        assert scale.tolist() == [0.0] * 40
        assert np.signbit(scale).tolist() == [False] * 30 + [True] + [False] * 9


def test_a_snapshot_is_not_changed_by_later_lines_and_big_feeds_are_cut() -> None:
    data = _benchmark_like(6000)  # 2.5 MB: more than two chunks in one feed()
    p = LogParser()
    p.feed(data[:500_000])
    snap = p.summary()
    n = len(snap.iterations)
    before = snap.iterations.elapsed_ms.copy()
    p.feed(data[500_000:])
    assert len(snap.iterations) == n and np.array_equal(snap.iterations.elapsed_ms, before)
    whole = LogParser()
    whole.feed(data)
    _same(whole.close(), p.close())
    _same(p.close(), _parse(data, bulk=False, chunks=[4096] * 600))
