"""Bad input closes (issue 14 item 7): each gives one line and its own exit code, before the
queue — never exit 70 (internal error), never a hang on a long line."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from slurmpod.backends.fake import FakeBackend
from slurmpod.backends.parse import parse_scontrol_partitions, partition_max_time
from slurmpod.config import builtin_site_path, load_site, validate
from slurmpod.errors import ConfigError, OutputError
from slurmpod.megatron import argnames
from slurmpod.megatron.args import (
    from_launch_script,
    from_megatron_args,
    parse_arguments_dump,
    shell_words,
)
from slurmpod.megatron.plan import make_plan
from slurmpod.megatron.runspec import MAX_JOB_NAME, run_from_dict
from slurmpod.model.site import Site
from slurmpod.render.launch import megatron_argv
from slurmpod.render.sbatch import RenderOptions
from slurmpod.submit import check_time_limit, prepare, submit
from tests.unit.submit.test_submit import GOOD, FakeRunner

ROOT = Path(__file__).resolve().parents[3]
SITE = load_site(builtin_site_path("sandbox"))


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurmpod", *args], cwd=cwd, text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=120)


def one_error_line(res: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert res.returncode == code, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if not ln.startswith("hint:")]
    assert len(lines) == 1 and lines[0].startswith("slurmpod: error: "), res.stderr
    assert "Traceback" not in res.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def run(job: dict[str, Any] | None = None, **megatron: Any) -> Any:
    return run_from_dict({"job": {"name": "t", "nodes": 2, **(job or {})},
                          "megatron": {**GOOD, **megatron}}, "run.toml")


# --- model checks ---------------------------------------------------------------------------

def test_ffn_hidden_size_not_divisible_by_tp_is_refused() -> None:
    plan = make_plan(run(ffn_hidden_size=1001), SITE, placement=False)
    errs = [e for e in plan.to_json()["errors"] if "ffn_hidden_size" in e]
    assert errs and "not divisible by TP=8" in errs[0]
    assert make_plan(run(ffn_hidden_size=1024), SITE, placement=False).to_json()["ok"]


def test_max_position_embeddings_below_seq_length_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"megatron.max_position_embeddings: 64 is below "
                                          r"seq_length = 128"):
        run(max_position_embeddings=64)
    run(max_position_embeddings=128)


@pytest.mark.parametrize(("key", "value"), [
    ("num_layers", 10**12), ("num_layers", 1e12), ("hidden_size", 2**40), ("num_experts", 10**9),
])
def test_absurd_sizes_are_config_errors(key: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"megatron.{key}"):
        run(**{key: value})


def test_job_name_longer_than_slurm_accepts_is_refused() -> None:
    run({"name": "a" * MAX_JOB_NAME})
    with pytest.raises(ConfigError, match=r"job.name: expected a string of length <= 1024") as e:
        run({"name": "a" * (MAX_JOB_NAME + 1)})
    assert len(e.value.message) < 200  # the value is cut, the line stays readable


@pytest.mark.parametrize("bad", ["inf", "nan", "-inf", "0.0", "-5.0"])
def test_site_peak_must_be_a_finite_positive_number(bad: str) -> None:
    text = builtin_site_path("dgx-h100-superpod").read_text()
    text = text.replace("peak_tflops_bf16 = 989", f"peak_tflops_bf16 = {bad}")
    import tomllib

    with pytest.raises(ConfigError, match=r"site.toml: node_types.dgx-h100.gpu.peak_tflops_bf16: "
                                          r"expected a (finite )?number"):
        validate(Site, tomllib.loads(text), "site.toml")


# --- parsers of user text: one line for a bad quote, linear for a long line --------------------

def test_unbalanced_quote_is_one_line() -> None:
    with pytest.raises(ConfigError, match="No closing quotation"):
        from_megatron_args('--num-layers 2 --data-path "a b')
    res = cli("plan", "--from-megatron-args", '--num-layers 32 --hidden-size "4096')
    one_error_line(res, 2, "--from-megatron-args", "No closing quotation")


@pytest.mark.parametrize("text", [
    "", "a b", "'a b' c", '"a \\" b" c', "a\\ b", "x # comment\ny", "a'b'c\"d\"", '""', "''",
    "--data-path 0.5 /d/a 0.5 /d/b", '"$HOME/x" \'$y\'', "a\tb\nc",
])
def test_shell_words_match_shlex(text: str) -> None:
    assert shell_words(text) == shlex.split(text, comments=True)


def test_moe_layer_freq_expression_cannot_exhaust_memory() -> None:
    with pytest.raises(ConfigError, match="moe_layer_freq"):
        from_megatron_args("--moe-layer-freq ([0]*10**12)")
    assert from_megatron_args("--moe-layer-freq ([0]*1+[1]*3)")["moe_layer_freq"] == [0, 1, 1, 1]


@pytest.mark.parametrize("line", [
    "X=" + "a" * 1_000_000,  # one long word (shlex and `\S+\.py\b` were quadratic)
    "python train.py " + "--x " * 250_000,
    "torchrun " + "a " * 500_000 + "pretrain_gpt.py --num-layers 2",
    "python t.py " + "${a:-" * 200_000,  # unclosed variable defaults
    "-" * 1_000_000,
    "x . " + " " * 1_000_000 + "y",
])
def test_one_megabyte_line_is_parsed_in_linear_time(line: str) -> None:
    # No timing assertion: before, the first line alone took minutes (100 KB took 16 s).
    for parse in (from_launch_script, parse_arguments_dump):
        with contextlib.suppress(ConfigError):
            parse(line)


def test_plan_of_a_launch_script_with_a_long_line(tmp_path: Path) -> None:
    script = tmp_path / "x.sh"
    script.write_text("#!/bin/bash\nX=" + "a" * 1_000_000 + "\npython pretrain_gpt.py "
                      "--num-layers 2 --hidden-size 64 --num-attention-heads 2 --seq-length 64 "
                      "--vocab-size 100 --global-batch-size 8 --max-position-embeddings 64\n")
    res = cli("plan", str(script), "--site", "sandbox")
    assert res.returncode in (0, 3) and "error" not in res.stderr.lower(), res.stderr


# --- unwritable outputs: exit 73, one line ----------------------------------------------------

def test_outputs_under_proc_are_file_errors(tmp_path: Path) -> None:
    spec = ROOT / "docs/examples/llama3-8b.toml"
    one_error_line(cli("render", str(spec), "-o", "/proc/x"), OutputError.exit_code, "/proc/x")
    res = cli("submit", "--dry-run", str(spec), "--run-dir", "/proc/x")
    one_error_line(res, OutputError.exit_code, "/proc/x")
    assert "would store" not in res.stderr
    one_error_line(cli("topo", "generate", "sandbox", "-o", "/proc/x"), OutputError.exit_code)
    res = cli("submit", "--dry-run", str(spec), "--run-dir", str(tmp_path / "new" / "dir"))
    assert res.returncode == 0 and "would store" in res.stderr
    assert not (tmp_path / "new").exists()  # a dry run creates nothing


# --- Megatron argument names per release ------------------------------------------------------

def test_fp8_renders_fp8_format_and_store_false_flags() -> None:
    argv = megatron_argv({"fp8": "hybrid", "add_bias_linear": False, "masked_softmax_fusion": True,
                          "load_optim": False, "num_layers": 2, "fp4": "nvfp4"})
    assert argv == ["--fp8-format", "hybrid", "--disable-bias-linear", "--no-load-optim",
                    "--num-layers", "2", "--fp4-format", "nvfp4"]


def test_release_names() -> None:
    assert set(argnames.releases()) >= {"core_r0.12", "core_r0.13", "core_r0.14", "main"}
    for rel in argnames.releases():
        names = argnames.names(rel)
        assert {"num_layers", "fp8", "moe_router_topk", "kv_lora_rank", "recompute_granularity",
                "use_distributed_optimizer", "tokenizer_type", "save"} <= names
    # Every store_false argument exists in some release (slurmpod's aliases are its own).
    every = frozenset().union(*(argnames.names(r) for r in argnames.releases()))
    assert all(dest in every for dest in argnames.store_false_flags()
               if dest not in ("load_optim", "load_rng", "save_optim", "save_rng"))
    # From the releases' own arguments.py: added, removed, and built from config dataclasses.
    assert "moe_latent_size" in argnames.names("main")
    assert "moe_latent_size" not in argnames.names("core_r0.14")
    assert "exit_signal" not in argnames.names("core_r0.14")  # no such argument before main
    assert "persist_layer_norm" not in argnames.names("core_r0.12")
    assert "microbatch_group_size_per_vp_stage" in argnames.names("core_r0.14")
    assert "retro_add_retriever" in argnames.names("core_r0.14")
    assert "retro_add_retriever" not in argnames.names("main")


def test_site_release_names_match_the_data_file() -> None:
    from typing import get_args, get_type_hints

    from slurmpod.model.site import Software

    assert set(get_args(get_type_hints(Software)["megatron"])) == set(argnames.releases())
    assert Software().megatron == argnames.default_release()


def test_unknown_megatron_key_warns_with_a_suggestion() -> None:
    warns = argnames.unknown_key_warnings(["num_layer", "lr", "zzz_qqq"], "core_r0.14", "run.toml")
    assert warns == [
        "run.toml: megatron.num_layer is not a Megatron-LM core_r0.14 argument "
        "(did you mean num_layers?)",
        "run.toml: megatron.zzz_qqq is not a Megatron-LM core_r0.14 argument",
    ]
    prep = prepare(run(lr_warmup_iter=5), SITE, RenderOptions(), "/runs/t", "r.toml")
    assert prep.warnings == ("r.toml: megatron.lr_warmup_iter is not a Megatron-LM core_r0.14 "
                             "argument (did you mean lr_warmup_iters?)",)
    assert "--lr-warmup-iter 5" in prep.script  # still passed through


def test_render_prints_the_warning(tmp_path: Path) -> None:
    spec = tmp_path / "run.toml"
    spec.write_text("[job]\nname = 't'\n[megatron]\nnum_layers = 2\nhidden_size = 64\n"
                    "num_attention_heads = 2\nseq_length = 64\nvocab_size = 100\n"
                    "global_batch_size = 8\nnum_layer = 3\n")
    res = cli("render", str(spec), "--site", "sandbox", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert ("slurmpod: warning: " + str(spec) + ": megatron.num_layer is not a Megatron-LM "
            "core_r0.14 argument (did you mean num_layers?)") in res.stderr


# --- time limit against the partition's MaxTime, at submit --------------------------------------

SCONTROL_PARTITIONS = (
    "PartitionName=batch AllowGroups=ALL Default=YES QoS=N/A DefaultTime=NONE MaxNodes=UNLIMITED "
    "MaxTime=01:00:00 MinNodes=0 State=UP TotalCPUs=64\n"
    "PartitionName=long AllowGroups=ALL Default=NO MaxTime=2-00:00:00 State=UP\n"
    "PartitionName=preemptible AllowGroups=ALL Default=NO MaxTime=UNLIMITED State=UP\n"
)


def test_parse_partitions() -> None:
    parts = parse_scontrol_partitions(SCONTROL_PARTITIONS)
    assert parts == {"batch": (True, 60), "long": (False, 2880), "preemptible": (False, None)}
    assert partition_max_time(parts, None) == 60
    assert partition_max_time(parts, "long") == 2880
    assert partition_max_time(parts, "preemptible") is None
    assert partition_max_time(parts, "nosuch") is None


def test_time_limit_above_partition_max_time_is_refused_before_anything_is_written() -> None:
    # The site file says 1 h (checked by the plan); Slurm says 30 min now: Slurm wins at submit.
    be = FakeBackend(max_time_min={"batch": 30})
    runner = FakeRunner(be)
    prep = prepare(run({"time_limit": "01:00:00"}), SITE, RenderOptions(), "/runs/t")
    with pytest.raises(ConfigError, match=r"job.time_limit: 01:00:00 exceeds the MaxTime of the "
                                          r"default partition \(00:30:00\)"):
        submit(prep, runner, be)
    assert not runner.files
    prep = prepare(run({"time_limit": "45", "partition": "batch"}), SITE, RenderOptions(),
                   "/runs/t")
    with pytest.raises(ConfigError, match=r"partition batch \(00:30:00\)"):
        check_time_limit(prep, be)
    ok = prepare(run({"time_limit": "00:30:00"}), SITE, RenderOptions(), "/runs/t")
    assert submit(ok, runner, be).job_ids == ["1"]
    check_time_limit(prep, FakeBackend())  # no MaxTime known: no check
