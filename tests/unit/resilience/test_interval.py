"""Checkpoint interval: Young/Daly against the papers' own numbers, the exact goodput model,
the recommendation `plan` shows and `submit` sets, and the site's reliability key."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmpod.cli.main import cli
from slurmpod.config import load_site, resolve_site_path
from slurmpod.errors import ConfigError
from slurmpod.render import launch
from slurmpod.resilience import interval as ri
from slurmpod.resilience.history import History

MIN = 60.0
H = 3600.0


@pytest.mark.parametrize(("mtbf_h", "expected_min"), [(24, 117), (6, 57), (0.25, 9.1)])
def test_daly_higher_order_matches_the_papers_worked_examples(mtbf_h: float,
                                                              expected_min: float) -> None:
    # Daly (2006), Figs. 3-5: R = 10 min, δ = 5 min; "the new model predicts τopt = ..."
    tau = ri.daly_interval(5 * MIN, mtbf_h * H)
    assert tau / MIN == pytest.approx(expected_min, abs=0.5 if expected_min > 10 else 0.05)


def test_young_is_sqrt_2_delta_m_and_daly_caps_at_m() -> None:
    assert ri.young_interval(50.0, 10_000.0) == pytest.approx(1000.0)
    assert ri.daly_interval(300.0, 100.0) == 100.0  # δ >= 2M: τ = M
    # δ ≪ M: Daly's correction vanishes relative to Young's term.
    assert ri.daly_interval(1.0, 1e8) / ri.young_interval(1.0, 1e8) == pytest.approx(1, abs=1e-4)


def _argmax_goodput(delta: float, r: float, m: float) -> float:
    # Golden-section search on log τ of Daly's exact goodput (unimodal in τ).
    lo, hi = math.log(delta / 100 + 1e-9), math.log(20 * m)
    phi = (math.sqrt(5) - 1) / 2
    for _ in range(200):
        a, b = hi - phi * (hi - lo), lo + phi * (hi - lo)
        if ri.expected_goodput(math.exp(a), delta, r, m) < \
                ri.expected_goodput(math.exp(b), delta, r, m):
            lo = a
        else:
            hi = b
    return math.exp((lo + hi) / 2)


@pytest.mark.parametrize(("delta", "m"), [(60, 30 * MIN), (300, 6 * H), (5, 1000 * H),
                                          (600, 20 * MIN)])
def test_daly_is_closer_to_the_exact_optimum_than_young(delta: float, m: float) -> None:
    best = _argmax_goodput(delta, 600.0, m)
    daly, young = ri.daly_interval(delta, m), ri.young_interval(delta, m)
    assert abs(daly - best) <= abs(young - best) + 1e-9
    assert abs(daly - best) / best < 0.05
    # and its goodput is within 0.1 point of the optimum's
    assert ri.expected_goodput(daly, delta, 600.0, m) == pytest.approx(
        ri.expected_goodput(best, delta, 600.0, m), abs=1e-3)


def test_expected_goodput_limits() -> None:
    # No failures in sight: goodput -> τ / (τ + δ).
    assert ri.expected_goodput(100.0, 10.0, 600.0, 1e12) == pytest.approx(100 / 110, rel=1e-6)
    # A restart as long as the MTBF costs a factor e on top.
    g0 = ri.expected_goodput(100.0, 10.0, 0.0, 1000.0)
    assert ri.expected_goodput(100.0, 10.0, 1000.0, 1000.0) == pytest.approx(g0 / math.e)
    with pytest.raises(ValueError):
        ri.expected_goodput(0.0, 10.0, 0.0, 1000.0)


def test_job_mtbf_scales_with_nodes() -> None:
    assert ri.job_mtbf_s(6300.0, 2048) == pytest.approx(6300 * H / 2048)
    with pytest.raises(ValueError):
        ri.job_mtbf_s(6300.0, 0)


@pytest.mark.parametrize(("x", "expected"), [(0.3, 1), (7.4, 7), (56.0, 56), (1234.5, 1200),
                                             (1250.0, 1200), (98765.0, 99000), (99.6, 100)])
def test_round_iterations_keeps_two_significant_figures(x: float, expected: int) -> None:
    assert ri.round_iterations(x) == expected


def test_recommend_in_iterations_with_goodput_at_the_interval_set() -> None:
    rec = ri.recommend(nodes=2048, node_mtbf_hours=6300.0, save_s=60.0, step_s=7.0,
                       restart_s=600.0)
    m = 6300 * H / 2048
    tau = ri.daly_interval(60.0, m)
    assert rec.save_interval == ri.round_iterations(tau / 7.0)
    assert rec.interval_s == pytest.approx(rec.save_interval * 7.0)
    assert rec.goodput == pytest.approx(ri.expected_goodput(rec.interval_s, 60.0, 600.0, m))
    assert rec.interruptions_per_day == pytest.approx(86400 / m)
    doc = rec.to_json()
    assert doc["save_interval"] == rec.save_interval and doc["mtbf_source"] == "site"
    json.dumps(doc, allow_nan=False)
    assert "save_interval" in rec.summary() and "goodput" in rec.summary()


def test_recommend_floors_the_save_time_and_handles_no_step_time() -> None:
    rec = ri.recommend(nodes=1, node_mtbf_hours=6300.0, save_s=0.0, step_s=None)
    assert rec.save_s == ri.MIN_SAVE_S and rec.save_interval is None and rec.step_s is None
    assert rec.interval_s == pytest.approx(ri.daly_interval(ri.MIN_SAVE_S, 6300 * H))
    with pytest.raises(ConfigError):
        ri.recommend(nodes=1, node_mtbf_hours=1.0, save_s=math.nan, step_s=1.0)


def test_recommend_for_run_reuses_the_signal_leads_save_prediction() -> None:
    site = load_site(resolve_site_path("dgx-h100-superpod"))
    rec = ri.recommend_for_run(site, nodes=64, params_total=70e9, step_s=5.0)
    assert rec.save_s == pytest.approx(
        launch.predicted_save_s(70e9, site.storage.checkpoint_write_gb_per_s))
    assert rec.save_source == "predicted" and rec.mtbf_source == "site"
    assert rec.node_mtbf_hours == site.reliability.node_mtbf_hours == 6300.0
    # History: 100 interruptions in 1e5 node-hours, shrunk by one prior interruption.
    hist = History(node_hours=1e5, failures=100, attempts=400)
    rec = ri.recommend_for_run(site, nodes=64, params_total=70e9, step_s=5.0, history=hist,
                               measured_save_s=42.0)
    assert rec.mtbf_source == "history" and rec.save_source == "measured"
    assert rec.node_mtbf_hours == pytest.approx((1e5 + 6300) / 101)
    assert rec.save_s == 42.0


def test_site_reliability_key_is_read_and_checked(tmp_path: Path) -> None:
    base = resolve_site_path("sandbox").read_text()
    good = tmp_path / "good.toml"
    good.write_text(base + "\n[reliability]\nnode_mtbf_hours = 1200\n")
    assert load_site(good).reliability.node_mtbf_hours == 1200.0
    bad = tmp_path / "bad.toml"
    bad.write_text(base + "\n[reliability]\nnode_mtbf_hours = -3\n")
    with pytest.raises(ConfigError, match=r"reliability\.node_mtbf_hours"):
        load_site(bad)


def _spec(tmp_path: Path, extra: str = "") -> Path:
    p = tmp_path / "run.toml"
    p.write_text(f"""
