"""`slurmpod mfu`: sources of the model, GPU count and peak; JSON; one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmpod.cli.main import main
from tests.helpers import DATA_DIR

DATA = DATA_DIR / "megatron"
MIXTRAL = str(DATA / "mixtral-8x7b-h100x16.log")
RUN = str(DATA / "mixtral-8x7b-h100x16.run.toml")


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["mfu", *args])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_real_log_with_run_spec_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, MIXTRAL, "--run", RUN, "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["n_gpus"] == 16  # 2 nodes x 8 GPUs of the default site's node type
    assert doc["peak_tflops"] == 989.0 and "dgx-h100" in doc["peak_source"]
    assert doc["model_source"].startswith("run spec")
    assert doc["tflops_reported"]["median"] == 238.7
    assert 0.97 < doc["reported_ratio"] < 0.99
    assert doc["mfu"]["median"] == pytest.approx(doc["tflops_per_gpu"]["median"] / 989.0)
    assert "series" not in doc


def test_text_output(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, MIXTRAL, "--run", RUN)
    assert rc == 0
    assert "MFU (%)" in out and "log's own TFLOP/s/GPU" in out and "0.980" in out
    assert "megatron-core-0.14-main" in out  # the formula version explains the ratio


def test_model_and_gpus_from_the_arguments_dump(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, str(DATA / "megatron-2026-microseconds.log"), "--json", "--series")
    assert rc == 0
    doc = json.loads(out)
    assert doc["n_gpus"] == 64 and doc["seq_length"] == 8192
    assert doc["model_source"] == "the log's arguments dump"
    assert doc["series"]["iteration"] == [5, 10, 15, 20, 25, 30, 35]


def test_site_peak_and_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    log = str(DATA / "megatron-2024-restart.log")
    _, out, _ = _run(capsys, log, "--site", "sandbox", "--json")
    assert json.loads(out)["peak_tflops"] == 0.05  # the sandbox's emulated GPU
    _, out, _ = _run(capsys, log, "--peak-tflops", "500", "--gpus", "4", "--json")
    doc = json.loads(out)
    assert doc["peak_tflops"] == 500.0 and doc["n_gpus"] == 4


def test_no_dump_and_no_run_spec_gives_the_logs_own_figures(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Without a model: iteration statistics and Megatron's own TFLOP/s, no MFU."""
    rc, out, err = _run(capsys, MIXTRAL)
    assert rc == 0 and err == ""
    assert "iteration time (ms)" in out and "5470.7" in out  # median of 5361.6, 5470.7, 5829.6
    assert "log's own TFLOP/s/GPU" in out and "238.7" in out
    assert "MFU (%)" not in out and "--run" in out
    rc, out, _ = _run(capsys, MIXTRAL, "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["model_source"] is None and doc["mfu"] is None
    assert doc["n_gpus"] is None and doc["flops_formula"] is None
    assert doc["iter_time_ms"]["median"] == 5470.7 and doc["n_records"] == 3
    assert doc["tflops_reported"]["median"] == 238.7


def test_log_without_iterations(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"\x00\xffnot a megatron log\n")
    rc, _, err = _run(capsys, str(empty))
    assert rc == 2 and "no Megatron iteration lines" in err


def test_unknown_node_type_and_missing_log(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(capsys, MIXTRAL, "--run", RUN, "--node-type", "b200")
    assert rc == 2 and "node type" in err
    rc, _, err = _run(capsys, "/nonexistent/job.log")
    assert rc == 2


def test_bad_model_in_the_dump_names_the_log(capsys: pytest.CaptureFixture[str],
                                             tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    line = Path(MIXTRAL).read_bytes().splitlines(keepends=True)[0]
    log.write_bytes(b"------------------------ arguments ------------------------\n"
                    b"  num_layers ...................................... 4\n"
                    b"  world_size ...................................... 8\n"
                    b"-------------------- end of arguments ---------------------\n" + line)
    rc, _, err = _run(capsys, str(log))
    assert rc == 3 and str(log) in err and "hidden_size" in err


def _two_attempts(tmp_path: Path) -> Path:
    """A slurmpod run dir whose job log holds two attempts of job 7 (the same real log twice,
    the second one with srun --label prefixes), and the job script's record of them."""
    real = Path(MIXTRAL).read_bytes()
    labelled = b"".join(b" 0: " + line for line in real.splitlines(keepends=True))
    log = tmp_path / "logs" / "mixtral-7.out"
    log.parent.mkdir(parents=True)
    log.write_bytes(b"slurmpod: job 7\n" + real + labelled)
    state = tmp_path / ".slurmpod"
    state.mkdir()
    first, second = len(b"slurmpod: job 7\n"), len(b"slurmpod: job 7\n") + len(real)
    lines = [
        {"v": 1, "event": "start", "job_id": "7", "attempt": 1, "restart": 0, "time": 1,
         "nodes": ["gpu001"], "log": str(log), "log_offset": first},
        {"v": 1, "event": "end", "job_id": "7", "attempt": 1, "restart": 0, "time": 2,
         "end": "timelimit", "rc": 0, "iteration": None, "progress": False, "failures": 0,
         "max_restarts": 3},
        {"v": 1, "event": "start", "job_id": "7", "attempt": 2, "restart": 1, "time": 3,
         "nodes": ["gpu001"], "log": str(log), "log_offset": second},
    ]
    (state / "attempts.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines)
                                          + "{garbage\n")
    return log


def test_attempt_reads_only_that_attempts_bytes(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    log = _two_attempts(tmp_path)
    whole = json.loads(_run(capsys, MIXTRAL, "--run", RUN, "--json")[1])
    rc, out, err = _run(capsys, str(log), "--run", RUN, "--json", "--attempt", "2")
    assert rc == 0, err
    doc = json.loads(out)
    # The second attempt alone is the real log once: the same records and figures.
    assert doc["attempt"] == 2 and doc["n_records"] == whole["n_records"]
    assert doc["mfu"]["median"] == pytest.approx(whole["mfu"]["median"])
    both = json.loads(_run(capsys, str(log), "--run", RUN, "--json")[1])
    assert both["n_records"] > whole["n_records"]


def test_attempt_larger_than_a_read_loses_no_line(capsys: pytest.CaptureFixture[str],
                                                 tmp_path: Path) -> None:
    """An attempt of more than 4 MiB is read in pieces; a line cut between two pieces is one
    line (it was read as two broken ones)."""
    log = _two_attempts(tmp_path)
    real = Path(MIXTRAL).read_bytes().splitlines(keepends=True)
    body = [ln for ln in real if b" iteration " in ln and b"elapsed time" in ln]
    tail = b"".join(body) * (5 * 2**20 // len(b"".join(body)) + 1)  # > 4 MiB of lines
    with log.open("ab") as f:
        f.write(tail)
    whole = tmp_path / "attempt2.log"
    whole.write_bytes(log.read_bytes()[len(b"slurmpod: job 7\n") + len(b"".join(real)):])
    rc, out, err = _run(capsys, str(log), "--run", RUN, "--json", "--attempt", "2")
    assert rc == 0, err
    doc = json.loads(out)
    ref = json.loads(_run(capsys, str(whole), "--run", RUN, "--json")[1])
    assert doc["log_summary"]["n_rejected"] == ref["log_summary"]["n_rejected"] == 0
    assert doc["n_records"] == ref["n_records"] and doc["mfu"] == ref["mfu"]


def test_attempt_that_is_not_recorded_is_one_line(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    log = _two_attempts(tmp_path)
    rc, _, err = _run(capsys, str(log), "--run", RUN, "--attempt", "5")
    assert rc == 2 and "no attempt 5" in err and "attempts: 1, 2" in err
    rc, _, err = _run(capsys, MIXTRAL, "--run", RUN, "--attempt", "1")
    assert rc == 2 and "attempt record" in err and "Traceback" not in err


def test_attempt_record_that_is_a_fifo_does_not_hang(capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path) -> None:
    import os

    log = _two_attempts(tmp_path)
    record = tmp_path / ".slurmpod" / "attempts.jsonl"
    record.unlink()
    os.mkfifo(record)
    rc, _, err = _run(capsys, str(log), "--run", RUN, "--attempt", "1")
    assert rc == 2 and "attempt record" in err


@pytest.mark.parametrize("peak", ["nan", "inf", "-inf"])
def test_non_finite_peak_is_a_usage_error(capsys: pytest.CaptureFixture[str], peak: str) -> None:
    rc, _, err = _run(capsys, MIXTRAL, "--run", RUN, "--peak-tflops", peak)
    assert rc == 2 and "--peak-tflops" in err and "internal error" not in err
