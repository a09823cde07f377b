"""Parser over hand-made samples of other Megatron releases, restarts and progress.txt."""

from __future__ import annotations

import io

import numpy as np

from slurmpod.accounting.logparse import LogParser, parse_log, parse_timestamp
from tests.helpers import DATA_DIR

DATA = DATA_DIR / "megatron"


def _parse(name: str):
    with (DATA / name).open("rb") as f:
        return parse_log(f)


def _ts(text: str) -> float:
    t = parse_timestamp(text.encode())
    assert t is not None
    return t


def test_2023_release_without_timestamps() -> None:
    s = _parse("megatron-2023-no-timestamp.log")
    it = s.iterations
    assert it.iteration.tolist() == [10, 20, 30, 40, 50]
    assert it.elapsed_ms.tolist() == [12650.3, 9812.4, 9790.0, 9801.7, 9795.2]
    assert np.isnan(it.time_s).all() and np.isnan(it.tflops_reported).all()
    assert it.global_batch_size.tolist() == [256] * 5
    (seg,) = s.segments
    assert seg.start_seen and seg.cause == "arguments" and seg.loaded_iteration is None
    assert seg.exit_marker == "exiting program at iteration 50"
    # launch = "after megatron is initialized" − "time to initialize megatron (seconds)"
    assert seg.launch_time_s == _ts("2023-06-01 10:00:40") - 38.512
    assert seg.train_start_time_s == _ts("2023-06-01 10:01:30")
    args = s.args
    assert args is not None
    assert args["num_layers"] == 32 and args["swiglu"] is True and args["vocab_size"] == 32000
    assert args["padded_vocab_size"] == 32000  # from "> padded vocab (size: ...)" after the dump
    assert args["num_experts"] is None and args["lr"] == 0.0003 and args["min_lr"] == 3e-05
    assert args["data_path"] == ["0.5", "/data/a_text_document", "0.5", "/data/b_text_document"]
    assert args["params_dtype"] == "torch.bfloat16"
    assert [(c.iteration, c.timer_s, c.succeeded) for c in s.checkpoints] == [
        (20, 12.48091, True), (40, 12.1015, True)]


def test_2026_release_microseconds_labels_energy_and_timed_saves() -> None:
    s = _parse("megatron-2026-microseconds.log")
    it = s.iterations
    assert it.iteration.tolist() == [5, 10, 15, 20, 25, 30, 35]
    assert it.consumed_samples.tolist() == [i * 128 for i in (5, 10, 15, 20, 25, 30, 35)]
    assert it.elapsed_ms[0] == 3120.5 and it.tflops_reported[0] == 341.6
    assert it.time_s[0] == _ts("2026-03-02 14:01:00.725956")
    assert s.n_rejected == 0
    args = s.args
    assert args is not None and args["world_size"] == 64 and args["seq_length"] == 8192
    # 48+ character names are printed with no dots at all (_print_args pads with 48 - len).
    assert args["a_very_long_argument_name_that_megatron_prints_without_dots"] == 7
    assert args["padded_vocab_size"] == 128256
    (save,) = s.checkpoints
    assert save.iteration == 25 and save.succeeded and save.timer_s is None
    assert save.start_time_s is not None and save.end_time_s is not None
    assert round(save.end_time_s - save.start_time_s, 6) == 31.25


def test_restart_appended_to_the_same_log() -> None:
    s = _parse("megatron-2024-restart.log")
    assert s.restarts == 1
    first, second = s.segments
    assert (first.first_iteration, first.last_iteration, first.loaded_iteration) == (2, 24, None)
    assert (second.first_iteration, second.last_iteration, second.loaded_iteration) == (22, 40, 20)
    assert second.cause == "arguments" and second.exit_marker == "after training is done"
    seg = s.iterations.segment
    assert seg.tolist() == [0] * 12 + [1] * 10
    assert first.args is not None and second.args is not None
    assert [c.iteration for c in s.checkpoints] == [10, 20, 30, 40]
    assert [c.segment for c in s.checkpoints] == [0, 0, 1, 1]


def test_restart_without_a_second_dump_is_found_by_the_iteration_going_back() -> None:
    lines = (DATA / "mixtral-8x7b-h100x16.log").read_bytes().splitlines(keepends=True)
    s = parse_log(lines + lines[:2])
    assert s.iterations.segment.tolist() == [0, 0, 0, 1, 1]
    assert s.segments[1].cause == "iteration-reset"


def test_a_repeated_line_is_a_duplicate_not_a_restart() -> None:
    lines = (DATA / "mixtral-8x7b-h100x16.log").read_bytes().splitlines(keepends=True)
    s = parse_log([lines[0], lines[1], lines[1], lines[2]])
    assert s.iterations.iteration.tolist() == [71, 72, 73]
    assert s.n_duplicates == 1 and s.restarts == 0


