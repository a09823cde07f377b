"""`slurmpod mfu`: the log's arguments dump is checked like a run spec before it is used, and
logs of other formats (no dump) still give their own figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmpod.cli.main import main
from slurmpod.errors import ConfigError
from slurmpod.megatron.runspec import ModelConfig
from slurmpod.megatron.validate import check_dump_args
from tests.helpers import DATA_DIR

MEGATRON = DATA_DIR / "megatron"
LOGS = DATA_DIR / "logs"
LINE = (MEGATRON / "mixtral-8x7b-h100x16.log").read_bytes().splitlines(keepends=True)[0]
GOOD = {"num_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "seq_length": 2048,
        "world_size": 16, "num_query_groups": 8, "group_query_attention": True,
        "num_experts": None, "ffn_hidden_size": 14336, "padded_vocab_size": 32000}


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["mfu", *args])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def _dump(args: dict[str, object]) -> bytes:
    body = b"".join(f"  {k} {'.' * (48 - len(k))} {v}\n".encode() for k, v in args.items())
    return (b"------------------------ arguments ------------------------\n" + body
            + b"-------------------- end of arguments ---------------------\n")


def test_check_dump_args_accepts_a_real_model_and_names_the_bad_argument() -> None:
    assert check_dump_args(GOOD) is None
    assert check_dump_args({}) is None  # nothing to object to (missing keys are the model's)
    for key, value, words in [
            ("num_layers", -24, "at least 1"), ("num_layers", 10**12, "more than"),
            ("num_layers", 1e12, "whole number"), ("hidden_size", 0, "at least 1"),
            ("seq_length", None, "whole number"), ("seq_length", "2048x", "whole number"),
            ("global_batch_size", True, "whole number"), ("num_experts", -8, "at least 1"),
            ("num_query_groups", 64, "more than num_attention_heads"),
            ("microbatch_group_size_per_vp_stage", "4; x", "whole number"),
            ("microbatch_group_size_per_vp_stage", 0, "at least 1")]:
        msg = check_dump_args(GOOD | {key: value})
        assert msg is not None and msg.startswith(f"{key} = ") and words in msg, (key, msg)
        assert "\n" not in msg
    assert check_dump_args(GOOD | {"num_experts": 8, "moe_router_topk": 9}) is not None
    assert check_dump_args(GOOD | {"num_experts": 8, "moe_router_topk": 2}) is None


def test_a_sharding_strategy_megatron_cannot_print_is_refused_without_its_text() -> None:
    """Megatron's argparse allows four strategies (core 0.14+, `choices`); anything else in a
    dump is the job's text: named by key, shown escaped and cut short, never run through."""
    for good in ("no_shard", "optim", "optim_grads", "optim_grads_params", None):
        assert check_dump_args(GOOD | {"data_parallel_sharding_strategy": good}) is None
    msg = check_dump_args(GOOD | {"data_parallel_sharding_strategy":
                                  "optim\x1b[31m\nFAKE job 1 OK" + "x" * 500})
    assert msg is not None and msg.startswith("data_parallel_sharding_strategy = ")
    assert "\n" not in msg and "\x1b" not in msg and len(msg) < 160
    assert "optim_grads_params" in msg  # the fix: the strategies Megatron accepts
    with pytest.raises(ConfigError) as exc:
        ModelConfig.from_args(GOOD | {"use_megatron_fsdp": True,
                                      "data_parallel_sharding_strategy": "zero3"})
    assert exc.value.key == "data_parallel_sharding_strategy" and "zero3" not in str(exc.value)


@pytest.mark.parametrize(("value", "words"), [("-24", "at least 1"),
                                              ("1000000000000", "more than")])
def test_bad_dump_exits_3_naming_the_log_and_the_argument(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, value: str, words: str) -> None:
    """Before: num_layers = -24 gave MFU -11.7 %, 1e12 layers a MemoryError (exit 70)."""
    log = tmp_path / "job.log"
    log.write_bytes(_dump(GOOD | {"num_layers": value}) + LINE)
    rc, out, err = _run(capsys, str(log))
    assert rc == 3 and out == ""
    assert str(log) in err and "num_layers" in err and words in err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2  # error + hint


