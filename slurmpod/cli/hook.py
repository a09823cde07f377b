"""`slurmpod hook monitor|epilog|flush`: the accounting hooks run by jobs and by slurmctld."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click

from slurmpod.cli.output import emit_json, table
from slurmpod.errors import SlurmError, UsageError
from slurmpod.telemetry.runner import run


def _site_peak(site: str | None) -> float | None:
    """Peak dense BF16 TFLOP/s of the site's (first) GPU type."""
    if not site:
        return None
    from slurmpod.config import load_site, resolve_site_path  # lazy: start-up

    s = load_site(resolve_site_path(site))
    return s.node_types[s.su_groups[0].node_type].gpu.peak_tflops_bf16


def _site_gpu_resolver(site: str | None) -> Any:
    """nodelist -> the site's GPU of those nodes (trusted.site_gpu), or None without a site."""
    if not site:
        return None
    from slurmpod.accounting.trusted import site_gpu  # lazy: start-up
    from slurmpod.config import load_site, resolve_site_path  # lazy: start-up

    s = load_site(resolve_site_path(site))
    inv = s.inventory
    return lambda nodelist: site_gpu(nodelist, s, inv)


def _gpu_sampler() -> Any:
    """nvidia-smi sampling of the job's GPUs on this node (bounded: 10 s per call)."""
    from slurmpod.telemetry.sampler import Sampler, job_gpu_ids  # lazy: start-up

    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename
    return Sampler(run, node=node, ids=job_gpu_ids(os.environ))


@click.group()
def hook() -> None:
    """Accounting hooks: live MFU in the job's Comment, final summary in its AdminComment."""


@hook.command()
@click.option("--log", "log_path", type=click.Path(dir_okay=False),
              help="The job's log; default: the batch script's stdout, else scontrol's StdOut.")
@click.option("--job-id", envvar="SLURM_JOB_ID", required=True, help="Default: $SLURM_JOB_ID.")
@click.option("--interval-s", type=click.FloatRange(min=1.0), default=180.0, show_default=True,
              envvar="SLURMPOD_MONITOR_INTERVAL_S",
              help="Seconds between Comment updates [env SLURMPOD_MONITOR_INTERVAL_S].")
@click.option("--peak-tflops", type=click.FloatRange(min=0.0, min_open=True),
              help="Peak per GPU, if the Comment has none (default: --site's GPU).")
@click.option("--site", help="Site file or built-in name, for the GPU peak.")
@click.option("--parent-pid", type=int, help="Exit when this process ends (default: parent).")
@click.option("--max-cycles", type=click.IntRange(min=1), hidden=True)
@click.option("--gpu-telemetry/--no-gpu-telemetry", default=True, show_default=True,
              envvar="SLURMPOD_MONITOR_GPUS",
              help="Sample this node's GPUs with nvidia-smi each interval (docs/telemetry.md).")
@click.option("--attempts", "attempts_path", type=click.Path(dir_okay=False),
              help="The run's attempts record: turns hang detection on (a hang is recorded "
                   "there and the batch script, --parent-pid, gets SIGUSR1).")
@click.option("--hang-k", type=click.FloatRange(min=1.0), default=10.0, show_default=True,
              help="A hang: no iteration for k x the median step time (at least --hang-floor-s).")
@click.option("--hang-floor-s", type=click.FloatRange(min=1.0), default=300.0, show_default=True)
@click.option("--hang-setup-s", type=click.FloatRange(min=1.0), default=1800.0,
              show_default=True, help="Launch to first iteration.")
@click.option("--hang-save-s", type=click.FloatRange(min=1.0), default=1800.0,
              show_default=True, help="One checkpoint save.")
