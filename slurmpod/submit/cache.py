"""The prepared-script cache: a repeat `render`/`submit` of the same inputs reuses the script.

A local submit or render of inputs it has prepared before (same run spec, site file, template
files, options, working directory and slurmpod/Jinja/msgspec code) reuses the stored script
from ~/.cache/slurmpod/prepared: validating, planning and rendering cost a fresh process ~0.1 s
of CPU (Jinja's import and template compilation are most of it), which the cache saves. Only
prepared (valid, fitting) runs are stored, so every refusal is computed afresh. Safe to delete.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from slurmpod import __version__
from slurmpod.submit.prepare import Prepared, Rendered, token_matches

CACHE_FORMAT = 2  # 2: warnings, time limit and partition kept with the script
CACHE_KEEP = 64  # entries kept; the oldest go first
# Code whose change can change a rendered script (besides slurmpod itself and its templates).
_LIBRARIES = ("jinja2", "markupsafe", "msgspec")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "slurmpod" / "prepared"


def _stamp_tree(h: Any, root: Path) -> None:
    """Path, size and mtime of every file below `root` (not compiled bytecode)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            st = os.stat(os.path.join(dirpath, name))
            h.update(f"{dirpath}/{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())


def prepared_key(run_path: Path, site_path: Path, template_dirs: Sequence[Path],
                 choices: Mapping[str, Any], base: str) -> str | None:
    """The cache key of a local prepare: run spec and site file contents, every template file,
    the command-line choices, the working directory, and the code that renders. None when an
    input cannot be read (the uncached path then reports it properly)."""

    from slurmpod.config import PACKAGE_DIR, data_dir  # lazy: start-up

    h = hashlib.sha256()
    try:
        head = [CACHE_FORMAT, __version__, sys.version, str(site_path), base, dict(choices)]
        h.update(json.dumps(head, sort_keys=True, default=str).encode())
        for f in (run_path, site_path):
            data = f.read_bytes()
            h.update(f"\0{len(data)}\0".encode() + data)
        # The site's calibration (perf.store.store_path) sets the predicted iteration time
        # behind the derived --save-interval.
        calib = site_path.with_name(site_path.stem + ".perf.toml")
        data = calib.read_bytes() if calib.is_file() else b""
        h.update(f"\0{len(data)}\0".encode() + data)
        for root in (PACKAGE_DIR, data_dir("templates"), *template_dirs):
            _stamp_tree(h, Path(root))
        for lib in _LIBRARIES:
            spec = find_spec(lib)
            origin = spec.origin if spec is not None else None
            st = os.stat(origin) if origin else None
            h.update(f"{lib}\0{origin}\0{st and st.st_size}\0{st and st.st_mtime_ns}".encode())
    except (OSError, ValueError):
        return None
    return h.hexdigest()


def cache_load(key: str) -> Rendered | None:
    """The stored preparation for `key`, or None (missing, unreadable, or not ours)."""
    try:
        data = json.loads((cache_dir() / f"{key}.json").read_text(encoding="utf-8"))
        r = Rendered(name=data["name"], run_dir=data["run_dir"], script=data["script"],
                     token=data["token"], min_sus=data["min_sus"],
                     warnings=tuple(data["warnings"]), time_limit=data["time_limit"],
                     partition=data["partition"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    ok = (all(isinstance(v, str) for v in (r.name, r.run_dir, r.script, r.token, r.time_limit,
                                           *r.warnings))
          and isinstance(r.partition, str | None)
          and isinstance(r.min_sus, int) and token_matches(r.script, r.token))
    return r if ok else None


def cache_store(key: str, prep: Prepared) -> None:
    """Keep `prep` for the next identical prepare; any failure only means no cache."""
    from slurmpod.fsutil import write_atomic  # lazy: start-up

    d = cache_dir()
    r = Rendered.of(prep)
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(d / f"{key}.json", json.dumps(r.__dict__), mode=0o600)
        entries = sorted(d.glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
        for old in entries[:-CACHE_KEEP]:
            old.unlink(missing_ok=True)
    except OSError:
        pass
