"""Start-up stays lean: what a command imports, and the prepared-script
cache that lets a repeated submit skip validation, planning and rendering.

Import structure, not timing: a fresh interpreter runs the command and reports which heavy
libraries ended up in sys.modules (timings live in benchmarks/submit_overhead.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import slurmpod

PACKAGE = Path(slurmpod.__file__).resolve().parent
HEAVY = ("numpy", "msgspec", "jinja2", "paramiko")

# Runs the CLI in this fresh interpreter, then reports the exit code and the heavy modules loaded.
CHILD = r"""
import json, sys
from slurmpod.cli.main import main
rc = 0
try:
    main(json.loads(sys.argv[1]))
except SystemExit as exc:
    rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
heavy = sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)
sys.stderr.write("\nSTARTUP " + json.dumps({"rc": rc, "heavy": heavy}) + "\n")
"""


def run_cli(args: list[str], cwd: Path | None = None, env: dict[str, str] | None = None,
            watch: tuple[str, ...] = HEAVY) -> tuple[int, list[str], str, str]:
    """(exit code, watched modules imported, stdout, stderr without the report line)."""
    cp = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args), json.dumps(watch)],
                        capture_output=True, text=True, timeout=120, cwd=cwd,
                        env={**os.environ, **(env or {})})
    head, sep, tail = cp.stderr.rpartition("\nSTARTUP ")
    assert sep, f"child did not report: {cp.stderr[-2000:]}"
    report = json.loads(tail)
    return report["rc"], report["heavy"], cp.stdout, head


@pytest.mark.parametrize("args", [["--help"], ["plan", "--help"], ["submit", "--help"],
                                  ["render", "--help"]])
def test_help_imports_no_heavy_library(args: list[str]) -> None:
    rc, heavy, out, _ = run_cli(args)
    assert rc == 0 and "Usage:" in out
    assert heavy == []


def test_the_child_does_see_heavy_imports() -> None:
    # The probe itself must be able to fail: planning imports msgspec (site and run spec).
    rc, heavy, out, err = run_cli(["plan", "--preset", "llama3-8b", "--nodes", "2", "--json"])
    assert rc == 0, err
    assert "msgspec" in heavy and json.loads(out)["nodes"] == 2
    # Placement is plain Python: numpy's import would be most of plan's start-up.
    assert "numpy" not in heavy and json.loads(out)["placement"]["groups"]["dp"]["size"] == 8


def test_version_imports_only_click() -> None:
    rc, loaded, out, _ = run_cli(["--version"], watch=(*HEAVY, "traceback", "slurmpod.config"))
    assert rc == 0 and "version" in out and loaded == []


def _entry(args: list[str]) -> tuple[int, bool, str]:
    """The installed command (`slurmpod.cli.entry`) in a fresh interpreter: (exit code,
    whether click was loaded, stdout)."""
    child = ("import sys; sys.argv = ['slurmpod', *sys.argv[1:]]\n"
             "from slurmpod.cli.entry import main\n"
             "try:\n    main()\nfinally:\n"
             "    sys.stderr.write('\\nCLICK ' + str('click' in sys.modules) + '\\n')\n")
    cp = subprocess.run([sys.executable, "-c", child, *args], capture_output=True, text=True,
                        timeout=120)
    _, sep, tail = cp.stderr.rpartition("\nCLICK ")
    assert sep, cp.stderr[-2000:]
    return cp.returncode, tail.strip() == "True", cp.stdout


def test_the_installed_command_answers_version_without_click_in_clicks_words() -> None:
    rc, click_loaded, out = _entry(["--version"])
    assert rc == 0 and not click_loaded
    assert out == run_cli(["--version"])[2]  # what click.version_option prints


def test_the_installed_command_hands_everything_else_to_click() -> None:
    rc, click_loaded, out = _entry(["--help"])
    assert rc == 0 and click_loaded and "Usage:" in out
    rc, click_loaded, out = _entry(["--version", "--debug"])
    assert rc == 0 and click_loaded and out == run_cli(["--version"])[2]


# Which way imports point: tests/unit/test_architecture.py (against docs/architecture.md).


# --- the prepared-script cache --------------------------------------------------------------------

RUN = """
[job]
name = "{name}"
nodes = 1
time_limit = "00:05:00"
entrypoint = "/bin/true"

