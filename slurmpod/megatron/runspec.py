"""The run spec (`[job]` + `[megatron]` TOML) and the resolved Megatron model configuration.

`[megatron]` keys are Megatron-LM argument *destination* names as Megatron prints them in its
`arguments` dump, so users paste what they already have. Keys slurmpod understands are typed and
checked; any other key is kept and passed through to the launch command. A key that is not known
but is close to one slurmpod needs (`hiden_size`) is an error with a "did you mean".

`ModelConfig.from_args` applies Megatron's own defaults (megatron/training/arguments.py,
`validate_args`, core 0.14 / main 2025): ffn size, kv channels, query groups, MoE ffn size,
padded vocabulary, VPP from `num_layers_per_virtual_pipeline_stage`.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from slurmpod.errors import ConfigError
from slurmpod.megatron.pipeline import layout_vpp, split
from slurmpod.model.strict import Meta, SlurmTime, Strict, field

# Keys of [megatron] that slurmpod reads; misspellings of these get a "did you mean".
KNOWN_MEGATRON_KEYS: frozenset[str] = frozenset({
    "num_layers", "hidden_size", "num_attention_heads", "group_query_attention",
    "num_query_groups", "kv_channels", "ffn_hidden_size", "swiglu", "seq_length",
    "max_position_embeddings", "vocab_size", "padded_vocab_size", "make_vocab_size_divisible_by",
    "normalization", "untie_embeddings_and_output_weights", "add_bias_linear", "num_experts",
    "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
    "moe_layer_freq", "moe_latent_size", "mtp_num_layers", "multi_latent_attention",
    "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
    "attention_output_gate", "tensor_model_parallel_size", "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size", "num_layers_per_virtual_pipeline_stage",
    "num_virtual_stages_per_pipeline_rank", "context_parallel_size",
    "expert_model_parallel_size", "expert_tensor_parallel_size", "sequence_parallel",
    "use_distributed_optimizer", "recompute_granularity", "recompute_method",
    "recompute_num_layers", "global_batch_size", "micro_batch_size", "bf16", "fp16",
    "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
    "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
    "pipeline_model_parallel_layout", "fp8", "fp8_param_gather", "grad_reduce_in_bf16",
    "hidden_dropout", "recompute_modules", "use_megatron_fsdp",
    "data_parallel_sharding_strategy", "optimizer_cpu_offload", "optimizer_offload_fraction",
    "cpu_offloading_num_layers", "microbatch_group_size_per_vp_stage",
})

# Other real Megatron argument names that must never be mistaken for a typo of a known key.
_NOT_TYPOS: frozenset[str] = frozenset({
    "encoder_num_layers", "decoder_num_layers", "num_experts_per_tok",
    "moe_router_topk_scaling_factor",
    "expert_model_parallel_size", "num_layers_per_virtual_pipeline_stage", "moe_layer_recompute",
    "recompute_activations", "seq_len", "data_parallel_size", "fp8_recipe",
    "attention_dropout", "moe_shared_expert_gate", "cpu_offloading", "fp4",
})


# Bookkeeping fields filled by `run_from_dict`, never read from the TOML.
_GIVEN = "keys_given"
_PASSTHROUGH = "passthrough_args"


MAX_JOB_NAME = 1024


class JobSpec(Strict, frozen=True, kw_only=True):
    """`[job]`: what Slurm needs. Sizes in whole nodes; the site gives GPUs per node."""

    # slurmctld refuses a job name over 1024 characters (job_mgr.c `_test_strlen(name, 1024)`,
    # ESLURM_PATHNAME_TOO_LONG, Slurm 22.05-24.11): refused here, before the queue.
    name: Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$",
                              max_length=MAX_JOB_NAME)] = "megatron"
    nodes: Annotated[int, Meta(ge=1, le=100_000)] = 1
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: SlurmTime = "04:00:00"
    container_image: str | None = None
    container_mounts: list[str] = field(default_factory=list)
    # pyxis options (docs/submit.md "Containers"): workdir defaults to the run dir; name to
    # `<name>-<image hash>` ("" for an unnamed container per step); writable unset keeps the
    # site's enroot default.
    container_workdir: str | None = None
    container_name: Annotated[str, Meta(pattern=r"^([A-Za-z0-9][A-Za-z0-9_.+-]*)?$")] | None = None
    container_mount_home: bool = False
    container_writable: bool | None = None
    work_dir: str | None = None
    checkpoint_dir: str | None = None
    data_dir: str | None = None
    entrypoint: str = "pretrain_gpt.py"  # the Megatron training script
    env: dict[str, str] = field(default_factory=dict)  # extra environment for srun
    requeue: bool = True
    keys_given: frozenset[str] = frozenset()  # the [job] keys the run spec set

    def explicit(self) -> dict[str, Any]:
        """The keys the run spec set, with their values."""
        return {k: getattr(self, k) for k in JOB_KEYS if k in self.keys_given}


JOB_KEYS: tuple[str, ...] = tuple(k for k in JobSpec.__struct_fields__ if k != _GIVEN)


# Upper bounds keep an absurd value (`num_layers = 1e12`) a config error, not a MemoryError or an
# hour of arithmetic: slurmpod builds per-layer patterns and walks divisors of these counts.
# Far above any published model (≤ 200 layers, ≤ 512 experts); sizes stay within int32, which
# Megatron's kernels index with.
MAX_LAYERS = 10_000
Layers = Annotated[int, Meta(ge=1, le=MAX_LAYERS)]
Experts = Annotated[int, Meta(ge=1, le=100_000)]
Dim = Annotated[int, Meta(ge=1, le=2**31 - 1)]
NonNegDim = Annotated[int, Meta(ge=0, le=2**31 - 1)]
# Megatron-FSDP's `--data-parallel-sharding-strategy` choices (Megatron-LM core 0.14+).
ShardingStrategy = Literal["no_shard", "optim", "optim_grads", "optim_grads_params"]
FSDP_SHARDING: tuple[str, ...] = get_args(ShardingStrategy)
# The precision-aware optimizer's state dtypes (`--main-params-dtype`, `--exp-avg-dtype`,
# `--exp-avg-sq-dtype`; training/arguments.py, core 0.11-main).
MainParamsDtype = Literal["fp32", "fp16"]
MomentDtype = Literal["fp32", "fp16", "bf16", "fp8"]


class MegatronArgs(Strict, frozen=True, kw_only=True):
    """`[megatron]`: known keys typed; any other key kept in `passthrough_args` for the command
    line (`run_from_dict` splits them)."""

    num_layers: Layers
    hidden_size: Dim
    num_attention_heads: Dim
    group_query_attention: bool = False
    num_query_groups: Dim | None = None
    kv_channels: Dim | None = None
    ffn_hidden_size: Dim | None = None
    swiglu: bool = False
    seq_length: Dim
    max_position_embeddings: Dim | None = None
    vocab_size: Dim | None = None
    padded_vocab_size: Dim | None = None
    make_vocab_size_divisible_by: Dim = 128
    normalization: Literal["LayerNorm", "RMSNorm"] = "LayerNorm"
    untie_embeddings_and_output_weights: bool = False
    add_bias_linear: bool = True
    num_experts: Experts | None = None
    moe_router_topk: Dim = 2
    moe_ffn_hidden_size: Dim | None = None
    moe_shared_expert_intermediate_size: Dim | None = None
    moe_layer_freq: int | list[int] = 1
    moe_latent_size: Dim | None = None
    mtp_num_layers: Annotated[int, Meta(ge=0, le=MAX_LAYERS)] | None = None
    multi_latent_attention: bool = False
    q_lora_rank: Dim | None = None
    kv_lora_rank: Dim = 32
    qk_head_dim: Dim = 128
    qk_pos_emb_head_dim: NonNegDim = 64
    v_head_dim: Dim = 128
    attention_output_gate: bool = False
    tensor_model_parallel_size: Dim = 1
    pipeline_model_parallel_size: Dim = 1
    virtual_pipeline_model_parallel_size: Dim | None = None
    num_layers_per_virtual_pipeline_stage: Dim | None = None
    num_virtual_stages_per_pipeline_rank: Dim | None = None
    # The interleaved schedule's microbatch group (`--microbatch-group-size-per-virtual-
    # pipeline-stage`, ModelParallelConfig); None: PP, Megatron's default.
    microbatch_group_size_per_vp_stage: Dim | None = None
    context_parallel_size: Dim = 1
    expert_model_parallel_size: Dim = 1
    expert_tensor_parallel_size: Dim | None = None
    sequence_parallel: bool = False
    use_distributed_optimizer: bool = False
    recompute_granularity: Literal["full", "selective"] | None = None
    recompute_method: Literal["uniform", "block"] | None = None
    recompute_num_layers: Dim | None = None
    decoder_first_pipeline_num_layers: NonNegDim | None = None
    decoder_last_pipeline_num_layers: NonNegDim | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    pipeline_model_parallel_layout: Annotated[str, Meta(max_length=10_000)] | None = None
    # Megatron's `--fp8-format` (dest `fp8`, printed so in the arguments dump); None is BF16.
    fp8: Literal["e4m3", "hybrid"] | None = None
    fp8_param_gather: bool = False
    grad_reduce_in_bf16: bool = False
    hidden_dropout: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    recompute_modules: list[str] | None = None
    use_megatron_fsdp: bool = False
    data_parallel_sharding_strategy: ShardingStrategy | None = None
    optimizer_cpu_offload: bool = False
    use_precision_aware_optimizer: bool = False
    main_params_dtype: MainParamsDtype | None = None
    exp_avg_dtype: MomentDtype | None = None
    exp_avg_sq_dtype: MomentDtype | None = None
    optimizer_offload_fraction: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    cpu_offloading_num_layers: Annotated[int, Meta(ge=0, le=MAX_LAYERS)] | None = None
    global_batch_size: Dim | None = None
    micro_batch_size: Dim = 1
    bf16: bool = True
    fp16: bool = False
    passthrough_args: dict[str, Any] = field(default_factory=dict)
    keys_given: frozenset[str] = frozenset()  # the [megatron] keys the run spec set

    def __post_init__(self) -> None:
        # Megatron asserts it in validate_args (core 0.12-0.14), i.e. only once the job runs.
        mpe = self.max_position_embeddings
        if mpe is not None and mpe < self.seq_length:
            raise ValueError(f"max_position_embeddings: {mpe} is below seq_length = "
                             f"{self.seq_length}; raise it to at least {self.seq_length}")
        v = self.moe_layer_freq
        if isinstance(v, list) and any(b not in (0, 1) for b in v):
            raise ValueError("moe_layer_freq: a list holds 0 (dense) or 1 (MoE) per layer")
        if isinstance(v, int) and v < 1:
            raise ValueError("moe_layer_freq: must be >= 1 (every n-th layer is MoE)")

    def passthrough(self) -> dict[str, Any]:
        """Megatron arguments slurmpod does not interpret, for the launch command line."""
        return dict(self.passthrough_args)

    def explicit(self) -> dict[str, Any]:
        """Every key the user set (known and unknown), as given."""
        return self.values(only_set=True)

    def values(self, only_set: bool = False) -> dict[str, Any]:
        """Known keys in field order (all, or only those the user set), then unknown ones; lists
        are copies."""
        out = {k: (list(v) if isinstance(v := getattr(self, k), list) else v)
               for k in MEGATRON_FIELDS if not only_set or k in self.keys_given}
        return out | self.passthrough()


MEGATRON_FIELDS: tuple[str, ...] = tuple(
    k for k in MegatronArgs.__struct_fields__ if k not in (_GIVEN, _PASSTHROUGH))


class RunSpec(Strict, frozen=True, kw_only=True):
    job: JobSpec = field(default_factory=JobSpec)
    megatron: MegatronArgs


def check_megatron_keys(data: Mapping[str, Any], file: str) -> None:
    """Reject unknown keys that look like misspellings of keys slurmpod needs."""
    for key in data:
        if key == "fp8_format":
            raise ConfigError("Megatron's --fp8-format stores into dest `fp8`, which its "
                              "arguments dump prints: write fp8 = \"hybrid\" (or \"e4m3\")",
                              file=file, key=f"megatron.{key}")
        if key in KNOWN_MEGATRON_KEYS or key in _NOT_TYPOS:
            continue
        close = difflib.get_close_matches(key, sorted(KNOWN_MEGATRON_KEYS), n=1, cutoff=0.85)
        if close and close[0] not in data:
            raise ConfigError(f"unknown Megatron argument; did you mean `{close[0]}`?", file=file,
                              key=f"megatron.{key}",
                              hint="unknown arguments are passed through to Megatron unchanged")


def megatron_from_dict(data: Mapping[str, Any]) -> dict[str, Any]:
    """`[megatron]` as MegatronArgs input: known keys typed, the others passed through."""
    known = {k: v for k, v in data.items() if k in _MEGATRON_FIELD_SET}
    rest = {k: v for k, v in data.items() if k not in _MEGATRON_FIELD_SET}
    return known | {_PASSTHROUGH: rest, _GIVEN: list(data)}


_MEGATRON_FIELD_SET = frozenset(MEGATRON_FIELDS)


def run_from_dict(data: dict[str, Any], file: str) -> RunSpec:
    """Validate a parsed run spec; every problem is one ConfigError naming file and key."""
    from slurmpod.config import validate  # lazy: start-up

    if not isinstance(data.get("megatron"), dict):
        raise ConfigError("missing [megatron] table; add the model and layout there", file=file,
                          key="megatron")
    extra_top = set(data) - {"job", "megatron"}
    if extra_top:
        raise ConfigError("unknown table; a run spec has [job] and [megatron]", file=file,
                          key=sorted(extra_top)[0])
    job = data.get("job", {})
    if isinstance(job, dict):
        for key in job:
            if key not in JOB_KEYS:
                close = difflib.get_close_matches(key, sorted(JOB_KEYS), n=1, cutoff=0.7)
                hint = (f"did you mean `{close[0]}`?" if close
                        else f"known: {', '.join(sorted(JOB_KEYS))}")
                raise ConfigError(f"unknown key; {hint}", file=file, key=f"job.{key}")
        job = job | {_GIVEN: list(job)}
    check_megatron_keys(data["megatron"], file)
    for key, value in data["megatron"].items():
        if key in KNOWN_MEGATRON_KEYS and isinstance(value, str) and value.startswith("$"):
            raise ConfigError(f"{value} is a shell variable the launch script does not define; "
                              "define it in the script or pass the value", file=file,
                              key=f"megatron.{key}")
    return validate(RunSpec, {"job": job, "megatron": megatron_from_dict(data["megatron"])},
                    file)


def load_run(path: Path | str) -> RunSpec:
    from slurmpod.config import read_toml  # lazy: start-up

    path = Path(path)
    return run_from_dict(read_toml(path), str(path))


def padded_vocab_size(vocab_size: int, divisible_by: int = 128, tp: int = 1) -> int:
    """Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by x TP
    (megatron/training/tokenizer `_vocab_size_with_padding`)."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


