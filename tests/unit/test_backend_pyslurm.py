"""The pyslurm backend refuses a missing or mismatched pyslurm with one clear SlurmError."""

from __future__ import annotations

import sys
import types

import pytest

from slurmpod.backends.pyslurm_backend import PyslurmBackend, load_pyslurm
from slurmpod.errors import SlurmError


def fake_module(version: str) -> types.ModuleType:
    mod = types.ModuleType("pyslurm")
    mod.__version__ = version  # type: ignore[attr-defined]
    return mod


def test_missing_pyslurm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", None)  # import raises ImportError
    with pytest.raises(SlurmError, match="needs the pyslurm package") as exc:
        load_pyslurm("22.05.8")
    assert "--backend cli" in exc.value.hint and exc.value.exit_code == 4


@pytest.mark.parametrize("have", ["25.11.2", "23.2.0", "garbage"])
def test_version_mismatch(monkeypatch: pytest.MonkeyPatch, have: str) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", fake_module(have))
    with pytest.raises(SlurmError, match=f"pyslurm {have} does not match the running Slurm"):
        load_pyslurm("22.05.8")


@pytest.mark.parametrize("have", ["22.5.3", "17.11.0.1"])
def test_old_pyslurm_api_refused(monkeypatch: pytest.MonkeyPatch, have: str) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", fake_module(have))
    with pytest.raises(SlurmError, match="predates the object API"):
        load_pyslurm("22.05.8")


def test_matching_version_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = fake_module("24.11.0")
    monkeypatch.setitem(sys.modules, "pyslurm", mod)
    assert load_pyslurm("24.11.1") is mod
    assert PyslurmBackend("24.11.1").version() == "24.11.1"


def test_submit_refuses_extra_args() -> None:
    backend = PyslurmBackend("24.11.1", module=fake_module("24.11.0"))
    with pytest.raises(SlurmError, match="#SBATCH"):
        backend.submit("#!/bin/bash\n", args=["-N", "2"])
