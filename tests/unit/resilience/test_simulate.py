"""Goodput simulator: against Daly's exact model, the stationary failure rate of Weibull
nodes, conservation of wall time, determinism, and the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from slurmpod.cli.main import cli
from slurmpod.cli.simulate import parse_count
from slurmpod.resilience import interval as ri
from slurmpod.resilience.simulate import Scenario, draw_paths, mean_goodput, score, simulate

H = 3600.0


@pytest.mark.parametrize(("save", "restart", "mtbf_factor"), [
    (300.0, 600.0, 1.0),  # δ = 5 min, R = 10 min, job MTBF 5 h
    (60.0, 1800.0, 0.2),  # a long restart against a 1 h job MTBF
    (600.0, 60.0, 4.0),   # a slow save, quick restart, 20 h job MTBF
])
def test_exponential_mean_goodput_matches_dalys_exact_model(save: float, restart: float,
                                                            mtbf_factor: float) -> None:
    # 100 nodes at 500 h each -> job MTBF 5 h x factor; 2,000-day runs so the start (no
    # restart) and the end (an unsaved tail) shift the mean by < 1e-4.
    scn = Scenario(nodes=100, days=2000, node_mtbf_hours=500 * mtbf_factor, save_s=save,
                   restart_s=restart)
    paths = draw_paths(scn, 64, seed=7)
    for tau in (0.5, 1.0, 2.0):
        t = tau * ri.daly_interval(save, scn.job_mtbf_s)
        out = score(paths, t, save)
        exact = ri.expected_goodput(t, save, restart, scn.job_mtbf_s)
        se = out.goodput.std(ddof=1) / math.sqrt(out.goodput.size)
        assert abs(out.goodput.mean() - exact) < 4 * se + 2e-4, (tau, out.goodput.mean(), exact)
        assert mean_goodput(paths, t, save) == pytest.approx(out.goodput.mean(), rel=1e-12)


def test_best_interval_is_near_the_exact_optimum() -> None:
    scn = Scenario(nodes=2048, days=365, node_mtbf_hours=6300, save_s=120, restart_s=600)
    res = simulate(scn, samples=64, seed=3)
    # The exact optimum of Daly's cost function, by a fine scan.
    taus = np.geomspace(res.daly_interval_s / 3, res.daly_interval_s * 3, 2001)
    exact = [ri.expected_goodput(t, 120, 600, scn.job_mtbf_s) for t in taus]
    best = taus[int(np.argmax(exact))]
    assert res.best_interval_s == pytest.approx(best, rel=0.15)
    assert res.best_goodput == pytest.approx(max(exact), abs=2e-3)
    assert res.daly_interval_s == pytest.approx(best, rel=0.03)  # Daly's estimate is close
    assert res.daly_goodput == pytest.approx(
        ri.expected_goodput(res.daly_interval_s, 120, 600, scn.job_mtbf_s))
    curve = [g for _, g in res.curve]
    assert max(curve) <= res.best_goodput + 1e-12
    assert curve[0] < res.best_goodput and curve[-1] < res.best_goodput  # a real maximum


@pytest.mark.parametrize("shape", [0.5, 0.7, 1.5, 3.0])
def test_weibull_fleet_fails_at_the_mean_rate(shape: float) -> None:
    # A stationary renewal process has rate 1 / mean whatever the law (its mean is the MTBF).
    scn = Scenario(nodes=1000, days=30, node_mtbf_hours=2000, save_s=60, restart_s=600,
                   law="weibull", shape=shape)
    paths = draw_paths(scn, 200, seed=11)
    expected = 1000 * 30 * 24 / 2000  # 360 a run
    f = paths.failures
    assert abs(f.mean() - expected) < 4 * f.std(ddof=1) / math.sqrt(f.size) + 1.0


def test_weibull_new_fleet_with_infant_mortality_fails_more_early() -> None:
    common = dict(nodes=500, days=10, node_mtbf_hours=5000, save_s=60, restart_s=600,
                  law="weibull", shape=0.5)
    new = draw_paths(Scenario(**common, start="new"), 100, seed=1).failures.mean()
    fleet = draw_paths(Scenario(**common, start="fleet"), 100, seed=1).failures.mean()
    assert new > 1.5 * fleet


def test_wall_time_is_conserved_and_results_are_deterministic() -> None:
    scn = Scenario(nodes=512, days=20, node_mtbf_hours=300, save_s=90, restart_s=900,
                   restart_law="exponential", hang_fraction=0.3, hang_detect_s=1200)
    paths = draw_paths(scn, 50, seed=5)
    out = score(paths, 1500.0, 90.0)
    total = out.work_s + out.restart_s + out.save_s + out.lost_s
    assert np.allclose(total, scn.horizon_s, rtol=1e-9)
    again = score(draw_paths(scn, 50, seed=5), 1500.0, 90.0)
    assert np.array_equal(out.goodput, again.goodput)
    assert not np.array_equal(out.goodput, score(draw_paths(scn, 50, seed=6), 1500.0,
                                                 90.0).goodput)


def test_hangs_cost_their_detection_time() -> None:
    base = dict(nodes=1000, days=365, node_mtbf_hours=2000, save_s=60, restart_s=300)
    plain = simulate(Scenario(**base), samples=32, grid=1).policy.goodput.mean()
    hung = simulate(Scenario(**base, hang_fraction=1.0, hang_detect_s=1800), samples=32,
                    grid=1)
    # Every failure a hang detected after 30 min = a 35-minute restart in Daly's model.
    m = 2000 * H / 1000
    tau = hung.daly_interval_s
    assert hung.policy.goodput.mean() == pytest.approx(
        ri.expected_goodput(tau, 60, 2100, m), abs=2e-3)
    assert hung.policy.goodput.mean() < plain - 0.05


def test_no_failures_gives_tau_over_tau_plus_delta() -> None:
    scn = Scenario(nodes=1, days=1, node_mtbf_hours=1e7, save_s=10, restart_s=0)
    out = score(draw_paths(scn, 4, seed=0), 990.0, 10.0)
    # 86400 s = 86 cycles of 1000 s + 400 s of unsaved work (kept: the run goes on)
    assert out.goodput == pytest.approx(np.full(4, (86 * 990 + 400) / 86400))


@pytest.mark.parametrize("bad", [dict(nodes=0), dict(days=0), dict(node_mtbf_hours=-1),
                                 dict(shape=0.0), dict(hang_fraction=2.0)])
def test_scenario_refuses_nonsense(bad: dict[str, float]) -> None:
    args = dict(nodes=8, days=1, node_mtbf_hours=100, save_s=1, restart_s=1) | bad
    with pytest.raises(ValueError):
        Scenario(**args)  # type: ignore[arg-type]


def test_parse_count() -> None:
    assert parse_count("405B") == 405e9 and parse_count("70e9") == 70e9
    assert parse_count("7.5M") == 7.5e6


def test_cli_json_and_text() -> None:
    r = CliRunner().invoke(cli, ["simulate", "--gpus", "1024", "--days", "30", "--save", "60",
                                 "--samples", "20", "--step", "2.5", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    s = d["scenario"]
    assert s["nodes"] == 128 and s["gpus"] == 1024 and s["mtbf_source"] == "site"
    assert s["node_mtbf_hours"] == 6300.0
    assert 0 < d["goodput"]["p5"] <= d["goodput"]["p50"] <= d["goodput"]["p95"] <= 1
    assert d["best_save_interval"] == max(1, round(d["best_interval_s"] / 2.5))
    assert set(d["lost_fraction"]) == {"restart", "checkpoint", "recomputed"}
    r = CliRunner().invoke(cli, ["simulate", "--nodes", "100", "--params", "70B",
                                 "--law", "weibull", "--samples", "10"])
    assert r.exit_code == 0, r.output
    assert "Weibull k=0.7" in r.output and "closed     Daly" in r.output


@pytest.mark.parametrize("args", [["--save", "60"], ["--gpus", "8", "--nodes", "1", "--save",
                                                     "1"], ["--gpus", "8"],
                                  ["--gpus", "8", "--params", "lots"],
                                  ["--gpus", "8", "--save", "1", "--save-interval", "10"],
                                  ["--gpus", "1000000", "--save", "1", "--samples", "100000"]])
def test_cli_bad_input_is_one_line(args: list[str]) -> None:
    r = subprocess.run([sys.executable, "-m", "slurmpod", "simulate", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.startswith("slurmpod: error: ") and "Traceback" not in r.stderr


def test_replayed_timeline_is_scored_by_hand() -> None:
    """A measured run replayed: gaps between faults with their restart latencies, scored as the
    simulated paths are (whole cycles of tau + delta kept; the cycle a fault cuts is lost)."""
    from slurmpod.resilience.simulate import timeline

    tau, delta = 10.0, 2.0
    # start -> fault at 50 s; 8 s restart; fault 30 s later; 5 s restart; run ends 40 s later.
    out = score(timeline([50.0, 30.0, 40.0], [0.0, 8.0, 5.0]), tau, delta)
    # gap 1: 50 s = 4 cycles (48 s) + 2 s lost; gap 2: 22 s = 1 cycle + 10 s lost;
    # gap 3 (the end): 35 s = 2 cycles + 10 s more of work kept (the run ended, nothing lost)
    #   + 1 s left that the last partial cycle spends saving.
    assert out.work_s[0] == pytest.approx(4 * tau + tau + 2 * tau + 10.0)
    assert out.lost_s[0] == pytest.approx(2.0 + 10.0)
    assert out.restart_s[0] == pytest.approx(13.0)
    assert out.save_s[0] == pytest.approx(7 * delta + 1.0)
    assert out.work_s[0] + out.lost_s[0] + out.restart_s[0] + out.save_s[0] == pytest.approx(120)
    with pytest.raises(ValueError):
        timeline([1.0], [0.0, 1.0])
    with pytest.raises(ValueError):
        timeline([-1.0], [0.0])
