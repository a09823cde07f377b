"""`slurmpod calibrate`: its two sources (LOG files or `--since`, exactly one), and the
accounting path end to end against a stand-in `sacct` on PATH printing the recorded-shape
files of tests/data/report/ (handmade.records.txt: 101 completed on gpu[001-004] with 32 GPUs,
102 failed on gpu[004-005] with 16, 103 requeued, 104 completed, 105 running), with spool
records and job logs written here."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurmpod.cli.main import cli, main
from tests.helpers import DATA_DIR

DATA = DATA_DIR / "report"
LOG = DATA_DIR / "megatron" / "megatron-2024-restart.log"

# Megatron's arguments dump as it prints it (megatron/training/arguments.py `_print_args`):
# a small GPT on 32 GPUs, sized for the sandbox site's emulated GPU (its peak is measured on
# CPUs, ~0.05 TFLOP/s): the model predicts ~1.4 s per iteration there, the records say 2 s.
DUMP = {"num_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "seq_length": 256,
        "max_position_embeddings": 256, "ffn_hidden_size": 1024, "vocab_size": 50257,
        "make_vocab_size_divisible_by": 128, "micro_batch_size": 2, "global_batch_size": 64,
        "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1,
        "context_parallel_size": 1, "world_size": 32, "bf16": True,
        "group_query_attention": False}


def megatron_log(path: Path, args: dict[str, Any]) -> Path:
    lines = ["------------------------ arguments ------------------------"]
    lines += [f"  {k} {'.' * (48 - len(k))} {v}" for k, v in sorted(args.items())]
    lines += ["-------------------- end of arguments ---------------------",
              "time to initialize megatron (seconds): 20.000"]
    path.write_text("\n".join(lines) + "\n")
    return path


def spool_record(spool: Path, job_id: str, attempt: int, median: float | None,
                 log: Path | None, **summary: Any) -> None:
    """A record as the epilog writes it (accounting.epilog.build_record), series left out."""
    metrics = {} if median is None else {"iter_time_ms": {"median": median, "p10": median,
                                                          "p90": median, "n": 100}}
    rec = {"v": 1, "job": {"job_id": job_id, "uid": os.getuid(), "restart": attempt},
           "log": {"path": str(log) if log else "", "bytes": 1000, "truncated": False},
           "summary": {"iters": 110, "implausible": None, "metrics": metrics, **summary},
           "series": {}, "written": 1795004000}
    (spool / "records").mkdir(parents=True, exist_ok=True)
    (spool / "records" / f"{job_id}.{attempt}.json").write_text(json.dumps(rec))


@pytest.fixture()
def spool(tmp_path: Path) -> Path:
    """101: usable; 102: its dump claims 32 GPUs, Slurm gave 16; 103: no record; 104: flagged
    implausible; 105: running (its earlier record is not read)."""
    d = tmp_path / "spool"
    logs = tmp_path / "logs"
    logs.mkdir()
    spool_record(d, "101", 0, 2000.0, megatron_log(logs / "101.out", DUMP))
    spool_record(d, "102", 0, 900.0, megatron_log(logs / "102.out", DUMP))
    spool_record(d, "104", 0, 1200.0, megatron_log(logs / "104.out", DUMP),
                 implausible="mfu-over-100")
    spool_record(d, "105", 0, 1200.0, megatron_log(logs / "105.out", DUMP))
    return d


def run(*args: str) -> Any:
    return CliRunner().invoke(cli, ["calibrate", *args], catch_exceptions=False)


def main_rc(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Through the real entry point: exit code, stdout and stderr as a user sees them."""
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", *args])
    out = capsys.readouterr()
    return int(exc.value.code or 0), out.out, out.err


@pytest.mark.parametrize("args", [(), (str(LOG), "--since", "7d"), ("--dry-run",),
                                  ("--user", "alice")])