[megatron]
num_layers = 4
hidden_size = 256
num_attention_heads = 8
seq_length = 128
vocab_size = 1024
tensor_model_parallel_size = {tp}
global_batch_size = 8
train_iters = 10
"""


@pytest.fixture
def work(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    (tmp_path / "run.toml").write_text(RUN.format(name="cached", tp=8))
    return tmp_path, {"XDG_CACHE_HOME": str(tmp_path / "cache")}


def _entries(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache" / "slurmpod" / "prepared").glob("*.json"))


def test_repeated_render_reuses_the_script_without_validating(work) -> None:
    tmp, env = work
    args = ["render", "run.toml", "--topo-dir", ""]
    rc1, heavy1, first, err = run_cli(args, cwd=tmp, env=env)
    assert rc1 == 0, err
    assert {"msgspec", "jinja2"} <= set(heavy1)
    assert len(_entries(tmp)) == 1
    rc2, heavy2, second, _ = run_cli(args, cwd=tmp, env=env)
    assert rc2 == 0 and second == first
    assert heavy2 == []
    # The run directory is below the cwd it was prepared in.
    assert f"#SBATCH --chdir={tmp}/slurmpod-runs/cached" in second


def test_first_render_loads_only_what_rendering_needs(work) -> None:
    # A cache miss validates, plans and renders; it never needs Slurm, SSH, accounting, reports,
    # fabric tools or numpy.
    tmp, env = work
    unneeded = ("numpy", "paramiko", "slurmpod.transport", "slurmpod.backends", "slurmpod.report",
                "slurmpod.accounting", "slurmpod.fabric", "slurmpod.sandbox", "subprocess")
    rc, loaded, out, err = run_cli(["render", "run.toml", "--topo-dir", ""], cwd=tmp, env=env,
                                   watch=(*unneeded, "msgspec", "jinja2"))
    assert rc == 0 and "#SBATCH --job-name=cached" in out, err
    assert loaded == ["jinja2", "msgspec"]


def test_changed_inputs_are_prepared_afresh(work, tmp_path: Path) -> None:
    tmp, env = work
    args = ["render", "run.toml", "--topo-dir", ""]
    first = run_cli(args, cwd=tmp, env=env)[2]
    (tmp / "run.toml").write_text(RUN.format(name="renamed", tp=8))
    rc, heavy, second, _ = run_cli(args, cwd=tmp, env=env)
    assert rc == 0 and "msgspec" in heavy
    assert "--job-name=renamed" in second and "--job-name=cached" in first
    # Another option, another working directory: other scripts, not the stored one.
    other = run_cli([*args, "--nccl-debug"], cwd=tmp, env=env)[2]
    assert "NCCL_DEBUG" in other and "NCCL_DEBUG=" not in second
    (tmp / "sub").mkdir()
    moved = run_cli(["render", "../run.toml", "--topo-dir", ""], cwd=tmp / "sub", env=env)[2]
    assert f"--chdir={tmp}/sub/slurmpod-runs/renamed" in moved
    assert len(_entries(tmp)) == 4


def test_site_template_edit_is_seen(work) -> None:
    tmp, env = work
    tdir = tmp / "site-templates" / "sbatch"
    tdir.mkdir(parents=True)
    tpl = tdir / "megatron.sbatch.j2"
    tpl.write_text('{% extends "sbatch/megatron-base.sbatch.j2" %}\n'
                   "{% block accounting_monitor %}# site v1{% endblock %}\n")
    args = ["render", "run.toml", "--topo-dir", "", "--template-dir", str(tmp / "site-templates")]
    rc, _, first, err = run_cli(args, cwd=tmp, env=env)
    assert rc == 0, err
    # Same path, new content (and size, so even a coarse mtime clock cannot hide the edit).
    tpl.write_text(tpl.read_text().replace("site v1", "site v2 (longer)"))
    second = run_cli(args, cwd=tmp, env=env)[2]
    assert "# site v1" in first and "# site v2 (longer)" in second


def test_damaged_entry_is_ignored(work) -> None:
    tmp, env = work
    args = ["render", "run.toml", "--topo-dir", ""]
    first = run_cli(args, cwd=tmp, env=env)[2]
    (entry,) = _entries(tmp)
    data = json.loads(entry.read_text())
    data["script"] = data["script"].replace("#SBATCH --exclusive", "#SBATCH --oversubscribe")
    entry.write_text(json.dumps(data))
    rc, heavy, second, _ = run_cli(args, cwd=tmp, env=env)
    assert rc == 0 and second == first and "msgspec" in heavy


def test_refusals_are_never_stored(work) -> None:
    tmp, env = work
    (tmp / "run.toml").write_text(RUN.format(name="bad", tp=3))  # TP=3 divides no 8-GPU node
    for _ in range(2):
        rc, heavy, out, err = run_cli(["render", "run.toml", "--topo-dir", ""], cwd=tmp, env=env)
        assert rc == 3 and out == "" and "TP=3" in err and "msgspec" in heavy
    assert _entries(tmp) == []


def test_unwritable_cache_only_costs_time(work) -> None:
    tmp, _ = work
    blocker = tmp / "not-a-dir"
    blocker.write_text("")
    env = {"XDG_CACHE_HOME": str(blocker)}
    runs = [run_cli(["render", "run.toml", "--topo-dir", ""], cwd=tmp, env=env) for _ in range(2)]
    assert [r[0] for r in runs] == [0, 0] and runs[0][2] == runs[1][2]
    assert all("msgspec" in r[1] for r in runs)


# --- run spec values ---------------------------------------------------------------------------

def test_megatron_values_and_explicit() -> None:
    # values(): every known key in field order, then the passed-through ones; explicit(): only
    # what the run spec set. Checked against msgspec's own view of the struct.
    import msgspec

    from slurmpod.megatron.runspec import MEGATRON_FIELDS, run_from_dict

    given_in = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 8, "seq_length": 32,
                "moe_layer_freq": [1, 0, 1, 0], "swiglu": True, "lr": 3e-4,
                "data_path": ["a", "b"]}
    m = run_from_dict({"megatron": given_in}, "run.toml").megatron
    full, given = m.values(), m.explicit()
    as_dict = msgspec.structs.asdict(m)
    assert list(full)[: len(MEGATRON_FIELDS)] == list(MEGATRON_FIELDS)
    assert {k: full[k] for k in MEGATRON_FIELDS} == {k: as_dict[k] for k in MEGATRON_FIELDS}
    assert {k: full[k] for k in ("lr", "data_path")} == as_dict["passthrough_args"]
    assert given == {k: given_in[k] for k in full if k in given_in}  # field order, then extras
    assert "kv_channels" in full and "kv_channels" not in given and given["lr"] == 3e-4
    assert "keys_given" not in full and "passthrough_args" not in full
    assert given["moe_layer_freq"] == [1, 0, 1, 0]
    assert given["moe_layer_freq"] is not m.moe_layer_freq  # a copy: callers may edit it
