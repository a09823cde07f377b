"""The job script's resilience helpers (`python -m slurmpod.resilience.shedding`, `.health`,
`.allreduce`): one argparse parser each, built the same way (slurmpod.resilience.stepargs), that
takes every flag the job script template and docs/resilience-in-job.md pass, and that starts
without click or slurmpod's CLI."""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from slurmpod.resilience import allreduce, health, shedding, stepargs

ROOT = Path(__file__).parents[3]
TEMPLATE = ROOT / "templates" / "sbatch" / "megatron-base.sbatch.j2"
ENTRY_POINTS = {"shedding": shedding, "health": health, "allreduce": allreduce}


def _parser_constructions(module: ModuleType) -> int:
    tree = ast.parse(Path(str(module.__file__)).read_text(encoding="utf-8"))
    return sum(1 for n in ast.walk(tree) if isinstance(n, ast.Call)
               and getattr(n.func, "attr", getattr(n.func, "id", None)) == "ArgumentParser")


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_one_parser_per_entry_point_built_by_stepargs(name: str) -> None:
    module = ENTRY_POINTS[name]
    assert _parser_constructions(module) == 0  # no parser of its own ...
    p = module.build_parser()  # ... but the one stepargs builds, named as the script calls it
    assert p.prog == f"python -m slurmpod.resilience.{name}"
    assert _parser_constructions(stepargs) == 1


def _invocations(text: str, start: str) -> list[str]:
    """Each command line beginning with `start`, continuation lines joined."""
    out = []
    for m in re.finditer(re.escape(start), text):
        end = m.end()
        while True:
            nl = text.find("\n", end)
            if nl < 0 or not text[:nl].rstrip().endswith("\\"):
                break
            end = nl + 1
        out.append(text[m.start(): nl if nl >= 0 else len(text)])
    return out


def _options(p: argparse.ArgumentParser, sub: str | None = None) -> set[str]:
    if sub is not None:
        action = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
        p = action.choices[sub]
    return set(p._option_string_actions)


def test_every_flag_the_job_script_passes_is_known() -> None:
    text = TEMPLATE.read_text(encoding="utf-8")
    calls = {name: _invocations(text, f"-m slurmpod.resilience.{name}")
             for name in ("shedding", "health")}
    calls["shedding"] += _invocations(text, "  shed_nodes --")  # shed_nodes ARGS -> "$@"
    docs = (ROOT / "docs" / "resilience-in-job.md").read_text(encoding="utf-8")
    gate = _invocations(docs, "-m slurmpod.resilience.allreduce gate")
    assert len(calls["shedding"]) >= 3 and calls["health"] and gate
    for name, lines in calls.items():
        known = _options(ENTRY_POINTS[name].build_parser())
        for line in lines:
            flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", line))
            assert flags and flags <= known, (name, flags - known)
    for line in gate:
        flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", line))
        assert flags <= _options(allreduce.build_parser(), "gate"), flags


def test_the_job_scripts_forms_parse_to_the_values_used() -> None:
    a = shedding.build_parser().parse_args(
        ["--list", "--job-id", "7", "--attempt", "1", "--attempts", "a.jsonl"])
    assert (a.list, a.nodes, a.attempt) == (True, "", 1)
    a = shedding.build_parser().parse_args(
        ["--job-id", "7", "--attempts", "a", "--spares", "2", "--fraction", "0.05",
         "--partition", "", "--drain", "--attempt", "3", "--nodes", "g1,g2", "--health", "h1",
         "--health", "h2"])
    assert (a.spares, a.fraction, a.partition, a.drain) == (2, 0.05, "", True)
    assert (a.attempt, a.health) == (3, ["h1", "h2"])
    a = health.build_parser().parse_args(
        ["--job-id", "7", "--attempt", "2", "--attempts", "a", "--nodes", "g1,g2",
         "--output", "o", "--duration-s", "1234e-3"])  # the script's `$(( ns / 10^6 ))e-3`
    assert (a.job_id, a.attempt, a.nodes, a.duration_s) == ("7", 2, "g1,g2", 1.234)
    a = allreduce.build_parser().parse_args(["peer", "--rendezvous", "r"])
    assert (a.cmd, a.bytes, a.iters) == ("peer", allreduce.LOOPBACK_BYTES, allreduce.DEFAULT_ITERS)


@pytest.mark.parametrize(("name", "argv"), [
    ("health", ["--job-id", "7", "--attempt", "2", "--attempts", "a", "--output", "o"]),
    ("shedding", ["--job-id", "7", "--attempts", "a"]),
    ("allreduce", ["gate", "--nodes", "a,b"])])
def test_a_missing_argument_is_one_usage_error(name, argv, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        ENTRY_POINTS[name].main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "the following arguments are required" in err


def test_node_list_drops_empty_items() -> None:
    assert stepargs.node_list("") == []
    assert stepargs.node_list("gpu001,,gpu002,") == ["gpu001", "gpu002"]


def test_they_start_without_click_or_slurmpods_cli(tmp_path: Path) -> None:
    rec = tmp_path / "attempts.jsonl"
    rec.write_text(shedding.record("7", 1, "gpu002", "srun: task 3 Killed", "excluded"))
    code = ("import sys\n"
            "from slurmpod.resilience import allreduce, health, shedding\n"
            f"shedding.main(['--list', '--job-id', '7', '--attempt', '1', '--attempts', "
            f"{str(rec)!r}])\n"
            "print(sorted(m for m in sys.modules if m == 'click' or m.startswith("
            "('click.', 'slurmpod.cli'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=tmp_path).stdout
    assert out.splitlines() == ["gpu002", "[]"]
