"""Megatron's memory reports (`report_memory`, megatron/training/utils.py; common_utils.py on
main) read from a log: every release's number format, launcher prefixes, the device-memory
field of `--log-device-memory-used`, and job text that only looks like a report."""

from __future__ import annotations

import io

import pytest

from slurmpod.accounting.logparse import parse_log
from slurmpod.accounting.memreport import MAX_RANKS, MemoryReports, Report, parse_line
from slurmpod.model.memory import RecordedMemory

# core_r0.8 .. r0.13: Python's float repr ('{}'.format); main: two decimals, and the device
# memory used with --log-device-memory-used.
OLD = (b"[Rank 0] (after 10 iterations) memory (MB) | allocated: 21403.5693359375 | "
       b"max allocated: 61118.32763671875 | reserved: 64436.0 | max reserved: 64436.0")
MAIN = (b"[Rank 12] (after 20 iterations) memory (MB) | allocated: 21403.57 | max allocated: "
        b"61118.33 | reserved: 64436.00 | max reserved: 64436.00 | total device memory used: "
        b"67012.50")
ITER = (b" [2026-01-05 10:00:00.123456] iteration       10/     100 | consumed samples:       "
        b"   640 | elapsed time per iteration (ms): 1000.0 | learning rate: 1.000000E-04 | "
        b"global batch size:    64 | lm loss: 1.000000E+01 | loss scale: 1.0 | number of "
        b"skipped iterations:   0 | number of nan iterations:   0 |")


def test_every_release_shape() -> None:
    assert parse_line(OLD) == Report(0, 61118.32763671875, 64436.0, None, None)
    assert parse_line(MAIN) == Report(12, 61118.33, 64436.0, 67012.5, None)
    # srun --label, a torchrun prefix, a save's own report
    assert parse_line(b"3: " + OLD) == Report(0, 61118.32763671875, 64436.0, None, None)
    assert parse_line(b"[default0]:" + OLD) is not None
    save = OLD.replace(b"after 10 iterations", b"before save_checkpoint for iteration 100")
    assert parse_line(save) is not None


def test_the_first_iterations_report_is_not_a_steady_peak() -> None:
    """Megatron-LM issue 756 (Mixtral 8x7B, 16 H100, --log-interval 1): the only report, after
    iteration 1, peaks at the optimizer step with the activations' blocks cached."""
    line = (b"[Rank 1] (after 1 iterations) memory (MB) | allocated: 54250.97802734375 | "
            b"max allocated: 54250.98583984375 | reserved: 61480.0 | max reserved: 61480.0")
    assert parse_line(line) is None
    assert parse_line(line.replace(b"after 1 iterations", b"after 2 iterations")) is not None
    assert parse_line(line.replace(b"after 1 iterations", b"after 11 iterations")) is not None


@pytest.mark.parametrize("line", [
    OLD.replace(b"allocated: 21403.5693359375", b"allocated: 99999.0"),  # above reserved
    OLD.replace(b"max allocated: 61118.32763671875", b"max allocated: 70000.0"),  # > max res.
    OLD.replace(b"64436.0 | max", b"1e5 | max"),  # not a plain decimal
    OLD.replace(b"max reserved: 64436.0", b"max reserved: 99999999999.0"),  # 95 TB
    OLD.replace(b"max reserved: 64436.0", b"max reserved: nan"),
    OLD.replace(b"[Rank 0]", b"[Rank 2000000]"),  # no such rank
    OLD.replace(b"[Rank 0]", b"[Rank -1]"),
    OLD + b" | extra: 1",  # not the end of Megatron's line
    OLD.replace(b" | reserved", b" | max reserved: 1 | reserved"),
])
def test_what_is_not_a_report(line: bytes) -> None:
    assert parse_line(line) is None


def test_per_rank_maxima_over_the_log() -> None:
    log = b"\n".join([OLD, ITER, MAIN, OLD.replace(b"61118.32763671875", b"62000.0").replace(
        b"max reserved: 64436.0", b"max reserved: 66000.0"), b"junk memory (MB) | allocated: 1"])
    s = parse_log(io.BytesIO(log + b"\n"))
    assert len(s.iterations) == 1  # the iteration line between reports is still read
    assert s.memory is not None
    assert dict(s.memory.per_rank) == {0: (62000.0, 66000.0, None, None),
                                       12: (61118.33, 64436.0, 67012.5, None)}
    rec = s.memory.for_record(None)
    # not every rank printed device memory: the binding rank is the one PyTorch reserved most on
    assert rec is not None and rec["rank"] == 0 and rec["device_used_mib"] is None
    assert rec["cached_mib"] == 4000.0 and rec["outside_torch_mib"] is None
    assert rec["alloc_retries"] is None  # Megatron-LM does not print them
    assert s.to_json()["memory"] == rec
    # rank 12 is beyond a 8-GPU allocation: the record keeps Slurm's ranks only
    assert s.memory.for_record(8)["ranks"] == 1  # type: ignore[index]
    assert s.memory.for_record(0) is None