@click.option("--poll-s", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              help="Seconds between looks at the log for a hang.")
def monitor(log_path: str | None, job_id: str, interval_s: float, peak_tflops: float | None,
            site: str | None, parent_pid: int | None, max_cycles: int | None,
            gpu_telemetry: bool, attempts_path: str | None, hang_k: float, hang_floor_s: float,
            hang_setup_s: float, hang_save_s: float, poll_s: float) -> None:
    """Follow the job's log; every interval set its Comment to live MFU (Comment v1 JSON);
    with --attempts, detect hangs (docs/resilience-in-job.md)."""
    import logging  # lazy: start-up

    from slurmpod.accounting import monitor as mon  # lazy: start-up
    from slurmpod.backends.cli import CliBackend  # lazy: start-up
    from slurmpod.backends.parse import parse_scontrol_kv  # lazy: start-up
    from slurmpod.transport.local import LocalRunner  # lazy: start-up

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s slurmpod-monitor %(levelname)s %(message)s")
    backend = CliBackend(LocalRunner(), retries=1, timeout_s=30.0)
    peak = peak_tflops or _site_peak(site)
    ppid = parent_pid if parent_pid is not None else os.getppid()

    def show_job(jid: str) -> dict[str, str]:
        out = backend.query(["scontrol", "--oneliner", "show", "job", jid]).stdout
        return parse_scontrol_kv(out.strip().splitlines()[0]) if out.strip() else {}

    path = log_path or os.environ.get("SLURMPOD_LOG") or mon.find_log(job_id, ppid, show_job)
    if not path:
        raise UsageError(f"cannot find the log of job {job_id}", hint="pass --log FILE")

    def query(jid: str) -> tuple[str, str] | None:
        """(state, comment) of one job; ("", "") once Slurm no longer knows it; None if Slurm
        did not answer. `squeue -j ID` asks slurmctld for that job only (22.05's `--json` would
        dump every job of the cluster, every interval, from every running job)."""
        try:
            res = backend.runner.run(["squeue", "-h", "-j", jid, "-o", "%T|%k"], timeout_s=30.0,
                                     check=False)
        except SlurmError:
            return None
        if res.returncode != 0:
            # "Invalid job id specified": the job left the controller (MinJobAge)
            return ("", "") if "Invalid job id" in res.stderr else None
        state, _, comment = res.stdout.strip().partition("|")
        return state, "" if comment == "(null)" else comment

    def get_comment(jid: str) -> str | None:
        q = query(jid)
        return q[1] if q is not None else None

    def job_running(jid: str) -> bool | None:
        q = query(jid)
        return None if q is None else q[0] in ("RUNNING", "CONFIGURING")

    stop = threading.Event()
    mon.install_signal_handlers(stop)
    def on_hang(hang: Any) -> None:

        assert attempts_path is not None
        fd = os.open(attempts_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, mon.hang_record(job_id, hang, time.time()))
        finally:
            os.close(fd)
        if ppid:
            os.kill(ppid, signal.SIGUSR1)  # the batch script dumps stacks and ends the step

    io = mon.MonitorIO(get_comment=get_comment, set_comment=backend.update_comment,
                       job_running=job_running, sleep=stop.wait,
                       sampler=_gpu_sampler() if gpu_telemetry else None,
                       on_hang=on_hang if attempts_path else None)
    policy = mon.HangPolicy(k=hang_k, floor_s=hang_floor_s, setup_s=hang_setup_s,
                            save_s=hang_save_s)
    state = mon.run_monitor(job_id, path, io, interval_s=interval_s, peak_hint=peak,
                            parent_pid=ppid, stop=stop, max_cycles=max_cycles, poll_s=poll_s,
                            hang_policy=policy)
    logging.getLogger("slurmpod.hook.monitor").info(
        "job %s: monitor done (%d updates, %d failed)", job_id, state.updates, state.failures)


@hook.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("--spool", envvar="SLURMPOD_SPOOL", help="Spool directory (default "
              "$SLURMPOD_SPOOL, else /var/spool/slurmpod).")
