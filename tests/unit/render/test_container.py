"""Containers (pyxis/enroot): image references as enroot imports them, the mount list of a run
and the refusals (one ConfigError line, exit 3) for paths host and trainer would see apart."""

from __future__ import annotations

from typing import Any

import pytest

from slurmpod.errors import ConfigError
from slurmpod.megatron.runspec import run_from_dict
from slurmpod.render import launch
from slurmpod.render.container import (
    RunPath,
    container_run,
    default_name,
    normalize_image,
    parse_mount,
    plan_mounts,
)

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(("ref", "expected"), [
    ("nvcr.io/nvidia/pytorch:24.12-py3", "nvcr.io#nvidia/pytorch:24.12-py3"),
    ("nvcr.io#nvidia/pytorch:24.12-py3", "nvcr.io#nvidia/pytorch:24.12-py3"),
    ("docker://nvcr.io/nvidia/pytorch:24.12-py3", "nvcr.io#nvidia/pytorch:24.12-py3"),
    ("$oauthtoken@nvcr.io/nvidia/nemo:25.02", "$oauthtoken@nvcr.io#nvidia/nemo:25.02"),
    ("registry.example.com:5000/team/img", "registry.example.com:5000#team/img"),
    ("localhost:5000/img:dev", "localhost:5000#img:dev"),
    ("localhost/img:dev", "localhost#img:dev"),
    ("ubuntu", "ubuntu"),
    ("ubuntu:24.04", "ubuntu:24.04"),
    ("nvidia/cuda:12.6.0-devel-ubuntu22.04", "nvidia/cuda:12.6.0-devel-ubuntu22.04"),
    (f"nvcr.io/nvidia/pytorch@{DIGEST}", f"nvcr.io#nvidia/pytorch@{DIGEST}"),
    (f"nvcr.io/nvidia/pytorch:24.12-py3@{DIGEST}", f"nvcr.io#nvidia/pytorch:24.12-py3@{DIGEST}"),
    ("/lustre/images/pytorch-24.12.sqsh", "/lustre/images/pytorch-24.12.sqsh"),
    ("./images/x.sqsh", "./images/x.sqsh"),
    ("dockerd://my-local:dev", "dockerd://my-local:dev"),
    ("  nvcr.io/nvidia/pytorch:24.12-py3 ", "nvcr.io#nvidia/pytorch:24.12-py3"),
])
def test_image_normalised_for_enroot(ref: str, expected: str) -> None:
    assert normalize_image(ref) == expected
    assert normalize_image(expected) == expected  # idempotent


@pytest.mark.parametrize(("ref", "why"), [
    ("", "empty"),
    ("nvcr.io/nvidia/py torch:1", "whitespace"),
    ("a#b#c:1", "more than one '#'"),
    ("#nvidia/pytorch:1", "registry"),
    ("nvcr.io/NVIDIA/pytorch:1", "lower case"),
    ("nvcr.io/nvidia/pytorch:bad!tag", "tag"),
    ("nvcr.io/nvidia/pytorch@sha256:abc", "digest"),
    ("https://nvcr.io/nvidia/pytorch:1", "docker:// and dockerd://"),
    ("nvcr.io/nvidia//pytorch:1", "repository path"),
    ("nvcr.io/nvidia/pytorch:1,x", "comma"),
    ("bad_host.io!#img:1", "registry"),
])
def test_malformed_image_is_one_config_error(ref: str, why: str) -> None:
    with pytest.raises(ConfigError) as exc:
        normalize_image(ref)
    assert exc.value.exit_code == 3 and exc.value.key == "job.container_image"
    assert why in str(exc.value) and "\n" not in str(exc.value)
    assert exc.value.hint and "nvcr.io/nvidia/pytorch:24.12-py3" in exc.value.hint


def test_default_name_is_stable_per_job_and_image() -> None:
    a = default_name("llama", "nvcr.io#nvidia/pytorch:24.12-py3")
    assert a == default_name("llama", "nvcr.io#nvidia/pytorch:24.12-py3")
    assert a.startswith("llama-") and len(a) == len("llama-") + 8
    assert a != default_name("llama", "nvcr.io#nvidia/pytorch:25.01-py3")


