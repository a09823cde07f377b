"""`slurmpod plan --search` speed and the performance model's accuracy.

Prints (1) the search time for presets on 1,024 and 16,384 GPUs of the built-in DGX H100 site
(targets: < 2 s and < 10 s on a 2-core machine), the fastest of `--repeat` runs and the layouts
evaluated, for the top 10 (`search s`) and for the whole ranking `--distinct` folds (`all s`);
(2) the median and max |error| of predicted against published iteration times
(tests/data/perf/published.toml; target median <= 10 %, max <= 25 %), in how many pairs of
published layouts of one model on the same GPUs it names the faster, and where the search ranks
each published recipe's layout, dense and MoE (rows with a published configuration), with how
many are in its top 5. `--write` rewrites tests/data/perf/validation.md and the track record
`plan` reports (slurmpod/perf/track_record.json).

    .venv/bin/python benchmarks/plan_search.py [--repeat 3] [--write]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from slurmpod.config import load_site, resolve_site_path
from slurmpod.megatron.runspec import ModelConfig, load_run, preset_path
from slurmpod.perf.calibrate import (
    LayoutRank,
    error_stats,
    evaluate,
    layout_rank,
    load_published,
    markdown_table,
    recipe_rank,
    track_runs,
    usable_bytes,
)
from slurmpod.perf.fitted import FITTED
from slurmpod.perf.hardware import hardware_from_site
from slurmpod.perf.moe import CHECKED_EXPERTS_PER_GPU
from slurmpod.perf.options import RunOptions
from slurmpod.perf.pairs import TIE, layout_pairs
from slurmpod.perf.peaks import evaluate_peaks, load_peaks, markdown_peaks, peak_stats
from slurmpod.perf.search import search
from slurmpod.perf.track import TRACK_PATH, dumps

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "tests" / "data" / "perf" / "published.toml"
REPORT = ROOT / "tests" / "data" / "perf" / "validation.md"
PEAKS = ROOT / "tests" / "data" / "perf" / "memory.toml"
RECIPES = ROOT / "tests" / "data" / "recipes"


def _recipe_file_rank(path: Path, points: list) -> LayoutRank:
    """Rank of a recipe file's layout on its own GPU (from the file name) and node count."""
    gpu = "gb200" if "gb200" in path.stem else "h100"
    hw = next(p.hardware for p in points if p.hardware and p.hardware.gpu_model == gpu)
    run = load_run(path)
    c = ModelConfig.from_args(run.megatron)
    world = run.job.nodes * hw.gpus_per_node
    return layout_rank(c, world, hw, FITTED[hw.generation],
                       RunOptions.from_args(run.megatron.values()), usable_bytes(c, world, hw))


