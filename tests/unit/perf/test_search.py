"""`slurmpod plan --search` and the prediction in `slurmpod plan`."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from slurmpod.megatron.runspec import ModelConfig, load_run, preset_path
from slurmpod.perf.hardware import Hardware
from slurmpod.perf.search import search

ROOT = Path(__file__).resolve().parents[3]
H100 = Hardware(gpu_model="h100", generation="hopper", peak_bf16=989, peak_fp8=1979,
                hbm_tb_s=3.35, nvlink_gb_s=450, domain_gpus=8, gpus_per_node=8, nic_gb_s=50)
USABLE = 72 * 1024**3


def slurmpod(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurmpod", *args], cwd=cwd, text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=120)


def test_candidates_are_valid_sorted_and_fit() -> None:
    c = ModelConfig.from_args(load_run(preset_path("llama3-70b")).megatron)
    cands, n = search(c, 128, H100, USABLE, top=None)
    assert n >= len(cands) > 10
    times = [x.prediction.step_time_s for x in cands]
    assert times == sorted(times)
    for x in cands:
        k = x.config
        assert x.fits and x.memory_bytes <= USABLE
        assert 8 % k.tp == 0 and k.num_attention_heads % k.tp == 0
        assert 128 % (k.tp * k.cp * k.pp) == 0 and k.pp <= k.num_layers
        dp = 128 // (k.tp * k.cp * k.pp)
        assert k.global_batch_size % (k.micro_batch_size * dp) == 0
        assert not k.pipeline_split().errors  # a split Megatron accepts
        uneven = k.num_layers % (k.pp * (k.vpp or 1)) != 0
        if uneven:
            assert k.pipeline_layout is not None or k.account_for_embedding or k.account_for_loss
        if k.pipeline_layout is not None and not uneven:
            # An even split replaced only by a layout that gives the loss its own slot.
            assert k.pipeline_layout.endswith("L")
        assert k.sequence_parallel == (k.tp > 1)


def test_candidates_offload_activations_only_where_megatron_allows_it() -> None:
    """A run that offloads activations keeps it on PP1 layouts without recompute; the search
    drops it elsewhere (Megatron refuses it with PP > 1 or recompute), and the written spec of
    such a candidate leaves the key out."""
    c = dataclasses.replace(
        ModelConfig.from_args(load_run(preset_path("llama3-8b")).megatron),
        cpu_offloading_num_layers=8, recompute_granularity=None, pp=1, vpp=None)
    cands, _ = search(c, 16, H100, USABLE, top=None)
    kept = [x for x in cands if x.config.cpu_offloading_num_layers]
    assert kept and len(kept) < len(cands)
    for x in cands:
        k = x.config
        allowed = k.pp == 1 and k.recompute_granularity is None
        assert k.cpu_offloading_num_layers == (8 if allowed else 0)
        assert x.megatron_keys()["cpu_offloading_num_layers"] == (8 if allowed else None)


def test_the_presets_own_layout_is_among_the_candidates() -> None:
    c = ModelConfig.from_args(load_run(preset_path("llama3-70b")).megatron)
    cands, _ = search(c, 128, H100, USABLE, top=None)
    keys = {(x.config.tp, x.config.cp, x.config.pp, x.config.vpp) for x in cands}
    assert (c.tp, c.cp, c.pp, c.vpp) in keys


def test_nothing_fits_returns_the_smallest_not_fitting() -> None:
    c = ModelConfig.from_args(load_run(preset_path("llama3-405b")).megatron)
    cands, _ = search(dataclasses.replace(c, global_batch_size=64), 8, H100, USABLE, top=3)
    assert cands and not any(x.fits for x in cands)
    assert [x.memory_bytes for x in cands] == sorted(x.memory_bytes for x in cands)


def test_moe_search_varies_expert_parallelism() -> None:
    c = ModelConfig.from_args(load_run(preset_path("qwen3-30b-a3b")).megatron)
    cands, _ = search(c, 32, H100, USABLE, top=None)
    assert len({x.config.ep for x in cands}) > 2
    assert all(c.num_experts % x.config.ep == 0 for x in cands)  # type: ignore[operator]


def test_plan_json_has_prediction_and_search_candidates(tmp_path: Path) -> None:
    out = tmp_path / "best.toml"
    r = slurmpod("plan", "--preset", "llama3-70b", "--nodes", "16", "--search", "--top", "3",
                 "--json", "--write-spec", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    pred = data["prediction"]
    assert set(pred) >= {"step_time_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu", "mfu",
                         "breakdown_s"}
    assert set(pred["breakdown_s"]) >= {"compute", "tp", "cp", "pp_bubble", "dp", "ep",
                                        "optimizer", "exposed_communication"}
    cands = data["candidates"]
    assert len(cands) == 3 and data["search"]["evaluated"] >= 3
    assert set(cands[0]["layout"]) == set(data["layout"])
    assert cands[0]["fits"] and cands[0]["prediction"]["step_time_s"] <= \
        cands[1]["prediction"]["step_time_s"]
    # How far each is from the fastest, and whether the model's error can order them.
    assert cands[0]["vs_fastest"] == 1.0 and cands[0]["within_model_error"] is True
    for c in cands[1:]:
        want = c["prediction"]["step_time_s"] / cands[0]["prediction"]["step_time_s"]
        assert abs(c["vs_fastest"] - want) < 1e-4
        assert c["within_model_error"] == (c["vs_fastest"] <= 1.10)
    # The written spec is the fastest candidate, and it plans as predicted.
    r2 = slurmpod("plan", str(out), "--json")
    assert r2.returncode == 0, r2.stderr
    again = json.loads(r2.stdout)
    assert again["layout"] == cands[0]["layout"]
    assert again["micro_batch_size"] == cands[0]["micro_batch_size"]
    assert abs(again["prediction"]["step_time_s"] - cands[0]["prediction"]["step_time_s"]) \
        < 1e-6 * again["prediction"]["step_time_s"]


def test_search_text_says_which_candidates_the_model_cannot_order() -> None:
    r = slurmpod("plan", "--preset", "llama3-70b", "--nodes", "16", "--search", "--top", "4")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    head = next(i for i, x in enumerate(lines) if x.strip().startswith("#  TP"))
    assert "vs best" in lines[head] and "+0.0%" in lines[head + 2]
    assert any("within 10% of the fastest" in x and "cannot order them" in x for x in lines)
    assert not any("None" in x for x in lines[head:])  # no recompute reads "none"


def test_search_text_names_the_recompute_each_candidate_runs() -> None:
    from slurmpod.cli.plan import _recompute_words

    c = ModelConfig.from_args(load_run(preset_path("llama3-8b")).megatron)
    assert _recompute_words(dataclasses.replace(c, recompute_granularity=None)) == "none"
    assert _recompute_words(dataclasses.replace(c, recompute_granularity="full")) == "full"
    sel = dataclasses.replace(c, recompute_granularity="selective",
                              recompute_modules=("moe_act", "layernorm"))
    assert _recompute_words(sel) == "selective moe_act,layernorm"


def test_plan_text_prints_the_prediction() -> None:
    r = slurmpod("plan", "--preset", "llama3-8b", "--nodes", "2")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.strip().startswith("predicted"))
    assert "s/iteration" in line and "MFU" in line
    # The switches the preset sets, by Megatron's names.
    assert "  switches   overlap_grad_reduce, overlap_param_gather\n" in r.stdout


def test_pruned_top_n_is_the_head_of_the_full_ranking() -> None:
    """`top` skips the memory of layouts predicted slower than the top-th so far; the answer
    must be what ranking everything gives."""
    for preset, world in (("llama3-70b", 128), ("qwen3-30b-a3b", 64)):
        c = ModelConfig.from_args(load_run(preset_path(preset)).megatron)
        every, _ = search(c, world, H100, USABLE, top=None)
        head, _ = search(c, world, H100, USABLE, top=5)
        assert [x.prediction.step_time_s for x in head] == \
            [x.prediction.step_time_s for x in every[:5]]


def test_layers_that_do_not_divide_get_a_split_megatron_accepts() -> None:
    """Llama 3.1 405B (126 layers) at PP8 x VPP8 on 1,024 GPUs, the Megatron-Bridge recipe's
    layout, is a candidate through the embedding/loss slots."""
    c = ModelConfig.from_args(load_run(preset_path("llama3-405b")).megatron)
    c = dataclasses.replace(c, global_batch_size=512)
    cands, _ = search(c, 1024, H100, USABLE, top=None)
    hit = [x for x in cands if (x.config.tp, x.config.pp, x.config.vpp) == (8, 8, 8)]
    assert hit and all(x.config.account_for_embedding and x.config.account_for_loss
                       for x in hit)
    keys = hit[0].megatron_keys()
    assert keys["account_for_loss_in_pipeline_split"] is True
    assert keys["pipeline_model_parallel_layout"] is None


def test_candidates_carry_the_runs_settings() -> None:
    c = ModelConfig.from_args(load_run(ROOT / "tests/data/recipes/"
                                       "deepseek-v3-h100-fp8cs-1024gpu.toml").megatron)
    cands, _ = search(c, 1024, H100, USABLE, top=3)
    for x in cands:
        assert x.config.fp8 == c.fp8 and x.config.grad_bytes == 2
        assert x.config.hidden_dropout == 0.0 and x.config.fp8_param_gather


def test_in_flight_counts_match_the_schedule_walk() -> None:
    import itertools
    from collections import Counter

    from slurmpod.megatron.memory import _in_flight_chunks, _in_flight_counts

    c = ModelConfig.from_args(load_run(preset_path("llama3-70b")).megatron)
    for pp, v, nmb in itertools.product([2, 4, 8], [None, 2, 5], [1, 3, 8, 64, None]):
        k = dataclasses.replace(c, pp=pp, vpp=v)
        for r in range(pp):
            walk = Counter(_in_flight_chunks(k, r, nmb))
            assert [walk.get(i, 0) for i in range(v or 1)] == _in_flight_counts(k, r, nmb)


def test_the_loss_gets_a_layer_slot_where_the_last_stage_would_be_slowest() -> None:
    """Llama 3 70B FP8 at PP8 x VPP5: the output layer and loss (~2-3 FP8 layer-times) make the
    evenly split last rank the slowest, so the search predicts the balanced layout with the
    loss in its own slot, as Megatron-Bridge's H100 recipe pins ("...,tL")."""
    import dataclasses

    from slurmpod.perf.options import RunOptions

    c = ModelConfig.from_args(load_run(preset_path("llama3-70b")).megatron)
    c = dataclasses.replace(c, global_batch_size=128, fp8="hybrid")
    opts = RunOptions(tp_comm_overlap=True, overlap_grad_reduce=True, overlap_param_gather=True)
    cands, _ = search(c, 64, H100, USABLE, None, opts, top=None)
    pp8 = [x for x in cands
           if (x.config.tp, x.config.pp, x.config.vpp, x.config.cp) == (4, 8, 5, 1)]
    assert pp8 and all(x.config.pipeline_layout and x.config.pipeline_layout.endswith("tL")
                       for x in pp8)


