"""Run spec model: Megatron defaults, padded vocabulary, typo detection, TOML round trip."""

import tomllib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmpod.errors import ConfigError
from slurmpod.megatron.runspec import (
    ModelConfig,
    fp8_format,
    grad_reduce_bytes,
    moe_layer_pattern,
    optimizer_state_bytes,
    padded_vocab_size,
    run_from_dict,
    to_toml,
)

MIN = dict(num_layers=8, hidden_size=4096, num_attention_heads=32, seq_length=2048,
           vocab_size=50257)


@pytest.mark.parametrize(("vocab", "div", "tp", "want"), [
    (50257, 128, 1, 50304), (50257, 128, 8, 51200), (128256, 128, 1, 128256),
    (128256, 128, 4, 128512), (32000, 128, 2, 32000), (151936, 128, 8, 152576), (7, 1, 1, 7),
])
def test_padded_vocab(vocab, div, tp, want):
    got = padded_vocab_size(vocab, div, tp)
    assert got == want and got % (div * tp) == 0 and got - vocab < div * tp


def test_megatron_defaults():
    c = ModelConfig.from_args(MIN)
    assert (c.ffn_hidden_size, c.kv_channels, c.num_query_groups) == (4 * 4096, 128, 32)
    assert c.padded_vocab_size == 50304 and c.etp == c.tp == 1
    s = ModelConfig.from_args(MIN | {"swiglu": True, "group_query_attention": True,
                                     "num_query_groups": 8, "tensor_model_parallel_size": 4})
    assert s.ffn_hidden_size == 10880  # int(4h·2/3 / 64)·64
    assert s.num_query_groups == 8 and s.etp == 4 and s.padded_vocab_size == 50688
    # num_query_groups is ignored without group_query_attention, as in Megatron
    assert ModelConfig.from_args(MIN | {"num_query_groups": 8}).num_query_groups == 32


def test_vpp_from_layers_per_virtual_stage_and_recompute_flag():
    c = ModelConfig.from_args(MIN | {"pipeline_model_parallel_size": 2,
                                     "num_layers_per_virtual_pipeline_stage": 2,
                                     "recompute_activations": True})
    assert c.vpp == 2 and c.recompute_granularity == "selective"
    assert ModelConfig.from_args(MIN | {"virtual_pipeline_model_parallel_size": 1}).vpp is None


def test_moe_pattern():
    assert moe_layer_pattern(1, 3) == (1, 1, 1)
    assert moe_layer_pattern(2, 5) == (1, 0, 1, 0, 1)
    assert moe_layer_pattern([0, 1], 2) == (0, 1)
    c = ModelConfig.from_args(MIN | {"num_experts": 4, "moe_layer_freq": 4})
    assert c.num_moe_layers == 2 and c.moe_ffn_hidden_size == 4 * 4096


def test_passthrough_and_typos():
    run = run_from_dict({"megatron": MIN | {"lr": 1e-4, "tokenizer_type": "GPT2BPETokenizer",
                                            "decoder_num_layers": 2}}, "r.toml")
    assert run.megatron.passthrough() == {"lr": 1e-4, "tokenizer_type": "GPT2BPETokenizer",
                                          "decoder_num_layers": 2}
    with pytest.raises(ConfigError, match=r"megatron.num_layer: .*did you mean `num_layers`"):
        run_from_dict({"megatron": {"num_layer": 2} | {k: v for k, v in MIN.items()
                                                       if k != "num_layers"}}, "r.toml")
    with pytest.raises(ConfigError, match=r"megatron.moe_layer_freq: .*0 \(dense\) or 1"):
        run_from_dict({"megatron": MIN | {"moe_layer_freq": [0, 2]}}, "r.toml")
    with pytest.raises(ConfigError, match=r"^r.toml: extra: unknown table"):
        run_from_dict({"megatron": MIN, "extra": {}}, "r.toml")


_scalars = st.one_of(st.booleans(), st.integers(-2**40, 2**40),
                     st.floats(allow_nan=False, allow_infinity=False),
                     st.text(st.characters(exclude_categories=("Cs",)), max_size=20))
_values = st.one_of(_scalars, st.lists(st.integers(0, 1), max_size=5),
                    st.lists(st.text(max_size=5), max_size=3))
_keys = st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True)


@given(st.dictionaries(_keys, _values, max_size=10), st.dictionaries(_keys, _values, max_size=5))
def test_to_toml_round_trip(megatron, job):
    text = to_toml({"job": job, "megatron": megatron})
    assert tomllib.loads(text) == {"job": job, "megatron": megatron}


@pytest.mark.parametrize(("value", "want"), [
    ("hybrid", "hybrid"), ("e4m3", "e4m3"),  # a run spec, or a dump with FP8 on
    ("None", None), (None, None),  # a dump with FP8 off; the key absent
    (False, None), ("False", None), ("", None),  # a run spec's `fp8 = false`, its string form
])
def test_fp8_format_reads_spec_and_dump_alike(value, want):
    args = {} if value is None else {"fp8": value}
    assert fp8_format(args) == want
    # The model config (which memory and the performance model read) and the reports read it
    # through the same function.
    from slurmpod.accounting.figures import is_fp8
    assert is_fp8(args) is (want is not None)
    assert ModelConfig.from_args({**MIN, **args}).fp8 == want