def _rank_words(r: LayoutRank) -> str:
    if not r.rank:
        return r.why
    gap = (r.vs_fastest or 1.0) - 1
    return (f"rank {r.rank} of {r.candidates}, predicted {gap:+.1%} vs the fastest; "
            f"layout {r.distinct_rank} of --distinct")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    site = load_site(resolve_site_path("dgx-h100-superpod"))
    hw = hardware_from_site(site)
    print(f"{'preset':<14} {'GPUs':>6} {'GBS':>6} {'layouts':>8} {'best s':>8} {'search s':>9} "
          f"{'all s':>6}")
    for name, gbs in (("llama3-70b", 1024), ("llama3-405b", 2048), ("deepseek-v3", 8192),
                      ("qwen3-30b-a3b", 4096)):
        run = load_run(preset_path(name))
        base = dataclasses.replace(ModelConfig.from_args(run.megatron), global_batch_size=gbs)
        opts = RunOptions.from_args(run.megatron.values())
        for world in (1024, 16384):
            best = every = float("inf")
            usable = usable_bytes(base, world, hw)  # as `plan` counts it
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                cands, n = search(base, world, hw, usable, None, opts)
                best = min(best, time.perf_counter() - t0)
                t0 = time.perf_counter()  # the whole ranking, as --distinct needs it
                search(base, world, hw, usable, None, opts, top=None)
                every = min(every, time.perf_counter() - t0)
            top = f"{cands[0].prediction.step_time_s:.3g}" if cands and cands[0].fits else "-"
            print(f"{name:<14} {world:>6} {gbs:>6} {n:>8} {top:>8} {best:>9.3f} {every:>6.3f}")

    points = load_published(TABLE)
    results = evaluate(points)
    stats = error_stats(results)
    print("\nvalidation (|predicted / published - 1| over validation rows):")
    for kind in ("all", "dense", "moe", "moe_published"):
        print(f"  {kind:<13} n={stats[f'{kind}_n']:.0f}  median {stats[f'{kind}_median']:.1%}"
              f"  max {stats[f'{kind}_max']:.1%}")
    pairs = layout_pairs(results)
    print(f"\npublished layouts of one model on the same GPUs, the faster by more than "
          f"{TIE:.0%} (most a recipe changed between releases): the model names the faster")
    for gap, kind in ((False, "with a published configuration"), (True, "with a config_gap row")):
        sel = [x for x in pairs if x.config_gap == gap]
        print(f"  {kind:<31} {sum(x.agrees for x in sel)} of {len(sel)} pairs")
        for x in sel:
            if not x.agrees:
                print(f"    not {x.faster.id} ({x.published_ratio - 1:.0%} faster than "
                      f"{x.slower.id}): predicted {1 / x.predicted_ratio - 1:.0%} slower")
    for moe, kind in ((False, "dense rows"),
                      (True, "MoE rows with a published configuration")):
        print(f"\nsearch rank of each published recipe's layout ({kind}):")
        ranks = [(p, recipe_rank(p)) for p in points
                 if p.role != "excluded" and p.is_moe == moe and p.source != "narayanan2021"
                 and not p.raw.get("config_gap")]
        for p, r in ranks:
            print(f"  {p.id:<40} " + _rank_words(r))
        def top5(field: str, ranks: list = ranks) -> int:
            return sum(1 for _, r in ranks if (getattr(r, field) or 99) <= 5)

        print(f"  in the top 5: {top5('rank')} of {len(ranks)}; its parallel layout (TP, CP, "
              f"PP, EP, ETP) in the top 5 of --distinct: {top5('distinct_rank')}")
        if moe:
            print(f"  in the top 5 of the layouts within the published range (at most "
                  f"{CHECKED_EXPERTS_PER_GPU} experts per GPU): {top5('checked_rank')} of "
                  f"{len(ranks)}; --distinct: {top5('checked_distinct_rank')}")
    peaks = evaluate_peaks(load_peaks(PEAKS, TABLE))
    ps = peak_stats(peaks)
    print(f"\nmemory estimate against published peaks: n={ps['n']:.0f}  median {ps['median']:.1%}"
          f"  max {ps['max']:.1%}; plan judges {ps['agree']:.0f} of {ps['rows']:.0f} runs as they "
          "went (ran: fits; out of memory: refused)")
    print("\nsearch rank of each recipe in tests/data/recipes (its own settings):")
    for path in sorted(RECIPES.glob("*.toml")):
        print(f"  {path.stem:<40} " + _rank_words(_recipe_file_rank(path, points)))
    if args.write:
        REPORT.write_text("# Performance model: published points, predicted, error\n\n"
                          "Written by `benchmarks/plan_search.py --write`; checked by "
                          "tests/unit/perf/test_validation.py.\n\n"
                          + markdown_table(points, results)
                          + "\n## Memory: published peaks against the estimate\n\n"
                          "Rows of tests/data/perf/memory.toml; checked by "
                          "tests/unit/perf/test_peaks.py.\n\n" + markdown_peaks(peaks),
                          encoding="utf-8")
        TRACK_PATH.write_text(dumps(track_runs(results)), encoding="utf-8")
        print(f"\nwrote {REPORT.relative_to(ROOT)} and {TRACK_PATH.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