def test_a_run_specs_switches_reach_the_prediction(tmp_path: Path) -> None:
    """Megatron main's `cuda_graph_impl` and the fused expert MLP, set in a run spec's
    [megatron], make `plan`'s prediction faster (docs/perf-model.md, the options it reads)."""
    preset = preset_path("qwen3-30b-a3b").read_text(encoding="utf-8")
    plain, switched = tmp_path / "plain.toml", tmp_path / "switched.toml"
    plain.write_text(preset, encoding="utf-8")
    switched.write_text(preset.replace("[megatron]\n", "[megatron]\ncuda_graph_impl = "
                                       "\"full_iteration\"\nuse_transformer_engine_op_fuser = "
                                       "true\n", 1), encoding="utf-8")
    got = {}
    for spec in (plain, switched):
        r = slurmpod("plan", str(spec), "--json")
        assert r.returncode == 0, r.stderr
        got[spec.stem] = json.loads(r.stdout)["prediction"]
    assert got["plain"]["switches"] == ["overlap_grad_reduce", "overlap_param_gather"]
    assert got["switched"]["switches"] == got["plain"]["switches"] + [
        "cuda_graph_impl=full_iteration", "use_transformer_engine_op_fuser"]
    assert got["switched"]["step_time_s"] < got["plain"]["step_time_s"]
    assert got["switched"]["breakdown_s"]["compute"] < got["plain"]["breakdown_s"]["compute"]


