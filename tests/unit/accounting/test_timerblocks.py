"""Megatron's timer blocks (`--timing-log-level`, `--timing-log-option minmax|max|all`) read
from a job log. The blocks are written here the way megatron/core/timers.py formats them
(`_get_global_min_max_time_string`, `_get_all_ranks_time_string`): a header, then
`(name + ' ').ljust(48, '.')` entries, or `  name:` and `     rank {:2d}: {:.2f}` lines."""

from __future__ import annotations

import io
import json

import pytest

from slurmpod.accounting.logparse import LogParser, parse_log
from slurmpod.accounting.logrecords import RankTimers
from slurmpod.accounting.timerblocks import MAX_CELLS, MAX_TIMERS, TimerBlocks


def iteration(i: int, n: int = 100) -> str:
    return (f" [2025-03-01 10:00:{i:02d}] iteration {i:8d}/{n:8d} | consumed samples: "
            f"{i * 512:12d} | elapsed time per iteration (ms): 1250.0 | learning rate: "
            "1.000000E-04 | global batch size:   512 | lm loss: 4.000000E+00 | loss scale: "
            "1.0 | grad norm: 1.000 | number of skipped iterations:   0 | number of nan "
            "iterations:   0 |\n")


def minmax(timers: dict[str, tuple[float, float]], max_only: bool = False) -> str:
    out = "max time across ranks (ms):" if max_only else "(min, max) time across ranks (ms):"
    for name, (lo, hi) in timers.items():
        dots = (name + " ").ljust(48, ".")
        out += f"\n    {dots}: {hi:.2f}" if max_only else f"\n    {dots}: ({lo:.2f}, {hi:.2f})"
    return out + "\n"


def all_ranks(timers: dict[str, list[float]], label: str = "") -> str:
    lines = ["times across ranks (ms):"]
    for name, per_rank in timers.items():
        lines.append(f"  {name}:")
        lines += [f"     rank {r:2d}: {ms:.2f}" for r, ms in enumerate(per_rank)]
    return "".join(f"{label}{line}\n" for line in lines)


def parse(text: str) -> RankTimers | None:
    return parse_log(io.BytesIO(text.encode())).rank_timers


def test_minmax_blocks_average_per_iteration_without_the_first_block() -> None:
    log = iteration(1) + minmax({"forward-backward": (9000.0, 9500.0)})  # start-up
    log += iteration(2) + minmax({"forward-backward": (1000.0, 1100.0),
                                  "forward-compute": (300.0, 330.0)})
    log += iteration(3) + minmax({"forward-backward": (1000.0, 1300.0),
                                  "forward-compute": (310.0, 350.0)})
    t = parse(log)
    assert t is not None and t.option == "minmax" and t.blocks == 2
    assert t.min_max == {"forward-backward": (1000.0, 1200.0), "forward-compute": (305.0, 340.0)}
    assert t.per_rank == {}


def test_max_option_has_no_minimum() -> None:
    log = "".join(iteration(i) + minmax({"forward-backward": (0.0, 1000.0 + i)}, max_only=True)
                  for i in (1, 2, 3))
    t = parse(log)
    assert t is not None and t.option == "max" and t.min_max == {"forward-backward": (None, 1002.5)}


def test_a_save_block_is_not_a_training_block_and_the_save_timer_is_still_read() -> None:
    log = iteration(1) + minmax({"forward-backward": (1000.0, 1000.0)})
    log += "saving checkpoint at iteration       1 to /ckpt\n"
    log += "  successfully saved checkpoint at iteration       1 to /ckpt\n"
    log += minmax({"save-checkpoint": (2500.0, 3000.0)})
    log += iteration(2) + minmax({"forward-backward": (1200.0, 1400.0)})
    s = parse_log(io.BytesIO(log.encode()))
    assert s.checkpoints[0].timer_s == 3.0
    t = s.rank_timers
    assert t is not None and t.blocks == 1 and t.min_max == {"forward-backward": (1200.0, 1400.0)}
    assert len(s.iterations) == 2 and s.n_rejected == 0


