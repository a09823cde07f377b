"""The performance model's track record (slurmpod.perf.track) and how `plan` reports it.

That the shipped record is the validation table's current errors is held by
tests/unit/perf/test_validation.py (test_the_track_record_is_current).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurmpod.megatron.runspec import ModelConfig, load_run, preset_path
from slurmpod.perf.track import Run, Track, architecture, dumps, load, track, track_line

ROOT = Path(__file__).resolve().parents[3]


def preset(name: str) -> ModelConfig:
    return ModelConfig.from_args(load_run(preset_path(name)).megatron)


def slurmpod(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurmpod", *args], cwd=ROOT, text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=120)


def test_the_architecture_is_the_shape_not_the_run() -> None:
    """A layout, sequence length, vocabulary or MTP does not change it; a shape does."""
    c = preset("llama3-70b")
    same = dataclasses.replace(c, tp=8, pp=4, seq_length=4096, padded_vocab_size=32000,
                               micro_batch_size=2, fp8="hybrid")
    assert architecture(same) == architecture(c) == "L80 h8192 a64 g8 d128 f28672"
    assert architecture(preset("llama3-8b")) != architecture(c)
    assert architecture(dataclasses.replace(c, num_query_groups=64)) != architecture(c)
    moe = preset("qwen3-30b-a3b")
    assert architecture(moe) == "L48 h2048 a32 g4 d128 f6144 e128x768 k8 s0"
    assert architecture(dataclasses.replace(moe, moe_router_topk=4)) != architecture(moe)
    dsv3 = preset("deepseek-v3")
    assert architecture(dataclasses.replace(dsv3, mtp_num_layers=0)) == architecture(dsv3)
    assert " mla1536/512 d128+64/128" in architecture(dsv3)


RUNS = [Run("a", "m1", "A", "h100", "bf16", -0.20), Run("b", "m1", "A", "h100", "fp8", 0.10),
        Run("c", "m2", "A", "b200", "bf16", -0.05), Run("d", "n", "B", "h100", "bf16", 0.40)]


def test_a_known_architecture_reports_its_runs_and_those_on_the_sites_gpu() -> None:
    c = preset("llama3-70b")
    runs = [dataclasses.replace(r, architecture=architecture(c)) if r.architecture == "A"
            else r for r in RUNS]
    t = track(c, "h100", runs)
    assert [r.id for r in t.runs] == ["a", "b", "c"] and [r.id for r in t.on_gpu] == ["a", "b"]
    data = t.to_json()
    assert data["models"] == ["m1", "m2"] and data["published_runs"] == 3
    assert data["error"] == {"min": -0.20, "median": -0.05, "max": 0.10}
    assert data["on_gpu"]["published_runs"] == 2
    assert data["on_gpu"]["error"]["median"] == pytest.approx(-0.05)
    assert track_line(t) == ("3 published runs of this architecture (m1, m2): predicted 20% "
                             "fast to 10% slow, median 5% fast; 2 on h100: 20% fast to 10% "
                             "slow, median 5% fast")
    assert track_line(track(c, "gb200", runs)).endswith("; none on gb200")
    one = track(c, "b200", [r for r in runs if r.id == "c"])
    assert track_line(one) == ("1 published run of this architecture (m2): predicted 5% fast; "
                               "all on b200")


def test_an_unknown_architecture_reports_the_whole_table() -> None:
    t = track(preset("mixtral-8x7b"), "h100", RUNS)
    assert not t.runs and t.to_json()["error"] is None
    assert t.to_json()["table"] == {"published_runs": 4, "median_abs_error": pytest.approx(0.15),
                                    "max_abs_error": 0.40}
    assert track_line(t) == ("no published run of this architecture is in the model's "
                             "validation table; over its 4 runs the prediction is off by 15% "
                             "(median), 40% at most")


def test_the_record_reads_back_what_was_written(tmp_path: Path) -> None:
    path = tmp_path / "track.json"
    path.write_text(dumps(RUNS), encoding="utf-8")
    assert load(path) == tuple(RUNS)
    assert len(path.read_text().splitlines()) == len(RUNS) + 2  # one run per line


def test_a_missing_or_broken_record_reads_as_none(tmp_path: Path) -> None:
    assert load(tmp_path / "absent.json") == ()
    for text in ("{not json", '{"runs": [{"id": 1}]}', '{"other": []}', "[]"):
        bad = tmp_path / f"bad{len(text)}.json"
        bad.write_text(text, encoding="utf-8")
        assert load(bad) == (), text


def test_plan_reports_the_track_record() -> None:
    """The shipped record: Llama 3 70B has published H100 runs; Mixtral 8x7B has none."""
    data = json.loads(slurmpod("plan", "--preset", "llama3-70b", "--nodes", "8",
                               "--json").stdout)
    rec = data["prediction"]["track_record"]
    assert rec["published_runs"] >= 10 and "llama3-70b" in rec["models"]
    assert rec["on_gpu"]["gpu"] == "h100" and rec["on_gpu"]["published_runs"] >= 1
    text = slurmpod("plan", "--preset", "llama3-70b", "--nodes", "8").stdout
    assert "  validated  " in text and "of this architecture (llama2-70b, llama3-70b)" in text
    other = slurmpod("plan", "--preset", "mixtral-8x7b", "--nodes", "2").stdout
    assert "validated  no published run of this architecture" in other, other


def test_submit_records_the_architecture_only_where_its_record_applies(tmp_path: Path) -> None:
    """`planning.recorded_architecture`, the Comment's `pred.arch`: the id of a published
    architecture (Llama 3 70B) under the built-in factors; nothing for an architecture with no
    published run (Mixtral 8x7B) or where the site's own calibration replaces those factors."""
    from slurmpod.config import load_site
    from slurmpod.perf.fitted import FITTED
    from slurmpod.perf.planning import recorded_architecture
    from slurmpod.perf.store import save, store_path
    from slurmpod.perf.track import ARCHITECTURE_ID, architecture_id, recorded_track

    site_file = ROOT / "site_configs" / "dgx-h100-superpod.toml"
    site = load_site(site_file)
    llama = load_run(preset_path("llama3-70b"))
    arch_id = recorded_architecture(llama, site, site_file)
    assert ARCHITECTURE_ID.fullmatch(arch_id)
    assert arch_id == architecture_id(architecture(preset("llama3-70b")))
    # The fleet report finds the same runs from the id as `plan` does from the shape.
    by_id = recorded_track(arch_id, "h100", load())
    assert by_id is not None
    assert by_id.runs == track(preset("llama3-70b"), "h100", load()).runs
    assert recorded_architecture(load_run(preset_path("mixtral-8x7b")), site, site_file) == ""
    own = tmp_path / "mysite.toml"
    own.write_text(site_file.read_text())
    save(store_path(own), "hopper", FITTED["hopper"], 3)
    assert recorded_architecture(llama, site, own) == ""


