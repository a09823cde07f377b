"""What `render`/`submit` put in the job script for resilience and the fleet report: the per-run
flags (--hang-k, --hang-floor, --shed-fraction, --health-gate, --health-allreduce,
--allreduce-min-busbw) reach the rendered defaults, bad values are one line; the health gate's
all-reduce is wired before the shedder with flags its parser knows; the submit Comment records
the plan's performance prediction (`pred`), which the fleet report reads back."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurmpod.cli.main import cli
from slurmpod.config import builtin_site_path, load_site
from slurmpod.errors import ConfigError
from slurmpod.megatron.plan import make_plan
from slurmpod.megatron.runspec import run_from_dict
from slurmpod.perf.planning import predict_run
from slurmpod.render.sbatch import (
    PlanFacts,
    RenderOptions,
    build_context,
    layout_text,
    render_script,
)
from slurmpod.report.predicted import recorded_vs_predicted
from slurmpod.resilience import allreduce
from slurmpod.submit import prepare

SANDBOX = builtin_site_path("sandbox")
MEGATRON = {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "seq_length": 128,
            "vocab_size": 1000, "tensor_model_parallel_size": 8, "micro_batch_size": 1,
            "global_batch_size": 16, "train_iters": 100}


def _run(**job: Any) -> Any:
    return run_from_dict({"job": {"name": "flags", "nodes": 2, **job}, "megatron": MEGATRON},
                         "run.toml")


def _write_run(path: Path) -> Path:
    body = "\n".join(f"{k} = {json.dumps(v)}" for k, v in MEGATRON.items())
    path.write_text(f'[job]\nname = "flags"\nnodes = 2\n\n[megatron]\n{body}\n')
    return path


@pytest.fixture
def render_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """`slurmpod render RUN --site sandbox ARGS` in this process: (exit code, output)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    run = _write_run(tmp_path / "run.toml")

    def go(*args: str) -> tuple[int, str]:
        res = CliRunner().invoke(cli, ["render", str(run), "--site", str(SANDBOX),
                                       "--topo-dir", "", *args])
        return res.exit_code, res.output

    return go


def _default(script: str, var: str) -> str:
    """The rendered default of VAR="${SLURMPOD_...:-DEFAULT}" in the script."""
    m = re.search(rf'^{var}="\$\{{SLURMPOD_[A-Z_]+:-([^}}]*)\}}"$', script, re.M)
    assert m, f"{var} not in the script"
    return m.group(1)


# -- per-run flags ---------------------------------------------------------------------------

def test_defaults_are_todays(render_cli: Any) -> None:
    code, out = render_cli()
    assert code == 0, out
    assert (_default(out, "HANG_K"), _default(out, "HANG_FLOOR_S")) == ("10.0", "300.0")
    assert _default(out, "SHED_FRACTION") == "0.02"
    assert _default(out, "HEALTH_GATE") == "1"
    assert _default(out, "HEALTH_ALLREDUCE") == "0"
    assert _default(out, "ALLREDUCE_MIN_BUSBW") == ""


@pytest.mark.parametrize(("args", "var", "value"), [
    (("--hang-k", "5"), "HANG_K", "5.0"),
    (("--hang-floor", "120"), "HANG_FLOOR_S", "120.0"),
    (("--shed-fraction", "0.1"), "SHED_FRACTION", "0.1"),
    (("--no-health-gate",), "HEALTH_GATE", "0"),
    (("--health-allreduce",), "HEALTH_ALLREDUCE", "1"),
    (("--allreduce-min-busbw", "60"), "ALLREDUCE_MIN_BUSBW", "60.0"),
])
def test_each_flag_reaches_the_script(render_cli: Any, args: tuple[str, ...], var: str,
                                      value: str) -> None:
    code, out = render_cli(*args)
    assert code == 0, out
    assert _default(out, var) == value


