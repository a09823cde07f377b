"""FLOPs per iteration: checked against an independent per-GEMM, per-layer re-derivation, the
Narayanan et al. 2021 closed form, and the 6N + attention rule."""

import math

import pytest

from slurmpod.megatron.flops import FLOPS_FORMULA_VERSION, flops_per_iteration, flops_per_token
from slurmpod.megatron.runspec import load_run, padded_vocab_size, preset_path

REL = 1e-9

GPT_SMALL = dict(num_layers=4, hidden_size=256, num_attention_heads=8, seq_length=512,
                 vocab_size=1000, global_batch_size=16)
LLAMA_LIKE = dict(num_layers=6, hidden_size=512, num_attention_heads=8,
                  group_query_attention=True, num_query_groups=2, ffn_hidden_size=1408,
                  swiglu=True, seq_length=1024, vocab_size=32000, global_batch_size=8,
                  tensor_model_parallel_size=2)
MOE_PATTERN = dict(num_layers=5, hidden_size=384, num_attention_heads=6, seq_length=256,
                   vocab_size=5000, global_batch_size=4, num_experts=16, moe_router_topk=4,
                   moe_ffn_hidden_size=96, moe_shared_expert_intermediate_size=192,
                   moe_layer_freq=[0, 1, 0, 1, 1], ffn_hidden_size=1024, swiglu=True,
                   mtp_num_layers=2)
MOE_FREQ_INT = dict(MOE_PATTERN, moe_layer_freq=2, mtp_num_layers=None, swiglu=False)
MLA = dict(num_layers=3, hidden_size=512, num_attention_heads=4, seq_length=128,
           vocab_size=7000, global_batch_size=2, multi_latent_attention=True, q_lora_rank=96,
           kv_lora_rank=64, qk_head_dim=32, qk_pos_emb_head_dim=16, v_head_dim=48,
           num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=64, moe_layer_freq=[0, 1, 1],
           ffn_hidden_size=700, swiglu=True, mtp_num_layers=1)
MLA_NO_QLORA = dict(MLA, q_lora_rank=None, mtp_num_layers=None)
GATED = dict(LLAMA_LIKE, attention_output_gate=True, kv_channels=80)
LATENT = dict(MOE_PATTERN, moe_latent_size=64, mtp_num_layers=None)


def gemm(m: float, k: float, n: float) -> float:
    """FLOPs of one (m x k) @ (k x n) product, forward only."""
    return 2.0 * m * k * n


def reference_flops(a: dict) -> float:
    """Sum forward GEMMs layer by layer, then x3 for fwd + dgrad + wgrad."""
    h, heads, s, b = a["hidden_size"], a["num_attention_heads"], a["seq_length"], \
        a["global_batch_size"]
    tokens = b * s
    L = a["num_layers"]
    ffn = a.get("ffn_hidden_size") or 4 * h
    glu = a.get("swiglu", False)
    tp = a.get("tensor_model_parallel_size", 1)
    vocab = padded_vocab_size(a["vocab_size"], 128, tp)
    experts = a.get("num_experts")
    freq = a.get("moe_layer_freq", 1)
    if experts is None:
        kinds = ["dense"] * L
    elif isinstance(freq, int):
        kinds = ["moe" if i % freq == 0 else "dense" for i in range(L)]
    else:
        kinds = ["moe" if bit else "dense" for bit in freq]
    mtp = a.get("mtp_num_layers") or 0
    kinds += [kinds[-1]] * mtp  # an MTP module's layer is of the last layer's kind
    total = 0.0
    for kind in kinds:
        # attention
        if a.get("multi_latent_attention"):
            qk, rope, v = a["qk_head_dim"], a["qk_pos_emb_head_dim"], a["v_head_dim"]
            ql, kvl = a.get("q_lora_rank"), a["kv_lora_rank"]
            if ql is None:
                total += gemm(tokens, h, heads * (qk + rope))
            else:
                total += gemm(tokens, h, ql) + gemm(tokens, ql, heads * (qk + rope))
                total += 2.0 * tokens * ql  # q norm, one FMA per element
            total += gemm(tokens, h, kvl) + gemm(tokens, kvl, heads * (qk + v))
            total += 2.0 * tokens * kvl  # kv norm
            total += gemm(tokens, h, rope)  # shared rope key
            # causal: each query sees on average s/2 keys
            total += heads * b * gemm(s, qk + rope, s) / 2
            total += heads * b * gemm(s, s, v) / 2
            total += gemm(tokens, heads * v, h)
        else:
            d = a.get("kv_channels") or h // heads
            groups = a.get("num_query_groups", 1) if a.get("group_query_attention") else heads
            total += gemm(tokens, h, heads * d)  # Q
            total += 2 * gemm(tokens, h, groups * d)  # K, V
            if a.get("attention_output_gate"):
                total += gemm(tokens, h, heads * d)
            total += heads * b * gemm(s, d, s) / 2  # Q K^T, causal half
            total += heads * b * gemm(s, s, d) / 2  # scores x V
            total += gemm(tokens, heads * d, h)  # output projection
        # MLP
        mats_in = 2 if glu else 1
        if kind == "dense":
            total += mats_in * gemm(tokens, h, ffn) + gemm(tokens, ffn, h)
        else:
            f = a["moe_ffn_hidden_size"]
            k = a["moe_router_topk"]
            lat = a.get("moe_latent_size")
            width = lat if lat else h
            total += k * (mats_in * gemm(tokens, width, f) + gemm(tokens, f, width))
            if lat:
                total += gemm(tokens, h, lat) + gemm(tokens, lat, h)
            sh = a.get("moe_shared_expert_intermediate_size") or 0
            total += mats_in * gemm(tokens, h, sh) + gemm(tokens, sh, h)
    for _ in range(mtp):
        total += gemm(tokens, 2 * h, h) + 2.0 * tokens * 3 * h  # eh proj + 3 norms
    total += (1 + mtp) * gemm(tokens, h, vocab)  # logits for the main head and each MTP head
    return 3 * total


