"""The health gate's all-reduce between a job's nodes on the real sandbox: the pair tests run
as parallel srun steps inside one allocation (slurmpod.resilience.allreduce, loopback mode), a
node whose contribution is wrong fails both its tests and is excluded by the shedder with the
evidence; the gate's duration at 4 and 8 nodes is printed (docs/resilience-in-job.md
extrapolates it to 1,000 nodes), not asserted."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from slurmpod.runs.attempts import parse_attempts


def _gate_job(sandbox: Any, n: int, corrupt: str | None, where: Path) -> str:
    where.mkdir(parents=True, exist_ok=True)
    script = where / "gate.sh"
    script.write_text(f"""#!/bin/bash
nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)
{f'export SLURMPOD_EMU_ALLREDUCE_CORRUPT={corrupt}' if corrupt else ''}
t0=$(date +%s%N)
{sys.executable} -m slurmpod.resilience.allreduce gate --nodes "$nodes" --dir {where}/rdv \\
    --tool loopback --timeout 60 >{where}/gate.out 2>{where}/gate.err
echo "gate_ms $(( ($(date +%s%N) - t0) / 1000000 ))" >>{where}/gate.err
{sys.executable} -m slurmpod.resilience.shedding --job-id "$SLURM_JOB_ID" --attempt 1 \\
    --attempts {where}/attempts.jsonl --nodes "$nodes" --health {where}/gate.out \\
    --spares 1 --fraction 0.5 --partition "$SLURM_JOB_PARTITION" >{where}/shed.out 2>&1
""")
    return sandbox.sbatch(f"--nodes={n}", "--gpus-per-node=8", "--exclusive",
                          f"--output={where}/job.out", str(script))


@pytest.mark.parametrize("n", [4, 8])
def test_allreduce_gate_finds_the_bad_node(sandbox: Any, n: int) -> None:
    where = sandbox.tmp_dir / f"allreduce-{n}"
    probe = _gate_job(sandbox, n, None, where / "probe")  # which nodes does an n-node job get?
    job = sandbox.wait_job(probe, timeout_s=180)
    assert "COMPLETED" in json.dumps(job["state"]), (where / "probe" / "job.out").read_text()
    clean = (where / "probe" / "gate.out").read_text().splitlines()
    assert len(clean) == n and all(line.endswith(" ok") for line in clean), clean
    nodes = [line.split()[1] for line in clean]
    bad = nodes[n // 2]
    jid = _gate_job(sandbox, n, bad, where / "bad")
    sandbox.wait_job(jid, timeout_s=180)
    got = (where / "bad" / "gate.out").read_text().splitlines()
    err = (where / "bad" / "gate.err").read_text()
    if set(sandbox.nodes_of(jid)) != set(nodes):
        pytest.skip("the second job got other nodes (a node busy or down)")
    failed = [line for line in got if " fail " in line]
    assert len(failed) == 1 and failed[0].startswith(f"slurmpod-health: {bad} fail all-reduce:"),\
        got
    assert "wrong values" in failed[0]
    atts = parse_attempts((where / "bad" / "attempts.jsonl").read_bytes()).of_job(jid)
    (att,) = atts
    (ex,) = att.excluded
    assert ex["node"] == bad and ex["action"] == "excluded" and "all-reduce" in ex["evidence"]
    for text in ((where / "probe" / "gate.err").read_text(), err):
        print(f"{n} nodes: " + " | ".join(ln for ln in text.splitlines() if ln.strip()))