@pytest.mark.parametrize(("args", "want"), [
    ({}, 4), ({"grad_reduce_in_bf16": True}, 2), ({"grad_reduce_in_bf16": "True"}, 2),
    ({"grad_reduce_in_bf16": "False"}, 4), ({"accumulate_allreduce_grads_in_fp32": "False"}, 2),
    ({"accumulate_allreduce_grads_in_fp32": True}, 4),
])
def test_grad_reduce_bytes_one_reading_for_memory_and_speed(args, want):
    assert grad_reduce_bytes(args) == want
    assert ModelConfig.from_args({**MIN, **args}).grad_bytes == want


@pytest.mark.parametrize(("args", "state"), [
    ({}, 12.0),
    ({"exp_avg_dtype": "bf16"}, 12.0),  # without the flag Megatron ignores the dtypes
    ({"use_precision_aware_optimizer": True}, 12.0),  # its defaults are fp32
    ({"use_precision_aware_optimizer": True, "exp_avg_dtype": "bf16",
      "exp_avg_sq_dtype": "bf16"}, 8.0),
    ({"use_precision_aware_optimizer": True, "main_params_dtype": "fp16",
      "exp_avg_dtype": "fp8", "exp_avg_sq_dtype": "fp8"}, 4.0),
    # A log's argument dump prints them as the torch dtypes Megatron maps them to.
    ({"use_precision_aware_optimizer": True, "main_params_dtype": "torch.float32",
      "exp_avg_dtype": "torch.bfloat16", "exp_avg_sq_dtype": "torch.uint8"}, 7.0),
])
def test_optimizer_state_bytes_follow_the_precision_aware_dtypes(args, state):
    assert optimizer_state_bytes(args) == state


def test_an_optimizer_state_dtype_megatron_refuses_names_its_key_not_its_text():
    forged = "bf16\x1b[31m\nFAKE"
    with pytest.raises(ConfigError) as exc:
        optimizer_state_bytes({"use_precision_aware_optimizer": True, "exp_avg_dtype": forged})
    assert exc.value.key == "exp_avg_dtype" and "FAKE" not in str(exc.value)
    with pytest.raises(ConfigError):  # Megatron allows no fp8 main parameters
        optimizer_state_bytes({"use_precision_aware_optimizer": True, "main_params_dtype": "fp8"})


def test_the_interleaved_schedules_microbatch_group_is_typed():
    run = run_from_dict({"megatron": MIN | {"microbatch_group_size_per_vp_stage": 4}}, "r.toml")
    assert ModelConfig.from_args(run.megatron).microbatch_group == 4
    assert ModelConfig.from_args(MIN).microbatch_group is None  # Megatron's default: PP
    for bad in (0, "four", 2.5):
        with pytest.raises(ConfigError,
                           match=r"^r.toml: megatron.microbatch_group_size_per_vp_stage: "):
            run_from_dict({"megatron": MIN | {"microbatch_group_size_per_vp_stage": bad}},
                          "r.toml")


def test_an_empty_recompute_module_list_recomputes_nothing():
    """Megatron replaces only an unset list with `core_attn` (TransformerConfig, core
    0.13-main); `recompute_modules = []` is the explicit no-recompute control."""
    sel = dict(MIN, recompute_granularity="selective")
    assert ModelConfig.from_args(sel).recompute_modules == ("core_attn",)
    assert ModelConfig.from_args(dict(sel, recompute_modules=[])).recompute_modules == ()
    assert ModelConfig.from_args(dict(sel, recompute_modules=["moe_act"])).recompute_modules == (
        "moe_act",)


def test_a_run_spec_takes_the_optimizer_state_dtypes_megatron_takes():
    """The precision-aware optimizer's dtypes are typed with Megatron's choices: a wrong one is
    one line naming the file, the key and the choices."""
    aware = MIN | {"use_precision_aware_optimizer": True, "exp_avg_dtype": "bf16",
                   "exp_avg_sq_dtype": "bf16"}
    run = run_from_dict({"megatron": aware}, "r.toml")
    assert ModelConfig.from_args(run.megatron).optimizer_state_bytes == 8.0
    with pytest.raises(ConfigError, match=r"^r.toml: megatron.exp_avg_dtype: must be one of "
                                          r"'fp32', 'fp16', 'bf16', 'fp8' \(got 'int4'\)"):
        run_from_dict({"megatron": aware | {"exp_avg_dtype": "int4"}}, "r.toml")
    with pytest.raises(ConfigError, match=r"megatron.main_params_dtype: must be one of 'fp32', "
                                          r"'fp16'"):
        run_from_dict({"megatron": aware | {"main_params_dtype": "bf16"}}, "r.toml")