def test_good_dump_gives_mfu(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_bytes(_dump(GOOD) + LINE)
    rc, out, _ = _run(capsys, str(log), "--json")
    assert rc == 0 and json.loads(out)["mfu"]["median"] > 0


def test_energy_and_power_in_json_and_text(capsys: pytest.CaptureFixture[str]) -> None:
    log = str(LOGS / "megatron-2026-energy-torchrun-ansi.log")
    rc, out, _ = _run(capsys, log, "--json", "--series", "--warmup-iters", "0")
    doc = json.loads(out)
    assert rc == 0 and doc["n_records"] == 4
    # the launch's first line (its start is in the log) is warm-up: 651.6, 651.5, 652.4 remain
    assert doc["power_w"]["median"] == 651.6
    assert doc["energy_j"]["n"] == 3 and doc["series"]["power_w"][0] == 647.8
    rc, out, _ = _run(capsys, log)
    assert rc == 0 and "power per GPU (W)" in out and "energy per GPU (J/iter)" in out


@pytest.mark.parametrize(("name", "median_ms", "tflops"), [
    # medians of every line (no launch in the log: nothing to drop as warm-up)
    ("megatron-deepspeed-seconds-torchrun.log", (5355.1 + 5360.2) / 2, (136.98 + 137.11) / 2),
    ("nemo2-progress.log", (2301.0 + 2304.0) / 2, None),
    ("nemo1-lightning-progress.log", (1020.0 + 1030.0) / 2, None)])
def test_other_formats_give_iteration_statistics(capsys: pytest.CaptureFixture[str], name: str,
                                                 median_ms: float, tflops: float | None) -> None:
    rc, out, err = _run(capsys, str(LOGS / name), "--json", "--warmup-iters", "0")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["iter_time_ms"]["median"] == pytest.approx(median_ms)
    assert doc["mfu"] is None
    if tflops is None:
        assert doc["tflops_reported"] is None
    else:
        assert doc["tflops_reported"]["median"] == pytest.approx(tflops)


def test_fp8_run_shows_mfu_against_both_peaks(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    log = tmp_path / "fp8.log"
    log.write_bytes(_dump({**GOOD, "fp8": "hybrid"}) + LINE)
    rc, out, _ = _run(capsys, str(log), "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["peak_fp8_tflops"] == 1979.0  # H100 SXM, the default site
    assert doc["mfu_fp8"]["median"] == pytest.approx(doc["mfu"]["median"] * 989.0 / 1979.0)
    rc, out, _ = _run(capsys, str(log))
    assert "of the FP8 dense peak 1979 TFLOP/s" in out
    log.write_bytes(_dump({**GOOD, "fp8": None}) + LINE)
    assert "mfu_fp8" not in json.loads(_run(capsys, str(log), "--json")[1])


def test_implausible_mfu_is_flagged(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_bytes(_dump(GOOD) + LINE)
    rc, out, _ = _run(capsys, str(log), "--peak-tflops", "10")
    assert rc == 0 and "IMPLAUSIBLE: mfu-over-100" in out
    doc = json.loads(_run(capsys, str(log), "--peak-tflops", "10", "--json")[1])
    assert doc["implausible"] == ["mfu-over-100"]
    assert json.loads(_run(capsys, str(log), "--json")[1])["implausible"] == []


def test_memory_reports_in_text_and_json(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    """Megatron-Bridge's report (GB of 1e9 bytes, allocator retries) on rank 3."""
    log = tmp_path / "job.log"
    report = (b"[Rank 3] (after 20 iterations) memory (GB) | mem-allocated-gigabytes: 20.0 | "
              b"mem-reserved-gigabytes: 60.0 | mem-max-allocated-gigabytes: 53.687 | "
              b"mem-max-reserved-gigabytes: 64.425 | mem-alloc-retires: 2\n")
    log.write_bytes(_dump(GOOD) + LINE + report)
    rc, out, _ = _run(capsys, str(log))
    assert rc == 0
    assert ("GPU memory               rank 3 peak 50.0 GiB allocated, 60.0 GiB reserved by "
            "PyTorch; 2 allocator retries (cudaMalloc failed, PyTorch freed its cache and "
            "retried: at the memory limit) (1 rank(s) reported)") in out
    rc, out, _ = _run(capsys, str(log), "--json")
    mem = json.loads(out)["memory"]
    assert mem["rank"] == 3 and mem["alloc_retries"] == 2
    assert mem["max_allocated_mib"] == pytest.approx(53.687e9 / 2**20)


def test_a_precision_aware_dtype_megatron_cannot_print_is_refused_without_its_text() -> None:
    aware = GOOD | {"use_precision_aware_optimizer": True}
    assert check_dump_args(aware | {"exp_avg_dtype": "torch.bfloat16"}) is None
    assert check_dump_args(GOOD | {"exp_avg_dtype": "anything"}) is None  # unused without the flag
    msg = check_dump_args(aware | {"exp_avg_sq_dtype": "bf16\x1b[31m\nFAKE job 1 OK" + "x" * 500})
    assert msg is not None and msg.startswith("exp_avg_sq_dtype = ")
    assert "\n" not in msg and "\x1b" not in msg and len(msg) < 160
    assert "fp8" in msg  # the fix: the dtypes Megatron accepts
