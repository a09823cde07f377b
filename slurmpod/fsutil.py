"""Atomic file output: a failed run never leaves a half-written artefact."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from slurmpod.errors import OutputError

WRITE_HINT = "check the path, the directory's permissions and free space"


def output_error(path: Path | str, exc: OSError) -> OutputError:
    """The one-line error (exit 73) for an output that cannot be written."""
    return OutputError(f"cannot write {path}: {exc.strerror or exc}", hint=WRITE_HINT)


def check_writable_dir(path: Path) -> None:
    """Raise OutputError unless `path` is (or could be created as) a writable directory.

    For dry runs, which must not create anything: the nearest existing ancestor gets an
    anonymous temp file (O_TMPFILE where the kernel has it, so no name appears). A probe, not
    os.access: root passes access() on /proc and read-only mounts, yet cannot write there."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise OutputError(f"cannot write {path}: {probe} is not a directory", hint=WRITE_HINT)
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        raise output_error(path, exc) from None


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write `text` to `path` via a temp file in the same directory and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_tree_atomic(out_dir: Path, files: Mapping[str, str]) -> list[Path]:
    """Write a set of relative paths -> text, all or nothing.

    Everything is first rendered into a staging directory next to `out_dir`; only when every file
    is written are they moved into place, so an error leaves `out_dir` as it was.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.stage."))
    try:
        for rel, text in files.items():
            target = stage / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        written = []
        for rel in files:
            final = out_dir / rel
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(stage / rel, final)
            written.append(final)
        return written
    finally:
        shutil.rmtree(stage, ignore_errors=True)