def test_exactly_one_source(capsys: pytest.CaptureFixture[str], args: tuple[str, ...]) -> None:
    rc, out, err = main_rc(capsys, *args)
    assert rc == 2 and out == ""
    assert err.startswith("slurmpod: error: give LOG files or --since WINDOW, not both")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_selection_options_go_with_since(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = main_rc(capsys, str(LOG), "--user", "alice", "--dry-run")
    assert rc == 2 and "go with --since" in err and err.count("\n") == 1


def test_a_bad_window_is_one_line(fake_sacct: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = main_rc(capsys, "--since", "yesterday", "--dry-run")
    assert rc == 2 and err.startswith("slurmpod: error: --since 'yesterday'")
    assert not fake_sacct.exists()  # refused before asking Slurm


def test_logs_still_calibrate_with_json(tmp_path: Path) -> None:
    res = run(str(LOG), "--dry-run", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert [j["job_id"] for j in doc["jobs"]] == [LOG.name]
    assert doc["stored"] is None and doc["skipped"] == {}


def test_accounting_json(fake_sacct: Path, spool: Path) -> None:
    res = run("--since", "7d", "--site", "sandbox", "--spool", str(spool), "--dry-run",
              "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert set(doc) == {"site", "gpu", "generation", "jobs", "skipped", "before", "after",
                        "memory", "stored"}
    # no record holds a memory report: nothing measured, each job counted as such
    assert doc["memory"]["jobs"] == [] and doc["memory"]["cached_gib"] is None
    assert doc["memory"]["skipped"] == {"no-memory-report": 2}
    assert doc["site"] == "sandbox" and doc["gpu"] == "emu" and doc["stored"] is None
    assert [j["job_id"] for j in doc["jobs"]] == ["101"]
    assert doc["jobs"][0]["ratio"] == pytest.approx(1.0, abs=0.01)  # one job: fitted onto it
    assert doc["skipped"] == {"more-gpus-than-slurm": 1, "no-record": 1, "implausible": 1,
                              "running": 1}
    assert set(doc["before"]) == set(doc["after"]) == {"gemm", "fp8", "moe_fp8_host_forward_s"}
    # achieved 2 s where the model said ~1.4 s: the factors come down
    assert 0.5 < doc["after"]["gemm"] / doc["before"]["gemm"] < 0.9
    # a dense job: the host's figure is not this fit's
    assert doc["after"]["moe_fp8_host_forward_s"] == doc["before"]["moe_fp8_host_forward_s"]
    # one stderr line for every skipped job
    assert res.stderr == ("slurmpod: skipped 4 job(s): implausible 1, more-gpus-than-slurm 1, "
                          "no-record 1, running 1\n")
    argv = fake_sacct.read_text().splitlines()
    assert "--starttime=now-7days --endtime=now --allusers" in argv[0]


def test_accounting_text_stores_beside_the_site(fake_sacct: Path, spool: Path,
                                                tmp_path: Path) -> None:
    from slurmpod.config import builtin_site_path

    site = tmp_path / "lab.toml"
    site.write_text(builtin_site_path("sandbox").read_text())
    res = run("--since", "2d", "--site", str(site), "--spool", str(spool), "--user", "alice")
    assert res.exit_code == 0, res.output
    assert "sandbox (emu, emulated): 1 jobs" in res.stdout
    assert "  101: predicted / achieved 1.00" in res.stdout
    assert f"stored {tmp_path / 'lab.perf.toml'}" in res.stdout
    assert 'generation = "emulated"' in (tmp_path / "lab.perf.toml").read_text()
    # alice's jobs only: 101, 103, 104 (102 and 105 are bob's)
    assert "no-record 1" in res.stderr and "implausible 1" in res.stderr
    assert "running" not in res.stderr and "more-gpus" not in res.stderr
    assert "--user=alice" in fake_sacct.read_text()


def test_nothing_usable_names_what_was_missing(fake_sacct: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = main_rc(capsys, "--since", "7d", "--site", "sandbox", "--spool",
                           str(tmp_path / "empty"), "--dry-run")
    assert rc == 2 and out == "" and "Traceback" not in err
    lines = err.splitlines()
    assert lines[-2] == "slurmpod: error: no finished job since 7d to calibrate on"
    assert lines[-1].startswith("hint: skipped: 4 no spool record of the epilog (no-record); "
                                "1 not finished (running)")


def test_a_site_whose_nodes_are_not_the_jobs_skips_them(fake_sacct: Path, spool: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    # dgx-h100-superpod names its nodes dgx0001...: none of the sandbox's gpu nodes
    rc, _, err = main_rc(capsys, "--since", "7d", "--spool", str(spool), "--dry-run")
    assert rc == 2 and "(unknown-nodes)" in err


def test_the_spool_comes_from_the_environment(fake_sacct: Path, spool: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMPOD_SPOOL", str(spool))
    res = run("--since", "7d", "--site", "sandbox", "--dry-run", "--json")
    assert res.exit_code == 0, res.output
    assert [j["job_id"] for j in json.loads(res.stdout)["jobs"]] == ["101"]


def _memory(alloc: float, reserved: float, used: float | None) -> dict[str, Any]:
    """A record's `memory` as the epilog keeps it (logrecords.MemoryPeaks.for_record)."""
    return {"ranks": 8, "rank": 0, "max_allocated_mib": alloc, "max_reserved_mib": reserved,
            "device_used_mib": used, "cached_mib": reserved - alloc,
            "outside_torch_mib": None if used is None else used - reserved,
            "peak_allocated_mib": alloc}


def test_memory_reports_measure_the_reserve_plan_then_counts(
        fake_sacct: Path, tmp_path: Path) -> None:
    """Jobs' memory reports (Megatron's `memory (MB)` lines, in the epilog's record) give the
    site's runtime reserve: stored as `[memory]` beside the efficiency factors, and `plan` on
    the same site counts it. 102's report claims more than the emulated GPU's 80 GiB: not a
    measurement. The implausible 104 and the running 105 are not read."""
    from slurmpod.config import builtin_site_path

    site = tmp_path / "lab.toml"
    site.write_text(builtin_site_path("sandbox").read_text())
    spool = tmp_path / "spool"
    logs = tmp_path / "logs"
    logs.mkdir()
    recs = {"101": _memory(60_000.0, 62_048.0, 63_072.0),  # cache 2 GiB, outside 1 GiB
            "102": _memory(60_000.0, 90_000.0, None),  # over 80 GiB
            "104": _memory(1.0, 80_000.0, None), "105": _memory(1.0, 80_000.0, None)}
    for job, mem in recs.items():
        rec_path = spool / "records" / f"{job}.0.json"
        spool_record(spool, job, 0, 2000.0, megatron_log(logs / f"{job}.out", DUMP),
                     implausible="mfu-over-100" if job == "104" else None)
        rec = json.loads(rec_path.read_text())
        rec["summary"]["metrics"]["memory"] = mem
        rec_path.write_text(json.dumps(rec))
    res = run("--since", "7d", "--site", str(site), "--spool", str(spool), "--json")
    assert res.exit_code == 0, res.output
    mem = json.loads(res.stdout)["memory"]
    assert [j["job_id"] for j in mem["jobs"]] == ["101"]
    assert mem["skipped"] == {"bad-memory-report": 1}
    assert mem["cached_gib"] == pytest.approx(2.0) and mem["outside_torch_gib"] == 1.0
    stored = (tmp_path / "lab.perf.toml").read_text()
    assert "[memory]" in stored and 'generation = "emulated"' in stored
    plan = CliRunner().invoke(cli, ["plan", "--site", str(site), "--preset", "llama3-8b",
                                    "--nodes", "2", "--json"], catch_exceptions=False)
    doc = json.loads(plan.stdout)
    assert doc["reserve_measured"] == "measured on 1 job(s)"
    # HBM less 1 % not visible, 1 GiB outside PyTorch, 2 GiB of cache
    assert doc["usable_bytes_per_gpu"] / 2**30 == pytest.approx(80 * 79.18 / 80 - 3.0)
    text = CliRunner().invoke(cli, ["plan", "--site", str(site), "--preset", "llama3-8b",
                                    "--nodes", "2"], catch_exceptions=False).stdout
    assert "runtime reserve, measured on 1 job(s) of this site)" in text
    # a second calibration keeps what the first measured when its jobs report no memory
    for job in recs:
        p = spool / "records" / f"{job}.0.json"
        rec = json.loads(p.read_text())
        del rec["summary"]["metrics"]["memory"]
        p.write_text(json.dumps(rec))
    assert run("--since", "7d", "--site", str(site), "--spool", str(spool)).exit_code == 0
    assert "[memory]" in (tmp_path / "lab.perf.toml").read_text()


def test_memory_alone_is_enough_to_calibrate(fake_sacct: Path, tmp_path: Path) -> None:
    """A job whose log has no arguments dump still measured its memory."""
    spool = tmp_path / "spool"
    spool_record(spool, "101", 0, None, None)
    p = spool / "records" / "101.0.json"
    rec = json.loads(p.read_text())
    rec["summary"]["metrics"]["memory"] = _memory(10_000.0, 11_024.0, None)
    p.write_text(json.dumps(rec))
    res = run("--since", "7d", "--site", "sandbox", "--spool", str(spool), "--dry-run",
              "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["jobs"] == [] and doc["after"] is None
    assert doc["memory"]["cached_gib"] == pytest.approx(1.0)
    assert doc["memory"]["outside_torch_gib"] is None


def test_nothing_usable_counts_forged_memory_reports(fake_sacct: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    spool = tmp_path / "spool"
    spool_record(spool, "101", 0, None, None)
    p = spool / "records" / "101.0.json"
    rec = json.loads(p.read_text())
    rec["summary"]["metrics"]["memory"] = _memory(10_000.0, 90_000.0, None)  # over 80 GiB
    p.write_text(json.dumps(rec))
    rc, out, err = main_rc(capsys, "--since", "7d", "--site", "sandbox", "--spool", str(spool),
                           "--dry-run")
    assert rc == 2 and out == ""
    assert err.splitlines()[-1].endswith(
        "; memory reports: 1 memory figures no GPU of the job's nodes can have "
        "(bad-memory-report)")


ITER = (" [2026-06-01 10:00:{s:02d}] iteration {i:8d}/     200 | consumed samples: {c:12d} | "
        "elapsed time per iteration (ms): {ms:.1f} | learning rate: 1.500000E-04 | global batch "
        "size: {gbs:5d} | lm loss: 2.750000E+00 | loss scale: 1.0 | grad norm: 0.812 | number "
        "of skipped iterations:   0 | number of nan iterations:   0 |")


def training_log(path: Path, args: dict[str, Any], step_s: float) -> Path:
    """Megatron's dump and 60 iteration lines at `step_s` seconds each."""
    megatron_log(path, args)
    gbs = int(args["global_batch_size"])
    lines = [ITER.format(s=i % 60, i=i, c=i * gbs, ms=step_s * 1e3, gbs=gbs)
             for i in range(1, 61)]
    with path.open("a") as f:
        f.write("\n".join(lines) + "\n")
    return path


def test_an_fp8_moe_log_fits_the_hosts_figure_and_a_dense_one_the_gpus(tmp_path: Path) -> None:
    """Two logs on the default H100 site: a dense BF16 job 10 % slower than predicted scales
    the GPU factors; an FP8 MoE job without CUDA graphs, whose predicted step waits on the
    host, 30 % slower than predicted raises the host's figure. Both are stored and named."""
    import tomllib

    from slurmpod.config import load_site, resolve_site_path
    from slurmpod.megatron.runspec import ModelConfig, load_run, preset_path
    from slurmpod.perf.fitted import FITTED, MOE_FP8_HOST_FORWARD_S
    from slurmpod.perf.hardware import hardware_from_site
    from slurmpod.perf.model import predict
    from slurmpod.perf.options import RunOptions

    hw = hardware_from_site(load_site(resolve_site_path("dgx-h100-superpod")))
    moe = {k: v for k, v in load_run(preset_path("qwen3-30b-a3b")).megatron.values().items()
           if v is not None} | {"fp8": "hybrid", "world_size": 8}
    dense = DUMP | {"num_layers": 24, "hidden_size": 2048, "num_attention_heads": 16,
                    "ffn_hidden_size": 8192, "seq_length": 2048,
                    "max_position_embeddings": 2048, "world_size": 8, "global_batch_size": 256}

    def predicted(args: dict[str, Any]) -> Any:
        p = predict(ModelConfig.from_args(args), 8, hw, FITTED["hopper"],
                    RunOptions.from_args(args))
        assert p is not None
        return p

    assert predicted(moe).host_bound and not predicted(dense).host_bound
    logs = [training_log(tmp_path / "dense.log", dense, predicted(dense).step_time_s * 1.1),
            training_log(tmp_path / "moe.log", moe, predicted(moe).step_time_s * 1.3)]
    out = tmp_path / "lab.perf.toml"
    res = run(*map(str, logs), "--output", str(out))
    assert res.exit_code == 0, res.output
    stored = tomllib.loads(out.read_text())
    assert stored["gemm"] < FITTED["hopper"].gemm
    assert stored["moe_fp8_host_forward_s"] > MOE_FP8_HOST_FORWARD_S
    assert f"host's FP8 MoE forward {MOE_FP8_HOST_FORWARD_S * 1e3:.2f} -> " in res.stdout
    for line in res.stdout.splitlines():
        if line.startswith("  ") and ": predicted / achieved " in line:
            assert line.endswith("1.00"), line  # each fitted onto its own figure


# GPT-OSS 120B as Megatron-Bridge's H100 recipe runs it (PP4 EP8, MBS 1, GBS 1280 on 64 GPUs):
# an architecture whose published runs the model predicts 26 % fast (median).
GPT_OSS = DUMP | {"num_layers": 36, "hidden_size": 2880, "num_attention_heads": 64,
                  "group_query_attention": True, "num_query_groups": 8, "kv_channels": 64,
                  "ffn_hidden_size": 2880, "swiglu": True, "normalization": "RMSNorm",
                  "untie_embeddings_and_output_weights": True, "seq_length": 4096,
                  "max_position_embeddings": 131072, "vocab_size": 201088,
                  "num_experts": 128, "moe_router_topk": 4, "moe_ffn_hidden_size": 2880,
                  "moe_grouped_gemm": True, "expert_model_parallel_size": 8,
                  "pipeline_model_parallel_size": 4, "micro_batch_size": 1,
                  "global_batch_size": 1280, "world_size": 64}


def test_a_known_missed_architecture_is_left_out_of_the_fit(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    """A dense job 10 % slower than predicted and a GPT-OSS 120B job 40 % slower: by default
    the fit is the dense job's alone (GPT-OSS skipped as `known-miss`, its gap the model's);
    with --all-architectures both count, so the factors fall further. GPT-OSS logs alone are
    one usage error line that names the option."""
    from slurmpod.config import load_site, resolve_site_path
    from slurmpod.megatron.runspec import ModelConfig
    from slurmpod.perf.fitted import FITTED
    from slurmpod.perf.hardware import hardware_from_site
    from slurmpod.perf.model import predict
    from slurmpod.perf.options import RunOptions
    from slurmpod.perf.track import load, track

    hw = hardware_from_site(load_site(resolve_site_path("dgx-h100-superpod")))
    dense = DUMP | {"num_layers": 24, "hidden_size": 2048, "num_attention_heads": 16,
                    "ffn_hidden_size": 8192, "seq_length": 2048,
                    "max_position_embeddings": 2048, "world_size": 8, "global_batch_size": 256}
    assert track(ModelConfig.from_args(GPT_OSS), "h100", load()).missed

    def step(args: dict[str, Any]) -> float:
        p = predict(ModelConfig.from_args(args), int(args["world_size"]), hw,
                    FITTED["hopper"], RunOptions.from_args(args))
        assert p is not None and not p.host_bound
        return p.step_time_s

    dense_log = training_log(tmp_path / "dense.log", dense, step(dense) * 1.1)
    oss_log = training_log(tmp_path / "gpt-oss.log", GPT_OSS, step(GPT_OSS) * 1.4)
    rc, out, err = main_rc(capsys, str(dense_log), str(oss_log), "--dry-run", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    assert [j["job_id"] for j in doc["jobs"]] == ["dense.log"]
    assert doc["skipped"] == {"known-miss": 1}
    assert "skipped 1 job(s): known-miss 1" in err
    only_dense = doc["after"]["gemm"]
    assert only_dense < FITTED["hopper"].gemm
    assert doc["jobs"][0]["ratio"] == pytest.approx(1.0, abs=0.01)  # fitted on it alone
    rc, out, err = main_rc(capsys, str(dense_log), str(oss_log), "--dry-run", "--json",
                           "--all-architectures")
    both = json.loads(out)
    assert rc == 0 and len(both["jobs"]) == 2 and both["skipped"] == {}
    assert both["after"]["gemm"] < only_dense
    rc, out, err = main_rc(capsys, str(oss_log), "--dry-run")
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) <= 2, err  # the error and its hint
    assert "known to miss" in err or "misses by more than 15 %" in err
    assert "--all-architectures" in err and "Traceback" not in err
