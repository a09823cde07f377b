"""Load TOML files into validated models; every problem becomes one ConfigError line.

The line names the file, the key path (`su_groups[1].nodes_per_rack`) and the fix, as DESIGN.md
asks. msgspec (the validator, see `slurmpod.model.strict`) is imported here, never at CLI
start-up.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from slurmpod.errors import ConfigError

if TYPE_CHECKING:
    from slurmpod.model.site import Site
    from slurmpod.model.strict import Strict

S = TypeVar("S", bound="Strict")

PACKAGE_DIR = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """`templates` or `site_configs`: inside the wheel, or at the source tree's top level."""
    inside = PACKAGE_DIR / name
    return inside if inside.is_dir() else PACKAGE_DIR.parent / name


def builtin_site_path(name: str) -> Path:
    return data_dir("site_configs") / f"{name}.toml"


def read_input(path: Path,
               not_found_hint: str = "check the path, or run from the directory holding it",
               ) -> bytes:
    """A user-named input file's bytes; a missing or unreadable one is a one-line ConfigError."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise ConfigError("file not found", file=str(path), hint=not_found_hint) from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", file=str(path)) from None


def read_toml(path: Path) -> dict[str, Any]:
    raw = read_input(path)
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError("not UTF-8 text; save the file as UTF-8", file=str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"malformed TOML: {exc}; fix the syntax there", file=str(path)) from None


def validate(model: type[S], data: Any, file: str) -> S:
    """Validate `data` against `model`, raising ConfigError for the first problem."""
    import msgspec  # lazy: start-up (msgspec only when used)

    try:
        return msgspec.convert(data, model)
    except msgspec.ValidationError as exc:
        from slurmpod.model.explain import explain  # lazy: start-up

        msg, key = explain(str(exc), model, data)
        raise ConfigError(msg, file=file, key=key or None) from None


def load_site(path: Path | str) -> Site:
    """Read, validate and resolve a site file (its inventory is built here, so naming clashes
    surface as config errors too)."""
    from slurmpod.model.site import Site  # lazy: start-up

    path = Path(path)
    site = validate(Site, read_toml(path), str(path))
    try:
        _ = site.inventory
    except ValueError as exc:
        head, sep, rest = str(exc).partition(": ")
        raise ConfigError(rest if sep else str(exc), file=str(path),
                          key=head if sep else None) from None
    return site


DEFAULT_SITE = "dgx-h100-superpod"
SITE_ENV = "SLURMPOD_SITE"


def resolve_site_path(site: str | None, default: str = DEFAULT_SITE) -> Path:
    """A path, or the name of a built-in site (`dgx-h100-superpod`, `sandbox`, …).

    Without one, `$SLURMPOD_SITE` (set by `slurmpod sandbox env` to the sandbox's measured site),
    else the built-in `default`.
    """
    if site is None:
        site = os.environ.get(SITE_ENV) or None
    if site is None:
        return builtin_site_path(default)
    p = Path(site)
    if p.exists() or p.suffix == ".toml" or "/" in site:
        return p
    builtin = builtin_site_path(site)
    if builtin.exists():
        return builtin
    known = sorted(f.stem for f in data_dir("site_configs").glob("*.toml"))
    raise ConfigError(f"no such site file or built-in site {site!r}",
                      hint=f"built-in sites: {', '.join(known)}")
