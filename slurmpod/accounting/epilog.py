"""`slurmpod hook epilog`: the EpilogSlurmctld hook that stores a job's final MFU summary.

Runs as SlurmUser on the controller after every job (Slurm 22.05: the job is already COMPLETING,
so slurmctld refuses updates to it; the AdminComment goes to slurmdbd through sacctmgr). It

0. decides from the job's Comment and its log's first MiB whether the job is slurmpod's or
   Megatron's at all (most jobs of a cluster are not: they cost one bounded read);
1. asks Slurm for what decides the scale (attempt, start and end, allocated GPUs: trusted.py)
   and the site file for the GPU's peak;
2. reads the job's log, safely (safeio: no symlinks, owner must be the job's uid, size-capped),
   and computes the summary (slurmpod's FLOPs model; implausible figures flagged);
3. writes a per-job record (summary + time series) into the spool, atomically;
4. sets the AdminComment through `sacctmgr -i modify job where jobid=N set AdminComment=...`
   unless another tool's summary is there (jobstats' `JS1:`; `--admin-comment`); if
   slurmdbd does not take it, the update is queued in the spool and the next epilog (or
   `slurmpod hook flush`) delivers it;
5. delivers whatever earlier epilogs left queued.

Only jobs slurmpod knows (a slurmpod Comment) or whose log shows Megatron iterations get a record
and an AdminComment; other jobs' AdminComment is left alone (a site may keep another tool's
summary there), unless the site asks for every job (`--all-jobs`).

It never fails the epilog: every error is logged to `<spool>/hook.log` and it returns 0. A slow
slurmdbd cannot hold it past `PrologEpilogTimeout`: every command has a timeout and the flush
stops at the first failure (slurmdbd is down; the rest waits for the next run).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from slurmpod.accounting.safeio import (
    DEFAULT_HEAD_BYTES,
    DEFAULT_TAIL_BYTES,
    StreamedRead,
    UnsafeFileError,
    expand_output_pattern,
    read_job_file,
    stream_job_file,
)
from slurmpod.accounting.spool import LOG_NAME, Deliver, DeliveryError, Spool, safe_job_id
from slurmpod.accounting.trusted import SiteGpu, allocated_gpus, parse_scontrol_job
from slurmpod.errors import CommandError
from slurmpod.model import comment as hooks

log = logging.getLogger("slurmpod.hook")
SPOOL_ENV = "SLURMPOD_SPOOL"
DEFAULT_SPOOL = "/var/spool/slurmpod"
COMMAND_TIMEOUT_S = 20.0
# sacctmgr/scontrol stderr when slurmdbd or slurmctld cannot be reached (22.05 – 24.11)
_UNREACHABLE = ("Connection refused", "Problem talking to the database", "PersistInit",
                "Unable to contact slurm controller", "Socket timed out", "timed out")


def setup_logging(spool_root: Path) -> logging.Handler | None:
    """Log to `<spool>/hook.log` (and stderr, which the epilog wrapper may redirect)."""
    log.setLevel(logging.INFO)
    log.propagate = False
    fmt = logging.Formatter("%(asctime)s %(process)d %(levelname)s %(message)s")
    handler: logging.Handler | None = None
    try:
        handler = logging.FileHandler(spool_root / LOG_NAME, encoding="utf-8")
    except OSError:
        handler = None
    for h in list(log.handlers):
        log.removeHandler(h)
    if handler is not None:
        handler.setFormatter(fmt)
        log.addHandler(handler)
    err = logging.StreamHandler()
    err.setFormatter(fmt)
    log.addHandler(err)
    return handler


# sacctmgr's answers when the job's own record has not reached slurmdbd yet (22.05: " Nothing
# modified", or "Request didn't affect anything" from acct_storage_p_modify_job; 25.11: "Error
# with request: Data has not changed since time specified", SLURM_NO_CHANGE_IN_DATA from
# as_mysql_modify_job's "Job(s) not found"). slurmctld sends the job's end to slurmdbd around the
# time EpilogSlurmctld starts, so this clears in seconds.
NOT_YET_IN_SLURMDBD = ("Nothing modified", "didn't affect anything",
                       "Data has not changed since time specified")
# Waits between in-process retries of such an update before it goes to the spool (15 s in all,
# well inside the PrologEpilogTimeout that docs/accounting.md recommends).
NOT_YET_WAITS_S = (1.0, 2.0, 4.0, 8.0)


def slurm_deliver(run: Callable[[list[str], float], tuple[int, str, str]]) -> Deliver:
    """Deliver updates with Slurm's commands. `run(argv, timeout_s) -> (rc, stdout, stderr)`."""

    def deliver(job_id: str, kind: str, value: str) -> None:
        if kind == "admin_comment":
            # One argv element: sacctmgr takes everything after `AdminComment=`; no shell.
            argv = ["sacctmgr", "-i", "modify", "job", "where", f"JobID={job_id}", "set",
                    f"AdminComment={value}"]
        elif kind == "comment":
            argv = ["scontrol", "update", f"JobId={job_id}", f"Comment={value}"]
        else:
            raise DeliveryError(f"unknown update kind {kind!r}", retry=False)
        try:
            rc, out, err = run(argv, COMMAND_TIMEOUT_S)
        except OSError as exc:
            raise DeliveryError(f"{argv[0]}: {exc}") from None
        text = f"{out}\n{err}".strip()
        # sacctmgr 22.05 exits 1 with " Nothing modified" when the job is not (yet) in slurmdbd:
        # slurmctld may still hold the job's start record in its queue. Keep it for later.
        not_yet = any(s in text for s in NOT_YET_IN_SLURMDBD)
        if rc != 0 or not_yet or "Error" in text:
            last = text.splitlines()[-1].strip() if text else f"exit {rc}"
            raise DeliveryError(f"{argv[0]} exited {rc}: {last}", retry=rc != 0 or not_yet)

    return deliver


