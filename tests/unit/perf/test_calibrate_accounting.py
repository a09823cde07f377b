"""`perf.calibrate.achieved_from_record`: one job of Slurm's accounting, its epilog record and
its log's arguments dump -> a point for `slurmpod calibrate --since`, or why not."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from slurmpod.config import load_site, resolve_site_path
from slurmpod.model.jobs import JobRecord, JobState
from slurmpod.model.site import Site
from slurmpod.perf.calibrate import SKIP_REASONS, Achieved, achieved_from_record, fit_site
from slurmpod.perf.hardware import hardware_from_site

ROOT = Path(__file__).resolve().parents[3]

# The parsed shape of a Megatron arguments dump (typed values, as `parse_arguments_dump` gives):
# a 1.3B GPT with TP2 on 16 GPUs.
ARGS: dict[str, Any] = {
    "num_layers": 24, "hidden_size": 2048, "num_attention_heads": 16, "seq_length": 2048,
    "max_position_embeddings": 2048, "ffn_hidden_size": 8192, "vocab_size": 50257,
    "make_vocab_size_divisible_by": 128, "micro_batch_size": 4, "global_batch_size": 256,
    "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1,
    "context_parallel_size": 1, "world_size": 16, "bf16": True, "group_query_attention": False,
}


def job(state: JobState = JobState.COMPLETED, nodes: str = "dgx[0001-0002]", n_nodes: int = 2,
        n_gpus: int = 16, job_id: str = "4242") -> JobRecord:
    return JobRecord(job_id=job_id, name="train", user="alice", account="ml", partition="batch",
                     state=state, exit_code=0, signal=0, submit_time=None, start_time=None,
                     end_time=None, elapsed_s=3600, nodes=nodes, n_nodes=n_nodes, n_gpus=n_gpus)


def record(median: Any = 1250.0, **summary: Any) -> dict[str, Any]:
    """An epilog spool record (v1) as `accounting.epilog.build_record` writes it."""
    return {"v": 1, "job": {"job_id": "4242", "uid": 1000, "nodelist": "dgx[0001-0002]"},
            "log": {"path": "/home/alice/train-4242.out", "bytes": 90000, "truncated": False},
            "summary": {"iters": 500, "gpus": 16, "implausible": None,
                        "metrics": {"iter_time_ms": {"median": median, "p10": 1200.0,
                                                     "p90": 1300.0, "n": 490}},
                        **summary}}


@pytest.fixture(scope="module")
def superpod() -> Site:
    return load_site(resolve_site_path("dgx-h100-superpod"))


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Site:
    """The superpod with one more SU of DGX A100 (dgx0129-dgx0160): another generation."""
    text = (ROOT / "site_configs" / "dgx-h100-superpod.toml").read_text()
    block = text[text.index("[node_types.dgx-h100]"):text.index("[fabric]")]
    a100 = block.replace("[node_types.dgx-h100]", "[node_types.dgx-a100]").replace(
        'model = "h100", name = "H100 SXM5 80GB", peak_tflops_bf16 = 989, '
        'peak_tflops_fp8 = 1979', 'model = "a100", name = "A100 SXM4 80GB", '
        'peak_tflops_bf16 = 312')
    assert a100 != block
    text = text.replace("[fabric]", a100 + "[fabric]").replace(
        "[naming]", '[[su_groups]]\nnode_type = "dgx-a100"\nsus = 1\nnodes_per_su = 32\n'
                    'nodes_per_rack = 4\n\n[naming]')
    path = tmp_path_factory.mktemp("site") / "mixed.toml"
    path.write_text(text)
    return load_site(path)


def decide(site: Site, rec: Any = None, args: Any = ARGS, *, sj: JobRecord | None = None,
           node_type: str | None = "dgx-h100") -> Achieved | str:
    return achieved_from_record(sj or job(), record() if rec is None else rec, args,
                                node_type=node_type, site=site,
                                generation=hardware_from_site(site).generation)


def test_good_record_gives_the_epilog_median_and_the_dump_layout(superpod: Site) -> None:
    got = decide(superpod)
    assert isinstance(got, Achieved)
    assert got.job_id == "4242" and got.step_time_s == pytest.approx(1.25)
    assert got.world == 16 and got.config.tp == 2 and got.config.num_layers == 24
    assert got.hardware is not None and got.hardware.gpu_model == "h100"
    # The point is one the model places: one job, so the fit makes its ratio 1.
    eff, ratios = fit_site([got], hardware_from_site(superpod))
    assert [j for j, _ in ratios] == ["4242"] and ratios[0][1] == pytest.approx(1.0, abs=0.01)
    assert 0 < eff.gemm < 1.5


def test_a_dump_without_world_size_runs_on_slurms_gpus(superpod: Site) -> None:
    args = {k: v for k, v in ARGS.items() if k != "world_size"}
    got = decide(superpod, args=args)
    assert isinstance(got, Achieved) and got.world == 16


def test_a_whole_node_job_without_gres_holds_its_nodes_gpus(superpod: Site) -> None:
    got = decide(superpod, sj=job(n_gpus=0))
    assert isinstance(got, Achieved) and got.world == 16


@pytest.mark.parametrize(("state", "reason"), [(JobState.RUNNING, "running"),
                                               (JobState.PENDING, "running")])
def test_an_unfinished_job_is_skipped(superpod: Site, state: JobState, reason: str) -> None:
    assert decide(superpod, sj=job(state=state)) == reason


def test_a_failed_job_with_a_steady_median_counts(superpod: Site) -> None:
    assert isinstance(decide(superpod, sj=job(state=JobState.FAILED)), Achieved)


@pytest.mark.parametrize("rec", [[], "record", 42, ["summary"]])
def test_a_non_dict_record_is_no_record(superpod: Site, rec: Any) -> None:
    assert decide(superpod, rec) == "no-record"


def test_no_record_at_all(superpod: Site) -> None:
    got = achieved_from_record(job(), None, ARGS, node_type="dgx-h100", site=superpod,
                               generation="hopper")
    assert got == "no-record"


def test_implausible_record_is_skipped(superpod: Site) -> None:
    assert decide(superpod, record(implausible="mfu-over-100")) == "implausible"


@pytest.mark.parametrize("rec", [
    {"v": 1, "summary": {"iters": 0}},
    {"v": 1, "summary": "no"},
    {"v": 1, "summary": {"metrics": {"iter_time_ms": None}}},
    {"v": 1, "summary": {"metrics": {"iter_time_ms": {"p10": 3.0}}}},
    {"v": 1},
])
def test_a_record_without_the_median_is_skipped(superpod: Site, rec: dict[str, Any]) -> None:
    assert decide(superpod, rec) == "no-step-time"


@pytest.mark.parametrize("median", [math.nan, math.inf, -math.inf, -1250.0, 0, 0.0, 1e300,
                                    86_400_001.0, "1250", True, [1250.0], {"ms": 1}])
def test_hostile_medians_are_no_measurement(superpod: Site, median: Any) -> None:
    assert decide(superpod, record(median)) == "bad-step-time"


def test_a_day_long_step_is_the_bound(superpod: Site) -> None:
    got = decide(superpod, record(86_400_000.0))
    assert isinstance(got, Achieved) and got.step_time_s == 86_400.0


def test_nodes_of_no_single_site_type_are_skipped(superpod: Site) -> None:
    assert decide(superpod, node_type=None) == "unknown-nodes"
    assert decide(superpod, node_type="no-such-type") == "unknown-nodes"


def test_a_job_on_another_generation_is_skipped(mixed: Site) -> None:
    assert hardware_from_site(mixed).generation == "hopper"
    assert decide(mixed, node_type="dgx-a100") == "other-generation"
    assert isinstance(decide(mixed, node_type="dgx-h100"), Achieved)


@pytest.mark.parametrize("args", [None, {}])
def test_no_dump_is_skipped(superpod: Site, args: Any) -> None:
    assert decide(superpod, args=args) == "no-dump"


def test_the_log_is_read_only_when_every_other_check_passed(superpod: Site) -> None:
    calls: list[int] = []

    def read() -> dict[str, Any]:
        calls.append(1)
        return ARGS

    assert achieved_from_record(job(), record(math.nan), read, node_type="dgx-h100",
                                site=superpod, generation="hopper") == "bad-step-time"
    assert achieved_from_record(job(), record(implausible="x"), read, node_type="dgx-h100",
                                site=superpod, generation="hopper") == "implausible"
    assert not calls
    assert isinstance(achieved_from_record(job(), record(), read, node_type="dgx-h100",
                                           site=superpod, generation="hopper"), Achieved)
    assert calls == [1]


@pytest.mark.parametrize("change", [
    {"num_layers": 0}, {"hidden_size": -2048}, {"num_layers": "24"}, {"world_size": 0},
    {"world_size": True}, {"world_size": "16"}, {"num_layers": 10**12},
    {"micro_batch_size": 1.5},
])
def test_a_dump_the_checks_refuse_is_skipped(superpod: Site, change: dict[str, Any]) -> None:
    assert decide(superpod, args=ARGS | change) == "bad-dump"


def test_a_dump_claiming_more_gpus_than_slurm_gave_is_skipped(superpod: Site) -> None:
    assert decide(superpod, args=ARGS | {"world_size": 32}) == "more-gpus-than-slurm"
    assert decide(superpod, sj=job(n_gpus=8, n_nodes=1, nodes="dgx0001")) == \
        "more-gpus-than-slurm"
    # fewer GPUs than the job held: the run used part of its allocation, predicted on that
    got = decide(superpod, args=ARGS | {"world_size": 8, "tensor_model_parallel_size": 8})
    assert isinstance(got, Achieved) and got.world == 8


def test_every_reason_is_described() -> None:
    assert all(k and v for k, v in SKIP_REASONS.items())
    assert "no-prediction" in SKIP_REASONS


def test_the_site_fit_splits_gpu_and_host_bound_jobs(superpod: Site) -> None:
    """Jobs made from known factors (GPU factors x 0.9, the host's FP8 MoE forward 7 ms): the
    fit finds both, the GPU scale on the dense job and the host on the FP8 MoE job, which
    waits on the host; each job's ratio is then 1."""
    import dataclasses

    from slurmpod.megatron.runspec import ModelConfig, load_run, preset_path
    from slurmpod.perf.fitted import FITTED
    from slurmpod.perf.model import predict
    from slurmpod.perf.options import RunOptions

    hw = hardware_from_site(superpod)
    base = FITTED["hopper"]
    truth = dataclasses.replace(base, gemm=base.gemm * 0.9, fp8=base.fp8 * 0.9,
                                moe_fp8_host_forward_s=0.007)

    def made(name: str, world: int, **kw: Any) -> Achieved:
        c = dataclasses.replace(
            ModelConfig.from_args(load_run(preset_path(name)).megatron), **kw)
        pred = predict(c, world, hw, truth, RunOptions())
        assert pred is not None
        return Achieved(name, c, world, RunOptions(), pred.step_time_s)

    dense = made("llama3-8b", 8, tp=1, pp=1, vpp=None, cp=1, global_batch_size=128)
    moe = made("qwen3-30b-a3b", 8, tp=1, pp=1, vpp=None, cp=1, ep=8, etp=1,
               global_batch_size=128, micro_batch_size=1, fp8="hybrid")
    eff, ratios = fit_site([dense, moe], hw)
    assert eff.gemm == pytest.approx(truth.gemm, rel=2e-3)
    assert eff.moe_fp8_host_forward_s == pytest.approx(0.007, rel=2e-3)
    assert [r for _, r in ratios] == pytest.approx([1.0, 1.0], abs=3e-3)
    # Without a host-bound job the host's figure is left as fitted on the published row.
    eff, _ = fit_site([dense], hw)
    assert eff.moe_fp8_host_forward_s == base.moe_fp8_host_forward_s
