"""Containers for pyxis/enroot: the image reference enroot imports and the mounts a run needs.

Pure functions from `[job]` values and the paths slurmpod decides (run dir, checkpoint dir, …)
to what `srun --container-*` gets. slurmpod's rule for paths: **one path, both sides**. The
batch script runs on the host and reads the run dir, its logs and the checkpoint dir there
(resume, `training_done`); the trainer runs in the container and writes the same directories.
So every such path is mounted at the same path, unless a user mount already maps it to itself
(`/lustre:/lustre` covers `/lustre/ckpt/gpt`); a user mount that puts something else at that
path (`/lustre/ckpt:/ckpt` with `checkpoint_dir = "/ckpt/gpt"`) is refused, because host and
trainer would see two different directories. The data dir only the trainer reads: any mount
may hold it (`/lustre/data:/data` with `data_dir = "/data/c4"`).
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from slurmpod.errors import ConfigError
from slurmpod.render.launch import Container

if TYPE_CHECKING:
    from slurmpod.megatron.runspec import JobSpec

IMAGE_KEY = "job.container_image"
IMAGE_HINT = ("use REGISTRY/IMAGE:TAG (nvcr.io/nvidia/pytorch:24.12-py3), REGISTRY#IMAGE:TAG, "
              "IMAGE:TAG (Docker Hub) or an absolute path to a squashfs file (/images/x.sqsh)")

# The docker reference grammar (distribution/reference), as enroot 3.x matches it in
# src/docker.sh: repository path components are lower case; tags up to 128 characters.
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPO = re.compile(rf"^{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"@(sha256:[A-Fa-f0-9]{64})$")
_REGISTRY = re.compile(r"^(?:localhost|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)(?::\d{1,5})?$")
# enroot 3.x accepts these in `USER@` (docker.sh reg_user), e.g. NGC's `$oauthtoken@nvcr.io#…`.
_USER = re.compile(r"^[A-Za-z0-9_.!~*'()%;&=+$-]+$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _bad_image(ref: str, why: str) -> ConfigError:
    return ConfigError(f"{ref!r} is not an image reference enroot can import: {why}",
                       key=IMAGE_KEY, hint=IMAGE_HINT)


def normalize_image(ref: str) -> str:
    """A `[job] container_image` as pyxis hands it to enroot (`docker://` + this).

    enroot before 4.0 reads `docker://[USER@][REGISTRY#]IMAGE[:TAG]` only: a registry must be
    set off with `#`, or `nvcr.io/nvidia/pytorch` is taken for a Docker Hub repository named
    `nvcr.io/nvidia/pytorch` and the import fails. So `registry/path:tag` becomes
    `registry#path:tag` when the first component is a registry host (holds `.` or `:`, or is
    `localhost`, Docker's own rule); the `#` form, Docker Hub names and squashfs paths are kept.
    Digests (`@sha256:…`) are kept too; enroot reads them from 4.0 on. `dockerd://` (the local
    Docker daemon) is passed as is; a `docker://` prefix is dropped (pyxis adds it back).
    """
    text = ref.strip()
    if not text:
        raise _bad_image(ref, "it is empty")
    if _CONTROL.search(text) or any(c.isspace() for c in text) or "," in text:
        raise _bad_image(ref, "it holds whitespace, a comma or a control character")
    if text.startswith(("/", "./", "../")):
        # A squashfs file (pyxis: "a path to a squashfs file on the remote host filesystem").
        return text
    if text.startswith("dockerd://"):
        if not _REPO.match(text[len("dockerd://"):].split(":", 1)[0]):
            raise _bad_image(ref, "the name after dockerd:// is not a Docker image name")
        return text
    if text.startswith("docker://"):
        text = text[len("docker://"):]
    elif "://" in text:
        raise _bad_image(ref, "pyxis imports docker:// and dockerd:// images only")
    user = ""
    at = text.find("@")
    if at > 0 and not text[at + 1:].startswith("sha256:") and not re.search(r"[/#]", text[:at]):
        user, text = text[:at], text[at + 1:]
        if not _USER.match(user):
            raise _bad_image(ref, f"user {user!r} holds characters enroot does not accept")
    digest = ""
    m = _DIGEST.search(text)
    if m:
        digest, text = m.group(1), text[:m.start()]
    if "@" in text:
        raise _bad_image(ref, "a digest is @sha256: and 64 hex digits")
    if text.count("#") > 1:
        raise _bad_image(ref, "it holds more than one '#'")
    registry = ""
    if "#" in text:
        registry, text = text.split("#")
        if not registry:
            raise _bad_image(ref, "nothing before '#' (the registry)")
    else:
        first, sep, rest = text.partition("/")
        if sep and ("." in first or ":" in first or first == "localhost"):
            registry, text = first, rest
    if registry and not _REGISTRY.match(registry):
        raise _bad_image(ref, f"registry {registry!r} is not a host name with an optional :port")
    repo, tag = text, ""
    colon = text.rfind(":")
    if colon > text.rfind("/"):
        repo, tag = text[:colon], text[colon + 1:]
        if not _TAG.match(tag):
            raise _bad_image(ref, f"tag {tag!r} is not a Docker tag ([A-Za-z0-9_.-], ≤ 128)")
    if not _REPO.match(repo):
        why = ("image names are lower case" if _REPO.match(repo.lower())
               else f"{repo!r} is not a repository path (a-z 0-9 . _ - separated by /)")
        raise _bad_image(ref, why)
    return (f"{user + '@' if user else ''}{registry + '#' if registry else ''}{repo}"
            f"{':' + tag if tag else ''}{'@' + digest if digest else ''}")


def default_name(job_name: str, image: str) -> str:
    """`--container-name` when the run spec names none: the job name plus a short hash of the
    image. pyxis (args.c, 0.9+) names the container `pyxis_<job id>_<name>` with the site's
    `container_scope=job` and removes it in the job epilog, so the steps of one allocation
    (the hot-spare relaunches) reuse it and a requeued attempt imports afresh; with the
    default `container_scope=global` it is `pyxis_<name>` and stays on the node, and the hash
    keeps a later job of the same name but another image from starting the old container."""
    return f"{job_name}-{hashlib.sha256(image.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class Mount:
    """One pyxis mount, `SRC:DST[:FLAGS]` with FLAGS joined by `+` (pyxis args.c)."""

    src: str
    dst: str
    flags: tuple[str, ...] = ()

    @property
    def spec(self) -> str:
        return f"{self.src}:{self.dst}" + (":" + "+".join(self.flags) if self.flags else "")

    @property
    def readonly(self) -> bool:
        return "ro" in self.flags

    def holds(self, path: str) -> bool:
        """True when `path` (in the container) is at or below this mount's destination."""
        return path == self.dst or path.startswith(self.dst.rstrip("/") + "/")

    def host_path(self, path: str) -> str | None:
        """The host path the container sees at `path` (None for tmpfs/umount sources)."""
        if not self.src.startswith("/"):
            return None
        return posixpath.normpath(self.src + path[len(self.dst):]) if self.dst != "/" \
            else posixpath.normpath(self.src + "/" + path)


# pyxis splits --container-mounts at ',' and ':' and writes `SRC DST FLAGS` into an enroot
# fstab line (args.c add_mount), which getmntent splits at whitespace and unescapes at '\':
# a mounted path cannot hold any of these.
_MOUNT_UNSAFE = re.compile(r"[\s,:\\\x00-\x1f\x7f]")
_FLAG = re.compile(r"^[a-z][a-z0-9_-]*(=[A-Za-z0-9_.-]+)?$")


def _mount_key(index: int) -> str:
    return f"job.container_mounts[{index}]"


def parse_mount(text: str, index: int) -> Mount:
    """`SRC[:DST[:FLAGS]]` (pyxis ≥ 0.6 takes `SRC` alone for `SRC:SRC`); absolute paths, or the
    pyxis sources `tmpfs` and `umount`; FLAGS are enroot mount options joined by `+`."""
    key = _mount_key(index)
    fix = "write SRC:DST or SRC:DST:FLAGS with absolute paths, e.g. /lustre/data:/data:ro"
    if not text or any(c.isspace() or c in ",\\" or _CONTROL.match(c) for c in text):
        raise ConfigError(f"{text!r} is empty or holds whitespace, ',' or '\\', which pyxis "
                          f"cannot carry; {fix}", key=key)
    parts = text.split(":")
    if len(parts) > 3 or any(p == "" for p in parts[:2]):
        raise ConfigError(f"{text!r} is not SRC[:DST[:FLAGS]]; {fix}", key=key)
    src = parts[0]
    dst = parts[1] if len(parts) > 1 else src
    flags = tuple(parts[2].split("+")) if len(parts) == 3 and parts[2] else ()
    if src not in ("tmpfs", "umount"):
        if not src.startswith("/"):
            raise ConfigError(f"source {src!r} is not an absolute path (a relative one would "
                              f"depend on the step's working directory); {fix}", key=key)
        src = posixpath.normpath(src)
    if not dst.startswith("/"):
        raise ConfigError(f"destination {dst!r} is not an absolute path; {fix}", key=key)
    bad = [f for f in flags if not _FLAG.match(f)]
    if bad:
        raise ConfigError(f"mount flag {bad[0]!r} is not an enroot mount option (ro, rw, "
                          f"rprivate, …); {fix}", key=key)
    return Mount(src, posixpath.normpath(dst), flags)


@dataclass(frozen=True)
class RunPath:
    """A path slurmpod hands the trainer: its `[job]` key (for errors), the absolute path,
    whether the trainer writes there, and whether the batch script uses it on the host too
    (then host and container must agree on it; the data dir is the trainer's alone)."""

    key: str
    path: str
    writable: bool = False
    host_too: bool = True


def check_plain_path(path: str, key: str) -> None:
    if _CONTROL.search(path):
        raise ConfigError(f"{path!r} holds a newline or control character; a container run "
                          "passes it to every rank in one line per path: rename it", key=key)


def plan_mounts(user_mounts: Sequence[str], paths: Sequence[RunPath],
                topo_dir: str | None = None) -> tuple[Mount, ...]:
    """The `--container-mounts` of a run: the user's, then each path mounted at the same path
    where no mount covers it yet, the NCCL topology directory read-only; deduplicated and
    ordered parents first (enroot mounts in order: a parent mounted later would hide a child).

    Raises ConfigError (one line) for a path that a user mount maps to another host directory,
    a writable path under a read-only mount, or two mounts on one destination."""
    mounts = [parse_mount(m, i) for i, m in enumerate(user_mounts)]
    seen: dict[str, Mount] = {}
    for i, m in enumerate(mounts):
        other = seen.get(m.dst)
        if other is not None and other != m:
            raise ConfigError(f"{m.spec!r} and {other.spec!r} both mount on {m.dst}; the later "
                              "one would hide the earlier: keep one", key=_mount_key(i))
        seen[m.dst] = m
    unique = list(dict.fromkeys(mounts))
    added: list[Mount] = []
    wanted = [*paths]
    if topo_dir:
        # Read-only, and `nofail` (enroot-mount.c, enroot ≥ 1.0): a site without the file must
        # not fail the step; the script unsets NCCL_TOPO_FILE where it is not readable.
        wanted.append(RunPath("topo_dir", posixpath.normpath(topo_dir)))
    for rp in sorted(wanted, key=lambda r: r.path.count("/")):
        covering = [m for m in (*unique, *added) if m.holds(rp.path)]
        if covering:
            m = max(covering, key=lambda m: len(m.dst))
            host = m.host_path(rp.path)
            if host != rp.path and (rp.host_too or host is None):
                if host is None:
                    raise ConfigError(f"{rp.path} is inside the {m.src} mount {m.spec!r}, which "
                                      "the job's end discards; mount a host directory there",
                                      key=rp.key)
                raise ConfigError(
                    f"{rp.path} is inside container mount {m.spec!r}, so the trainer would see "
                    f"host {host} there, while the batch script uses {rp.path} on the host; give "
                    "the host path (slurmpod mounts it at the same path) or mount it at the "
                    "same path (SRC:SRC)", key=rp.key)
            if rp.writable and m.readonly:
                raise ConfigError(f"{rp.path} is written by the trainer but inside read-only "
                                  f"mount {m.spec!r}; drop `ro` or move the directory",
                                  key=rp.key)
            continue
        if _MOUNT_UNSAFE.search(rp.path):
            raise ConfigError(f"{rp.path!r} must be mounted into the container, but pyxis cannot "
                              "mount a path holding whitespace, ',', ':' or '\\'; rename it or "
                              "mount a parent directory at the same path in container_mounts",
                              key=rp.key)
        flags = ("ro", "nofail") if rp.key == "topo_dir" else ()
        added.append(Mount(rp.path, rp.path, flags))
    return tuple(sorted([*unique, *added], key=lambda m: m.dst.rstrip("/").count("/")))


@dataclass(frozen=True)
class ContainerRun:
    """What a container run renders: the pyxis options, the checkpoint dir as the trainer and
    the batch script both use it (absolute), and the directories the rank wrapper creates."""

    container: Container
    checkpoint_dir: str
    trainer_dirs: tuple[str, ...]


def container_run(job: JobSpec, *, run_dir: str, log_dir: str, checkpoint_dir: str,
                  topo_dir: str | None) -> ContainerRun:
    """Decide a container run's pyxis options from `[job]` and the paths slurmpod chose.

    The run dir must be absolute: pyxis needs absolute mount sources, and `slurmpod render`
    and `submit` resolve it from the current directory (or the remote home) already. A relative
    checkpoint or data dir is taken from the run dir, the batch shell's working directory."""
    if not run_dir.startswith("/"):
        raise ConfigError(f"run dir {run_dir!r} is relative; a container run mounts it by its "
                          "absolute path: set [job] work_dir or --run-dir to an absolute path",
                          key="job.work_dir")

    def absolute(path: str) -> str:
        return posixpath.normpath(posixpath.join(run_dir, path))

    ckpt = absolute(checkpoint_dir)
    paths = [RunPath("job.work_dir", run_dir, writable=False),
             RunPath("job.work_dir", absolute(log_dir)),
             RunPath("job.checkpoint_dir", ckpt, writable=True)]
    if job.data_dir:
        paths.append(RunPath("job.data_dir", absolute(job.data_dir), host_too=False))
    for rp in paths:
        check_plain_path(rp.path, rp.key)
    image = normalize_image(job.container_image or "")
    mounts = plan_mounts(job.container_mounts, paths, topo_dir or None)
    workdir = job.container_workdir or run_dir
    if not workdir.startswith("/") or _CONTROL.search(workdir):
        raise ConfigError(f"{workdir!r} is not an absolute path", key="job.container_workdir")
    name = job.container_name
    if name is None:
        name = default_name(job.name, image)
    return ContainerRun(
        Container(image=image, mounts=tuple(m.spec for m in mounts), workdir=workdir,
                  name=name or None, mount_home=job.container_mount_home,
                  writable=job.container_writable),
        checkpoint_dir=ckpt, trainer_dirs=(ckpt,))