@pytest.mark.parametrize("cfg", [GPT_SMALL, LLAMA_LIKE, MOE_PATTERN, MOE_FREQ_INT, MLA,
                                 MLA_NO_QLORA, GATED, LATENT],
                         ids=["gpt", "llama", "moe-pattern-mtp", "moe-freq", "mla", "mla-noq",
                              "gate", "latent"])
def test_matches_per_layer_rederivation(cfg):
    got = flops_per_iteration(cfg)
    want = reference_flops(cfg)
    assert abs(got - want) / want <= REL


@pytest.mark.parametrize("name", ["llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b",
                                  "qwen3-30b-a3b", "deepseek-v3", "gpt3-175b"])
def test_presets_match_rederivation(name):
    run = load_run(preset_path(name))
    args = run.megatron.values()
    got = flops_per_iteration(run.megatron)
    want = reference_flops({k: v for k, v in args.items() if v is not None})
    assert abs(got - want) / want <= REL


def test_gpt3_vs_narayanan_closed_form():
    """Narayanan et al. 2021 (eq. 3): F = 96 B s l h^2 (1 + s/6h + V/16lh), which counts 4 GEMM
    passes (activation recompute) on the transformer layers, no causal halving, and 3 passes on
    the logits. Megatron's model FLOPs = 3/4 (F - 6BshV) - 6 B s^2 l h + 6 B s h V."""
    run = load_run(preset_path("gpt3-175b"))
    c = run.megatron
    B, s, nl, h = c.global_batch_size, c.seq_length, c.num_layers, c.hidden_size
    V = padded_vocab_size(c.vocab_size, 128, c.tensor_model_parallel_size)
    narayanan = 96 * B * s * nl * h**2 * (1 + s / (6 * h) + V / (16 * nl * h))
    expected = 0.75 * (narayanan - 6 * B * s * h * V) - 6 * B * s**2 * nl * h + 6 * B * s * h * V
    got = flops_per_iteration(c)
    assert abs(got - expected) / expected <= REL
    # and the published ballpark: about 3.3e18 FLOPs per 1536 x 2048-token batch
    assert 3.2e18 < got < 3.5e18


def test_dense_equals_6n_plus_causal_attention():
    """Kaplan/PaLM: 6 x (matmul params) + 6 x L x s x (heads x head dim) per token, the
    attention term halved for the causal mask."""
    run = load_run(preset_path("llama3-8b"))
    c = run.megatron
    h, L, s = c.hidden_size, c.num_layers, c.seq_length
    q = c.num_attention_heads * c.kv_channels
    kv = c.num_query_groups * c.kv_channels
    V = padded_vocab_size(c.vocab_size, 128, c.tensor_model_parallel_size)
    matmul_params = L * (h * q + 2 * h * kv + q * h + 3 * h * c.ffn_hidden_size) + h * V
    want = 6 * matmul_params + 6 * L * s * q
    assert abs(flops_per_token(c) - want) / want <= REL
    assert math.isclose(flops_per_iteration(c, batch_size=3), 3 * s * want, rel_tol=REL)


def test_moe_active_not_total_experts():
    """Only the top-k routed experts count: doubling num_experts changes nothing."""
    base = flops_per_iteration(MOE_PATTERN)
    more = flops_per_iteration(dict(MOE_PATTERN, num_experts=64))
    topk = flops_per_iteration(dict(MOE_PATTERN, moe_router_topk=8))
    assert base == more
    assert topk > base


def test_accepts_arguments_dump_dict():
    from slurmpod.megatron.args import parse_arguments_dump

    lines = ["------------------------ arguments ------------------------"]
    for k, v in GPT_SMALL.items():
        lines.append(f"  {k} {'.' * (48 - len(k))} {v}")
    lines += ["  num_experts " + "." * 37 + " None", "  group_query_attention ... False",
              "  num_query_groups ......... 1",
              "-------------------- end of arguments ---------------------"]
    assert flops_per_iteration(parse_arguments_dump(lines)) == flops_per_iteration(GPT_SMALL)


def test_version_string_and_missing_batch():
    from slurmpod.errors import ConfigError

    assert FLOPS_FORMULA_VERSION.startswith("megatron-core-")
    with pytest.raises(ConfigError, match="global_batch_size"):
        flops_per_iteration({k: v for k, v in GPT_SMALL.items() if k != "global_batch_size"})