@pytest.mark.parametrize(("text", "spec"), [
    ("/lustre:/lustre", "/lustre:/lustre"),
    ("/lustre/data:/data:ro", "/lustre/data:/data:ro"),
    ("/tmp:/mnt:unbindable+ro", "/tmp:/mnt:unbindable+ro"),
    ("/var/lib", "/var/lib:/var/lib"),  # pyxis short form
    ("/a/./b/:/c/", "/a/b:/c"),
    ("tmpfs:/scratch", "tmpfs:/scratch"),
])
def test_mount_forms(text: str, spec: str) -> None:
    assert parse_mount(text, 0).spec == spec


@pytest.mark.parametrize("text", ["", "data:/data", "/a:b", "/a::ro", "/a:/b:ro:x", "/a b:/b",
                                  "/a:/b:RO", "/a,/b", "/a:/b:ro+", "/a\n:/b"])
def test_bad_mounts_refused(text: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_mount(text, 2)
    assert exc.value.key == "job.container_mounts[2]" and "\n" not in exc.value.message


RUN = "/lustre/runs/gpt"


def _paths(ckpt: str = f"{RUN}/checkpoints", data: str | None = None) -> list[RunPath]:
    out = [RunPath("job.work_dir", RUN), RunPath("job.work_dir", f"{RUN}/logs"),
           RunPath("job.checkpoint_dir", ckpt, writable=True)]
    return out + ([RunPath("job.data_dir", data, host_too=False)] if data else [])


@pytest.mark.parametrize(("user", "paths", "topo", "expected"), [
    # nothing given: the run dir (holding logs and checkpoints) at the same path
    ([], _paths(), None, [f"{RUN}:{RUN}"]),
    # a same-path parent mount covers everything
    (["/lustre:/lustre"], _paths("/lustre/ckpt/gpt"), None, ["/lustre:/lustre"]),
    # checkpoint and data dirs elsewhere get their own mounts; topology read-only, nofail
    (["/home/me/data:/data"], _paths("/scratch/ckpt", "/datasets/c4"), "/etc/slurmpod/nccl-topo",
     ["/home/me/data:/data", "/scratch/ckpt:/scratch/ckpt", "/datasets/c4:/datasets/c4",
      f"{RUN}:{RUN}", "/etc/slurmpod/nccl-topo:/etc/slurmpod/nccl-topo:ro+nofail"]),
    # duplicates collapse; parents are mounted before their children
    ([f"/x:{RUN}/extra", "/lustre:/lustre", "/lustre:/lustre"], _paths(), None,
     ["/lustre:/lustre", f"/x:{RUN}/extra"]),
    # a user mount nested in the run dir is kept after the run dir's own mount
    ([f"/x:{RUN}/extra"], _paths(), None, [f"{RUN}:{RUN}", f"/x:{RUN}/extra"]),
    # the data dir is the trainer's alone: any mount may hold it
    (["/lustre/data:/data"], _paths(data="/data/c4"), None, ["/lustre/data:/data", f"{RUN}:{RUN}"]),
    # a data dir under a read-only same-path mount is fine
    (["/datasets:/datasets:ro"], _paths(data="/datasets/c4"), None,
     ["/datasets:/datasets:ro", f"{RUN}:{RUN}"]),
])
def test_mount_plan(user: list[str], paths: list[RunPath], topo: str | None,
                    expected: list[str]) -> None:
    assert [m.spec for m in plan_mounts(user, paths, topo)] == expected


@pytest.mark.parametrize(("user", "paths", "key", "words"), [
    # the docs' old example: checkpoint_dir given as the container side of a mapped mount
    (["/lustre/ckpt:/ckpt"], _paths("/ckpt/llama"), "job.checkpoint_dir",
     "host /lustre/ckpt/llama"),
    (["tmpfs:/data"], _paths(data="/data/c4"), "job.data_dir", "tmpfs mount"),
    ([f"/elsewhere:{RUN}"], _paths(), "job.work_dir", "host /elsewhere"),
    ([f"/elsewhere:{RUN}/logs"], _paths(), "job.work_dir", "/elsewhere"),
    (["tmpfs:/lustre"], _paths(), "job.work_dir", "the tmpfs mount"),
    (["/lustre:/lustre:ro"], _paths(), "job.checkpoint_dir", "read-only"),
    (["/a:/data", "/b:/data"], _paths(), "job.container_mounts[1]", "both mount on /data"),
    ([], _paths("/scratch/my ckpt"), "job.checkpoint_dir", "whitespace"),
    ([], _paths("/scratch/a:b"), "job.checkpoint_dir", "':'"),
])
def test_mount_refusals(user: list[str], paths: list[RunPath], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as exc:
        plan_mounts(user, paths)
    assert exc.value.key == key and words in exc.value.message, exc.value.message
    assert exc.value.exit_code == 3 and "\n" not in exc.value.message


def _job(**job: Any) -> Any:
    return run_from_dict({"job": {"name": "gpt", "container_image": "nvcr.io/nvidia/pytorch:1",
                                  **job},
                          "megatron": {"num_layers": 2, "hidden_size": 64,
                                       "num_attention_heads": 4, "seq_length": 32}},
                         "run.toml").job


def _crun(job: Any, run_dir: str = RUN, ckpt: str = f"{RUN}/checkpoints") -> Any:
    return container_run(job, run_dir=run_dir, log_dir=f"{run_dir}/logs", checkpoint_dir=ckpt,
                         topo_dir="")


def test_container_run_defaults() -> None:
    c = _crun(_job())
    assert c.container == launch.Container(
        image="nvcr.io#nvidia/pytorch:1", mounts=(f"{RUN}:{RUN}",), workdir=RUN,
        name=default_name("gpt", "nvcr.io#nvidia/pytorch:1"), mount_home=False, writable=None)
    assert c.trainer_dirs == (f"{RUN}/checkpoints",)


def test_container_run_options_and_relative_paths() -> None:
    job = _job(container_workdir="/opt/megatron-lm", container_name="", data_dir="data",
               container_mount_home=True, container_writable=False)
    c = _crun(job, ckpt="ckpt")
    assert c.checkpoint_dir == f"{RUN}/ckpt" and c.trainer_dirs == (f"{RUN}/ckpt",)
    assert c.container.mounts == (f"{RUN}:{RUN}",)  # data dir is under the run dir
    argv = launch.srun_argv(nodes=2, tasks_per_node=8, container=c.container, cpu_bind="none",
                            gpu_numa=[0] * 8)
    assert [a for a in argv if "container" in a] == ["--container-image=nvcr.io#nvidia/pytorch:1",
                        f"--container-mounts={RUN}:{RUN}",
                        "--container-workdir=/opt/megatron-lm",
                        "--container-mount-home", "--container-readonly"]
    writable = _crun(_job(container_writable=True)).container
    assert "--container-writable" in launch.srun_argv(
        nodes=1, tasks_per_node=8, container=writable, cpu_bind="none", gpu_numa=[0] * 8)


@pytest.mark.parametrize(("job", "run_dir", "key"), [
    ({}, "slurmpod-runs/gpt", "job.work_dir"),
    ({"container_workdir": "relative"}, RUN, "job.container_workdir"),
    ({"container_image": "nvcr.io/NVIDIA/x"}, RUN, "job.container_image"),
    ({"checkpoint_dir": "x"}, RUN, None),
])
def test_container_run_refusals(job: dict[str, Any], run_dir: str, key: str | None) -> None:
    if key is None:  # a plain relative checkpoint dir is fine: taken from the run dir
        assert _crun(_job(**job), run_dir=run_dir, ckpt="x").checkpoint_dir == f"{RUN}/x"
        return
    with pytest.raises(ConfigError) as exc:
        _crun(_job(**job), run_dir=run_dir)
    assert exc.value.key == key


def test_container_name_pattern_checked_in_run_spec() -> None:
    with pytest.raises(ConfigError, match=r"job\.container_name"):
        _job(container_name="has space")
