"""job_metrics without the series (`series=False`, what `slurmpod mfu` runs) gives every figure
bit for bit as the per-record arrays do, and `exactstats` gives numpy's own statistics."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmpod.accounting import exactstats, logrecords
from slurmpod.accounting.logparse import parse_log
from slurmpod.accounting.metrics import flops_fn_for, job_metrics

ROOT = Path(__file__).resolve().parent.parent.parent.parent
LOGS = sorted((ROOT / "tests" / "data" / "megatron").glob("*.log")) + sorted(
    (ROOT / "tests" / "data" / "logs").glob("*.log"))


# -- exactstats against numpy -----------------------------------------------------------------

def _exact(v: np.ndarray, pieces: int) -> exactstats.Exact:
    ex = exactstats.Exact()
    first = True
    while True:
        for part in np.array_split(v, pieces):
            ex.feed(part)
        if first:
            first = False
            ex.want(exactstats.percentile_ranks(ex.m) | exactstats.median_ranks(ex.m))
        if not ex.end_pass():
            return ex


def _same_as_numpy(v: np.ndarray, pieces: int) -> None:
    ex = _exact(v, pieces)
    assert ex.m == v.shape[0]
    got = exactstats.percentiles(ex.m, ex.at)
    assert np.array(got).view(np.int64).tolist() == np.percentile(
        v, [10, 50, 90]).view(np.int64).tolist()
    assert repr(ex.total) == repr(float(np.add.reduce(v)))
    assert repr(float(ex.total / ex.m)) == repr(float(v.mean()))  # type: ignore[operator]
    assert repr(float(exactstats.median(ex.m, ex.at))) == repr(float(np.median(v)))


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small leaves and buckets: every level of the sum tree and of the selection is used."""
    monkeypatch.setattr(exactstats, "LEAF", 128)
    monkeypatch.setattr(exactstats, "LIMIT", 5)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=700),
       st.integers(min_value=1, max_value=9))
def test_exact_statistics_of_any_floats(vals: list[float], pieces: int) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(exactstats, "LEAF", 128)
        mp.setattr(exactstats, "LIMIT", 5)
        _same_as_numpy(np.array(vals), pieces)


@pytest.mark.usefixtures("tiny")
@pytest.mark.parametrize("kind", ["normal", "few values", "decimals", "wide", "one value"])
def test_exact_statistics_of_typical_columns(kind: str) -> None:
    rng = np.random.default_rng(7)
    def column(m: int) -> np.ndarray:
        if kind == "normal":
            return rng.standard_normal(m)
        if kind == "few values":
            return rng.integers(0, 4, m) / 10
        if kind == "decimals":
            return np.round(rng.uniform(5300, 5800, m), 1)
        if kind == "wide":
            return rng.standard_normal(m) * 10.0 ** rng.integers(-300, 300, m)
        return np.full(m, 243.6)

    for m in (1, 2, 7, 8, 9, 127, 128, 129, 1000, 4099):
        _same_as_numpy(column(m), int(rng.integers(1, 12)))


def test_pairwise_sum_of_millions_is_numpys() -> None:
    """numpy sums a whole contiguous array with one pairwise tree, whatever its length."""
    v = np.random.default_rng(3).standard_normal(3_000_017) * 1e3
    s = exactstats.PairwiseSum(v.shape[0])
    for a in range(0, v.shape[0], 16_384):
        s.add(v[a:a + 16_384])
    assert repr(s.result()) == repr(float(np.sum(v)))
    assert _exact(v, 40).at  # the selection on millions: three passes


# -- lean and full job_metrics ------------------------------------------------------------------

def _dump(log_interval: int | None, gbs: int = 64) -> list[str]:
    rows = [("global_batch_size", gbs), ("hidden_size", 1024), ("num_layers", 4),
            ("num_attention_heads", 16), ("ffn_hidden_size", 4096), ("padded_vocab_size", 32000),
            ("seq_length", 1024), ("world_size", 8)]
    if log_interval:
        rows.append(("log_interval", log_interval))
    return (["------------------------ arguments ------------------------"]
            + [f"  {k} {'.' * (48 - len(k))} {v}" for k, v in rows]
            + ["-------------------- end of arguments ---------------------"])


def _line(i: int, ms: float, t: float | None, gbs: int, tflops: float | None = None,
          energy: bool = False) -> str:
    ts = ""
    if t is not None:
        import time

        ts = f" [{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(t))}]"
    tf = f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |" if tflops is not None else ""
    en = (f" energy per GPU (J/iter/GPU): {ms * 0.7:.1f} | power per GPU (W/GPU): "
          f"{600 + ms % 97:.1f} |" if energy else "")
    return (f"{ts} iteration {i:8d}/{10_000:8d} | consumed samples: {i * gbs:12d} | elapsed time "
            f"per iteration (ms): {ms:.1f} |{tf}{en} learning rate: 1.000000E-04 | global batch "
            f"size: {gbs:5d} | lm loss: {2 / (1 + i / 100):.6E} | loss scale: 1.0 | number of "
            "skipped iterations:   0 | number of nan iterations:   0 |")


