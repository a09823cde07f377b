"""Submission orchestration with the in-memory FakeBackend and a recording runner: refuse before
anything is written, store script and marker, never queue the same script twice, chains, --wait
mapping nodes to SUs, and the CLI's exit codes."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from slurmpod.backends.fake import FakeBackend
from slurmpod.config import builtin_site_path, load_site
from slurmpod.errors import CommandError, ConfigError, SlurmError
from slurmpod.megatron.runspec import run_from_dict
from slurmpod.render.sbatch import RenderOptions
from slurmpod.runs import files
from slurmpod.submit import (
    MARKER,
    load_site_env,
    prepare,
    resolve_run_dir,
    submit,
    wait_for_start,
)
from slurmpod.transport.base import CommandResult

SITE = load_site(builtin_site_path("sandbox"))
GOOD = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "seq_length": 128,
        "vocab_size": 1000, "tensor_model_parallel_size": 8, "global_batch_size": 16,
        "train_iters": 10}


class FakeRunner:
    """Files in a dict (shared with the FakeBackend), the run-file reader of slurmpod.runs.files
    answered from them, a command log. Slurm is the FakeBackend's alone: any other command
    through the runner fails the test."""

    where = "fake"

    def __init__(self, backend: FakeBackend) -> None:
        self.files: dict[str, str] = {}
        self.backend = backend
        self.commands: list[list[str]] = []

    def run(self, argv: Sequence[str], *, input_text: str | None = None,
            timeout_s: float | None = None, env: Mapping[str, str] | None = None,
            cwd: str | None = None, check: bool = True) -> CommandResult:
        argv = list(argv)
        self.commands.append(argv)
        if argv[:2] == ["sh", "-c"] and argv[2] == files._READ:  # path, offset, length
            text = self.files.get(argv[4])
            if text is None:
                if check:
                    raise CommandError(argv, 66, "")
                return CommandResult(tuple(argv), 66, "", "", 0.0)
            data, offset = text.encode(), int(argv[5])
            piece = base64.b64encode(data[offset:offset + int(argv[6])]).decode()
            return CommandResult(tuple(argv), 0, f"{len(data)} {offset}\n{piece}\n", "", 0.0)
        raise AssertionError(f"unexpected command {argv}")

    def write_text(self, path: str, text: str, mode: int = 0o644) -> str:
        self.files[path] = text
        self.backend.add_file(path, text)
        return path

    def upload(self, local_path: Path, remote_dir: str, name: str | None = None) -> str:
        raise AssertionError("not used")

    def close(self) -> None:
        pass


def _run(nodes: int = 2, **megatron: Any) -> Any:
    return run_from_dict({"job": {"name": "t", "nodes": nodes},
                          "megatron": {**GOOD, **megatron}}, "run.toml")


def _prep(nodes: int = 2, **megatron: Any) -> Any:
    return prepare(_run(nodes, **megatron), SITE, RenderOptions(), "/runs/t")


def _blocker(backend: FakeBackend, nodes: int = 16) -> str:
    return backend.submit(f"#!/bin/bash\n#SBATCH --nodes={nodes}\nsleep 1000\n")


def test_token_is_deterministic_and_tracks_the_script() -> None:
    a, b, c = _prep(), _prep(), _prep(train_iters=11)
    assert a.token == b.token and a.script == b.script
    assert c.token != a.token
    assert f'\\"token\\":\\"{a.token}\\"' in a.script  # inside the #SBATCH --comment


def test_submit_stores_script_and_marker() -> None:
    be = FakeBackend()
    runner = FakeRunner(be)
    prep = _prep()
    res = submit(prep, runner, be)
    assert res.job_ids == ["1"] and not res.reused
    assert runner.files["/runs/t/t.sbatch"] == prep.script
    assert "/runs/t/logs/.keep" in runner.files
    marker = json.loads(runner.files[f"/runs/t/{MARKER}"])
    assert marker == {"token": prep.token, "state": "submitted", "script": "/runs/t/t.sbatch",
                      "job_ids": ["1"]}


def test_retry_reuses_the_queued_job() -> None:
    be = FakeBackend()
    _blocker(be)  # keeps our job pending, so it is alive when we retry
    runner = FakeRunner(be)
    first = submit(_prep(), runner, be)
    again = submit(_prep(), runner, be)
    assert again.reused and again.job_ids == first.job_ids
    assert sorted(be.status(["1", "2", "3"])) == ["1", "2"]  # nothing new queued
    forced = submit(_prep(), runner, be, force=True)
    assert forced.job_ids == ["3"] and not forced.reused


def test_finished_job_does_not_block_a_new_submission() -> None:
    be = FakeBackend()
    runner = FakeRunner(be)
    first = submit(_prep(), runner, be)
    assert be.status(first.job_ids)[first.job_ids[0]].state.is_terminal
    again = submit(_prep(), runner, be)
    assert not again.reused and again.job_ids == ["2"]


def test_lost_marker_update_adopts_job_found_by_token() -> None:
    be = FakeBackend()
    _blocker(be)
    prep = _prep()
    be.submit(_prep(train_iters=11).script)  # same name, another script: not ours
    jid = be.submit(prep.script)  # queued, but the client died before writing the job id
    runner = FakeRunner(be)
    runner.files[f"/runs/t/{MARKER}"] = json.dumps(
        {"token": prep.token, "state": "submitting", "job_ids": []})
    res = submit(prep, runner, be)
    assert res.reused and res.job_ids == [jid]


def test_slurm_is_asked_through_the_backend_only() -> None:
    # The runner stores and reads the run directory's files; sbatch, squeue and scontrol are
    # the backend's (here the FakeBackend, which runs nothing through the runner).
    be = FakeBackend()
    _blocker(be)
    runner = FakeRunner(be)
    prep = _prep()
    assert submit(prep, runner, be).job_ids == ["2"]
    # as if the client died between sbatch and the marker update: found by its token
    runner.files[f"/runs/t/{MARKER}"] = json.dumps(
        {"token": prep.token, "state": "submitting", "job_ids": []})
    assert submit(prep, runner, be).job_ids == ["2"]
    assert runner.commands and {c[0] for c in runner.commands} == {"sh"}


def test_an_unreadable_marker_is_no_marker() -> None:
    be = FakeBackend()
    runner = FakeRunner(be)
    runner.files[f"/runs/t/{MARKER}"] = "{not json"
    assert submit(_prep(), runner, be).job_ids == ["1"]


def test_chain_submits_n_singleton_jobs() -> None:
    be = FakeBackend()
    _blocker(be)
    prep = prepare(_run(), SITE, RenderOptions(chain=3), "/runs/t")
    res = submit(prep, FakeRunner(be), be, chain=3)
    assert res.job_ids == ["2", "3", "4"]
    assert "#SBATCH --dependency=singleton" in prep.script


def test_invalid_plan_refused_before_anything_is_written() -> None:
    with pytest.raises(ConfigError) as info:
        prepare(_run(tensor_model_parallel_size=3), SITE, RenderOptions(), "/runs/t")
    assert info.value.exit_code == 3 and "refusing" in info.value.message


def test_plan_that_does_not_fit_memory_is_refused() -> None:
    huge = {"num_layers": 96, "hidden_size": 12288, "num_attention_heads": 96,
            "vocab_size": 50000, "seq_length": 2048, "tensor_model_parallel_size": 8}
    with pytest.raises(ConfigError) as info:
        prepare(_run(1, **huge), SITE, RenderOptions(), "/runs/t")
    assert info.value.exit_code == 3


def test_sbatch_rejection_is_a_slurm_error() -> None:
    be = FakeBackend(partitions=("other",))
    run = run_from_dict({"job": {"name": "t", "nodes": 2, "partition": "batch"},
                         "megatron": GOOD}, "run.toml")
    with pytest.raises(CommandError) as info:
        submit(prepare(run, SITE, RenderOptions(), "/runs/t"), FakeRunner(be), be)
    assert isinstance(info.value, SlurmError) and info.value.exit_code == 4


def test_wait_maps_nodes_to_sus() -> None:
    be = FakeBackend()
    runner = FakeRunner(be)
    _blocker(be, 2)  # gpu001-002 busy: our 4-node job takes gpu003-006 (su1 and su2)
    prep = prepare(_run(4, global_batch_size=32), SITE, RenderOptions(), "/runs/t")
    res = wait_for_start(be, SITE, submit(prep, runner, be), timeout_s=1, sleep=lambda s: None)
    assert res.nodes == "gpu[003-006]" and res.sus == ["su1", "su2"]
    assert res.min_sus == 1  # the FakeBackend ignores --switches; Slurm does not (integration)


def test_site_env_file(tmp_path: Path) -> None:
    (tmp_path / "nccl-env.toml").write_text(
        '[env]\nNCCL_IB_TIMEOUT = 22\nNCCL_TOPO_FILE = false\nMY = "a b"\n')
    assert load_site_env((tmp_path,)) == {"NCCL_IB_TIMEOUT": "22", "NCCL_TOPO_FILE": None,
                                          "MY": "a b"}
    prep = prepare(_run(), SITE, RenderOptions(template_dirs=(tmp_path,)), "/runs/t")
    assert "export NCCL_IB_TIMEOUT=22" in prep.script and "NCCL_TOPO_FILE=" not in prep.script
    (tmp_path / "nccl-env.toml").write_text("[env]\nX = [1]\n")
    with pytest.raises(ConfigError, match=r"env\.X"):
        load_site_env((tmp_path,))


def test_run_dir_resolution() -> None:
    run = _run()
    assert resolve_run_dir(run, None, "/home/u") == "/home/u/slurmpod-runs/t"
    assert resolve_run_dir(run, "/abs/x", "/home/u") == "/abs/x"
    assert resolve_run_dir(run, "rel", "/home/u") == "/home/u/rel"


# -- the CLI ---------------------------------------------------------------------------------

def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurmpod", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd, stdin=subprocess.DEVNULL)


def _write_run(path: Path, **megatron: Any) -> Path:
    mg = {**GOOD, **megatron}
    body = "\n".join(f"{k} = {json.dumps(v)}" for k, v in mg.items())
    path.write_text(f'[job]\nname = "cli"\nnodes = 2\n\n[megatron]\n{body}\n')
    return path


def test_cli_render_to_file_and_stdout(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "run.toml")
    out = tmp_path / "job.sbatch"
    cp = _cli("render", str(run), "-o", str(out), "--env", "A=b c", cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    text = out.read_text()
    assert text.startswith("#!/bin/bash\n# Generated by slurmpod")
    assert f"#SBATCH --chdir={tmp_path}/slurmpod-runs/cli" in text
    assert "export A='b c'" in text
    cp = _cli("render", str(run), "--env", "A=b c", cwd=tmp_path)
    assert cp.stdout == text
    assert subprocess.run(["bash", "-n", str(out)]).returncode == 0


@pytest.mark.parametrize(("args", "code"), [
    (("--env", "NOEQUALS"), 2),
    (("--env", "1BAD=x"), 3),
    (("--switch-wait", "soon"), 3),
    (("--site", "no-such-site"), 3),
    (("--template", "sbatch/missing.j2"), 3),
])
def test_cli_bad_input_is_one_line(tmp_path: Path, args: tuple[str, ...], code: int) -> None:
    run = _write_run(tmp_path / "run.toml")
    cp = _cli("render", str(run), *args, cwd=tmp_path)
    assert cp.returncode == code, cp.stderr
    assert cp.stderr.startswith("slurmpod: error:") and "Traceback" not in cp.stderr


def test_cli_submit_invalid_plan_exit_3_writes_nothing(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "run.toml", tensor_model_parallel_size=3)
    cp = _cli("submit", str(run), cwd=tmp_path)
    assert cp.returncode == 3 and "refusing" in cp.stderr
    assert not (tmp_path / "slurmpod-runs").exists()


def test_cli_dry_run_json(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "run.toml")
    cp = _cli("submit", str(run), "--dry-run", "--json", cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["dry_run"] is True and doc["job_id"] is None
    assert doc["script"] == f"{tmp_path}/slurmpod-runs/cli/cli.sbatch"
    assert doc["script_text"].startswith("#!/bin/bash")
    assert not (tmp_path / "slurmpod-runs").exists()
