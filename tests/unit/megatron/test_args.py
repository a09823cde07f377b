"""Importing Megatron arguments from command lines, launch scripts and the `arguments` dump."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmpod.errors import ConfigError
from slurmpod.megatron.args import (
    from_launch_script,
    from_megatron_args,
    parse_arguments_dump,
    read_launch_script,
)


def test_flags_to_dest_names():
    got = from_megatron_args(
        "torchrun --nproc_per_node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
        "--swiglu --disable-bias-linear --no-masked-softmax-fusion --lr 3e-4 "
        "--data-path 0.5 /d/a 0.5 /d/b --split=949,50,1 --recompute-activations "
        "--normalization RMSNorm --moe-layer-freq '([0]*2+[1]*3)'"
    )
    assert got == {
        "num_layers": 32, "hidden_size": 4096, "swiglu": True, "add_bias_linear": False,
        "masked_softmax_fusion": False, "lr": 3e-4, "data_path": [0.5, "/d/a", 0.5, "/d/b"],
        "split": "949,50,1", "recompute_granularity": "selective", "normalization": "RMSNorm",
        "moe_layer_freq": [0, 0, 1, 1, 1],
    }


def test_moe_layer_freq_rejects_code():
    with pytest.raises(ConfigError, match="moe_layer_freq"):
        from_megatron_args(["--moe-layer-freq", "__import__('os').system('x')"])


SCRIPT = r"""#!/bin/bash
# Megatron launch, in the style of examples/gpt3/train_gpt3_175b_distributed.sh
set -euo pipefail
TP=4
PP=${PP:-2}
export SEQ=4096
DISTRIBUTED_ARGS=(
    --nproc_per_node 8
    --nnodes $SLURM_NNODES
)
GPT_MODEL_ARGS=(
    --num-layers 24   # comment inside an array
    --hidden-size 2048
    --num-attention-heads 16
    --seq-length $SEQ
)
PAR="--tensor-model-parallel-size $TP --pipeline-model-parallel-size ${PP} --sequence-parallel"
torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${GPT_MODEL_ARGS[@]} \
    $PAR \
    --global-batch-size 64 \
    --vocab-size 50257 --save "$CKPT"
"""


def test_launch_script_substitutes_variables_and_arrays(tmp_path):
    got = from_launch_script(SCRIPT)
    assert got["num_layers"] == 24 and got["hidden_size"] == 2048
    assert got["seq_length"] == 4096
    assert got["tensor_model_parallel_size"] == 4
    assert got["pipeline_model_parallel_size"] == 2  # ${PP:-2} with PP undefined
    assert got["sequence_parallel"] is True
    assert got["global_batch_size"] == 64
    assert got["save"] == "$CKPT"  # undefined in the script: kept literally
    assert "nproc_per_node" not in got  # torchrun's own flags are not Megatron's
    p = tmp_path / "train.sh"
    p.write_text(SCRIPT)
    assert read_launch_script(p) == got


def test_launch_script_without_launch_line():
    with pytest.raises(ConfigError, match="launch line"):
        from_launch_script("echo hello\n")


DUMP = """\
srun: job 42 queued
0: using world size: 16, data-parallel size: 4
0: ------------------------ arguments ------------------------
0:   add_bias_linear ................................. False
0:   data_path ....................................... ['/data/a_text_document']
0:   hidden_size ..................................... 4096
0:   lr .............................................. 0.0003
0:   moe_layer_freq .................................. [0, 1, 1]
0:   num_experts ..................................... None
0:   params_dtype .................................... torch.bfloat16
0:   seq_length ...................................... 8192
0:   swiglu .......................................... True
0: -------------------- end of arguments ---------------------
0:   hidden_size ..................................... 9999
"""


def test_arguments_dump_between_banners():
    got = parse_arguments_dump(DUMP)
    assert got == {"add_bias_linear": False, "data_path": ["/data/a_text_document"],
                   "hidden_size": 4096, "lr": 0.0003, "moe_layer_freq": [0, 1, 1],
                   "num_experts": None, "params_dtype": "torch.bfloat16", "seq_length": 8192,
                   "swiglu": True}


_names = st.from_regex(r"[a-z][a-z0-9_]{0,40}", fullmatch=True)
_values = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.lists(st.integers(0, 1), max_size=8),
    st.from_regex(r"/[a-z0-9_/.-]{0,30}", fullmatch=True),
)


@given(st.dictionaries(_names, _values, min_size=1, max_size=20), st.sampled_from(["", "3: "]))
def test_dump_round_trip(args, prefix):
    """Formatting as Megatron's _print_args does, then parsing, gives the values back."""
    lines = [f"{prefix}------------------------ arguments ------------------------"]
    for name in sorted(args, key=str.lower):
        dots = "." * max(1, 48 - len(name))
        lines.append(f"{prefix}  {name} {dots} {args[name]}")
    lines.append(f"{prefix}-------------------- end of arguments ---------------------")
    got = parse_arguments_dump("\n".join(lines))
    assert got == args


@pytest.mark.parametrize(("printed", "value"), [
    ("None", None), ("True", True), ("False", False), ("32", 32), ("-3", -3),
    ("1e-05", 1e-05), ("0.5", 0.5), ("inf", float("inf")), ("-inf", float("-inf")),
    ("[1, 0, 1]", [1, 0, 1]), ("(2, 3)", [2, 3]), ("{'a': 1}", {"a": 1}),
    ("torch.bfloat16", "torch.bfloat16"), ("[unbalanced", "[unbalanced"),
    ("/path/with spaces", "/path/with spaces")])
def test_dump_values_are_typed(printed, value):
    """str() of each Python value `_print_args` prints, back to the value (tuples as lists)."""
    assert parse_arguments_dump([f"  some_arg .............. {printed}"]) == {"some_arg": value}
    assert math.isnan(parse_arguments_dump(["  x ... nan"])["x"])


def test_dump_lines_without_banners():
    """What the log parser hands over: the lines between the banners, labels stripped."""
    assert parse_arguments_dump(["  num_layers .......... 4", "  x" + "y" * 50 + "  None",
                                 "garbage"]) == {"num_layers": 4, "x" + "y" * 50: None}


def test_an_unexpandable_moe_layer_freq_raises_only_when_strict():
    lines = ["  moe_layer_freq ..... ([0]*99999999)", "  num_layers ..... 4"]
    with pytest.raises(ConfigError, match="moe_layer_freq"):
        parse_arguments_dump(lines)
    assert parse_arguments_dump(lines, strict=False) == {
        "moe_layer_freq": "([0]*99999999)", "num_layers": 4}


def test_long_names_and_padded_vocab_from_the_log():
    log = [
        "0: ------------------------ arguments ------------------------",
        "0:   a_very_long_argument_name_that_megatron_prints_without_dots  7",
        "0:   num_layers ...................................... 2",
        "0:   vocab_size ...................................... None",
        "0: -------------------- end of arguments ---------------------",
        "0: > building GPT2BPETokenizer tokenizer ...",
        "0:  > padded vocab (size: 50257) with 47 dummy tokens (new size: 50304)",
    ]
    got = parse_arguments_dump(log)
    assert got == {"a_very_long_argument_name_that_megatron_prints_without_dots": 7,
                   "num_layers": 2, "vocab_size": 50257, "padded_vocab_size": 50304}
    assert "padded_vocab_size" not in parse_arguments_dump(log[:5])