def _story(seed: int, n: int) -> list[str]:
    """A job's log with what the rules care about: a fragment start or a dump (with or without
    --log-interval), batch-size ramp-up, lines with and without Megatron's TFLOP/s, untimed
    checkpoint saves (their stall comes from the gap in the clock), a restart from an older
    checkpoint (lost work), an iteration reset without a dump, and --log-energy."""
    rng = random.Random(seed)
    interval = rng.choice([1, 1, 5, None])
    step = interval or rng.choice([1, 3])
    out: list[str] = [] if seed % 4 == 0 else _dump(interval)
    t: float | None = 1_712_372_532.0 if seed % 3 else None
    it = rng.randrange(0, 50) if not out else 0
    energy = seed % 2 == 1
    for k in range(n):
        it += step
        gbs = 64 if k > n // 10 else rng.choice([16, 32, 64])
        ms = rng.choice([1000.0, 1000.0, 1234.5]) + rng.randrange(0, 3000) / 10
        if t is not None:
            t += ms / 1000 * step
        tflops = None if rng.random() < 0.1 else round(150 + rng.random() * 30, 1)
        out.append(_line(it, ms, t, gbs, tflops, energy))
        if k % 97 == 50:
            if t is not None:
                t += 40
            out.append(f"saving checkpoint at iteration {it:7d} to /ckpt in torch_dist format")
            out.append(f"  successfully saved checkpoint at iteration {it:7d} to /ckpt")
        if k == n // 2:  # requeued: resumes from an older checkpoint
            it = max(0, it - 7 * step)
            out += _dump(interval)
            out.append(f"  successfully loaded checkpoint from /ckpt [ t 0, p 0 ] at iteration "
                       f"{it}")
        if k == 3 * n // 4:  # an auto-resume loop without a dump: the iteration goes back
            it = max(0, it - 3 * step)
    return out


def _both(summary: Any, **kw: Any) -> tuple[str, str]:
    args = summary.args
    flops_fn, formula, seq = None, "none", None
    if args is not None:
        try:
            flops_fn, formula = flops_fn_for(args)
            seq = args.get("seq_length")
        except Exception:  # a dump without a model: no FLOPs, as slurmpod mfu
            pass
    kw.setdefault("peak_tflops", 989.0)
    out = []
    for series in (True, False):
        m = job_metrics(summary, flops_fn, kw["peak_tflops"], kw.get("n_gpus", 8),
                        seq_length=kw.get("seq_length", seq), flops_formula=formula,
                        series=series,
                        **{k: v for k, v in kw.items()
                           if k not in ("peak_tflops", "n_gpus", "seq_length")})
        assert (m.series is None) is not series
        out.append(json.dumps(m.to_json(), sort_keys=True))
    return out[0], out[1]


OPTIONS: list[dict[str, Any]] = [
    {}, {"warmup_iters": 0}, {"warmup_iters": 10 ** 9}, {"job_start_s": 1_712_372_000.0},
    {"n_gpus": 3, "peak_tflops": 1e-300}, {"peak_tflops": math.nan},
    {"default_global_batch_size": 48, "job_end_s": 1_712_400_000.0, "allocated_gpu_s": 5e5},
]


@pytest.mark.parametrize("path", LOGS, ids=lambda p: p.name)
def test_fixture_logs_same_figures(path: Path) -> None:
    s = parse_log(path.open("rb"))
    for kw in OPTIONS:
        full, lean = _both(s, **kw)
        assert full == lean, kw


@pytest.mark.usefixtures("tiny")
@pytest.mark.parametrize("seed", range(12))
def test_synthetic_jobs_same_figures(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logrecords, "BLOCK", 64)  # records span many blocks
    lines = _story(seed, 300 + 37 * seed)
    s = parse_log(lines)
    assert len(s.iterations) > 250 and len(s.segments) >= 2
    assert any(c.timer_s is None for c in s.checkpoints)
    for kw in OPTIONS:
        full, lean = _both(s, **kw)
        assert full == lean, (seed, kw)
    m = json.loads(full)
    assert m["lost_iters"] > 0  # the restart redid work
    if seed % 3:  # timestamps: the untimed saves' stalls come from the clock
        assert m["checkpoint_stall_s"] > 0


def test_a_snapshot_while_parsing_same_figures() -> None:
    """The monitor's view: a log still growing (the packed columns end in a raw block)."""
    from slurmpod.accounting.logparse import LogParser

    p = LogParser()
    data = ("\n".join(_story(5, 400)) + "\n").encode()
    p.feed(data[: len(data) * 2 // 3])
    full, lean = _both(p.summary())
    assert full == lean


def test_no_records() -> None:
    s = parse_log(_dump(5))
    full, lean = _both(s)
    assert full == lean


def test_mfu_command_prints_the_same_with_and_without_the_series(tmp_path: Path) -> None:
    from slurmpod.cli.mfu import mfu

    log = tmp_path / "job.log"
    log.write_text("\n".join(_story(7, 500)) + "\n")
    runner = CliRunner()
    lean = runner.invoke(mfu, [str(log), "--json"])
    full = runner.invoke(mfu, [str(log), "--json", "--series"])
    assert lean.exit_code == 0 and full.exit_code == 0, (lean.output, full.output)
    a, b = json.loads(lean.output), json.loads(full.output)
    assert "series" not in a and len(b.pop("series")["iteration"]) == a["n_records"]
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert a["mfu"]["n"] > 0 and a["reported_ratio"] is not None


def test_series_is_refused_when_left_out() -> None:
    s = parse_log([*_dump(1), _line(1, 1000.0, None, 64), _line(2, 1000.0, None, 64)])
    m = job_metrics(s, None, 989.0, 8, seq_length=None, series=False)
    assert m.series is None and "series" not in m.to_json()
    with pytest.raises(ValueError, match="without the per-record series"):
        m.to_json(series=True)