@pytest.mark.parametrize("args", [
    ("--hang-k", "0.5"), ("--hang-k", "ten"), ("--hang-floor", "0"),
    ("--shed-fraction", "1.5"), ("--shed-fraction", "-0.1"), ("--allreduce-min-busbw", "0"),
])
def test_out_of_range_values_are_one_usage_line(render_cli: Any, args: tuple[str, ...]) -> None:
    code, out = render_cli(*args)
    assert code == 2
    errors = [ln for ln in out.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and args[0] in errors[0] and "Traceback" not in out


@pytest.mark.parametrize("changes", [{"hang_k": float("nan")}, {"hang_floor_s": 0.0},
                                     {"shed_fraction": 2.0}, {"allreduce_min_busbw": -1.0},
                                     {"hang_k": float("inf")}])
def test_render_options_out_of_range_are_a_config_error(changes: dict[str, Any]) -> None:
    plan = make_plan(_run(), load_site(SANDBOX), placement=False)
    with pytest.raises(ConfigError, match=r"out of range|must be > 0"):
        build_context(_run(), load_site(SANDBOX), PlanFacts.of(plan),
                      RenderOptions(run_dir="/r", **changes))


# -- the health gate's all-reduce ------------------------------------------------------------

def _gate_function(script: str) -> str:
    start = script.index("health_gate() {")
    return script[start: script.index("\n}\n", start)]


def _allreduce_call(script: str) -> str:
    body = _gate_function(script)
    start = body.index("-m slurmpod.resilience.allreduce gate")
    end = body.index("</dev/null", start)
    return body[start:end]


def test_allreduce_runs_in_the_gate_before_the_record_and_the_shedder() -> None:
    site = load_site(SANDBOX)
    plan = make_plan(_run(), site, placement=False)
    script = render_script(build_context(_run(), site, PlanFacts.of(plan),
                                         RenderOptions(run_dir="/r", health_allreduce=True)))
    body = _gate_function(script)
    per_node = body.index("slurmpod-health")
    ar = body.index("-m slurmpod.resilience.allreduce gate")
    assert per_node < ar < body.index("-m slurmpod.resilience.health") < body.index("shed_nodes")
    guard = body.index('if [ "$HEALTH_ALLREDUCE" = 1 ]; then')
    assert per_node < guard < ar < body.index("\n  fi\n", ar)  # only when asked for
    call = _allreduce_call(script)
    assert '--health "$out"' in call and '>>"$out"' in call  # lines after the per-node ones
    assert "--tool loopback" in call  # emulated GPUs: the sandbox's stand-in for NCCL
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_allreduce_flags_are_known_to_its_parser_and_parse() -> None:
    site = load_site(builtin_site_path("dgx-h100-superpod"))
    run = run_from_dict({"job": {"name": "big", "nodes": 4},
                         "megatron": {**MEGATRON, "global_batch_size": 64}}, "run.toml")
    plan = make_plan(run, site, placement=False)
    script = render_script(build_context(run, site, PlanFacts.of(plan),
                                         RenderOptions(run_dir="/r", health_allreduce=True,
                                                       allreduce_min_busbw=60.0)))
    call = _allreduce_call(script)
    assert "--tool auto" in call  # real GPUs: nccl-tests when the nodes have it
    action = next(a for a in allreduce.build_parser()._actions
                  if isinstance(a, argparse._SubParsersAction))
    known = set(action.choices["gate"]._option_string_actions)
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", call))
    assert flags <= known, flags - known
    # The words bash would pass (with the variables the script sets), through the real parser.
    words = (call.replace("\\\n", " ").replace('"$list"', "n1,n2").replace('"$out"', "/o")
             .replace('"$STATE_DIR/allreduce-${SLURM_JOB_ID}-${next}"', "/d")
             .replace('${ALLREDUCE_MIN_BUSBW:+--min-busbw "$ALLREDUCE_MIN_BUSBW"}',
                      "--min-busbw 60.0").replace(">>/o 2>&1", "").split())
    args = allreduce.build_parser().parse_args(words[2:])
    assert (args.nodes, args.health, args.dir, args.tool, args.gpus, args.min_busbw) == (
        "n1,n2", "/o", "/d", "auto", 8, 60.0)


def test_gate_off_by_default_and_env_override_named() -> None:
    site = load_site(SANDBOX)
    plan = make_plan(_run(), site, placement=False)
    script = render_script(build_context(_run(), site, PlanFacts.of(plan),
                                         RenderOptions(run_dir="/r")))
    assert 'HEALTH_ALLREDUCE="${SLURMPOD_HEALTH_ALLREDUCE:-0}"' in script
    assert 'ALLREDUCE_MIN_BUSBW="${SLURMPOD_ALLREDUCE_MIN_BUSBW:-}"' in script


# -- the prediction in the submit Comment ----------------------------------------------------

def _comment(script: str) -> dict[str, Any]:
    line = next(ln for ln in script.splitlines() if ln.startswith("#SBATCH --comment="))
    raw = line[len("#SBATCH --comment="):]
    assert raw.startswith('"') and raw.endswith('"')
    return dict(json.loads(re.sub(r"\\(.)", r"\1", raw[1:-1])))


def test_prepare_records_the_plans_prediction_in_the_comment() -> None:
    site = load_site(SANDBOX)
    run = _run()
    prep = prepare(run, site, RenderOptions(), "/runs/flags")
    doc = _comment(prep.script)
    pred = predict_run(run, site, 2)
    assert pred is not None
    rec = doc["pred"]
    assert rec["s"] == float(f"{pred.step_time_s:.4g}") and rec["mfu"] == float(f"{pred.mfu:.4g}")
    assert rec["gpu"] == prep.plan.gpu_model and rec["layout"] == layout_text(prep.plan)
    assert rec["layout"] == "TP8 PP1 DP2 MBS1 GBS16"
    # The fleet report reads it back: a job twice as slow as predicted is at 50 %.
    comment = json.dumps(doc, separators=(",", ":"))
    v = recorded_vs_predicted(comment, 2 * rec["s"], 16)
    assert v is not None and v.ratio == pytest.approx(0.5)
    assert v.layout == rec["layout"] and v.gpu == rec["gpu"]


def test_the_comment_names_a_published_architecture() -> None:
    """`pred.arch`: the id of the model's architecture where published runs of it are in the
    track record (Llama 3 70B on H100), which the fleet report looks its record up by; none
    for the sandbox's small model, which no published run has."""
    from slurmpod.megatron.runspec import ModelConfig, load_run, preset_path
    from slurmpod.perf.track import architecture, architecture_id

    run = load_run(preset_path("llama3-70b"))
    prep = prepare(run, load_site(builtin_site_path("dgx-h100-superpod")), RenderOptions(),
                   "/runs/llama")
    arch = architecture(ModelConfig.from_args(run.megatron))
    assert _comment(prep.script)["pred"]["arch"] == architecture_id(arch)
    sandbox = prepare(_run(), load_site(SANDBOX), RenderOptions(), "/runs/flags")
    assert "arch" not in _comment(sandbox.script)["pred"]


def test_no_prediction_no_pred_key() -> None:
    site = load_site(SANDBOX)
    plan = make_plan(_run(), site, placement=False)
    facts = PlanFacts.of(plan)  # the model made none
    assert facts.prediction is None
    script = render_script(build_context(_run(), site, facts, RenderOptions(run_dir="/r")))
    assert "pred" not in _comment(script)


def test_an_unusable_prediction_is_not_recorded() -> None:
    site = load_site(SANDBOX)
    run = _run()
    plan = make_plan(run, site, placement=False)
    pred = predict_run(run, site, 2)
    assert pred is not None
    for bad in (float("nan"), 0.0, float("inf")):
        assert PlanFacts.of(plan, replace(pred, step_time_s=bad)).prediction is None
    assert PlanFacts.of(plan, replace(pred, mfu=1.5)).prediction is None
    assert PlanFacts.of(plan, pred).prediction is not None