@pytest.mark.parametrize("arch_id", ["", "000000000000", "ABCDEF012345", "0123456789abc",
                                     "0123456789a", "zzzzzzzzzzzz", "0123456789ab\n", 123456789012,
                                     None, ["0123456789ab"], {"id": 1}])
def test_an_id_of_no_published_architecture_selects_nothing(arch_id: object) -> None:
    """The id comes from the job's Comment: any other shape, or an id no published
    architecture has, gives no track record (and no error)."""
    from slurmpod.perf.track import recorded_track

    assert recorded_track(arch_id, "h100", load()) is None


def test_an_architecture_is_known_missed_by_its_published_runs_median() -> None:
    """`Track.missed`: GPT-OSS 120B (published runs 26 % faster predicted than run, median)
    is; GPT-3 175B (13 % over 13 runs), Llama 3 70B and DeepSeek-V3 (within 2 %) and an
    architecture without published runs (Mixtral 8x7B) are not. The rule's edges: more than
    15 % over at least three runs."""
    from slurmpod.perf.calibrate import load_published
    from slurmpod.perf.track import KNOWN_MISS_MEDIAN, KNOWN_MISS_RUNS

    gpt_oss = next(p.config for p in load_published(ROOT / "tests/data/perf/published.toml")
                   if p.id == "bridge2604-gb200-gptoss120b-bf16")
    assert gpt_oss is not None
    assert track(gpt_oss, "gb200", load()).missed
    gpt3 = track(preset("gpt3-175b"), "h100", load())
    assert len(gpt3.runs) == 13 and not gpt3.missed
    for name in ("llama3-70b", "deepseek-v3", "mixtral-8x7b"):
        assert not track(preset(name), "h100", load()).missed, name
    # Only GPT-OSS in the shipped record.
    missed = {r.model for r in load() if track_of(r.architecture).missed}
    assert missed == {"gpt-oss-120b"}

    def runs(*errors: float) -> list[Run]:
        return [Run(f"r{i}", "m", "A", "h100", "bf16", e) for i, e in enumerate(errors)]

    edge = KNOWN_MISS_MEDIAN + 0.01
    assert KNOWN_MISS_RUNS == 3
    assert track_of("A", runs(-edge, -edge, -edge)).missed
    assert track_of("A", runs(edge, edge, -0.5)).missed  # predicted slow counts the same
    assert not track_of("A", runs(-edge, -edge)).missed  # two runs are not a record
    assert not track_of("A", runs(-KNOWN_MISS_MEDIAN, -KNOWN_MISS_MEDIAN, -0.9)).missed


def track_of(arch: str, runs: list[Run] | None = None) -> Track:
    from slurmpod.perf.track import _track

    return _track(arch, "h100", runs if runs is not None else load())
