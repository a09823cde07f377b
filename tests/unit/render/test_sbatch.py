"""Rendered sbatch scripts: #SBATCH quoting, placement by topology, the Megatron command line,
golden scripts (SLURMPOD_UPDATE_GOLDEN=1 rewrites them) and `bash -n` on every one."""

from __future__ import annotations

import ast
import os
import re
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmpod.config import builtin_site_path, load_site, read_toml, validate
from slurmpod.errors import ConfigError
from slurmpod.megatron.runspec import run_from_dict
from slurmpod.model.comment import prediction_keys
from slurmpod.model.site import Site
from slurmpod.render import launch
from slurmpod.render.sbatch import (
    PlanFacts,
    RenderOptions,
    build_context,
    render_script,
    sbatch_line,
    segment_size,
)

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "sbatch"
C_SPACE = " \t\n\v\f\r"


def slurm_tokens(line: str) -> list[str]:
    """sbatch's own reading of one `#SBATCH` line, ported from src/sbatch/opt.c
    `_get_argument` (22.05): backslash escapes the next character even inside quotes,
    '…' or "…" group, unquoted `#` ends the line, C-locale whitespace separates."""
    assert line.startswith("#SBATCH")
    s, i, out = line[len("#SBATCH"):], 0, []
    while True:
        while i < len(s) and s[i] in C_SPACE:
            i += 1
        if i >= len(s):
            return out
        arg: list[str] = []
        quoted, q, esc = False, "", False
        while i < len(s) and (quoted or s[i] not in C_SPACE):
            c = s[i]
            if esc:
                esc = False
            elif c == "\\":
                esc, i = True, i + 1
                continue
            elif quoted:
                if c == q:
                    quoted, i = False, i + 1
                    continue
            elif c in "\"'":
                quoted, q, i = True, c, i + 1
                continue
            elif c == "#":
                return [*out, "".join(arg)] if arg else out
            arg.append(c)
            i += 1
        assert not quoted, f"unmatched quote in {line!r}"
        if not arg:
            return out
        out.append("".join(arg))


def sandbox() -> Site:
    return load_site(builtin_site_path("sandbox"))


def site_variant(**changes: Any) -> Site:
    """The sandbox site with some tables changed (roce fabric, NVL block topology, …)."""
    data = read_toml(builtin_site_path("sandbox"))
    for path, value in changes.items():
        node = data
        keys = path.split("__")
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return validate(Site, data, "variant.toml")


def run_spec(job: dict[str, Any] | None = None, **megatron: Any) -> Any:
    mg = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "seq_length": 128,
          "vocab_size": 1000, "tensor_model_parallel_size": 8, "global_batch_size": 16,
          "train_iters": 100}
    mg.update(megatron)
    return run_from_dict({"job": {"name": "golden", "nodes": 2, **(job or {})},
                          "megatron": mg}, "run.toml")


def facts(nodes: int, min_sus: int = 1, gpn: int = 8) -> PlanFacts:
    return PlanFacts(nodes=nodes, gpus_per_node=gpn, min_sus=min_sus, min_blocks=1,
                     flops_per_iteration=1.25e15, peak_tflops=989.0, formula="test-1")


# -- #SBATCH lines ---------------------------------------------------------------------------

def test_sbatch_line_forms() -> None:
    assert sbatch_line("exclusive", True) == "#SBATCH --exclusive"
    assert sbatch_line("account", None) is None
    assert sbatch_line("requeue", False) is None
    assert sbatch_line("nodes", 4) == "#SBATCH --nodes=4"
    assert sbatch_line("signal", "B:TERM@300") == "#SBATCH --signal=B:TERM@300"
    with pytest.raises(ValueError):
        sbatch_line("--nodes", 1)


HOSTILE = ["a b", "it's", 'say "hi"', "$(touch /tmp/x)", "`id`", "a;b", "x # y", "back\\slash",
           "\\\"'", "ünïcode ✓", "", "%j-%x", "-N 999"]


@pytest.mark.parametrize("value", HOSTILE)
def test_sbatch_line_round_trips_through_slurms_tokenizer(value: str) -> None:
    line = sbatch_line("job-name", value)
    assert line is not None
    assert slurm_tokens(line) == [f"--job-name={value}"]


