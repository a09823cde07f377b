"""`slurmpod plan`: exit codes, JSON keys, every input form, and one-line errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurmpod.config import load_site, resolve_site_path
from slurmpod.megatron.flops import flops_per_iteration
from slurmpod.megatron.plan import make_plan
from slurmpod.megatron.runspec import list_presets, load_run, preset_path, run_from_dict

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "docs" / "examples"

REQUIRED_KEYS = {
    "world_size", "data_parallel_size", "flops_per_iteration", "params_total", "params_active",
    "weight_and_optimizer_bytes_per_gpu", "activation_bytes_per_gpu", "total_bytes_per_gpu",
    "fits", "placement", "errors", "warnings", "tokens_per_iteration", "flops_per_token",
    "min_sus", "min_blocks", "peak_tflops_per_gpu", "flops_formula_version",
}


def slurmpod(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurmpod", *args], cwd=cwd, text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=60)


def test_preset_ok_exit_0_and_json_keys():
    r = slurmpod("plan", "--preset", "llama3-70b", "--nodes", "16", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert set(data) >= REQUIRED_KEYS
    assert data["world_size"] == 128 and data["data_parallel_size"] == 4
    assert data["fits"] is True and data["errors"] == []
    assert data["total_bytes_per_gpu"] == pytest.approx(
        data["weight_and_optimizer_bytes_per_gpu"] + data["activation_bytes_per_gpu"])
    assert data["flops_per_iteration"] == pytest.approx(
        data["flops_per_token"] * data["tokens_per_iteration"])
    assert data["placement"]["rank_order"] == "tp-cp-ep-dp-pp"


def test_invalid_layout_exit_3_with_numbers_and_fix():
    r = slurmpod("plan", "--preset", "llama3-70b", "--nodes", "12")
    assert r.returncode == 3
    assert "flops" in r.stdout and "memory" in r.stdout  # numbers still shown
    assert "error: preset llama3-70b: megatron.global_batch_size" in r.stdout
    # 132, not 129: at PP=4 with VPP the interleaved schedule needs 44 microbatches, not 43.
    assert "use global_batch_size=132 (a multiple of micro_batch_size×DP×PP = 12)" in r.stdout


def test_tp_beyond_nvlink_names_fix():
    r = slurmpod("plan", "--nodes", "2", "--json", "--from-megatron-args",
                 "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 "
                 "--tensor-model-parallel-size 16 --vocab-size 50257 --global-batch-size 64")
    assert r.returncode == 3
    errs = json.loads(r.stdout)["errors"]
    assert any("TP=16 exceeds the 8-GPU NVLink domain of dgx-h100: use TP=8, PP=2" in e
               for e in errs), errs


def test_launch_script_input(tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("TP=2\nARGS=(\n --num-layers 4 --hidden-size 256\n"
                      " --num-attention-heads 4 --seq-length 256 --vocab-size 1024\n)\n"
                      "torchrun pretrain_gpt.py ${ARGS[@]} --tensor-model-parallel-size $TP \\\n"
                      "  --sequence-parallel --global-batch-size 64 --micro-batch-size 2\n")
    r = slurmpod("plan", str(script), "--site", "sandbox", "--nodes", "1", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(r.stdout)
    assert data["layout"]["tensor_model_parallel_size"] == 2
    assert data["data_parallel_size"] == 4


def test_undefined_script_variable_named(tmp_path):
    script = tmp_path / "t.sh"
    script.write_text("python pretrain_gpt.py --num-layers 4 --hidden-size 256 "
                      "--num-attention-heads 4 --seq-length 256 --vocab-size 1024 "
                      "--tensor-model-parallel-size $TP --global-batch-size 8\n")
    r = slurmpod("plan", str(script), "--site", "sandbox")
    assert r.returncode == 3
    assert f"{script}: megatron.tensor_model_parallel_size: $TP is a shell variable" in r.stderr


def test_write_spec_round_trips(tmp_path):
    out = tmp_path / "imported.toml"
    r = slurmpod("plan", "--site", "sandbox", "--nodes", "2", "--write-spec", str(out),
                 "--from-megatron-args",
                 "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 256 "
                 "--vocab-size 1024 --global-batch-size 64 --lr 1e-4 --data-path a b")
    assert r.returncode == 0, r.stdout + r.stderr
    run = load_run(out)
    assert run.job.nodes == 2
    assert run.megatron.passthrough() == {"lr": 1e-4, "data_path": ["a", "b"]}


@pytest.mark.parametrize(("body", "needle"), [
    ("[megatron]\nnum_layers = 4\nhiden_size = 256\n", "megatron.hiden_size: unknown Megatron "
     "argument; did you mean `hidden_size`?"),
    ("[job]\nnode = 2\n[megatron]\nnum_layers = 4\n", "job.node: unknown key; did you mean "
     "`nodes`?"),
    ("[megatron]\nnum_layers = 'four'\n", "megatron.num_layers:"),
    ("[job]\nnodes = 1\n", "megatron: missing [megatron] table"),
    ("[megatron\n", "malformed TOML"),
])
def test_bad_spec_one_line_exit_3(tmp_path, body, needle):
    spec = tmp_path / "run.toml"
    spec.write_text(body)
    r = slurmpod("plan", str(spec))
    assert r.returncode == 3
    assert r.stdout == ""
    first = r.stderr.splitlines()[0]
    assert first.startswith(f"slurmpod: error: {spec}") and needle in first, r.stderr
    assert "Traceback" not in r.stderr


def test_usage_errors():
    assert slurmpod("plan").returncode == 2
    r = slurmpod("plan", "--preset", "lama3-405b")
    assert r.returncode == 3 and "did you mean llama3-405b" in r.stderr


@pytest.mark.parametrize("name", ["llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b",
                                  "qwen3-30b-a3b", "deepseek-v3", "gpt3-175b"])
def test_every_preset_plans_ok_at_its_default_size(name):
    site = load_site(resolve_site_path(None, default="dgx-h100-superpod"))
    run = load_run(preset_path(name))
    plan = make_plan(run, site)
    assert plan.ok, plan.errors
    assert plan.flops_per_iteration == flops_per_iteration(run.megatron)


def test_presets_listed():
    assert set(list_presets()) == {"llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b",
                                   "qwen3-30b-a3b", "deepseek-v3", "gpt3-175b"}


def test_examples_plan_ok():
    dgx = load_site(resolve_site_path(None, default="dgx-h100-superpod"))
    sandbox = load_site(resolve_site_path("sandbox"))
    llama = make_plan(load_run(EXAMPLES / "llama3-8b.toml"), dgx)
    assert llama.ok and llama.nodes == 2
    tiny = make_plan(load_run(EXAMPLES / "sandbox-run.toml"), sandbox)
    assert tiny.ok and tiny.world_size == 16 and tiny.warnings == ()


def test_oversize_job_is_an_error_with_numbers():
    site = load_site(resolve_site_path(None, default="dgx-h100-superpod"))
    plan = make_plan(load_run(preset_path("llama3-8b")), site, nodes=256)
    assert not plan.ok
    assert any("job.nodes: 256 nodes requested but site dgx-h100-superpod has 128" in e
               for e in plan.errors)
    assert plan.placement is not None and plan.placement.min_sus == plan.min_sus == 8


def test_moe_plan_json_is_serialisable():
    site = load_site(resolve_site_path(None, default="dgx-h100-superpod"))
    run = run_from_dict({"job": {"nodes": 8}, "megatron": load_run(
        preset_path("mixtral-8x7b")).megatron.explicit()}, "x.toml")
    data = make_plan(run, site).to_json()
    json.dumps(data)
    assert data["params_active"] < data["params_total"]
    assert data["weight_and_optimizer_bytes_per_gpu"] < \
        data["megatron_weight_and_optimizer_bytes_per_gpu"]


_SITE = None


def _dgx():
    global _SITE
    if _SITE is None:
        _SITE = load_site(resolve_site_path(None, default="dgx-h100-superpod"))
    return _SITE


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=150, deadline=None)
@given(st.fixed_dictionaries({
    "tensor_model_parallel_size": st.sampled_from([1, 2, 4, 8, 16]),
    "pipeline_model_parallel_size": st.sampled_from([1, 2, 3, 4]),
    "context_parallel_size": st.sampled_from([1, 2, 3]),
    "expert_model_parallel_size": st.sampled_from([1, 2, 4, 6]),
    "num_experts": st.sampled_from([None, 4, 8]),
    "global_batch_size": st.sampled_from([None, 30, 64]),
    "sequence_parallel": st.booleans(),
    "recompute_granularity": st.sampled_from([None, "selective", "full"]),
    "seq_length": st.sampled_from([2048, 4098]),
}), st.integers(1, 40))
def test_every_error_carries_a_fix(layout, nodes):
    megatron = {"num_layers": 12, "hidden_size": 1024, "num_attention_heads": 16,
                "vocab_size": 32000} | {k: v for k, v in layout.items() if v is not None}
    plan = make_plan(run_from_dict({"job": {"nodes": nodes}, "megatron": megatron}, "r.toml"),
                     _dgx())
    for e in plan.errors:
        assert ": use " in e, e
    assert plan.ok == (not plan.errors and plan.fits)


def test_partition_checks():
    site = load_site(resolve_site_path(None, default="dgx-h100-superpod"))
    mg = load_run(preset_path("llama3-8b")).megatron.explicit()

    def errors(**job):
        return list(make_plan(run_from_dict({"job": {"nodes": 2, **job}, "megatron": mg},
                                            "r.toml"), site).errors)

    assert errors(partition="batch", time_limit="4-00:00:00") == []
    assert errors(partition="bach") == ["job.partition: no partition 'bach' on site "
                                        "dgx-h100-superpod: use one of batch, debug"]
    assert errors(partition="debug", time_limit="03:00:00") == [
        "job.time_limit: 03:00:00 exceeds partition debug's MaxTime 02:00:00: use "
        'time_limit = "02:00:00" or less']
    big = make_plan(run_from_dict({"job": {"nodes": 40, "partition": "debug",
                                           "time_limit": "01:00:00"},
                                   "megatron": mg | {"global_batch_size": 320}}, "r.toml"), site)
    assert big.errors == ("job.nodes: partition debug has 32 nodes, 40 requested: use at most "
                          "32 nodes or partition batch",)
    # the default time limit only warns
    default = make_plan(run_from_dict({"job": {"nodes": 2, "partition": "debug"},
                                       "megatron": mg}, "r.toml"), site)
    assert default.errors == () and any("default [job] time_limit" in w for w in default.warnings)