def test_all_ranks_with_srun_labels_and_every_iteration_still_read() -> None:
    ranks = 16
    log = ""
    for i in (1, 2, 3):
        fwd = [100.0 + r + i for r in range(ranks)]
        bwd = [200.0 + 2 * r for r in range(ranks)]
        log += f"15: {iteration(i)}" + all_ranks({"forward-compute": fwd,
                                                   "backward-compute": bwd}, label="15: ")
    s = parse_log(io.BytesIO(log.encode()))
    t = s.rank_timers
    assert t is not None and t.option == "all" and t.blocks == 2
    assert t.per_rank["forward-compute"] == {r: 100.0 + r + 2.5 for r in range(ranks)}
    assert t.per_rank["backward-compute"] == {r: 200.0 + 2 * r for r in range(ranks)}
    assert s.iterations.iteration.tolist() == [1, 2, 3] and s.n_rejected == 0


def test_each_launch_leaves_out_its_own_first_block() -> None:
    log = iteration(1) + minmax({"forward-backward": (5000.0, 5000.0)})
    log += iteration(2) + minmax({"forward-backward": (1000.0, 1000.0)})
    log += iteration(1) + minmax({"forward-backward": (7000.0, 7000.0)})  # restart: warm-up
    log += iteration(2) + minmax({"forward-backward": (2000.0, 2000.0)})
    s = parse_log(io.BytesIO(log.encode()))
    assert s.restarts == 1
    assert s.rank_timers is not None and s.rank_timers.min_max == {
        "forward-backward": (1500.0, 1500.0)}


def test_only_start_up_blocks_are_used_when_there_is_nothing_else() -> None:
    t = parse(iteration(1) + minmax({"forward-backward": (5000.0, 5100.0)}))
    assert t is not None and t.blocks == 1 and t.min_max["forward-backward"] == (5000.0, 5100.0)


def test_no_blocks_no_timers() -> None:
    assert parse(iteration(1) + iteration(2)) is None


@pytest.mark.parametrize("chunk", [1, 7, 64, 4096])
@pytest.mark.parametrize("bulk", [True, False])
def test_blocks_cut_by_chunk_ends_and_the_bulk_reader_give_the_same(chunk: int,
                                                                     bulk: bool) -> None:
    log = ""
    for i in range(1, 40):
        log += iteration(i)
        if i % 3 == 0:
            log += all_ranks({"forward-compute": [10.0 * i + r for r in range(8)],
                              "backward-compute": [20.0 * i + r for r in range(8)]})
    data = log.encode()
    whole = parse_log(io.BytesIO(data))
    p = LogParser()
    p.bulk, p.bulk_min_bytes = bulk, 0
    for k in range(0, len(data), chunk):
        p.feed(data[k:k + chunk])
    cut = p.close()
    assert cut.rank_timers == whole.rank_timers and whole.rank_timers is not None
    assert cut.rank_timers.blocks == 12
    assert cut.iterations.iteration.tolist() == list(range(1, 40))


@pytest.mark.parametrize("bad", [
    "     rank 1000000000: 12.00",  # a rank no job has
    "     rank  1: nan",
    "     rank  1: 1e308",
    "     rank  1: -5.00",
    "  " + "x" * 200 + ":",  # a name longer than Megatron's
    "    forward-compute .........: (1.00, 2.00)",  # a minmax entry inside an `all` block
])
def test_a_line_that_is_not_megatrons_ends_the_block(bad: str) -> None:
    log = iteration(1) + all_ranks({"forward-compute": [100.0, 110.0]})
    log += iteration(2) + all_ranks({"forward-compute": [200.0, 210.0]}) + bad + "\n"
    log += "     rank  0: 999999.00\n"  # after the block ended: not a timer line
    log += iteration(3)
    s = parse_log(io.BytesIO(log.encode()))
    assert s.rank_timers is not None
    assert s.rank_timers.per_rank == {"forward-compute": {0: 200.0, 1: 210.0}}
    assert s.iterations.iteration.tolist() == [1, 2, 3]


def test_timer_names_are_capped() -> None:
    many = {f"timer-{k}": (1.0, 2.0) for k in range(MAX_TIMERS + 50)}
    t = parse(iteration(1) + minmax(many) + iteration(2) + minmax(many))
    assert t is not None and len(t.min_max) == MAX_TIMERS


def test_a_second_option_mid_log_is_not_mixed_in() -> None:
    log = iteration(1) + minmax({"forward-backward": (1.0, 2.0)})
    log += iteration(2) + minmax({"forward-backward": (3.0, 4.0)})
    log += iteration(3) + all_ranks({"forward-backward": [50.0, 60.0]})
    t = parse(log)
    assert t is not None and t.option == "minmax" and t.per_rank == {}
    assert t.min_max == {"forward-backward": (3.0, 4.0)}