[job]
name = "ckpt"
nodes = 2
time_limit = "01:00:00"
entrypoint = "pretrain_gpt.py"

[megatron]
num_layers = 8
hidden_size = 512
num_attention_heads = 8
seq_length = 1024
vocab_size = 32000
tensor_model_parallel_size = 8
micro_batch_size = 1
global_batch_size = 16
train_iters = 100000
{extra}
""")
    return p


def test_plan_shows_and_returns_the_recommendation(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["plan", str(_spec(tmp_path)), "--site", "sandbox", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    ck = doc["checkpoint"]
    assert doc["prediction"] is not None  # the other engineer's prediction stays
    assert ck["save_interval"] >= 1 and ck["nodes"] == 2 and ck["mtbf_source"] == "site"
    assert ck["step_s"] == pytest.approx(doc["prediction"]["step_time_s"], rel=1e-5)
    assert 0 < ck["expected_goodput"] <= 1 and ck["run_spec_save_interval"] is None
    r = CliRunner().invoke(cli, ["plan", str(_spec(tmp_path)), "--site", "sandbox"])
    assert r.exit_code == 0
    assert "  checkpoint save_interval " in r.output and "  predicted " in r.output
    assert r.output.rstrip().endswith("plan: OK")


def test_plan_scores_the_run_specs_own_interval(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["plan", str(_spec(tmp_path, "save_interval = 5")),
                                 "--site", "sandbox", "--json", "--restart", "60"])
    ck = json.loads(r.output)["checkpoint"]
    assert ck["run_spec_save_interval"] == 5 and ck["restart_s"] == 60.0
    own = ri.expected_goodput(5 * ck["step_s"], ck["save_s"], 60.0, ck["job_mtbf_hours"] * H)
    assert ck["run_spec_goodput"] == pytest.approx(own, abs=1e-4)
    assert ck["run_spec_goodput"] < ck["expected_goodput"]  # every 5 iterations is too often


def test_plan_history_path_without_attempts_is_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    r = subprocess.run([sys.executable, "-m", "slurmpod", "plan", str(_spec(tmp_path)),
                        "--site", "sandbox", "--history", str(empty)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 3
    assert r.stderr.startswith("slurmpod: error: ") and "no attempts.jsonl there" in r.stderr
    assert "Traceback" not in r.stderr


def test_submit_sets_save_interval_only_when_the_run_spec_does_not(tmp_path: Path) -> None:
    from slurmpod import submit as sub
    from slurmpod.megatron.runspec import load_run
    from slurmpod.render.sbatch import RenderOptions

    site_path = resolve_site_path("sandbox")
    site = load_site(site_path)
    run = load_run(_spec(tmp_path))
    prep = sub.prepare(run, site, RenderOptions(), str(tmp_path / "r"), site_path=site_path)
    r = CliRunner().invoke(cli, ["plan", str(_spec(tmp_path)), "--site", "sandbox", "--json"])
    expected = json.loads(r.output)["checkpoint"]["save_interval"]
    assert f"  --save-interval {expected}\n" in prep.script
    assert sub.save_interval_for(run, site, prep.facts, site_path) == expected
    own = load_run(_spec(tmp_path, "save_interval = 7"))
    prep = sub.prepare(own, site, RenderOptions(), str(tmp_path / "r"), site_path=site_path)
    assert "  --save-interval 7\n" in prep.script
    assert prep.script.count("--save-interval") == 1