def slurmctld_conf(proc: Path = Path("/proc"), start_pid: int | None = None) -> str | None:
    """The slurm.conf of the slurmctld that runs this epilog.

    EpilogSlurmctld gets only the job's variables (Slurm 22.05 `job_common_env_vars`: no PATH,
    no SLURM_CONF), so sacctmgr would read the compiled-in default. Walk up the process tree
    (wrapper script -> slurmscriptd -> slurmctld) and take SLURM_CONF from an ancestor's
    environment, or `-f FILE` from slurmctld's command line.
    """
    pid = os.getppid() if start_pid is None else start_pid
    for _ in range(8):
        if pid <= 1:
            return None
        base = proc / str(pid)
        try:
            argv = (base / "cmdline").read_bytes().split(b"\0")
            environ = (base / "environ").read_bytes().split(b"\0")
            stat_fields = (base / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            return None
        name = os.path.basename(argv[0].decode(errors="replace")) if argv else ""
        is_ctld = name.startswith("slurmctld")
        for item in environ:
            if item.startswith(b"SLURM_CONF=") and is_ctld:
                return item[len(b"SLURM_CONF="):].decode(errors="replace") or None
        if is_ctld:
            for i, a in enumerate(argv[:-1]):
                if a == b"-f":
                    return argv[i + 1].decode(errors="replace") or None
            if "slurmscriptd" not in name:
                return None  # slurmctld itself, on its default configuration
        pid = int(stat_fields[1])  # ppid
    return None


def local_runner(slurm_conf: str | None = None) -> Callable[[list[str], float],
                                                            tuple[int, str, str]]:
    """Run Slurm commands here (argv lists, never a shell) through slurmpod's LocalRunner,
    with SLURM_CONF and a PATH set (the epilog's own environment has neither)."""
    from slurmpod.transport.local import LocalRunner  # lazy: start-up

    # Epoch seconds in scontrol/sacct output: no guessing at the controller's time zone.
    env = {"PATH": os.environ.get("PATH") or "/usr/local/bin:/usr/bin:/bin",
           "SLURM_TIME_FORMAT": "%s"}
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    runner = LocalRunner(env=env)

    def run(argv: list[str], timeout_s: float) -> tuple[int, str, str]:
        try:
            res = runner.run(argv, timeout_s=timeout_s, check=False)
        except CommandError as exc:  # not found, or timed out
            return exc.returncode, "", exc.stderr or exc.message
        return res.returncode, res.stdout, res.stderr

    return run


def scontrol_job(run: Callable[[list[str], float], tuple[int, str, str]],
                 job_id: str) -> str | None:
    """`scontrol --oneliner show job ID` with epoch times: the job is still in slurmctld's memory
    while EpilogSlurmctld runs. Slurm 22.05 exports neither the start and end times nor the
    restart count to EpilogSlurmctld (later releases set SLURM_JOB_START_TIME/END_TIME), and
    the allocation's GPU count is only in `TRES=`/`AllocTRES=`. `trusted.parse_scontrol_job`
    reads it so that job-controlled text cannot plant keys."""
    try:
        rc, out, _ = run(["scontrol", "--oneliner", "show", "job", job_id], COMMAND_TIMEOUT_S)
    except OSError:
        return None
    return out if rc == 0 and out.strip() else None


def current_admin_comment(run: Callable[[list[str], float], tuple[int, str, str]],
                          job_id: str) -> str | None:
    """The job's AdminComment in slurmdbd now (another tool's, e.g. jobstats' `JS1:…`), or None
    when sacct cannot say. One field of one job: no free text of the job can shift it."""
    try:
        rc, out, _ = run(["sacct", "--noheader", "--parsable2", "--allocations", "--jobs",
                          job_id, "--format=AdminComment"], COMMAND_TIMEOUT_S)
    except OSError:
        return None
    return out.split("\n", 1)[0].strip() if rc == 0 else None


def local_run(argv: list[str], timeout_s: float) -> tuple[int, str, str]:
    """`local_runner()` with this process's SLURM_CONF (for `hook flush` run by an admin)."""
    return local_runner(os.environ.get("SLURM_CONF"))(argv, timeout_s)


def job_from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The EpilogSlurmctld environment (Slurm 22.05 `job_common_env_vars`), typed."""

    def _int(name: str) -> int | None:
        try:
            return int(env[name])
        except (KeyError, ValueError):
            return None

    return {
        "job_id": env.get("SLURM_JOB_ID", ""),
        "uid": _int("SLURM_JOB_UID"),
        "user": env.get("SLURM_JOB_USER", ""),
        "name": env.get("SLURM_JOB_NAME", ""),
        "nodelist": env.get("SLURM_JOB_NODELIST", ""),
        "n_nodes": _int("SLURM_JOB_NUM_NODES"),
        "restart": _int("SLURM_JOB_RESTART_COUNT") or 0,
        "exit_code": env.get("SLURM_JOB_EXIT_CODE2", ""),
        "derived_ec": _int("SLURM_JOB_DERIVED_EC"),
        "partition": env.get("SLURM_JOB_PARTITION", ""),
        "comment": env.get("SLURM_JOB_COMMENT", ""),
        # Not set by 22.05; set by later releases (and by tests): used when present.
        "start_time": _int("SLURM_JOB_START_TIME"),
        "end_time": _int("SLURM_JOB_END_TIME"),
        "gpus": env.get("SLURM_JOB_GPUS", ""),
        "work_dir": env.get("SLURM_JOB_WORK_DIR", ""),
    }


def build_record(job: Mapping[str, Any], log_path: str, read_info: Mapping[str, Any],
                 summary: Mapping[str, Any], series: Mapping[str, Any], admin_comment: str,
                 now_s: float) -> dict[str, Any]:
    """The spool record (v1): what the AdminComment says, plus the time series and provenance."""
    return {
        "v": hooks.RECORD_V,
        "job": {k: job.get(k) for k in ("job_id", "uid", "user", "name", "nodelist", "n_nodes",
                                        "restart", "exit_code", "derived_ec", "partition",
                                        "start_time", "end_time", "alloc_gpus", "gsrc")},
        "comment": hooks.decode_field(job.get("comment")) or {},
        "log": {"path": log_path, **read_info},
        "summary": dict(summary),
        "admin_comment": admin_comment,
        "series": dict(series),
        "written": int(now_s),
    }


ADMIN_COMMENT_MODES = ("auto", "never", "always")
# Markers of a log worth summarising, looked for in its head only when the job is not
# slurmpod's: Megatron's arguments banner and iteration lines, NeMo's step timing.
MEGATRON_MARKERS = (b" arguments ---", b"elapsed time per iteration", b"train_step_timing")


@dataclass(frozen=True)
class EpilogOptions:
    """What the admin's wrapper decides (`slurmpod hook epilog` options)."""

    head_bytes: int = DEFAULT_HEAD_BYTES
    tail_bytes: int = DEFAULT_TAIL_BYTES
    peak_tflops: float | None = None  # --peak-tflops: one peak for every job
    site_gpu: Callable[[str], SiteGpu | None] | None = None  # nodelist -> the site's GPU
    track_all: bool = False
    admin_comment: str = "auto"  # auto | never | always (ADMIN_COMMENT_MODES)
    gpu_run: Callable[[list[str], float], tuple[int, str, str]] | None = None  # telemetry tools


def run_epilog(
    env: Mapping[str, str],
    spool_dir: Path | str,
    *,
    deliver: Deliver | None = None,
    summarise: Callable[..., tuple[dict[str, Any], dict[str, Any]]] | None = None,
    head_bytes: int = DEFAULT_HEAD_BYTES,
    tail_bytes: int = DEFAULT_TAIL_BYTES,
    peak_tflops: float | None = None,
    site_gpu: Callable[[str], SiteGpu | None] | None = None,
    slurm_conf: str | None = None,
    track_all: bool = False,
    admin_comment: str = "auto",
    show_job: Callable[[str], str | None] | None = None,
    admin_now: Callable[[str], str | None] | None = None,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Do everything the module docstring lists. Returns 0, always.

    Jobs that are neither slurmpod's (no slurmpod Comment) nor Megatron (no marker in the
    log's head) get nothing stored unless `track_all`: their AdminComment is left alone.
    `show_job(job_id)` gives `scontrol show job` text and `admin_now(job_id)` the AdminComment
    slurmdbd holds; both default to Slurm's commands when `deliver` is not given (tests pass
    fakes).
    """
    try:
        spool = Spool(spool_dir)
    except OSError as exc:
        logging.getLogger("slurmpod.hook").error("spool %s unusable: %s", spool_dir, exc)
        return 0
    handler = setup_logging(spool.root)
    opts = EpilogOptions(head_bytes, tail_bytes, peak_tflops, site_gpu, track_all,
                         admin_comment if admin_comment in ADMIN_COMMENT_MODES else "auto")
    try:
        if deliver is None:
            conf = slurm_conf or env.get("SLURM_CONF") or slurmctld_conf()
            run = local_runner(conf)
            deliver = slurm_deliver(run)
            opts = replace(opts, gpu_run=run)
            show_job = show_job or (lambda jid: scontrol_job(run, jid))
            admin_now = admin_now or (lambda jid: current_admin_comment(run, jid))
        _epilog(env, spool, deliver, summarise, opts, now, show_job, admin_now, sleep)
    except Exception:  # never fail the epilog: record the bug and go on
        log.exception("epilog for job %s failed", env.get("SLURM_JOB_ID", "?"))
    finally:
        if handler is not None:
            handler.close()
            log.removeHandler(handler)
    return 0


def _looks_like_training(log_path: str, uid: int | None, head_bytes: int) -> bool:
    """Whether a job slurmpod did not submit printed Megatron/NeMo output: its log's head only
    (the arguments dump and the first iterations are there), so deciding costs O(1)."""
    if uid is None:
        return False
    try:
        got = read_job_file(log_path, uid, head_bytes=min(head_bytes, 1 << 20), tail_bytes=0)
        head = b"".join(got.chunks())
    except (UnsafeFileError, OSError):
        return False
    return any(m in head for m in MEGATRON_MARKERS)


def _epilog(env: Mapping[str, str], spool: Spool, deliver: Deliver,
            summarise: Callable[..., tuple[dict[str, Any], dict[str, Any]]] | None,
            opts: EpilogOptions, now: Callable[[], float],
            show_job: Callable[[str], str | None] | None,
            admin_now: Callable[[str], str | None] | None,
            sleep: Callable[[float], None] = time.sleep) -> None:
    job = job_from_env(env)
    try:
        job_id = safe_job_id(job["job_id"])
    except ValueError:
        log.error("no usable SLURM_JOB_ID (%r): nothing to do", job["job_id"])
        return
    log_path = expand_output_pattern(env.get("SLURM_JOB_STDOUT", ""), env)
    # Decide first, reading nothing large: most jobs of a cluster are not slurmpod's.
    if (not opts.track_all and not is_tracked(job.get("comment"))
            and not _looks_like_training(log_path, job["uid"], opts.head_bytes)):
        log.info("job %s: not a slurmpod job and no Megatron output; nothing stored", job_id)
        _flush_queue(spool, deliver)
        return
    _trusted_facts(job, job_id, show_job, opts)
    summary: dict[str, Any]
    series: dict[str, Any] = {}
    read_info: dict[str, Any] = {}
    if job["uid"] is None:
        summary = {"err": "no-uid"}
        log.error("job %s: SLURM_JOB_UID missing; log not read", job_id)
    else:
        try:
            with stream_job_file(log_path, job["uid"], head_bytes=opts.head_bytes,
                                 tail_bytes=opts.tail_bytes) as got:
                read_info = {"bytes": got.size, "truncated": got.truncated}
                summary, series = _summarise(got, job, job_id, log_path, summarise, opts)
        except UnsafeFileError as exc:
            summary = {"err": exc.reason}
            read_info = {"refused": exc.reason}
            log.warning("job %s: log %s refused (%s)%s; no data read", job_id, log_path,
                        exc.reason, f": {exc.detail}" if exc.detail else "")
        except OSError as exc:
            summary = {"err": "unreadable"}
            read_info = {"refused": "unreadable"}
            log.warning("job %s: log %s unreadable: %s", job_id, log_path, exc)
    summary.setdefault("gpus", job.get("alloc_gpus"))
    summary["attempt"] = job["restart"]
    gpu_part = _gpu_telemetry(job, env, log_path, summary, opts)
    admin = hooks.build_admin_comment(summary)
    record = build_record(job, log_path, read_info, summary, series, admin, now())
    if gpu_part:
        record["gpu"] = gpu_part
    try:
        path = spool.write_record(job_id, job["restart"], record)
        log.info("job %s: record %s, admin comment %s", job_id, path, admin)
    except OSError as exc:
        log.error("job %s: cannot write record: %s", job_id, exc)
    if not _may_write_admin_comment(job_id, opts.admin_comment, admin_now):
        _flush_queue(spool, deliver)
        return
    try:
        _deliver_soon(deliver, job_id, "admin_comment", admin, sleep)
        log.info("job %s: admin comment delivered", job_id)
        delivered = True
    except DeliveryError as exc:
        spool.put(job_id, "admin_comment", admin, error=str(exc), attempt=job["restart"])
        log.warning("job %s: admin comment queued in the spool (%s)", job_id, exc)
        delivered = False
    if delivered:
        _flush_queue(spool, deliver)


def _summarise(got: StreamedRead, job: dict[str, Any], job_id: str, log_path: str,
               summarise: Callable[..., tuple[dict[str, Any], dict[str, Any]]] | None,
               opts: EpilogOptions) -> tuple[dict[str, Any], dict[str, Any]]:
    if summarise is None:
        from slurmpod.accounting.figures import summarise_log  # lazy: start-up

        summarise = summarise_log
    gpu: SiteGpu | None = job.get("site_gpu")
    peak = gpu.peak_tflops if gpu else opts.peak_tflops
    try:
        return summarise(got.chunks(), job, peak_tflops=peak,
                         peak_fp8=gpu.peak_fp8 if gpu else None, truncated=got.truncated)
    except OSError:
        raise  # the read itself failed: "unreadable"
    except Exception as exc:  # a parser bug must not cost the record
        log.exception("job %s: summarising %s failed", job_id, log_path)
        return {"err": f"summary-{type(exc).__name__}"}, {}


def _gpu_telemetry(job: dict[str, Any], env: Mapping[str, str], log_path: str,
                   summary: dict[str, Any], opts: EpilogOptions) -> dict[str, Any] | None:
    """GPU figures from the site's tools or the job's monitor (slurmpod.telemetry.collect):
    `summary["gpu"]`, and the per-GPU part of the record returned."""
    from slurmpod.telemetry.collect import collect_for_epilog  # lazy: start-up

    gpu: SiteGpu | None = job.get("site_gpu")

    def read(path: str, uid: int, cap: int) -> bytes:
        return b"".join(read_job_file(path, uid, head_bytes=cap, tail_bytes=0).chunks())

    got, part, tried = collect_for_epilog(job, env, opts.gpu_run, log_path=log_path,
                                          model=gpu.model if gpu else None, read_file=read,
                                          path_env=env.get("PATH"),
                                          comment=hooks.decode_field(job.get("comment")))
    if got is not None:
        summary["gpu"] = got
    if tried:
        log.info("job %s: GPU telemetry %s; not measured by %s", job.get("job_id"),
                 got.get("src") if got else "none",
                 ", ".join(f"{k} ({v})" for k, v in tried.items()))
    return part


def _trusted_facts(job: dict[str, Any], job_id: str,
                   show_job: Callable[[str], str | None] | None, opts: EpilogOptions) -> None:
    """Fill in from Slurm and the site what the figures' scale depends on: the attempt, the
    start and end, the allocated GPUs and the GPU's peak (trusted.py says why these)."""
    slurm = None
    if show_job is not None:
        text = show_job(job_id)
        slurm = parse_scontrol_job(text, job_id, job.get("name") or "") if text else None
        if text and slurm is None:
            log.warning("job %s: scontrol output does not start with this job's id and name; "
                        "not used", job_id)
    if slurm is not None:
        if slurm.restarts is not None:
            job["restart"] = slurm.restarts  # 22.05 does not export SLURM_JOB_RESTART_COUNT
        job["start_time"] = job["start_time"] or slurm.start_time
        job["end_time"] = job["end_time"] or slurm.end_time
        job["nodelist"] = job["nodelist"] or slurm.nodelist or ""
    gpu = opts.site_gpu(job["nodelist"]) if opts.site_gpu and job["nodelist"] else None
    job["site_gpu"] = gpu
    job["alloc_gpus"], job["gsrc"] = allocated_gpus(slurm, job, gpu)


def _may_write_admin_comment(job_id: str, mode: str,
                             admin_now: Callable[[str], str | None] | None) -> bool:
    """`never`: the spool only. `auto`: not over another tool's AdminComment (jobstats keeps
    `JS1:<base64 gzip JSON>` there). `always`: overwrite."""
    if mode == "never":
        log.info("job %s: AdminComment left alone (--admin-comment never); record in the spool",
                 job_id)
        return False
    if mode == "always" or admin_now is None:
        return True
    current = admin_now(job_id)
    if current and hooks.decode_field(current) is None:
        # sacctmgr before Slurm 23.02 lower-cases what it stores: `js1:` is jobstats' too
        owner = "jobstats" if current[:4].upper() == "JS1:" else "another tool"
        log.info("job %s: AdminComment holds %s's summary; left alone, record in the spool",
                 job_id, owner)
        return False
    return True


def _deliver_soon(deliver: Deliver, job_id: str, kind: str, value: str,
                  sleep: Callable[[float], None]) -> None:
    """Deliver, waiting briefly while slurmdbd has not got the job's record yet. Otherwise the
    update would sit in the spool until some later job's epilog (none, for a cluster's last job).
    Other failures (slurmdbd down) go to the spool at once."""
    for wait_s in NOT_YET_WAITS_S:
        try:
            deliver(job_id, kind, value)
            return
        except DeliveryError as exc:
            if not any(s in str(exc) for s in NOT_YET_IN_SLURMDBD):
                raise
            log.info("job %s: not in slurmdbd yet; retrying in %g s", job_id, wait_s)
            sleep(wait_s)
    deliver(job_id, kind, value)


def _flush_queue(spool: Spool, deliver: Deliver) -> None:
    """Deliver what earlier epilogs queued; stop at the first failure (Slurm still down)."""
    if not spool.list_pending():
        return
    result = spool.flush(deliver, blocking=False, stop_after_failures=1)
    if result.delivered or result.failed:
        log.info("flush: delivered %s, still pending %s", result.delivered, result.failed)


def is_tracked(comment: str | None) -> bool:
    """A job slurmpod submitted (rendered Comment) or whose monitor wrote Comment v1."""
    return hooks.is_slurmpod_comment(hooks.decode_field(comment))


def default_spool(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get(SPOOL_ENV) or DEFAULT_SPOOL)
