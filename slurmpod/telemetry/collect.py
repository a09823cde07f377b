"""The epilog's choice of GPU telemetry for a finished job (`collect_for_epilog`).

Sources are tried in this order, the first that measured the job winning:

1. `dcgm`: DCGM job statistics from each node's host engine (`dcgmi` on the epilog's PATH);
2. `prometheus`: a DCGM exporter scraped by Prometheus (`SLURMPOD_PROMETHEUS_URL`, label
   `SLURMPOD_PROMETHEUS_JOB_LABEL`, default `hpc_job`);
3. `sacct`: Slurm's own `gres/gpuutil`/`gres/gpumem` (when the site tracks them);
4. `comment`: the job's own `slurmpod hook monitor` (`nvidia-smi` sampling), from its Comment
   and the series file beside its log: the job's word, kept with `trust: job`.

The first three are the site's (`trust: site`): a job cannot write them. `SLURMPOD_GPU_TELEMETRY`
(in the admin's epilog wrapper; a job cannot set the epilog's environment) restricts the list,
e.g. `prometheus,comment`, or `none`. Each source has its own timeouts; a missing tool, a hang
or garbage gives "not measured" for that source and the next is tried. Nothing here raises.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable, Mapping
from typing import Any

from slurmpod.model.hostlist import expand as expand_hosts
from slurmpod.telemetry import comment as tcomment
from slurmpod.telemetry.dcgm import job_stats
from slurmpod.telemetry.schema import clean_gpu_summary, clean_record_part
from slurmpod.telemetry.slurm_tres import job_telemetry as sacct_telemetry
from slurmpod.telemetry.stats import Telemetry

log = logging.getLogger("slurmpod.hook")
ALL = ("dcgm", "prometheus", "sacct", "comment")
Run = Callable[[list[str], float], tuple[int, str, str]]


def chosen_sources(env: Mapping[str, str]) -> list[str]:
    text = (env.get("SLURMPOD_GPU_TELEMETRY") or "auto").strip().lower()
    if text in ("", "auto"):
        return list(ALL)
    if text == "none":
        return []
    return [s for s in (p.strip() for p in text.split(",")) if s in ALL]


def collect_for_epilog(job: Mapping[str, Any], env: Mapping[str, str], run: Run | None, *,
                       log_path: str, model: str | None = None,
                       read_file: Callable[[str, int, int], bytes] | None = None,
                       path_env: str | None = None, comment: Mapping[str, Any] | None = None
                       ) -> tuple[dict[str, Any] | None, dict[str, Any] | None, dict[str, str]]:
    """(summary.gpu, record.gpu, why each source tried gave nothing). Never raises.
    `comment`: the job's Comment as the caller decoded it (the accounting record's reader), for
    the monitor's summary in it; telemetry does not read the record's format itself."""
    tried: dict[str, str] = {}
    try:
        return _collect(job, env, run, log_path, model, read_file, path_env, comment or {},
                        tried)
    except Exception as exc:  # a bug must not cost the job's record
        log.exception("job %s: GPU telemetry failed", job.get("job_id"))
        tried["error"] = type(exc).__name__
        return None, None, tried


def _collect(job: Mapping[str, Any], env: Mapping[str, str], run: Run | None, log_path: str,
             model: str | None, read_file: Callable[[str, int, int], bytes] | None,
             path_env: str | None, comment: Mapping[str, Any], tried: dict[str, str]
             ) -> tuple[dict[str, Any] | None, dict[str, Any] | None, dict[str, str]]:

    job_id = str(job.get("job_id") or "")
    gpus = job.get("alloc_gpus") if isinstance(job.get("alloc_gpus"), int) else None
    if not gpus:
        tried["all"] = "no-gpus"
        return None, None, tried
    own_part = _job_series(job, log_path, model, read_file)
    for src in chosen_sources(env):
        got: Telemetry | None = None
        if src == "dcgm":
            exe = shutil.which("dcgmi", path=path_env)
            if run is None or exe is None:
                tried[src] = "not-installed"
                continue
            try:
                nodes = expand_hosts(job.get("nodelist") or "")
            except Exception:
                nodes = []
            got = _dcgm(run, job_id, nodes[:256], exe) if nodes else None
        elif src == "prometheus":
            url = env.get("SLURMPOD_PROMETHEUS_URL")
            start, end = job.get("start_time"), job.get("end_time")
            if not url:
                tried[src] = "not-configured"
                continue
            if not isinstance(start, int) or not isinstance(end, int):
                tried[src] = "no-times"
                continue
            from slurmpod.telemetry.prometheus import JOB_LABEL, job_telemetry  # lazy: start-up

            got = job_telemetry(url, job_id, start, end,
                                label=env.get("SLURMPOD_PROMETHEUS_JOB_LABEL") or JOB_LABEL)
        elif src == "sacct":
            if run is None:
                tried[src] = "not-installed"
                continue

            got = sacct_telemetry(run, job_id)
        elif src == "comment":
            summary = clean_gpu_summary(tcomment.expand(comment.get(tcomment.KEY)), model=model,
                                        max_gpus=gpus)
            if summary is None:
                tried[src] = "none"
                continue
            return summary, own_part, tried
        summary = got.summary(model=model, max_gpus=gpus) if got is not None else None
        if summary is None:
            tried[src] = "not-measured"
            continue
        part = clean_record_part(got.record_part(), model=model) if got else None
        if own_part and own_part.get("series") and part is not None:
            part["series"] = own_part["series"]  # the monitor's series beside the site's figures
        return summary, part, tried
    return None, own_part, tried


def _dcgm(run: Run, job_id: str, nodes: list[str], exe: str) -> Telemetry | None:

    return job_stats(run, job_id, nodes, exe=exe)


def _job_series(job: Mapping[str, Any], log_path: str, model: str | None,
                read_file: Callable[[str, int, int], bytes] | None) -> dict[str, Any] | None:
    """The monitor's per-GPU file beside the log, read safely as the job's uid, checked."""

    uid = job.get("uid")
    if read_file is None or not isinstance(uid, int) or not log_path:
        return None
    try:
        raw = read_file(str(tcomment.series_path(log_path)), uid,
                        tcomment.MAX_SERIES_FILE_BYTES)
        doc = json.loads(raw)
    except Exception:  # missing, refused (symlink, other owner), too big, not JSON
        return None
    return clean_record_part(doc, model=model)
