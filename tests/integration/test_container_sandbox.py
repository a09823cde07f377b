"""A container run (pyxis/enroot) on the real sandbox Slurm, with a stand-in for pyxis.

pyxis is a SPANK plugin that Debian does not package, so the sandbox's srun does not know the
`--container-*` options. The stand-in is an `srun` earlier on the job's PATH that checks those
options as pyxis and enroot would (an image enroot can import, mount sources that exist, a
working directory under a mount), records them, and runs the real srun without them. Every
trainer path is mounted at its own path, so the ranks see the host's directories, as they
would inside the container."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.integration.test_lifecycle_sandbox import ends_of
from tests.integration.test_submit_sandbox import log_of, slurmpod, write_run

PYXIS_SRUN = r"""#!/bin/bash
# pyxis stand-in: check and strip --container-* options, then run the real srun.
real="__REAL_SRUN__"
rec="__RECORD__"
args=() image="" mounts="" workdir=""
for a in "$@"; do
  case "$a" in
    --container-image=*) image="${a#*=}" ;;
    --container-mounts=*) mounts="${a#*=}" ;;
    --container-workdir=*) workdir="${a#*=}" ;;
    --container-name=*|--no-container-mount-home|--container-writable|--container-readonly) ;;
    --container-*) echo "pyxis: unknown option $a" >&2; exit 2 ;;
    *) args+=("$a") ;;
  esac
done
if [ -n "$image" ]; then
  # enroot imports registry#image:tag; a registry host before a '/' without '#' is refused.
  if [[ "$image" != *"#"* && "${image%%/*}" == *.* ]]; then
    echo "enroot: invalid image reference $image" >&2; exit 1
  fi
  IFS=, read -r -a ms <<< "$mounts"
  for m in "${ms[@]}"; do
    src="${m%%:*}"
    [[ "$m" == *nofail* ]] && continue
    [ -e "$src" ] || { echo "enroot: mount source $src does not exist" >&2; exit 1; }
  done
  printf '%s\n' "$image" "$mounts" "$workdir" >> "$rec"
  [ -n "$workdir" ] && args=("--chdir=$workdir" "${args[@]}")
fi
exec "$real" "${args[@]}"
"""


def test_container_run_completes_with_a_pyxis_stand_in(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "container"
    d.mkdir(exist_ok=True)
    shim = d / "bin"
    shim.mkdir()
    record = d / "pyxis.log"
    real = shutil.which("srun", path=sandbox.env.get("PATH"))
    assert real
    (shim / "srun").write_text(PYXIS_SRUN.replace("__REAL_SRUN__", real)
                               .replace("__RECORD__", str(record)))
    (shim / "srun").chmod(0o755)
    ckpt = d / "ckpt-store" / "ctr"  # outside the run dir: a mount of its own
    run = write_run(d / "run.toml", "ctr", 1, train_iters=4, job_extra=(
        'container_image = "nvcr.io/nvidia/pytorch:24.12-py3"\n'
        f'checkpoint_dir = "{ckpt}"\n'))
    env = {**sandbox.env, "PATH": f"{shim}{os.pathsep}{sandbox.env.get('PATH', '')}"}
    cp = subprocess.run([sys.executable, "-m", "slurmpod", "submit", str(run), "--topo-dir",
                         "", "--json"], env=env, capture_output=True, text=True, timeout=120,
                        cwd=sandbox.tmp_dir, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, cp.stderr
    jid = json.loads(cp.stdout)["job_id"]
    job = sandbox.wait_job(jid, timeout_s=180)
    run_dir = d / "ctr"
    assert "COMPLETED" in json.dumps(job["state"]), (job["state"], log_of(run_dir)[-3000:])
    image, mounts, workdir = record.read_text().splitlines()[:3]
    assert image == "nvcr.io#nvidia/pytorch:24.12-py3"
    assert f"{run_dir}:{run_dir}" in mounts.split(",") and f"{ckpt}:{ckpt}" in mounts.split(",")
    assert workdir == str(run_dir)
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    assert [e["end"] for e in ends_of(run_dir)] == ["completed"]
    assert slurmpod(sandbox, "runs", "--json").returncode == 0
    assert Path(run_dir / "logs").is_dir()