def test_megatron_fsdp_in_a_run_spec_is_named_and_moves_the_dp_time(tmp_path: Path) -> None:
    """`use_megatron_fsdp` (ZeRO-3 by default) gathers parameters every microbatch: `plan`
    names it among the switches and its DP time grows over the distributed optimizer's."""
    preset = preset_path("llama3-8b").read_text(encoding="utf-8")
    plain, fsdp = tmp_path / "plain.toml", tmp_path / "fsdp.toml"
    plain.write_text(preset, encoding="utf-8")
    fsdp.write_text(preset.replace("[megatron]\n", "[megatron]\nuse_megatron_fsdp = true\n", 1),
                    encoding="utf-8")
    got = {}
    for spec in (plain, fsdp):
        r = slurmpod("plan", str(spec), "--nodes", "2", "--json")
        assert r.returncode == 0, r.stderr
        got[spec.stem] = json.loads(r.stdout)["prediction"]
    assert got["fsdp"]["switches"] == got["plain"]["switches"] + [
        "use_megatron_fsdp=optim_grads_params"]
    assert got["fsdp"]["breakdown_s"]["dp"] > got["plain"]["breakdown_s"]["dp"]


def test_summary_line_keeps_the_emulated_gpus_fraction_of_a_tflops() -> None:
    from slurmpod.perf.model import BREAKDOWN_KEYS, Prediction
    from slurmpod.perf.planning import summary_line

    zero = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    gpu = Prediction(1.5, 7397.0, 1234.4, 0.5, {**zero, "compute": 1.2})
    emu = Prediction(0.141, 3643.0, 0.0797, 0.36, {**zero, "compute": 0.0972})
    assert "1,234 TFLOP/s/GPU, MFU 50%" in summary_line(gpu)
    # The sandbox's CPU "GPU" runs at a fraction of a TFLOP/s: never printed as 0.
    assert "0.0797 TFLOP/s/GPU, MFU 36%" in summary_line(emu)
    assert "offload" not in summary_line(gpu)
    off = Prediction(1.8, 6000.0, 1000.0, 0.4, {**zero, "compute": 1.2, "offload": 0.3})
    assert "compute 1.2 s, activation offload 0.3 s, bubble" in summary_line(off)