@given(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Cs")), max_size=40))
@settings(max_examples=300, deadline=None)
def test_sbatch_line_property(value: str) -> None:
    line = sbatch_line("comment", value)
    assert line is not None and "\n" not in line
    assert slurm_tokens(line) == [f"--comment={value}"]


@pytest.mark.parametrize("bad", ["two\nlines", "cr\r", "nul\x00", "tab\there"])
def test_control_characters_refused(bad: str) -> None:
    with pytest.raises(ConfigError):
        sbatch_line("job-name", bad)


# -- placement and derived values ------------------------------------------------------------

def _directives(site: Site, nodes: int, min_sus: int, **opts: Any) -> dict[str, str | bool]:
    ctx = build_context(run_spec({"nodes": nodes}), site, facts(nodes, min_sus),
                        RenderOptions(run_dir="/r", **opts))
    out: dict[str, str | bool] = {}
    for line in ctx.directives:
        (tok,) = slurm_tokens(line)
        key, sep, value = tok[2:].partition("=")
        out[key] = value if sep else True
    return out


def test_whole_node_directives_and_tree_placement() -> None:
    d = _directives(sandbox(), 8, 2, switch_wait="01:00:00")
    assert d["nodes"] == "8" and d["ntasks-per-node"] == "8" and d["gpus-per-node"] == "8"
    assert d["exclusive"] is True and d["mem"] == "0" and d["requeue"] is True
    assert d["switches"] == "2@01:00:00"
    # USR2 to the batch shell only: the time-limit warning, told apart from Slurm's SIGTERMs.
    assert d["signal"] == "B:USR2@60"
    assert "USR1" not in str(d["signal"])
    assert "segment" not in d and "nodelist" not in d


def test_block_topology_uses_segment_never_nodelist() -> None:
    # 4 emulated nodes of 8 GPUs share one 32-GPU NVLink domain; Slurm 24.11 block topology.
    site = site_variant(node_types__emu8__nvlink_domain_gpus=32, su_groups=[
        {"node_type": "emu8", "sus": 4, "nodes_per_su": 4, "nodes_per_rack": 4}],
        slurm={"version": "24.11", "cluster_name": "nvl", "topology": "block"})
    assert site.topology_plugin == "block"
    d = _directives(site, 8, 2)
    assert d["segment"] == "4"
    assert "switches" not in d and "nodelist" not in d
    assert _directives(site, 3, 1)["segment"] == "3"


@pytest.mark.parametrize(("nodes", "domain", "want"), [(36, 18, 18), (8, 18, 8), (20, 18, 10),
                                                       (17, 4, 1), (24, 18, 12)])
def test_segment_size_divides_nodes_and_fits_domain(nodes: int, domain: int, want: int) -> None:
    seg = segment_size(nodes, domain)
    assert seg == want and nodes % seg == 0 and seg <= max(domain, 1)


@pytest.mark.parametrize(("nodes", "domain", "unit", "want"), [
    (30, 18, 2, 10), (30, 18, 1, 15), (36, 18, 2, 18), (24, 18, 4, 12), (27, 18, 2, 9),
    (12, 18, 2, 12)])
def test_segment_size_keeps_tp_groups_whole(nodes: int, domain: int, unit: int,
                                            want: int) -> None:
    # (27, 18, 2): no even divisor of 27 fits a rack; the plain rule applies.
    assert segment_size(nodes, domain, unit) == want


def test_gb200_segments_align_to_tp_and_count_spares() -> None:
    site = load_site(builtin_site_path("gb200-nvl72"))
    assert site.topology_plugin == "block"

    def directives(nodes: int, tp: int, spares: int = 0) -> dict[str, str | bool]:
        ctx = build_context(run_spec({"nodes": nodes}, tensor_model_parallel_size=tp), site,
                            facts(nodes, gpn=4), RenderOptions(run_dir="/r", spares=spares))
        out: dict[str, str | bool] = {}
        for line in ctx.directives:
            key, sep, value = slurm_tokens(line)[0][2:].partition("=")
            out[key] = value if sep else True
        return out

    # TP 8 on 4-GPU trays spans 2 trays: segments of 10, not 15, keep TP pairs in one rack.
    assert directives(30, tp=8)["segment"] == "10"
    assert directives(30, tp=4)["segment"] == "15"
    # Slurm refuses a node count that is not a multiple of the segment: spares count.
    d = directives(16, tp=8, spares=2)
    assert d["nodes"] == "18" and d["segment"] == "18"
    # Whole nodes, not whole blocks; one IMEX channel for the job, not one per segment.
    assert d["exclusive"] is True
    assert "network" not in d and "nodelist" not in d


@pytest.mark.parametrize(("version", "has_segment"), [("23.11", False), ("24.05", True),
                                                       ("25.11", True)])
def test_segment_needs_slurm_24_05(version: str, has_segment: bool) -> None:
    site = site_variant(node_types__emu8__nvlink_domain_gpus=32, su_groups=[
        {"node_type": "emu8", "sus": 4, "nodes_per_su": 4, "nodes_per_rack": 4}],
        slurm={"version": version, "cluster_name": "nvl", "topology": "block"})
    assert ("segment" in _directives(site, 8, 2)) is has_segment


def test_distributed_timeout_default_and_user_value_wins() -> None:
    def timeout(**megatron: Any) -> str:
        cmd = list(build_context(run_spec(**megatron), sandbox(), facts(2),
                                 RenderOptions(run_dir="/r")).command)
        assert cmd.count("--distributed-timeout-minutes") == 1
        return cmd[cmd.index("--distributed-timeout-minutes") + 1]

    assert timeout() == str(launch.DISTRIBUTED_TIMEOUT_MIN) == "30"
    assert timeout(distributed_timeout_minutes=90) == "90"


def test_spares_chain_and_comment() -> None:
    d = _directives(sandbox(), 4, 1, spares=2, chain=3, token="abc")
    assert d["nodes"] == "6" and d["no-kill"] is True and d["dependency"] == "singleton"
    import json

    comment = json.loads(str(d["comment"]))
    assert comment["run"] == "golden" and comment["gpus"] == 32 and comment["token"] == "abc"
    assert comment["flops_per_iter"] == 1.25e15 and comment["peak_tflops"] == 989.0


def _timing(limit: str, params: float = 0.0, **opts: object) -> tuple[str, str | None]:
    plan = replace(facts(2), params_total=params)
    ctx = build_context(run_spec({"time_limit": limit}), sandbox(), plan,
                        RenderOptions(run_dir="/r", **opts))  # type: ignore[arg-type]
    (signal,) = [d for d in ctx.directives if d.startswith("#SBATCH --signal=")]
    cmd = list(ctx.command)
    exit_min = (cmd[cmd.index("--exit-duration-in-mins") + 1]
                if "--exit-duration-in-mins" in cmd else None)
    return signal.removeprefix("#SBATCH --signal="), exit_min


@pytest.mark.parametrize(("limit", "params", "lead", "exit_min"), [
    # 70e9 params x 14 B / 20 GB/s = 49 s to save: lead 60 + 2 x 49 = 158 s;
    # exit = (14400 - 158 - 98) s = 235.7 min -> 235.
    ("04:00:00", 70e9, 158, "235"),
    # 405e9 x 14 / 20e9 = 283.5 s: lead 60 + 567 = 627 s; (14400 - 627 - 567) / 60 = 220.1.
    ("04:00:00", 405e9, 627, "220"),
    # Nothing to save: 60 s; a 10-minute limit keeps (600 - 60) / 60 = 9 minutes.
    ("00:10:00", 0.0, 60, "9"),
    # A quarter of a short limit at most: 15 s of 1 minute, and no --exit-duration-in-mins
    # (45 s is under a minute; the whole limit must never be passed).
    ("00:01:00", 70e9, 15, None),
])
def test_signal_lead_follows_the_predicted_save_time(limit: str, params: float, lead: int,
                                                     exit_min: str | None) -> None:
    assert _timing(limit, params) == (f"B:USR2@{lead}", exit_min)


def test_signal_lead_option_overrides() -> None:
    # (14400 - 600 - 2 x 49) / 60 = 228.4
    assert _timing("04:00:00", 70e9, signal_lead_s=600) == ("B:USR2@600", "228")


def test_site_checkpoint_bandwidth_sets_the_save_time() -> None:
    site = sandbox()
    fast = msgspec.structs.replace(site, storage=msgspec.structs.replace(
        site.storage, checkpoint_write_gb_per_s=98.0))
    plan = replace(facts(2), params_total=70e9)  # 70e9 x 14 / 98e9 = 10 s -> lead 80 s
    ctx = build_context(run_spec({"time_limit": "04:00:00"}), fast, plan,
                        RenderOptions(run_dir="/r"))
    assert "#SBATCH --signal=B:USR2@80" in ctx.directives


def test_switches_count_the_spares() -> None:
    # 7 nodes fit 2 SUs of 4; with 2 spares the 9 nodes need 3.
    assert _directives(sandbox(), 7, 2, spares=2)["switches"] == "3@24:00:00"
    assert _directives(sandbox(), 7, 2)["switches"] == "2@24:00:00"


# Seconds round up to the next minute, as Slurm stores a limit (sbatch(1) --time).
@pytest.mark.parametrize(("limit", "minutes"), [("30", 30), ("1:30", 2), ("02:00:00", 120),
                                                ("1-00:00:00", 1440), ("2-12", 3600),
                                                ("INFINITE", None)])
def test_time_limit_minutes(limit: str, minutes: int | None) -> None:
    assert launch.parse_time_limit_min(limit) == minutes


def test_megatron_argv_flags_lists_store_false_and_passthrough() -> None:
    argv = launch.megatron_argv({
        "num_layers": 2, "swiglu": True, "bf16": False, "masked_softmax_fusion": False,
        "add_bias_linear": True, "lr": 3e-4, "data_path": ["1.0", "a b"], "eval_iters": None,
        "my_new_arg": "x",
    })
    assert argv == ["--num-layers", "2", "--swiglu", "--no-masked-softmax-fusion", "--lr",
                    "0.0003", "--data-path", "1.0", "a b", "--my-new-arg", "x"]


@pytest.mark.parametrize(("table", "want"), [
    # Megatron (core_r0.12 .. main) has no --virtual-pipeline-model-parallel-size: validate_args
    # sets that dest from --num-virtual-stages-per-pipeline-rank.
    ({"pipeline_model_parallel_size": 4, "virtual_pipeline_model_parallel_size": 5},
     ["--pipeline-model-parallel-size", "4", "--num-virtual-stages-per-pipeline-rank", "5"]),
    # Stated Megatron's way already: nothing added.
    ({"virtual_pipeline_model_parallel_size": 5, "num_layers_per_virtual_pipeline_stage": 2},
     ["--num-layers-per-virtual-pipeline-stage", "2"]),
    # A layout decides the virtual stages; a second source would be refused.
    ({"virtual_pipeline_model_parallel_size": 2, "pipeline_model_parallel_layout": "Et|t|tL"},
     ["--pipeline-model-parallel-layout", "Et|t|tL"]),
])
def test_the_virtual_pipeline_size_renders_as_an_argument_megatron_takes(
        table: dict[str, Any], want: list[str]) -> None:
    from slurmpod.megatron.argnames import names

    argv = launch.megatron_argv(table)
    assert argv == want
    for release in ("core_r0.14", "main"):  # the default release and main
        assert {a[2:].replace("-", "_") for a in argv if a.startswith("--")} <= names(release)


def test_keys_only_the_performance_model_reads_are_not_rendered() -> None:
    """`moe_imbalance` tunes slurmpod's prediction (docs/perf-model.md); Megatron has no such
    argument and would refuse the job at start-up."""
    from slurmpod.megatron import argnames

    assert launch.megatron_argv({"moe_imbalance": 1.2, "num_layers": 2}) == ["--num-layers", "2"]
    assert argnames.unknown_key_warnings(["moe_imbalance"], "main", "run.toml") == []


def test_the_emulator_reads_the_rendered_virtual_stages_as_megatron_does() -> None:
    from slurmpod.sandbox.workload import megatron_emu as emu

    argv = ["--num-layers", "8", "--hidden-size", "64", "--num-attention-heads", "4",
            "--seq-length", "32", "--train-iters", "1", "--pipeline-model-parallel-size", "2",
            *launch.megatron_argv({"virtual_pipeline_model_parallel_size": 2})]
    args, unknown = emu.build_parser().parse_known_args(argv)
    args = emu.finish_args(args, emu.Dist(0, 2, 0, "1", "0"))
    assert not unknown and args.virtual_pipeline_model_parallel_size == 2


def test_user_checkpoint_args_win_and_derived_added() -> None:
    ctx = build_context(run_spec(save="/mine"), sandbox(), facts(2),
                        RenderOptions(run_dir="/r"))
    cmd = list(ctx.command)
    assert cmd[cmd.index("--save") + 1] == "/mine"
    assert cmd[cmd.index("--load") + 1] == "/r/checkpoints"
    for flag in ("--log-throughput", "--exit-signal-handler"):
        assert cmd.count(flag) == 1


# -- golden scripts --------------------------------------------------------------------------

def _golden_cases() -> dict[str, str]:
    superpod = load_site(builtin_site_path("dgx-h100-superpod"))
    roce = site_variant(fabric={"kind": "roce", "rails": 8, "link_gbps": 400,
                                "leaf_radix": 16, "spine_radix": 16})
    block = site_variant(node_types__emu8__nvlink_domain_gpus=32, su_groups=[
        {"node_type": "emu8", "sus": 4, "nodes_per_su": 4, "nodes_per_rack": 4}],
        slurm={"version": "24.11", "cluster_name": "nvl", "topology": "block"})
    cases = {
        # With the plan's prediction, which the Comment records for the fleet report.
        "sandbox-2su": (sandbox(), run_spec({"nodes": 8, "time_limit": "00:30:00"}),
                        replace(facts(8, 2), prediction=prediction_keys(
                            step_time_s=0.0123456, mfu=0.15, tokens_per_s_per_gpu=1315.36,
                            breakdown_s={"compute": 0.0107, "tp": 0.00115,
                                         "exposed_communication": 0.00115, "dp": 0.0},
                            gpu="emu", layout="TP8 PP1 DP8 MBS1 GBS16")),
                        RenderOptions(run_dir="/scratch/runs/sandbox-2su")),
        "superpod-sharp-container": (
            superpod,
            run_spec({"nodes": 64, "partition": "batch", "account": "ml", "qos": "high",
                      "time_limit": "2-00:00:00",
                      "container_image": "nvcr.io/nvidia/pytorch:25.01-py3",
                      "container_mounts": ["/lustre:/lustre", "/home/me/data:/data"],
                      "checkpoint_dir": "/lustre/ckpt/gpt", "env": {"WANDB_MODE": "offline"}},
                     tensor_model_parallel_size=8, pipeline_model_parallel_size=4),
            facts(64, 2), RenderOptions(site_label="dgx-h100-superpod",
                                        run_dir="/lustre/runs/gpt", nccl_version="2.21.5")),
        "roce-debug": (roce, run_spec({"nodes": 2}), facts(2),
                       RenderOptions(run_dir="/r/roce", nccl_debug=True, nccl_version="2.19.3",
                                     cpu_bind="slurm")),
        "block-spares-chain": (block, run_spec({"nodes": 8}), facts(8, 2),
                               RenderOptions(run_dir="/r/nvl", spares=1, chain=3,
                                             max_restarts=5, monitor=False)),
    }
    return {name: render_script(build_context(run, site, f, o))
            for name, (site, run, f, o) in cases.items()}


def test_golden_scripts() -> None:
    rendered = _golden_cases()
    update = os.environ.get("SLURMPOD_UPDATE_GOLDEN") == "1"
    for name, text in rendered.items():
        path = GOLDEN / f"{name}.sbatch"
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        assert path.exists(), f"missing golden {path}; run with SLURMPOD_UPDATE_GOLDEN=1"
        assert text == path.read_text(), f"{name} differs from {path}"


def test_every_golden_script_parses_in_bash() -> None:
    files = sorted(GOLDEN.glob("*.sbatch"))
    assert len(files) >= 4
    for f in files:
        proc = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{f.name}: {proc.stderr}"
        lines = f.read_text().splitlines()
        assert lines[0] == "#!/bin/bash" and "Generated by slurmpod" in lines[1]
        # sbatch stops reading directives at the first command: all must come before it.
        first_cmd = next(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
        assert all(i < first_cmd for i, ln in enumerate(lines) if ln.startswith("#SBATCH"))


def test_site_template_dir_overrides_a_block(tmp_path: Path) -> None:
    (tmp_path / "sbatch").mkdir()
    (tmp_path / "sbatch" / "megatron.sbatch.j2").write_text(
        '{% extends "sbatch/megatron-base.sbatch.j2" %}\n'
        "{% block accounting_monitor %}\n# site monitor\n"
        "start_monitor() { true; }\nstop_monitor() { true; }\n{% endblock %}\n")
    ctx = build_context(run_spec(), sandbox(), facts(2), RenderOptions(run_dir="/r"))
    text = render_script(ctx, template_dirs=[tmp_path])
    assert "# site monitor" in text and "hook monitor" not in text
    assert "#SBATCH --exclusive" in text
    with pytest.raises(ConfigError, match="not found"):
        render_script(ctx, template="sbatch/nope.j2")


@pytest.mark.parametrize(("megatron", "alloc", "graph_register"), [
    ({}, "expandable_segments:True", None),
    ({"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ["attn"]},
     "expandable_segments:True", "0"),
    ({"cuda_graph_impl": "none"}, "expandable_segments:True", None),
    ({"enable_cuda_graph": True}, "expandable_segments:True", "0"),
    ({"nccl_ub": True}, None, None),
])
def test_the_script_sets_the_allocator_the_run_allows(megatron: dict[str, Any], alloc: str | None,
                                                      graph_register: str | None) -> None:
    ctx = build_context(run_spec(**megatron), sandbox(), facts(2), RenderOptions(run_dir="/r"))
    env = {v.name: v.value for v in ctx.env}
    assert env.get("PYTORCH_CUDA_ALLOC_CONF") == alloc
    assert env.get("NCCL_GRAPH_REGISTER") == graph_register


def _megatron_pattern(x: str) -> list[int]:
    """Megatron's `moe_freq_type` on a pattern string (megatron/training/arguments.py, core_r0.12
    to main): only digits, commas, brackets, parentheses, `+` and `*` (`_eval_pattern`), then
    evaluated; here with literal_eval, which is enough for what slurmpod renders."""
    assert "[" in x and not re.search(r"[^,\d\[\]\(\)\+\*]", x), x
    return list(ast.literal_eval(x))


def _megatron_tuple(x: str) -> tuple[int, ...]:
    """Megatron's `tuple_type` (the same file): the integers between commas, parentheses
    stripped."""
    return tuple(int(i) for i in x.strip("()").split(","))


def test_list_arguments_megatron_parses_from_one_string_render_as_one() -> None:
    """`--moe-layer-freq`, `--window-attn-skip-freq` and `--linear-attention-freq` take a Python
    list expression, `--window-size` comma-separated integers, each as one argparse value (no
    nargs): rendered as nargs values, Megatron refuses the job ("unrecognized arguments")."""
    from slurmpod.megatron.args import from_megatron_args
    from slurmpod.megatron.runspec import load_run, preset_path

    freq = [0, 0, 0] + [1] * 58
    argv = launch.megatron_argv({
        "moe_layer_freq": freq, "window_size": [127, 0], "window_attn_skip_freq": [1, 0, 1, 0],
        "linear_attention_freq": [1, 1, 1, 0], "data_path": ["1.0", "a b"]})
    assert argv == ["--moe-layer-freq", "[" + ",".join(map(str, freq)) + "]",
                    "--window-size", "127,0", "--window-attn-skip-freq", "[1,0,1,0]",
                    "--linear-attention-freq", "[1,1,1,0]", "--data-path", "1.0", "a b"]
    assert _megatron_pattern(argv[1]) == freq
    assert _megatron_tuple(argv[3]) == (127, 0)
    assert _megatron_pattern(argv[5]) == [1, 0, 1, 0]
    # An int stays an int; the DeepSeek-V3 preset's pattern is one value.
    assert launch.megatron_argv({"moe_layer_freq": 2}) == ["--moe-layer-freq", "2"]
    dsv3 = launch.megatron_argv(dict(load_run(preset_path("deepseek-v3")).megatron.values()))
    i = dsv3.index("--moe-layer-freq")
    assert _megatron_pattern(dsv3[i + 1]) == freq and dsv3[i + 2].startswith("--")
    # slurmpod's own importer reads the rendered pattern back.
    assert from_megatron_args(argv[:2])["moe_layer_freq"] == freq