@click.option("--site", help="Site file or built-in name: the GPU and its peak by the job's nodes.")
@click.option("--peak-tflops", help="Peak per GPU for jobs on nodes the site file does not know.")
@click.option("--head-mb", default="1", show_default=True, help="Read at most this from the start")
@click.option("--tail-mb", default="64", show_default=True, help="… and this from the end.")
@click.option("--slurm-conf", help="slurm.conf for sacctmgr (default: slurmctld's own).")
@click.option("--all-jobs", is_flag=True,
              help="Store a summary for every job, not only slurmpod/Megatron ones.")
@click.option("--admin-comment", "admin_mode", default="auto", show_default=True,
              help="auto: set AdminComment unless another tool's (jobstats) is there; never: "
                   "the spool only; always: overwrite.")
def epilog(spool: str | None, site: str | None, peak_tflops: str | None, head_mb: str,
           tail_mb: str, slurm_conf: str | None, all_jobs: bool, admin_mode: str) -> None:
    """EpilogSlurmctld hook: final summary to AdminComment and the spool. Always exits 0."""
    from slurmpod.accounting.epilog import default_spool, log, run_epilog  # lazy: start-up

    root = Path(spool) if spool else default_spool()
    peak: float | None = None
    site_gpu = None
    try:
        peak = float(peak_tflops) if peak_tflops else None
        head, tail = int(float(head_mb) * (1 << 20)), int(float(tail_mb) * (1 << 20))
    except Exception as exc:  # a bad option must not fail the epilog: log it, use defaults
        print(f"slurmpod hook epilog: ignoring bad option: {exc}", file=sys.stderr)
        head, tail = 1 << 20, 64 << 20
    try:
        site_gpu = _site_gpu_resolver(site)
    except Exception as exc:  # an unreadable site file: no peaks, but the record is still kept
        print(f"slurmpod hook epilog: site {site}: {exc}; no GPU peaks", file=sys.stderr)
    try:
        run_epilog(os.environ, root, peak_tflops=peak, site_gpu=site_gpu, head_bytes=head,
                   tail_bytes=tail, slurm_conf=slurm_conf, track_all=all_jobs,
                   admin_comment=admin_mode)
    except BaseException as exc:  # run_epilog catches everything; this is the last resort
        log.error("epilog crashed: %r", exc)
    sys.exit(0)


@hook.command()
@click.option("--spool", envvar="SLURMPOD_SPOOL", help="Spool directory (default "
              "$SLURMPOD_SPOOL, else /var/spool/slurmpod).")
@click.option("--list", "list_only", is_flag=True, help="Only list what is pending.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def flush(spool: str | None, list_only: bool, as_json: bool) -> None:
    """Deliver AdminComment updates queued while slurmctld/slurmdbd were unreachable."""
    from slurmpod.accounting.epilog import default_spool, local_run, slurm_deliver  # lazy: start-up
    from slurmpod.accounting.spool import Spool  # lazy: start-up

    root = Path(spool) if spool else default_spool()
    if not root.is_dir():
        raise UsageError(f"{root}: no such spool directory",
                         hint="pass --spool DIR or set SLURMPOD_SPOOL")
    sp = Spool(root)
    if list_only:
        rows = [(d.get("job_id"), d.get("kind"), d.get("attempts"), d.get("last_error", ""))
                for d in sp.list_pending()]
        if as_json:
            emit_json([dict(zip(("job_id", "kind", "attempts", "last_error"), r, strict=True))
                       for r in rows])
        else:
            click.echo(table(["job", "kind", "attempts", "last error"], rows) if rows
                       else "nothing pending")
        return
    result = sp.flush(slurm_deliver(local_run))
    if as_json:
        emit_json(result.to_json())
    else:
        click.echo(f"delivered {len(result.delivered)}, pending {len(result.failed)}")
        for key, err in result.errors.items():
            click.echo(f"  {key}: {err}")
    if result.failed:
        raise SlurmError(f"{len(result.failed)} update(s) still pending in {root}",
                         hint="is slurmdbd running? `sacctmgr show cluster`; then run again")