def test_device_memory_decides_the_binding_rank() -> None:
    m = MemoryReports()
    assert m.add(MAIN)
    assert m.add(MAIN.replace(b"[Rank 12]", b"[Rank 4]").replace(b"67012.50", b"70000.00"))
    peaks = m.freeze()
    assert peaks is not None
    rec = peaks.for_record(None)
    assert rec is not None and rec["rank"] == 4 and rec["device_used_mib"] == 70000.0
    assert rec["outside_torch_mib"] == pytest.approx(70000.0 - 64436.0)
    assert rec["cached_mib"] == pytest.approx(64436.0 - 61118.33)


def test_ranks_are_capped() -> None:
    m = MemoryReports()
    for r in range(MAX_RANKS + 10):
        m.add(OLD.replace(b"[Rank 0]", b"[Rank %d]" % r))
    peaks = m.freeze()
    assert peaks is not None and len(peaks.per_rank) == MAX_RANKS


def test_a_log_without_reports_has_none() -> None:
    assert parse_log(io.BytesIO(ITER + b"\n")).memory is None


# Megatron-Bridge since 2025-10 (training/utils/train_utils.py report_memory, MEMORY_KEYS): GB
# of 1e9 bytes, 5 significant digits, and the allocator's retries ("retires" as Bridge spells).
BRIDGE = (b"[Rank 3] (after 20 iterations) memory (GB) | mem-allocated-gigabytes: 22.443 | "
          b"mem-active-gigabytes: 22.443 | mem-inactive-gigabytes: 1.2346e-05 | "
          b"mem-reserved-gigabytes: 67.566 | mem-max-allocated-gigabytes: 64.087 | "
          b"mem-max-active-gigabytes: 64.087 | mem-max-inactive-gigabytes: 3.1 | "
          b"mem-max-reserved-gigabytes: 67.566 | mem-alloc-retires: 2 | "
          b"mem-allocated-count: 51234")
GB = 1e9 / 2**20


def test_megatron_bridge_form() -> None:
    got = parse_line(BRIDGE)
    assert got is not None and (got.rank, got.device_used, got.alloc_retries) == (3, None, 2)
    assert got.max_allocated == pytest.approx(64.087 * GB)
    assert got.max_reserved == pytest.approx(67.566 * GB)
    assert parse_line(b"0: " + BRIDGE) is not None
    assert parse_line(BRIDGE.replace(b"after 20", b"after 1")) is None
    s = parse_log(io.BytesIO(BRIDGE + b"\n" + ITER + b"\n"))
    assert s.memory is not None and len(s.iterations) == 1
    rec = s.memory.for_record(8)
    assert rec is not None and rec["alloc_retries"] == 2 and rec["rank"] == 3


@pytest.mark.parametrize("line", [
    BRIDGE.replace(b" | mem-max-reserved-gigabytes: 67.566", b""),  # a figure missing
    BRIDGE.replace(b"mem-max-reserved-gigabytes: 67.566", b"mem-max-reserved-gigabytes: 60.0"),
    BRIDGE.replace(b"mem-alloc-retires: 2", b"mem-alloc-retires: 2.5"),
    BRIDGE.replace(b"mem-alloc-retires: 2", b"mem-alloc-retires: 99999999999999"),
    BRIDGE.replace(b"67.566", b"1e9"),
    BRIDGE.replace(b"67.566", b"99999999.0"),  # 93 PB
    BRIDGE.replace(b"memory (GB)", b"memory (TB)"),
    BRIDGE + b" | evil: 1" * 8,  # more pairs than Bridge prints
])
def test_what_is_not_a_bridge_report(line: bytes) -> None:
    assert parse_line(line) is None


def test_a_record_read_back_round_trips() -> None:
    """What the epilog keeps (`for_record`) is what every reader gets back, in GiB."""
    s = parse_log(io.BytesIO(MAIN + b"\n"))
    assert s.memory is not None
    rec = s.memory.for_record(None)
    assert rec is not None
    got = RecordedMemory.from_record(rec, 80.0)
    assert got is not None and (got.rank, got.ranks, got.alloc_retries) == (12, 1, None)
    assert got.max_allocated_gib == pytest.approx(61118.33 / 1024)
    assert got.max_reserved_gib == pytest.approx(64436.0 / 1024)
    assert got.device_used_gib == pytest.approx(67012.5 / 1024)
    assert RecordedMemory.from_record(rec, 64.0) is None  # more than a 64 GiB GPU holds
    assert RecordedMemory.from_record(rec, None) == got

