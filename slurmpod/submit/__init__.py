"""Plan -> refuse -> render -> store the script with the run -> submit once -> job id (-> where).

The orchestration behind `slurmpod render` and `slurmpod submit`, one job per module:

- `prepare`: plan the run, refuse an invalid or non-fitting plan (nothing is written or queued
  then), render the script and its idempotency token;
- `cache`: the prepared-script cache (~/.cache/slurmpod/prepared), so that a repeat of the same
  inputs skips validating, planning and rendering;
- `store`: the run directory, what is written where (the script, `logs/`, the marker);
- `queue`: everything that asks Slurm, through the SlurmBackend only: the partition's time
  limit, submission (once per token), the job a lost marker update left behind, `--wait`.
"""

from __future__ import annotations

from slurmpod.submit.cache import cache_load, cache_store, prepared_key
from slurmpod.submit.prepare import (
    Prepared,
    Rendered,
    load_site_env,
    plan_or_refuse,
    prepare,
    read_run_and_site,
    save_interval_for,
)
from slurmpod.submit.queue import EnvRunner, SubmitResult, check_time_limit, submit, wait_for_start
from slurmpod.submit.store import MARKER, resolve_run_dir

__all__ = [
    "MARKER", "EnvRunner", "Prepared", "Rendered", "SubmitResult", "cache_load", "cache_store",
    "check_time_limit", "load_site_env", "plan_or_refuse", "prepare", "prepared_key",
    "read_run_and_site", "resolve_run_dir", "save_interval_for", "submit", "wait_for_start",
]
