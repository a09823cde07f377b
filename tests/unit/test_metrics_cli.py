"""`slurmpod mfu`: sources of the model, GPU count and peak; JSON; one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmpod.cli.main import main

DATA = Path(__file__).resolve().parent.parent / "data" / "megatron"
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
    assert "MFU (%)" in out and "Megatron's TFLOP/s/GPU" in out and "0.980" in out


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


def test_no_dump_and_no_run_spec_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(capsys, MIXTRAL)
    assert rc == 2 and out == ""
    assert err.startswith("slurmpod: error: ") and "arguments" in err and "--run" in err
    assert "Traceback" not in err


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