def test_megatron_deepspeed_layout() -> None:
    s = _parse("megatron-deepspeed.log")
    it = s.iterations
    assert it.iteration.tolist() == [100, 110, 120]
    assert it.elapsed_ms.tolist() == [4100.2, 4099.8, 4101.0]
    assert it.tflops_reported.tolist() == [140.25] * 3
    assert it.global_batch_size.tolist() == [512] * 3
    assert it.loss_scale.tolist() == [65536.0] * 3


def test_progress_txt() -> None:
    s = _parse("progress.txt")
    assert len(s.iterations) == 0
    events = [(p.job_id, p.event, p.iteration) for p in s.progress]
    assert events == [("4242", "Starting job", None), ("4242", "Saved checkpoint", 10),
                      ("4242", "Saved checkpoint", 20), ("4243", "Starting job", None),
                      ("4243", "Saving async checkpoint", 30),
                      ("4243", "Saved async checkpoint", 30)]
    saved = s.progress[2]
    assert (saved.n_gpus, saved.job_tflops, saved.cumulative_tflops, saved.flops) == (
        8, 96.2, 96.2, 1.23e17)
    assert saved.time_s == _ts("2024-05-10 08:01:34")


def test_an_unreadable_moe_layer_freq_does_not_lose_the_dump() -> None:
    """The planner refuses this value (ConfigError); the log parser keeps it as printed and
    keeps every other argument of the dump."""
    text = (b"------------------------ arguments ------------------------\n"
            b"  moe_layer_freq .................................. ([0]*99999999)\n"
            b"  num_layers ...................................... 4\n"
            b"-------------------- end of arguments ---------------------\n")
    args = parse_log(io.BytesIO(text)).args
    assert args == {"moe_layer_freq": "([0]*99999999)", "num_layers": 4}


def test_truncated_dump_ends_at_the_first_iteration_line() -> None:
    text = (b"------------------------ arguments ------------------------\n"
            b"  num_layers ...................................... 4\n"
            b"  hidden_size ..................................... 64\n")
    line = (DATA / "mixtral-8x7b-h100x16.log").read_bytes().splitlines(keepends=True)[0]
    s = parse_log(io.BytesIO(text + line))
    assert s.args == {"num_layers": 4, "hidden_size": 64}
    assert s.iterations.iteration.tolist() == [71]


def test_over_long_line_is_dropped_and_memory_stays_bounded() -> None:
    line = (DATA / "mixtral-8x7b-h100x16.log").read_bytes().splitlines(keepends=True)[0]
    p = LogParser()
    p.feed(line)
    for _ in range(64):  # 64 MiB without a newline
        p.feed(b"x" * (1 << 20))
        assert len(p._partial) <= 1 << 20
    p.feed(b"tail of the long line\n" + line.replace(b"71/", b"72/"))
    s = p.close()
    assert s.iterations.iteration.tolist() == [71, 72]


def test_every_iteration_line_of_the_samples_teaches_a_bulk_layout() -> None:
    """The careful reader learns each line's layout for the bulk reader (which must then read
    the same: tests/unit/accounting/test_logparse_bulk.py)."""
    from slurmpod.accounting.logparse import LogParser

    for name, n_layouts in (("mixtral-8x7b-h100x16.log", 1), ("megatron-2023-no-timestamp.log", 1),
                            ("megatron-2024-restart.log", 1),
                            # lines with and without `skipped samples`
                            ("megatron-2026-microseconds.log", 2)):
        p = LogParser()
        p.feed((DATA / name).read_bytes())
        assert len(p._layouts) == n_layouts, name


def test_a_cut_line_glued_to_a_whole_one_keeps_the_whole_one() -> None:
    lines = (DATA / "mixtral-8x7b-h100x16.log").read_bytes().splitlines(keepends=True)
    for cut in (30, 60, 140, 300):
        s = parse_log([lines[0][:cut] + lines[1]])
        assert s.iterations.iteration.tolist() == [72], cut
        assert s.iterations.elapsed_ms.tolist() == [5470.7]


def test_summary_json_is_plain_json() -> None:
    import json

    s = _parse("megatron-2024-restart.log")
    doc = json.loads(json.dumps(s.to_json(), allow_nan=False))
    assert doc["n_records"] == 22 and len(doc["segments"]) == 2
    assert doc["segments"][1]["loaded_iteration"] == 20 and doc["segments"][1]["has_args"]
    assert [c["iteration"] for c in doc["checkpoints"]] == [10, 20, 30, 40]