def test_sixteen_thousand_ranks() -> None:
    ranks = 16384
    block = all_ranks({"forward-compute": [1.0 + (r % 7) for r in range(ranks)]})
    t = parse(iteration(1) + block + iteration(2) + block)
    assert t is not None and len(t.per_rank["forward-compute"]) == ranks
    assert t.per_rank["forward-compute"][ranks - 1] == 1.0 + (ranks - 1) % 7


def test_json_round_trip_and_a_damaged_record() -> None:
    t = RankTimers("all", 3, {"forward-compute": {0: 1.5, 7: 2.5}},
                   {"forward-backward": (None, 3.0)})
    assert RankTimers.from_json(json.loads(json.dumps(t.to_json()))) == t
    assert RankTimers.from_json({"option": "all", "per_rank": {"x": {"zero": 1}}}) is None
    assert RankTimers.from_json({"option": "sometimes"}) is None
    assert RankTimers.from_json(None) is None


def test_save_blocks_fix_no_option() -> None:
    """A log's first block is often a save's `(min, max)` one (the default option) though its
    training blocks are `all`."""
    log = iteration(1) + minmax({"save-checkpoint": (3000.0, 3000.0)})
    log += iteration(2) + all_ranks({"forward-compute": [10.0, 11.0]})
    log += iteration(3) + all_ranks({"forward-compute": [20.0, 21.0]})
    t = parse(log)
    assert t is not None and t.option == "all"
    assert t.per_rank == {"forward-compute": {0: 20.0, 1: 21.0}}


def test_a_log_naming_the_highest_rank_under_every_timer_stays_within_its_budget() -> None:
    """Job text: 64 timers at rank 2^20 - 1 would be 64 x 12 MB of per-rank sums."""
    block = "times across ranks (ms):\n" + "".join(
        f"  timer-{k}:\n     rank 1048575: 5.00\n     rank  0: 1.00\n" for k in range(64))
    p = LogParser()
    p.feed((iteration(1) + block + iteration(2) + block).encode())
    s = p.close()
    t = s.rank_timers
    assert t is not None and 1 <= len(t.per_rank) < 64
    assert t.per_rank["timer-0"][1048575] == 5.0
    sums = p._timers._steady  # the parser's own sums: the budget holds
    assert sums.cells <= MAX_CELLS
    assert sum(a.shape[0] for a in sums.rank_sum.values()) == sums.cells
    assert isinstance(p._timers, TimerBlocks)


def test_the_record_keeps_the_compute_timers_of_slurms_ranks_only() -> None:
    from slurmpod.accounting.timerblocks import for_record

    t = RankTimers("all", 2, {"forward-compute": {0: 1.234, 7: 2.0, 500: 9.0},
                              "backward-compute": {0: 3.0}, "optimizer": {0: 4.0}},
                   {"forward-backward": (1.0, 2.0)})
    kept = for_record(t, 8)
    assert kept is not None
    assert kept.per_rank == {"forward-compute": {0: 1.23, 7: 2.0}, "backward-compute": {0: 3.0}}
    assert kept.min_max == {"forward-backward": (1.0, 2.0)}


def test_a_logger_prefix_on_the_header_is_read() -> None:
    """Megatron core logs the block through `logging` (timers.py `logger.info`): a formatter
    may prefix the header line; the entries of the same message follow unprefixed."""
    head = "[2025-06-01 10:00:01,123] [INFO] [megatron.core.timers] "
    log = iteration(1) + head + minmax({"forward-backward": (900.0, 950.0)})
    log += iteration(2) + head + minmax({"forward-backward": (1000.0, 1100.0)})
    t = parse(log)
    assert t is not None and t.min_max == {"forward-backward": (1000.0, 1100.0)}


def test_the_one_line_timer_form_of_older_releases_is_not_a_block() -> None:
    """Megatron-LM before the 2022 Timers rewrite, and Megatron-DeepSpeed, print one rank's
    times on one line (` time (ms) | forward-compute: 1.23 | ...`): nothing per rank or across
    ranks to read, and the iteration lines around it are untouched."""
    log = iteration(1) + " time (ms) | forward-compute: 1700.12 | backward-compute: 3400.50\n"
    log += iteration(2) + " time (ms) | forward-compute: 1701.00 | backward-compute: 3401.00\n"
    s = parse_log(io.BytesIO(log.encode()))
    assert s.rank_timers is None and s.iterations.iteration.tolist() == [1, 2]
    assert s.n_rejected == 0