def test_plan_names_the_hosts_wait_and_what_removes_it(tmp_path: Path) -> None:
    """An FP8 MoE spec without CUDA graphs: `plan` prints the host's share under the prediction
    (`host` in the summary and a line of its own); the full-iteration graph removes both."""
    preset = preset_path("qwen3-30b-a3b").read_text(encoding="utf-8")
    fp8, graphed = tmp_path / "fp8.toml", tmp_path / "graphed.toml"
    fp8.write_text(preset.replace("[megatron]\n", "[megatron]\nfp8 = \"hybrid\"\n", 1),
                   encoding="utf-8")
    graphed.write_text(preset.replace("[megatron]\n", "[megatron]\nfp8 = \"hybrid\"\n"
                                      "cuda_graph_impl = \"full_iteration\"\n", 1),
                       encoding="utf-8")
    r = slurmpod("plan", str(fp8))
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("  host       "))
    assert "waiting on the host's kernel launches" in line and "full_iteration" in line
    assert ", host " in next(x for x in r.stdout.splitlines() if x.startswith("  predicted"))
    r = slurmpod("plan", str(graphed), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["prediction"]["breakdown_s"]["host"] == 0.0
    r = slurmpod("plan", str(graphed))
    assert "  host       " not in r.stdout and ", host " not in r.stdout
    # Graphs of the attention alone (Megatron's MoE guide's fix) shorten the wait.
    waits = json.loads(slurmpod("plan", str(fp8), "--json").stdout)["prediction"]
    attn = tmp_path / "attn.toml"
    attn.write_text(preset.replace("[megatron]\n", "[megatron]\nfp8 = \"hybrid\"\n"
                                   "cuda_graph_impl = \"transformer_engine\"\n"
                                   "cuda_graph_scope = [\"attn\", \"moe_router\", "
                                   "\"moe_preprocess\"]\n", 1), encoding="utf-8")
    r = slurmpod("plan", str(attn), "--json")
    assert r.returncode == 0, r.stderr
    shorter = json.loads(r.stdout)["prediction"]["breakdown_s"]["host"]
    assert 0 < shorter < waits["breakdown_s"]["host"]


def test_candidates_keep_the_ep_overlap_only_where_megatron_accepts_it() -> None:
    """A run with `overlap_moe_expert_parallel_comm` (and delayed wgrad) keeps it on layouts
    Megatron runs it with; on the others (EP 1, PP without VPP, full recompute) the candidate
    is predicted without it and its written keys turn it off, so every candidate's spec is one
    Megatron starts."""
    from slurmpod.megatron.validate import ep_overlap_conflicts, switch_errors
    from slurmpod.perf.model import predict
    from slurmpod.perf.options import RunOptions

    run = load_run(preset_path("qwen3-30b-a3b"))
    args = run.megatron.values() | {"overlap_moe_expert_parallel_comm": True,
                                    "delay_wgrad_compute": True}
    base = ModelConfig.from_args(args)
    opts = RunOptions.from_args(args)
    cands, _ = search(base, 32, H100, USABLE, opts=opts, top=None)
    off = [x for x in cands if x.switches_off]
    assert off and len(off) < len(cands)
    assert any(x.config.recompute_granularity == "full" for x in off)
    assert any(x.config.pp > 1 and x.config.vpp is None for x in off)
    for x in cands:
        assert x.switches_off == (
            ("overlap_moe_expert_parallel_comm",) if ep_overlap_conflicts(x.config) else ())
        keys = x.megatron_keys()
        written = {k: v for k, v in (args | keys).items() if v is not None}
        assert switch_errors(ModelConfig.from_args(written), written) == []
        assert x.to_json()["switches_off"] == list(x.switches_off)
    # Predicted as it will run: without the overlap's hidden all-to-all.
    x = next(x for x in off if x.config.ep > 1)
    without = predict(x.config, 32, H100, opts=dataclasses.replace(opts, ep_overlap=False))
    with_ = predict(x.config, 32, H100, opts=opts)
    assert without is not None and with_ is not None
    assert x.prediction.step_time_s == without.step_time_s > with_.step_time_s


def test_plan_refuses_an_ep_overlap_megatron_refuses(tmp_path: Path) -> None:
    spec = tmp_path / "run.toml"
    spec.write_text(preset_path("qwen3-30b-a3b").read_text(encoding="utf-8").replace(
        "[megatron]\n", "[megatron]\noverlap_moe_expert_parallel_comm = true\n", 1).replace(
        'recompute_granularity = "selective"', 'recompute_granularity = "full"\n'
        'recompute_method = "uniform"\nrecompute_num_layers = 1'), encoding="utf-8")
    r = slurmpod("plan", str(spec))
    assert r.returncode == 3, r.stdout + r.stderr
    assert ("megatron.recompute_granularity: overlap_moe_expert_parallel_comm excludes full "
            "recompute: use recompute_granularity = 'selective' or none, or "
            "overlap_moe_expert_parallel_comm = false") in r.stdout + r.stderr
    assert "Traceback" not in r.stderr


def test_candidates_at_tp_1_run_without_the_tp_comm_overlap(tmp_path: Path) -> None:
    """A recipe with `tp_comm_overlap` (NVIDIA's Llama 3 70B FP8 recipe): its TP 1 candidates
    are written with it off (Megatron refuses it without sequence parallelism), and the
    written spec of every listed candidate plans without errors."""
    from slurmpod.megatron.validate import switch_errors
    from slurmpod.perf.options import RunOptions

    run = load_run(ROOT / "tests" / "data" / "recipes" / "llama3-70b-h100-fp8cs-64gpu.toml")
    args = run.megatron.values()
    assert args["tp_comm_overlap"] is True
    base = ModelConfig.from_args(args)
    cands, _ = search(base, 64, H100, USABLE, opts=RunOptions.from_args(args), top=None)
    assert any(x.config.tp == 1 for x in cands)
    for x in cands:
        assert x.switches_off == (("tp_comm_overlap",) if x.config.tp == 1 else ())
        written = {k: v for k, v in (args | x.megatron_keys()).items() if v is not None}
        assert switch_errors(ModelConfig.from_args(written), written) == []


def test_interleaved_candidates_have_microbatches_the_schedule_accepts() -> None:
    """At 96 GPUs and GBS 288 many PP x VPP layouts would leave a last group of microbatches
    shorter than PP, which Megatron's interleaved schedule refuses at the first step."""
    from slurmpod.megatron.validate import interleave_error

    c = dataclasses.replace(ModelConfig.from_args(load_run(preset_path("llama3-70b")).megatron),
                            global_batch_size=288)
    cands, _ = search(c, 96, H100, USABLE, top=None)
    assert any(x.config.vpp for x in cands)
    for x in cands:
        k = x.config
        if k.vpp:
            m = 288 // (k.micro_batch_size * (96 // (k.tp * k.cp * k.pp)))
            assert m % k.pp == 0 and interleave_error(k, m) is None


def test_candidates_without_expert_parallelism_leave_deepep() -> None:
    """A run on the flex dispatcher (DeepEP, Megatron's default backend): candidates with
    EP x ETP 1 are written with the alltoall dispatcher, which Megatron runs there."""
    from slurmpod.megatron.validate import switch_errors
    from slurmpod.perf.options import RunOptions

    args = load_run(preset_path("qwen3-30b-a3b")).megatron.values() | {
        "moe_token_dispatcher_type": "flex"}
    base = ModelConfig.from_args(args)
    cands, _ = search(base, 16, H100, USABLE, opts=RunOptions.from_args(args), top=None)
    assert any(x.config.ep * x.config.etp == 1 for x in cands)
    for x in cands:
        alone = x.config.ep * x.config.etp == 1
        assert x.switches_off == (("moe_token_dispatcher_type=flex",) if alone else ())
        written = {k: v for k, v in (args | x.megatron_keys()).items() if v is not None}
        assert written["moe_token_dispatcher_type"] == ("alltoall" if alone else "flex")
        assert switch_errors(ModelConfig.from_args(written), written) == []


def test_pick_writes_the_chosen_candidate(tmp_path: Path) -> None:
    """`--pick N` writes the N-th candidate shown (the next to try when the model cannot order
    them), and refuses what it cannot pick with one line and no file."""
    out = tmp_path / "second.toml"
    r = slurmpod("plan", "--preset", "llama3-70b", "--nodes", "16", "--search", "--top", "3",
                 "--json", "--pick", "2", "--write-spec", str(out))
    assert r.returncode == 0, r.stderr
    second = json.loads(r.stdout)["candidates"][1]
    again = json.loads(slurmpod("plan", str(out), "--json").stdout)
    assert again["layout"] == second["layout"]
    assert again["micro_batch_size"] == second["micro_batch_size"]
    for args, code in ((["--pick", "4", "--top", "3"], 2), (["--pick", "1"], 2)):
        bad = tmp_path / "bad.toml"
        extra = ["--search", "--write-spec", str(bad)] if args[1] == "4" else []
        r = slurmpod("plan", "--preset", "llama3-70b", "--nodes", "16", *args, *extra)
        assert r.returncode == code and "--pick" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and not bad.exists()
    # 21 layouts of Llama 3 70B fit on 3 nodes: a 30th cannot be picked.
    bad = tmp_path / "bad.toml"
    r = slurmpod("plan", "--preset", "llama3-70b", "--nodes", "3", "--search", "--top", "50",
                 "--pick", "30", "--write-spec", str(bad))
    assert r.returncode == 3 and "--pick 30: only 21 layouts" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not bad.exists()


def test_full_recompute_candidates_run_without_per_layer_cuda_graphs() -> None:
    """A recipe with Transformer Engine's per-layer CUDA graphs of the attention: its
    full-recompute candidates are predicted and written without graphs, which Megatron
    requires (full recompute only with the whole iteration captured)."""
    from slurmpod.megatron.validate import switch_errors
    from slurmpod.perf.model import predict
    from slurmpod.perf.options import RunOptions

    args = load_run(ROOT / "tests" / "data" / "recipes" / "llama3-70b-h100-fp8cs-64gpu.toml"
                    ).megatron.values() | {"cuda_graph_impl": "transformer_engine",
                                           "cuda_graph_scope": ["attn"]}
    base = ModelConfig.from_args(args)
    opts = RunOptions.from_args(args)
    assert opts.graphed_attention and opts.per_layer_graphs
    cands, _ = search(base, 32, H100, USABLE, opts=opts, top=None)
    full = [x for x in cands if x.config.recompute_granularity == "full"]
    assert full and len(full) < len(cands)
    for x in cands:
        assert ("cuda_graph_impl" in x.switches_off) == (x in full)
        written = {k: v for k, v in (args | x.megatron_keys()).items() if v is not None}
        assert switch_errors(ModelConfig.from_args(written), written) == []
    x = full[0]
    bare = dataclasses.replace(opts, graphed_attention=False, per_layer_graphs=False,
                               tp_comm_overlap=opts.tp_comm_overlap and x.config.tp > 1)
    want = predict(x.config, 32, H100, opts=bare)
    assert want is not None and x.prediction.step_time_s == want.step_time_s


def test_distinct_keeps_the_fastest_of_each_parallel_layout() -> None:
    """`fastest_per_layout` folds a layout's VPP sizes, micro-batches and recompute into its
    fastest candidate, keeping the search's order."""
    from slurmpod.perf.search import Candidate, fastest_per_layout

    c = ModelConfig.from_args(load_run(preset_path("llama3-70b")).megatron)
    every, _ = search(c, 128, H100, USABLE, top=None)

    def key(x: Candidate) -> tuple[int, ...]:
        k = x.config
        return (k.tp, k.cp, k.pp, k.ep, k.etp)

    folded = fastest_per_layout(every)
    assert len({key(x) for x in every}) == len(folded) < len(every)
    assert len({key(x) for x in folded}) == len(folded)
    assert folded[0] is every[0]
    for x in folded:  # each is the fastest of its layout
        assert x.prediction.step_time_s == min(y.prediction.step_time_s for y in every
                                               if key(y) == key(x))
    assert [x.prediction.step_time_s for x in folded] == \
        sorted(x.prediction.step_time_s for x in folded)
    assert fastest_per_layout(every, 3) == folded[:3]


def test_distinct_search_on_the_command_line(tmp_path: Path) -> None:
    out = tmp_path / "second.toml"
    r = slurmpod("plan", "--preset", "llama3-70b", "--nodes", "16", "--search", "--distinct",
                 "--top", "5", "--json", "--pick", "2", "--write-spec", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["search"]["distinct"] is True
    cands = data["candidates"]
    keys = {tuple(c["layout"][k] for k in ("tensor_model_parallel_size", "context_parallel_size",
                                           "pipeline_model_parallel_size",
                                           "expert_model_parallel_size",
                                           "expert_tensor_parallel_size")) for c in cands}
    assert len(cands) == 5 == len(keys)
    again = json.loads(slurmpod("plan", str(out), "--json").stdout)
    assert again["layout"] == cands[1]["layout"]
    text = slurmpod("plan", "--preset", "llama3-70b", "--nodes", "16", "--search", "--distinct",
                    "--top", "3").stdout
    assert "the fastest of each TP/CP/PP/EP/ETP layout" in text
    bad = slurmpod("plan", "--preset", "llama3-70b", "--distinct")
    assert bad.returncode == 2 and "--distinct needs --search" in bad.stderr
    assert "Traceback" not in bad.stderr
    # A pick beyond the folded list: one line, exit 3, no file (9 layouts of Llama 3 70B fit
    # on 3 nodes).
    none = tmp_path / "none.toml"
    r = slurmpod("plan", "--preset", "llama3-70b", "--nodes", "3", "--search", "--distinct",
                 "--top", "50", "--pick", "40", "--write-spec", str(none))
    assert r.returncode == 3 and "--pick 40: only 9 layouts" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not none.exists()


def test_candidates_that_fit_by_less_than_the_estimates_shortfall_are_marked() -> None:
    """A candidate within ESTIMATE_LOW_BY of the usable HBM may run out of memory, as `plan`
    warns: the search keeps it (published recipes run that close) and marks it, in JSON and
    in the table, with what the mark means."""
    from slurmpod.megatron.memory import ESTIMATE_LOW_BY

    base = ModelConfig.from_args(load_run(preset_path("qwen3-30b-a3b")).megatron)
    cands, _ = search(base, 16, H100, USABLE, top=None)
    tight = [x for x in cands if x.tight]
    assert tight and len(tight) < len(cands)
    for x in cands:
        assert x.tight == (x.fits and x.memory_bytes * (1 + ESTIMATE_LOW_BY) > USABLE)
        assert x.to_json()["tight_memory"] is x.tight
    r = slurmpod("plan", "--preset", "qwen3-30b-a3b", "--nodes", "2", "--search", "--top", "8")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(line.rstrip().split("GiB")[1].lstrip().startswith("!") for line in lines
               if "GiB" in line and line.strip()[:1].isdigit())
    assert any("! fits by less than 6%" in line for line in lines)
    r = slurmpod("plan", "--preset", "qwen3-30b-a3b", "--nodes", "2", "--search", "--json")
    marks = [c["tight_memory"] for c in json.loads(r.stdout)["candidates"]]
    assert True in marks and all(isinstance(m, bool) for m in marks)


def test_headroom_ranks_only_candidates_that_fit_with_room() -> None:
    """`room=True` (`plan --search --headroom`): every candidate fits by at least the estimate's
    shortfall; a layout whose least recompute fits only tightly comes with the next rung that
    leaves room, and nothing that fits with room is lost; the pruned top N is still the head
    of the whole ranking."""
    from slurmpod.megatron.memory import ESTIMATE_LOW_BY

    base = ModelConfig.from_args(load_run(preset_path("qwen3-30b-a3b")).megatron)
    every, _ = search(base, 16, H100, USABLE, top=None)
    roomy, _ = search(base, 16, H100, USABLE, top=None, room=True)
    assert roomy and all(x.fits and not x.tight for x in roomy)
    assert all(x.memory_bytes * (1 + ESTIMATE_LOW_BY) <= USABLE for x in roomy)

    def key(x: Any) -> tuple[Any, ...]:
        k = x.config
        return (k.tp, k.cp, k.pp, k.vpp, k.ep, k.etp, k.micro_batch_size)

    by_key = {key(x): x for x in every}
    moved = 0
    for x in roomy:
        first = by_key.get(key(x))
        if first is not None and first.tight:
            # The same layout and micro-batch, with more recompute than its tight fit.
            moved += 1
            assert x.memory_bytes < first.memory_bytes
            assert x.prediction.step_time_s >= first.prediction.step_time_s
        elif first is not None:
            assert x.config == first.config
    assert moved > 0
    assert {key(x) for x in every if not x.tight} <= {key(x) for x in roomy}
    assert roomy[0].prediction.step_time_s >= every[0].prediction.step_time_s
    top, _ = search(base, 16, H100, USABLE, top=5, room=True)
    assert [x.config for x in top] == [x.config for x in roomy[:5]]


def test_headroom_on_the_command_line(tmp_path: Path) -> None:
    r = slurmpod("plan", "--preset", "qwen3-30b-a3b", "--nodes", "2", "--search", "--top", "8",
                 "--headroom", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["search"]["headroom"] is True
    assert data["candidates"] and not any(c["tight_memory"] for c in data["candidates"])
    text = slurmpod("plan", "--preset", "qwen3-30b-a3b", "--nodes", "2", "--search",
                    "--headroom").stdout
    assert "only those that fit by at least 6%" in text and "! fits by less" not in text
    bad = slurmpod("plan", "--preset", "qwen3-30b-a3b", "--headroom")
    assert bad.returncode == 2 and "--headroom needs --search" in bad.stderr
    assert "Traceback" not in bad.stderr
    # A site whose GPUs fit Llama 3 8B on one node only tightly: the plain search ranks those,
    # --headroom says so in one line, exit 3, and writes no file.
    site = tmp_path / "small-hbm.toml"
    site.write_text((ROOT / "site_configs" / "dgx-h100-superpod.toml").read_text()
                    .replace("hbm_gib = 80", "hbm_gib = 21.5"))
    plain = slurmpod("plan", "--preset", "llama3-8b", "--site", str(site), "--nodes", "1",
                     "--search", "--json")
    assert plain.returncode == 0, plain.stderr
    assert all(c["tight_memory"] for c in json.loads(plain.stdout)["candidates"])
    out = tmp_path / "chosen.toml"
    r = slurmpod("plan", "--preset", "llama3-8b", "--site", str(site), "--nodes", "1",
                 "--search", "--headroom", "--write-spec", str(out))
    assert r.returncode == 3 and "fits with room" in r.stderr and "drop --headroom" in r.stderr
    assert "Traceback" not in r.stderr and not out.exists()


def test_layouts_with_more_experts_per_gpu_than_any_published_run_are_marked(
        tmp_path: Path) -> None:
    """More routed experts per GPU than any published run the model is checked on
    (CHECKED_EXPERTS_PER_GPU): the search marks the candidate (`~` after EP, JSON
    `unchecked_experts_per_gpu`, a line saying what it means) and `plan` says so of the run's
    own layout; within the range nothing is said."""
    from slurmpod.perf.moe import CHECKED_EXPERTS_PER_GPU

    base = ModelConfig.from_args(load_run(preset_path("qwen3-30b-a3b")).megatron)
    cands, _ = search(base, 16, H100, USABLE, top=None)
    beyond = [x for x in cands if x.unchecked_experts]
    assert beyond and len(beyond) < len(cands)
    for x in cands:
        local = 128 // x.config.ep
        assert x.unchecked_experts == (local if local > CHECKED_EXPERTS_PER_GPU else None)
        assert x.to_json()["unchecked_experts_per_gpu"] == x.unchecked_experts
    r = slurmpod("plan", "--preset", "qwen3-30b-a3b", "--nodes", "1", "--search", "--top", "3")
    rows = [line.split() for line in r.stdout.splitlines() if line.strip()[:1].isdigit()
            and "GiB" in line]
    assert rows and all(row[6] == "~" for row in rows), r.stdout  # EP 2: 64 experts per GPU
    assert "~ 64 experts per GPU, more than any published run the model is checked on (32)" \
        in r.stdout
    dense = slurmpod("plan", "--preset", "llama3-70b", "--nodes", "16", "--search", "--top", "3")
    assert "experts per GPU" not in dense.stdout and " ~ " not in dense.stdout
    # The run's own layout: EP 2 (64 experts per GPU) is named, EP 8 (16) is not.
    spec = tmp_path / "ep2.toml"
    spec.write_text(load_run_text("qwen3-30b-a3b").replace(
        "expert_model_parallel_size = 8", "expert_model_parallel_size = 2"))
    text = slurmpod("plan", str(spec), "--nodes", "2").stdout
    assert "unchecked  64 experts per GPU, more than any published run" in text, text
    data = json.loads(slurmpod("plan", str(spec), "--nodes", "2", "--json").stdout)
    assert data["prediction"]["unchecked_experts_per_gpu"] == 64
    own = json.loads(slurmpod("plan", "--preset", "qwen3-30b-a3b", "--json").stdout)
    assert own["prediction"]["unchecked_experts_per_gpu"] is None
    assert "unchecked" not in slurmpod("plan", "--preset", "qwen3-30b-a3b").stdout


def load_run_text(name: str) -> str:
    return preset_path(name).read_text()


def test_checked_ranks_only_layouts_within_the_published_experts_per_gpu(
        tmp_path: Path) -> None:
    """`checked=True` (`plan --search --checked`) is the whole ranking less the candidates
    beyond CHECKED_EXPERTS_PER_GPU, in the same order; its pruned top N is its head. A dense
    model is unaffected; nothing within the range fitting is one error line."""
    base = ModelConfig.from_args(load_run(preset_path("qwen3-30b-a3b")).megatron)
    every, _ = search(base, 16, H100, USABLE, top=None)
    checked, _ = search(base, 16, H100, USABLE, top=None, checked=True)
    assert checked and not any(x.unchecked_experts for x in checked)
    assert [x.config for x in checked] == [x.config for x in every if not x.unchecked_experts]
    assert len(checked) < len(every)
    top, _ = search(base, 16, H100, USABLE, top=5, checked=True)
    assert [x.config for x in top] == [x.config for x in checked[:5]]
    dense = ModelConfig.from_args(load_run(preset_path("llama3-8b")).megatron)
    assert ([x.config for x in search(dense, 16, H100, USABLE, top=None, checked=True)[0]]
            == [x.config for x in search(dense, 16, H100, USABLE, top=None)[0]])

    r = slurmpod("plan", "--preset", "qwen3-30b-a3b", "--nodes", "1", "--search", "--top", "5",
                 "--checked", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["search"]["checked"] is True and data["candidates"]
    assert all(c["unchecked_experts_per_gpu"] is None for c in data["candidates"])
    text = slurmpod("plan", "--preset", "qwen3-30b-a3b", "--nodes", "1", "--search",
                    "--checked").stdout
    assert "only those with at most 32 experts per GPU" in text and " ~ " not in text
    plain = slurmpod("plan", "--preset", "qwen3-30b-a3b", "--nodes", "1", "--search").stdout
    assert "--checked ranks only the layouts within it" in plain
    bad = slurmpod("plan", "--preset", "qwen3-30b-a3b", "--checked")
    assert bad.returncode == 2 and "--checked needs --search" in bad.stderr
    assert "Traceback" not in bad.stderr
    out = tmp_path / "chosen.toml"
    r = slurmpod("plan", "--preset", "deepseek-v3", "--nodes", "1", "--search", "--checked",
                 "--write-spec", str(out))
    assert r.returncode == 3 and "within the checked experts per GPU fits" in r.stderr
    assert "drop --checked" in r.stderr and "Traceback" not in r.stderr and not out.exists()