def moe_layer_pattern(freq: int | list[int] | tuple[int, ...], num_layers: int) -> tuple[int, ...]:
    """1 for each MoE layer. An int n means every n-th layer starting at layer 0 (Megatron's
    `i % n == 0`); a list is the pattern itself."""
    if isinstance(freq, int):
        return tuple(1 if i % freq == 0 else 0 for i in range(num_layers))
    return tuple(int(b) for b in freq)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Megatron arguments with Megatron's defaults applied: what the formulas read."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int  # == heads without GQA, as Megatron sets it
    kv_channels: int
    ffn_hidden_size: int
    swiglu: bool
    seq_length: int
    padded_vocab_size: int
    normalization: str
    untie_embeddings_and_output_weights: bool
    num_experts: int | None
    moe_router_topk: int
    moe_ffn_hidden_size: int
    moe_shared_expert_intermediate_size: int  # 0 when none
    moe_pattern: tuple[int, ...]
    moe_latent_size: int | None
    mtp_num_layers: int  # 0 when none
    multi_latent_attention: bool
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_head_dim: int
    qk_pos_emb_head_dim: int
    v_head_dim: int
    attention_output_gate: bool
    tp: int
    pp: int
    vpp: int | None
    cp: int
    ep: int
    etp: int
    sequence_parallel: bool
    use_distributed_optimizer: bool
    recompute_granularity: str | None
    recompute_method: str | None
    recompute_num_layers: int | None
    global_batch_size: int | None
    micro_batch_size: int
    group_query_attention: bool
    first_stage_layers: int | None = None  # decoder_first_pipeline_num_layers (uneven PP)
    last_stage_layers: int | None = None
    account_for_embedding: bool = False  # account_for_embedding_in_pipeline_split
    account_for_loss: bool = False  # account_for_loss_in_pipeline_split
    pipeline_layout: str | None = None  # pipeline_model_parallel_layout
    vpp_given: int | None = None  # the VPP the arguments stated (checked against a layout)
    microbatch_group: int | None = None  # microbatch_group_size_per_vp_stage; None: PP
    fp8: str | None = None  # Megatron's dest `fp8`: "e4m3" / "hybrid", None for BF16
    fp8_param_gather: bool = False
    grad_bytes: int = 4  # main-gradient bytes: fp32, or 2 with grad_reduce_in_bf16
    hidden_dropout: float = 0.1  # Megatron's default
    recompute_modules: tuple[str, ...] = ("core_attn",)  # Megatron's default for selective
    add_bias_linear: bool = True
    moe_shared_expert_gate: bool = False
    megatron_fsdp: bool = False  # use_megatron_fsdp
    fsdp_sharding: str = "no_shard"  # data_parallel_sharding_strategy
    optimizer_offload_fraction: float = 0.0  # optimizer_cpu_offload x fraction
    cpu_offloading_num_layers: int = 0
    qk_layernorm: bool = False  # RMSNorm/LayerNorm on each head's query and key (Qwen3)
    optimizer_state_bytes: float = 12.0  # per parameter: main params + Adam moments

    def pipeline_split(self) -> Any:
        """Layers per (pipeline rank, virtual stage): slurmpod.megatron.pipeline.Split."""

        return _cached_split(self, split)

    def stage_layers(self) -> tuple[float, float]:
        """(layers on the first stage, layers on the most loaded stage)."""
        sp = self.pipeline_split()
        per = [sp.rank_layers(r) for r in range(self.pp)]
        return float(per[0]), float(max(per))

    @property
    def num_moe_layers(self) -> int:
        return sum(self.moe_pattern)

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @property
    def dp_sharding(self) -> str:
        """What the data-parallel ranks shard, in Megatron-FSDP's words: `no_shard` (DDP),
        `optim` (the distributed optimizer, ZeRO-1), `optim_grads` (ZeRO-2) or
        `optim_grads_params` (ZeRO-3); Megatron-FSDP's `data_parallel_sharding_strategy`."""
        if self.megatron_fsdp:
            return self.fsdp_sharding
        return "optim" if self.use_distributed_optimizer else "no_shard"

    @classmethod
    def from_args(cls, args: Mapping[str, Any] | MegatronArgs | ModelConfig) -> ModelConfig:
        """From a run spec's Megatron arguments or a log's dump, with Megatron's defaults and
        derived values (validate_args): the shape, vocabulary padding, the virtual pipeline."""
        if isinstance(args, ModelConfig):
            return args
        a: Mapping[str, Any] = args.values() if isinstance(args, MegatronArgs) else args

        def get(key: str, default: Any = None) -> Any:
            return _get(a, key, default)

        h, heads, layers, seq = _required_shape(a)
        swiglu = bool(get("swiglu", False))
        ffn = _ffn_hidden_size(a, h, swiglu)
        gqa = bool(get("group_query_attention", False))
        groups = int(get("num_query_groups", 1)) if gqa else heads
        tp = int(get("tensor_model_parallel_size", 1))
        pp = int(get("pipeline_model_parallel_size", 1))
        num_experts = a.get("num_experts")
        pattern = (moe_layer_pattern(get("moe_layer_freq", 1), layers)
                   if num_experts is not None else (0,) * layers)
        vp = _virtual_pipeline(a, layers, pp)
        fsdp = megatron_flag(get("use_megatron_fsdp", False))
        sharding = str(get("data_parallel_sharding_strategy",
                           "optim_grads_params" if fsdp else "no_shard"))
        if sharding not in FSDP_SHARDING:  # a dump's value is the job's: never echoed
            raise ConfigError("data_parallel_sharding_strategy is not one of Megatron-FSDP's "
                              f"strategies ({', '.join(FSDP_SHARDING)})",
                              key="data_parallel_sharding_strategy")
        return cls(
            num_layers=layers, hidden_size=h, num_attention_heads=heads, num_query_groups=groups,
            kv_channels=int(get("kv_channels", h // heads)), ffn_hidden_size=ffn,
            swiglu=swiglu, seq_length=seq, padded_vocab_size=_padded_vocab_size(a, tp),
            normalization=str(get("normalization", "LayerNorm")),
            untie_embeddings_and_output_weights=bool(
                get("untie_embeddings_and_output_weights", False)),
            num_experts=None if num_experts is None else int(num_experts),
            moe_router_topk=int(get("moe_router_topk", 2)),
            moe_ffn_hidden_size=int(get("moe_ffn_hidden_size", ffn)),
            moe_shared_expert_intermediate_size=int(get("moe_shared_expert_intermediate_size", 0)),
            moe_pattern=pattern, moe_latent_size=a.get("moe_latent_size"),
            mtp_num_layers=int(get("mtp_num_layers", 0)),
            multi_latent_attention=bool(get("multi_latent_attention", False)),
            q_lora_rank=a.get("q_lora_rank"), kv_lora_rank=int(get("kv_lora_rank", 32)),
            qk_head_dim=int(get("qk_head_dim", 128)),
            qk_pos_emb_head_dim=int(get("qk_pos_emb_head_dim", 64)),
            v_head_dim=int(get("v_head_dim", 128)),
            attention_output_gate=bool(get("attention_output_gate", False)),
            tp=tp, pp=pp, vpp=vp.vpp,
            cp=int(get("context_parallel_size", 1)), ep=int(get("expert_model_parallel_size", 1)),
            etp=int(get("expert_tensor_parallel_size", tp)),
            sequence_parallel=bool(get("sequence_parallel", False)),
            use_distributed_optimizer=bool(get("use_distributed_optimizer", False)),
            recompute_granularity=_recompute_granularity(a),
            recompute_method=a.get("recompute_method"),
            recompute_num_layers=a.get("recompute_num_layers"),
            global_batch_size=a.get("global_batch_size"),
            micro_batch_size=int(get("micro_batch_size", 1)), group_query_attention=gqa,
            first_stage_layers=optional_int(a.get("decoder_first_pipeline_num_layers")),
            last_stage_layers=optional_int(a.get("decoder_last_pipeline_num_layers")),
            account_for_embedding=vp.account_for_embedding,
            account_for_loss=vp.account_for_loss, pipeline_layout=vp.layout,
            vpp_given=vp.vpp_given,
            microbatch_group=optional_int(a.get("microbatch_group_size_per_vp_stage")),
            fp8=fp8_format(a),
            fp8_param_gather=megatron_flag(get("fp8_param_gather", False)),
            grad_bytes=grad_reduce_bytes(a),
            hidden_dropout=float(get("hidden_dropout", 0.1)),
            recompute_modules=_recompute_modules(a),
            add_bias_linear=megatron_flag(get("add_bias_linear", True)),
            moe_shared_expert_gate=megatron_flag(get("moe_shared_expert_gate", False)),
            megatron_fsdp=fsdp,
            fsdp_sharding=sharding,
            optimizer_offload_fraction=(
                float(get("optimizer_offload_fraction", 1.0))
                if megatron_flag(get("optimizer_cpu_offload", False)) else 0.0),
            cpu_offloading_num_layers=int(get("cpu_offloading_num_layers", 0)),
            qk_layernorm=megatron_flag(get("qk_layernorm", False)),
            optimizer_state_bytes=optimizer_state_bytes(a),
        )


def _get(a: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """An argument, with `default` also for a stated None (a dump prints unset ones as None)."""
    v = a.get(key, default)
    return default if v is None else v


def _required_shape(a: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """(hidden size, attention heads, layers, sequence length): no FLOPs without them."""
    try:
        h = int(a["hidden_size"])
        heads = int(a["num_attention_heads"])
        layers = int(a["num_layers"])
        seq = int(a["seq_length"])
    except KeyError as exc:
        raise ConfigError(f"Megatron argument {exc.args[0]} is required",
                          key=str(exc.args[0])) from None
    if not 1 <= layers <= MAX_LAYERS:  # a log's dump is not validated by MegatronArgs
        raise ConfigError(f"num_layers={layers} is outside 1..{MAX_LAYERS}", key="num_layers")
    return h, heads, layers, seq


def _ffn_hidden_size(a: Mapping[str, Any], h: int, swiglu: bool) -> int:
    """Megatron's default: 4h, or for SwiGLU ⅔·4h rounded down to a multiple of 64."""
    ffn = a.get("ffn_hidden_size")
    if ffn is None:
        ffn = int((4 * h * 2 / 3) / 64) * 64 if swiglu else 4 * h
    return int(ffn)


def _padded_vocab_size(a: Mapping[str, Any], tp: int) -> int:
    """The dump's padded_vocab_size, else vocab_size padded as Megatron pads it."""
    padded = a.get("padded_vocab_size")
    if padded is None:
        vocab = a.get("vocab_size")
        if vocab is None:
            raise ConfigError("Megatron argument vocab_size (or padded_vocab_size) is required "
                              "to count embedding parameters and logit FLOPs",
                              key="vocab_size")
        padded = padded_vocab_size(int(vocab), int(_get(a, "make_vocab_size_divisible_by", 128)),
                                   tp)
    return int(padded)


@dataclass(frozen=True)
class _VirtualPipeline:
    vpp: int | None  # None: the non-interleaved schedule
    vpp_given: int | None  # what the arguments stated (checked against a layout)
    layout: str | None
    account_for_embedding: bool
    account_for_loss: bool


def _virtual_pipeline(a: Mapping[str, Any], layers: int, pp: int) -> _VirtualPipeline:
    """The virtual pipeline size from whichever of Megatron's ways the arguments state it:
    the size itself, stages per rank, layers per virtual stage, or a layout (which decides)."""
    vpp = a.get("virtual_pipeline_model_parallel_size")
    per_stage = a.get("num_layers_per_virtual_pipeline_stage")
    acct_e = megatron_flag(_get(a, "account_for_embedding_in_pipeline_split", False))
    acct_l = megatron_flag(_get(a, "account_for_loss_in_pipeline_split", False))
    layout = a.get("pipeline_model_parallel_layout")
    layout = None if layout in (None, "None", "") else str(layout)
    if vpp is None and a.get("num_virtual_stages_per_pipeline_rank") is not None:
        vpp = int(a["num_virtual_stages_per_pipeline_rank"])
    elif vpp is None and per_stage:
        # Megatron counts the embedding/loss slots here too (arguments.py, core_v0.13+).
        slots = layers + int(acct_e) + int(acct_l)
        vpp = (slots // pp) // int(per_stage) if slots % pp == 0 else None
    vpp_given = None if vpp is None else int(vpp)
    if layout is not None:

        vpp = layout_vpp(layout, pp)  # the layout decides (transformer_config.py)
    if vpp == 1:
        vpp = None  # Megatron: a VPP of 1 is the non-interleaved schedule
    return _VirtualPipeline(None if vpp is None else int(vpp), vpp_given, layout, acct_e, acct_l)


def fp8_format(a: Mapping[str, Any]) -> str | None:
    """Megatron's `--fp8-format` (dest `fp8`: "hybrid", "e4m3"), None when FP8 is off, as a run
    spec (a string or false) or a log's dump ("None") gives it."""
    fp8 = a.get("fp8")
    if fp8 is None or fp8 is False or str(fp8).strip().lower() in ("", "none", "false", "0"):
        return None
    return str(fp8)


def grad_reduce_bytes(a: Mapping[str, Any]) -> int:
    """Bytes per element of the main gradients the data-parallel reduce moves: 2 with
    `--grad-reduce-in-bf16` (or the older `accumulate_allreduce_grads_in_fp32 = False`),
    else Megatron's fp32 main gradients."""
    bf16 = (megatron_flag(a.get("grad_reduce_in_bf16", False))
            or a.get("accumulate_allreduce_grads_in_fp32") in (False, "False"))
    return 2 if bf16 else 4


# Bytes per element of the precision-aware optimizer's state dtypes (MainParamsDtype,
# MomentDtype), as a command line spells them and as a log's argument dump prints them after
# Megatron maps them to torch dtypes (fp8: torch.uint8).
_STATE_DTYPES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
_TORCH_DTYPES = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16",
                 "torch.uint8": "fp8"}
OPTIMIZER_STATE_CHOICES: dict[str, tuple[str, ...]] = {
    "main_params_dtype": get_args(MainParamsDtype), "exp_avg_dtype": get_args(MomentDtype),
    "exp_avg_sq_dtype": get_args(MomentDtype)}
FP32_ADAM_STATE_BYTES = 12.0  # fp32 main parameters, Adam's m and v


def state_dtype_name(value: Any) -> str:
    """An optimizer-state dtype as Megatron's command line names it (`bf16`), from either
    spelling; None (not set) is Megatron's default, fp32."""
    name = str(value if value is not None else "fp32").strip().lower()
    return _TORCH_DTYPES.get(name, name)


def bad_optimizer_state_dtype(a: Mapping[str, Any]) -> str | None:
    """The first optimizer-state dtype key whose value Megatron's choices do not hold, with
    `--use-precision-aware-optimizer` (without it Megatron ignores them); else None."""
    if not megatron_flag(a.get("use_precision_aware_optimizer", False)):
        return None
    return next((key for key, choices in OPTIMIZER_STATE_CHOICES.items()
                 if state_dtype_name(a.get(key)) not in choices), None)


def optimizer_state_bytes(a: Mapping[str, Any]) -> float:
    """Bytes per parameter of the optimizer's state: fp32 main parameters and Adam's two
    moments, or with `--use-precision-aware-optimizer` (Transformer Engine's FusedAdam) the
    dtypes `--main-params-dtype`, `--exp-avg-dtype` and `--exp-avg-sq-dtype` name."""
    if not megatron_flag(a.get("use_precision_aware_optimizer", False)):
        return FP32_ADAM_STATE_BYTES
    bad = bad_optimizer_state_dtype(a)
    if bad is not None:  # a dump's value is the job's: never echoed
        raise ConfigError(f"{bad} is not one of Megatron's choices "
                          f"({', '.join(OPTIMIZER_STATE_CHOICES[bad])})", key=bad)
    return float(sum(_STATE_DTYPES[state_dtype_name(a.get(key))]
                     for key in OPTIMIZER_STATE_CHOICES))


def _recompute_granularity(a: Mapping[str, Any]) -> str | None:
    gran = a.get("recompute_granularity")
    if gran is None and a.get("recompute_activations"):
        gran = "selective"  # --recompute-activations is selective recompute
    return gran


def _recompute_modules(a: Mapping[str, Any]) -> tuple[str, ...]:
    """Megatron's default (`core_attn`) when unset; an explicit empty list recomputes nothing
    (TransformerConfig replaces only None, core 0.13-main)."""
    modules = a.get("recompute_modules")
    if isinstance(modules, str):
        modules = modules.split() or None
    return ("core_attn",) if modules is None else tuple(modules)


def megatron_flag(v: Any) -> bool:
    """A boolean argument as a run spec (bool) or a log's dump ("True"/"False") gives it."""
    if isinstance(v, str):
        return v.strip().lower() == "true"
    return bool(v)


def flex_dispatcher_needs_peers(a: Mapping[str, Any]) -> bool:
    """The run's MoE dispatcher is flex with a backend that asserts expert-parallel peers
    (DeepEP, Megatron's default, or NCCL EP; not HybridEP): slurmpod.megatron.validate."""
    return (str(a.get("moe_token_dispatcher_type") or "").lower() == "flex"
            and str(a.get("moe_flex_dispatcher_backend") or "deepep").lower() != "hybridep")


def cuda_graph_scopes(args: Mapping[str, Any]) -> set[str]:
    """The words of a run's CUDA graph scope, in each release's spelling: core 0.15's string,
    core 0.16's list (a dump prints `[<CudaGraphScope.attn: 1>, ...]`), main's
    `cuda_graph_modules`."""
    words: set[str] = set()
    for key in ("cuda_graph_scope", "cuda_graph_modules"):
        v = args.get(key)
        parts = v if isinstance(v, (list, tuple)) else [v]
        for part in parts:
            words.update(re.findall(r"[a-z_]+", str(part or "").lower()))
    return words


def per_layer_cuda_graphs(args: Mapping[str, Any]) -> bool:
    """The run captures CUDA graphs per layer (`cuda_graph_impl` transformer_engine or local),
    not the whole iteration (main's `full_iteration`, core 0.15's local with a full_iteration
    scope)."""
    impl = str(args.get("cuda_graph_impl") or "").strip().lower()
    if impl not in ("transformer_engine", "local"):
        return False
    return not (impl == "local" and "full_iteration" in cuda_graph_scopes(args))


def optional_int(v: Any) -> int | None:
    """An optional integer argument as a run spec or a log's dump gives it ("None": unset)."""
    return None if v in (None, "None", "") else int(v)


_SPLITS: dict[tuple[Any, ...], Any] = {}


def _cached_split(c: ModelConfig, fn: Any) -> Any:
    """One split per distinct split input (the layout search asks for thousands of layouts
    that share a handful of PP x VPP splits)."""
    key = (c.num_layers, c.pp, c.vpp, c.vpp_given, c.first_stage_layers, c.last_stage_layers,
           c.account_for_embedding, c.account_for_loss, c.pipeline_layout, c.mtp_num_layers)
    hit = _SPLITS.get(key)
    if hit is not None:
        return hit
    if len(_SPLITS) > 4096:
        _SPLITS.clear()
    out = _SPLITS[key] = fn(c)
    return out


PRESETS_DIR = Path(__file__).resolve().parent / "presets"


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.toml"))


def preset_path(name: str) -> Path:
    """A built-in preset (`llama3-70b`) or a path to a run spec TOML."""
    path = PRESETS_DIR / f"{name}.toml"
    if path.is_file():
        return path
    p = Path(name)
    if p.suffix == ".toml" or "/" in name:
        return p
    close = difflib.get_close_matches(name, list_presets(), n=1)
    raise ConfigError(f"no such preset {name!r}",
                      hint=(f"did you mean {close[0]}? " if close else "")
                      + f"presets: {', '.join(list_presets())}")


def to_toml(data: Mapping[str, Mapping[str, Any]]) -> str:
    """A run spec dict ({'job': {...}, 'megatron': {...}}) as TOML text; None values are left
    out (TOML has no null, and Megatron's default is what None means)."""
    import tomli_w  # lazy: start-up (tomli_w only when used)

    return tomli_w.dumps({table: {k: v for k, v in body.items() if v is not None}
                          for table, body in data.items()})
