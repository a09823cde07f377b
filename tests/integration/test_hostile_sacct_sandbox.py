"""Jobs whose Comment and name forge sacct rows for other jobs, on the real sandbox Slurm: plain
sbatch (and `scontrol update` for what sbatch would not take), then the real fleet report
(`slurmpod report --since`, text, JSON, CSV, Prometheus). Only jobs Slurm has may come out,
each exactly once, with Slurm's own values (`sacct --json`). Run on 22.05 (Debian) and 24.11
(PATH=/opt/slurm-24.11/sbin:/opt/slurm-24.11/bin:$PATH)."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from slurmpod.backends.parse import SACCT_FIELDS
from tests.helpers import promtool_check

PHANTOM = "987654"  # an id the sandbox never reaches in one session


def forged(job_id: str, **over: str) -> str:
    """A whole records-query row, as slurmpod printed them before (unit separator)."""
    row = {f: "" for f in SACCT_FIELDS}
    row.update(JobID=job_id, JobIDRaw=job_id, JobName="forged", User="root", Account="ml",
               Partition="batch", State="RUNNING", ExitCode="0:0", Submit="1", Start="2",
               End="Unknown", ElapsedRaw="999999", NodeList="gpu[001-016]", NNodes="16",
               AllocTRES="billing=1,gres/gpu=4096,node=16", Comment='{"gpus": 4096}')
    row.update(over)
    return "\x1f".join(row[f] for f in SACCT_FIELDS)


@dataclass
class Hostile:
    ids: list[str]
    work: Path


def _slurmpod(sandbox: Any, *args: str) -> str:
    env = dict(sandbox.env, SLURMPOD_SPOOL=str(sandbox.sb.spool_dir))
    cp = subprocess.run([sys.executable, "-m", "slurmpod", "report", *args], env=env,
                        capture_output=True, text=True, timeout=180, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stderr
    return cp.stdout


@pytest.fixture(scope="module")
def hostile(sandbox: Any) -> Hostile:
    work = sandbox.tmp_dir / "hostile-sacct"
    work.mkdir(exist_ok=True)
    out = ["-o", "/dev/null", "-N1", "--wrap", "true"]
    # 1: the reported Comment, straight through sbatch.
    a = sandbox.sbatch("--job-name=plain-a", "--comment=hello\x1fworld\nsecond line|pipe", *out)
    # 2: held, then a Comment that forges rows for job 1, a phantom id, and attempts-query
    # lines, with newlines and control characters (scontrol update takes any text).
    b = sandbox.sbatch("--hold", "--job-name=forger-b", "--comment=x", *out)
    text = ("x\x1f\x1f" + b + "\n" + forged(a, JobName="stolen") + "\n" + forged(PHANTOM)
            + f"\n{PHANTOM}|1|2|3|999999|RUNNING\n{a}|1|2|3|4|FAILED\r\n\u2028\x01\x0b"
            + f"{PHANTOM}\x1f0:0")
    cp = sandbox.run(["scontrol", "update", f"JobId={b}", f"Comment={text}"], check=False)
    assert cp.returncode == 0, cp.stderr
    # 3: a name with the old delimiter and a newline, forging the phantom from JobName.
    c_name = "n\x1fa|me\n" + forged(PHANTOM)
    cp = sandbox.run(["sbatch", "--parsable", f"--job-name={c_name}", "--hold", *out],
                     check=False)
    if cp.returncode == 0:
        c = cp.stdout.strip().split(";")[0]
    else:  # sbatch refused the name: set it on a held job instead
        c = sandbox.sbatch("--hold", "--job-name=c", *out)
        sandbox.run(["scontrol", "update", f"JobId={c}", f"JobName={c_name}"])
    ids = [a, b, c]
    try:
        sandbox.run(["scontrol", "release", b, c])
        for jid in ids:
            sandbox.wait_job(jid)
    except BaseException:
        sandbox.cancel(*ids)
        raise
    return Hostile(ids, work)


def _slurm_truth(sandbox: Any) -> dict[str, dict[str, Any]]:
    """Slurm's own job records of the window, from `sacct --json` (a superset window)."""
    cp = sandbox.run(["sacct", "--json", "-X", "--allusers", "--starttime=now-3hours",
                      "--endtime=now"], timeout_s=60)
    return {str(j["job_id"]): j for j in json.loads(cp.stdout)["jobs"]}


def _comment(job: dict[str, Any]) -> str:
    c = job.get("comment")
    return str((c or {}).get("job") or "") if isinstance(c, dict) else str(c or "")


def _gpus(job: dict[str, Any]) -> int:
    for t in (job.get("tres") or {}).get("allocated") or []:
        if t.get("type") == "gres" and t.get("name") == "gpu":
            return int(t["count"])
    return 0


def test_forged_rows_never_reach_the_fleet_report(sandbox: Any, hostile: Hostile) -> None:
    truth = _slurm_truth(sandbox)
    a, b, c = hostile.ids
    # The forgeries reached accounting (slurmdbd keeps them, a double quote as a backtick).
    assert "\x1f" in truth[c]["name"] and "\n" in truth[c]["name"]
    assert all(x in _comment(truth[b])
               for x in ("\x1f", "\n", PHANTOM, forged(a, JobName="stolen")[:40]))
    assert _comment(truth[a]) == "hello\x1fworld\nsecond line|pipe"
    doc = json.loads(_slurmpod(sandbox, "--since", "2h", "--json", "--jobs"))
    rows = doc["job_rows"]
    ids = [r["job_id"] for r in rows]
    assert len(ids) == len(set(ids)) and set(ids) <= set(truth), ids
    assert all(ids.count(jid) == 1 for jid in hostile.ids)
    assert PHANTOM not in ids  # (it does appear inside job 3's name: text, not a row)
    by_id = {r["job_id"]: r for r in rows}
    for jid in hostile.ids:
        r, t = by_id[jid], truth[jid]
        assert r["name"] == t["name"] and r["user"] == t["user"]
        assert r["state"] == "COMPLETED" and r["exit_code"] == 0
        assert r["n_gpus"] == _gpus(t) and r["n_nodes"] == 1
    # implausible jobs (other tests' forged FLOPs) are rows but stay out of the totals
    assert doc["jobs"] + len(doc["implausible_jobs"]) == len(rows)
    table = list(csv.DictReader(io.StringIO(_slurmpod(sandbox, "--since", "2h", "--csv"),
                                            newline="")))
    assert [r["job_id"] for r in table] == ids
    assert [r["name"] for r in table] == [r["name"] for r in rows]
    text = _slurmpod(sandbox, "--since", "2h")
    assert not re.search(rf"^\s*{PHANTOM}\b", text, re.MULTILINE)
    prom = hostile.work / "fleet.prom"
    _slurmpod(sandbox, "--since", "2h", "--prometheus", str(prom))
    body = prom.read_text()
    assert f'slurmpod_fleet_jobs{{window="2h"}} {doc["jobs"]}' in body  # plausible ones
    promtool_check(body)


def test_job_report_and_textfile_of_the_forger(sandbox: Any, hostile: Hostile) -> None:
    _, b, c = hostile.ids
    doc = json.loads(_slurmpod(sandbox, b, "--json"))
    assert doc["job"]["job_id"] == b and doc["job"]["name"] == "forger-b"
    assert doc["job"]["n_gpus"] == _gpus(_slurm_truth(sandbox)[b])
    prom = hostile.work / f"{c}.prom"
    _slurmpod(sandbox, c, "--prometheus", str(prom))
    body = prom.read_text()
    assert f'job_id="{c}",name="n\x1fa|me\\n' in body  # escaped, on one line
    promtool_check(body)
