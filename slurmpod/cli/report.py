"""`slurmpod report`: the efficiency report of one job, or of the fleet over a time window.

    slurmpod report 1234 [--json [--series] | --html FILE] [--site SITE] [--spool DIR]
    slurmpod report --since 7d [--user U] [--account A] [--partition P] [--efficiency]
    ... [--json | --csv | --html F]
    ... [--prometheus FILE]

Data: sacct (slurmpod's `--parsable2` fields, every attempt of a requeued job; see
`slurmpod.report.sacct` for why not `--json`), the AdminComment summary
the EpilogSlurmctld hook stored, and the hook's spool record (summary + time series) when the
spool is readable here. This module is the I/O edge; `slurmpod.report` is pure.
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import operator
import os
import re
import sys
import time
from dataclasses import fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import click

from slurmpod.accounting.safeio import UnsafeFileError, expand_output_pattern, read_job_file
from slurmpod.cli.output import emit_json
from slurmpod.errors import CommandError, SlurmError, UsageError
from slurmpod.report.extras import page_extras

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping

    from slurmpod.model.jobs import JobState
    from slurmpod.model.site import Inventory, Site
    from slurmpod.report.fleet import FleetReport, JobRow
    from slurmpod.report.model import JobReport, LogHints
    from slurmpod.report.sacct import SacctJob, Usage

_JOB_ID = re.compile(r"^[0-9]+(?:[_+][0-9]+)?$")
_SINCE = re.compile(r"^(\d+)\s*(s|m|h|d|w)$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2})?)?$")
PROGRESS_MIN_JOBS = 100
PARALLEL_MIN_JOBS = 20_000  # below this a fork costs more than it saves
LOG_HEAD_BYTES = 4 << 20
SACCT_TIMEOUT_S = 120.0


def slurm_since(text: str) -> str:
    """`7d`, `12h`, `2w`, `30m` -> sacct's `now-7days`; ISO dates pass through."""
    t = text.strip()
    m = _SINCE.match(t)
    if m:
        return f"now-{int(m.group(1))}{_UNITS[m.group(2)]}"
    if _DATE.match(t):
        return t
    raise UsageError(f"--since {text!r}: expected a duration like 7d, 12h, 2w, 30m or a date "
                     "YYYY-MM-DD[THH:MM[:SS]]")


def window_selection(since: str, user: str | None, account: str | None,
                     partition: str | None) -> list[str]:
    """sacct's selection of the jobs of a window (`--since`), all users' unless one is named."""
    sel = [f"--starttime={slurm_since(since)}", "--endtime=now"]
    sel += [f"--user={user}"] if user else ["--allusers"]
    if account:
        sel.append(f"--accounts={account}")
    if partition:
        sel.append(f"--partition={partition}")
    return sel


def _sacct(argv: list[str]) -> str:
    """sacct's output, with the CLI backend's retry while slurmdbd is briefly unreachable."""
    from slurmpod.backends.cli import CliBackend  # lazy: start-up
    from slurmpod.backends.parse import SACCT_TIME_ENV  # lazy: start-up
    from slurmpod.transport.local import LocalRunner  # lazy: start-up

    try:
        return CliBackend(LocalRunner(), timeout_s=SACCT_TIMEOUT_S).query(
            argv, env=SACCT_TIME_ENV).stdout
    except CommandError as exc:  # the message already names sacct and its last stderr line
        if "Invalid user id" in exc.stderr:  # also Slurm's answer to "nobody" (uid.c, 25.11)
            raise UsageError(f"--user: {exc.message}",
                             hint="name a user this machine resolves (getent passwd NAME)"
                             ) from None
        raise SlurmError(exc.message,
                         hint="is slurmdbd running and accounting enabled? try `sacct -X`"
                         ) from None


def _spool_dir(option: str | None) -> Path:
    if option:
        return Path(option)
    sandbox = os.environ.get("SLURMPOD_SANDBOX")
    if sandbox:
        return Path(sandbox) / "spool"
    return Path("/var/spool/slurmpod")


def spool_index(spool: Path, *, compact: bool = False) -> dict[str, Path]:
    """job id -> its latest attempt's record (`records/<job>.<attempt>.json`), listing the
    directory once (a fleet report looks up thousands of jobs). `compact`: that attempt's
    summary (`summaries/<job>.<attempt>.json`, no series) where it has one."""
    from slurmpod.accounting.spool import latest_record_paths  # lazy: start-up

    return {k: Path(p) for k, p in latest_record_paths(spool, compact=compact).items()}


def read_spool_record(path: Path | str | None) -> dict[str, Any] | None:
    """A spool record or compact summary (record v1); None when missing or not one."""
    from slurmpod.accounting.spool import read_json_file  # lazy: start-up

    if path is None:
        return None
    try:
        doc = read_json_file(path)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("v") == 1 else None


def log_hints(record: dict[str, Any] | None) -> LogHints | None:
    """NCCL topology evidence from the head of the job's log, if this user can read it."""
    from slurmpod.report.model import LogHints  # lazy: start-up

    log = (record or {}).get("log") or {}
    path = str(log.get("path") or "")
    uid = ((record or {}).get("job") or {}).get("uid")
    if not path or log.get("refused") or not isinstance(uid, int):
        return None
    try:
        # The epilog's reader: the job chose this path, so no symlink, FIFO, device or other
        # user's file, and a bounded read (an admin running the report may be root).
        head = read_job_file(path, uid, head_bytes=LOG_HEAD_BYTES, tail_bytes=0).head
    except (UnsafeFileError, OSError):
        return None
    warn = re.search(rb"NCCL_TOPO_FILE \S* ?is not readable", head) is not None
    return LogHints(path=path, nccl_topo_warning=warn,
                    nccl_topo_loaded=b"NCCL_TOPO_FILE set by environment to" in head,
                    nccl_info=b"NCCL INFO" in head, attempt_ends=attempt_ends(path),
                    args=megatron_args(head))


def megatron_args(head: bytes) -> Mapping[str, Any] | None:
    """Megatron's arguments dump in the head of the log (the model and layout the job ran, for
    the report's achieved vs predicted); None without one or when it cannot be parsed."""

    from slurmpod.accounting.logparse import parse_log  # lazy: start-up

    if b"arguments" not in head:
        return None
    try:
        return parse_log(io.BytesIO(head)).args
    except (ValueError, OverflowError):
        return None


def attempt_ends(log_path: str) -> tuple[str, ...]:
    """Why each attempt that wrote to this log ended, from the job script's record in the run
    directory; () when it cannot be read (slurmpod.runs.local opens it safely)."""
    from slurmpod.runs.local import attempts_of_log  # lazy: start-up

    return tuple(a.end or "running" for a in attempts_of_log(log_path) or ())


def _inventory(site: str | None) -> Inventory | None:
    return _site(site)[0].inventory


def _site(site: str | None) -> tuple[Site, Path]:
    from slurmpod.config import load_site, resolve_site_path  # lazy: start-up

    path = Path(resolve_site_path(site))
    return load_site(path), path


def _write(path: Path, text: str, what: str) -> None:
    from slurmpod.fsutil import output_error, write_atomic  # lazy: start-up

    try:
        write_atomic(path, text)
    except OSError as exc:
        raise output_error(f"the {what} {path}", exc) from None
    click.echo(f"wrote {what} {path}", err=True)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@contextlib.contextmanager
def _no_cyclic_gc() -> Iterator[None]:
    """Building 100,000 job reports allocates millions of small acyclic objects; the cyclic
    collector would rescan the growing heap again and again (a third of the time at 100,000
    jobs, benchmarks/report_scale.py). Reference counting still frees everything."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def build_reports(jobs: list[SacctJob], spool: Path, inventory: Inventory | None, *,
                  with_series: bool, hints: bool = False, progress: bool = False,
                  typical_mfu: dict[str, float] | None = None,
                  usage: dict[str, Usage] | None = None, site: Site | None = None,
                  site_path: Path | None = None) -> list[JobReport]:
    """One report per job. Without the series (a fleet) each job's compact summary is read
    instead of its record: 10,000 full records are ~330 MB of JSON, their summaries ~12 MB."""
    from slurmpod.accounting.spool import latest_record_paths  # lazy: start-up
    from slurmpod.report.build import build_job_report  # lazy: start-up

    index = latest_record_paths(spool, compact=not with_series)

    def one(sj: SacctJob) -> JobReport:
        rec = read_spool_record(index.get(sj.record.job_id))
        return build_job_report(sj, spool_record=rec, inventory=inventory,
                                log_hints=log_hints(rec) if hints else None,
                                typical_mfu=typical_mfu, with_series=with_series,
                                with_notes=with_series,
                                usage=(usage or {}).get(sj.record.job_id),
                                site=site, site_path=site_path)

    with _no_cyclic_gc():
        if progress and len(jobs) >= PROGRESS_MIN_JOBS:
            with click.progressbar(jobs, label="reading jobs", file=sys.stderr) as bar:
                return [one(sj) for sj in bar]
        return [one(sj) for sj in jobs]


def fleet_of(jobs: list[SacctJob], spool: Path, *, window: str,
             filters: dict[str, str | None] | None = None, progress: bool = False,
             usage: Mapping[str, Usage] | None = None) -> FleetReport:
    """The fleet report of these jobs, from their compact spool summaries (never the series).

    Each job's report is made, turned into its row and dropped (100,000 reports are not held
    at once). From `PARALLEL_MIN_JOBS` jobs on, a forked child does the second half of the jobs
    while this process does the first: reading the summaries and building the rows is ~85 % of
    this function's time, and sending the child's rows back as pickled tuples costs about a
    tenth of building them. That pays on a machine with a free core; where every core is busy
    the two processes only compete (benchmarks/report_scale.py prints both)."""
    from slurmpod.accounting.spool import latest_record_paths  # lazy: start-up
    from slurmpod.report.fleet import attach_usage, fleet_from_rows  # lazy: start-up

    index = latest_record_paths(spool, compact=True)
    with _no_cyclic_gc():
        if len(jobs) >= PARALLEL_MIN_JOBS and _cpus() >= 2 and hasattr(os, "fork"):
            half = len(jobs) // 2
            rows, running = _rows_in_two(jobs[:half], jobs[half:], index, progress)
        else:
            rows, running = _fleet_rows(jobs, index, progress)
        if usage is not None:  # `--efficiency`
            attach_usage(rows, usage)
        return fleet_from_rows(rows, running, window=window, filters=filters,
                               efficiency=usage is not None)


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _fleet_rows(jobs: list[SacctJob], index: dict[str, str],
                progress: bool) -> tuple[list[JobRow], int]:
    from slurmpod.report.build import build_job_report  # lazy: start-up
    from slurmpod.report.fleet import rows_of  # lazy: start-up

    def reports(part: Iterable[SacctJob]) -> Iterator[JobReport]:
        for sj in part:
            yield build_job_report(sj, spool_record=read_spool_record(index.get(
                sj.record.job_id)), with_series=False, with_notes=False)

    if progress and len(jobs) >= PROGRESS_MIN_JOBS:
        with click.progressbar(jobs, label="reading jobs", file=sys.stderr) as bar:
            return rows_of(reports(bar))
    return rows_of(reports(jobs))


def _rows_in_two(mine: list[SacctJob], theirs: list[SacctJob], index: dict[str, str],
                 progress: bool) -> tuple[list[JobRow], int]:
    """`_fleet_rows` of both halves, the second in a forked child. Whatever goes wrong in the
    child (killed, out of memory), this process does its half itself."""
    import pickle  # lazy: start-up

    from slurmpod.report.fleet import JobRow  # lazy: start-up

    values = operator.attrgetter(*(f.name for f in fields(JobRow)))
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the CLI
        code = 1
        try:
            os.close(rfd)
            rows, running = _fleet_rows(theirs, index, False)
            data = pickle.dumps((running, [values(r) for r in rows]),
                                protocol=pickle.HIGHEST_PROTOCOL)
            with os.fdopen(wfd, "wb") as out:
                out.write(data)
            code = 0
        finally:
            os._exit(code)
    os.close(wfd)
    got: tuple[int, list[tuple[Any, ...]]] | None = None
    inp = os.fdopen(rfd, "rb")
    try:
        rows, running = _fleet_rows(mine, index, progress)
        data = inp.read()
        with contextlib.suppress(pickle.UnpicklingError, EOFError, ValueError, TypeError):
            got = pickle.loads(data) if data else None
    finally:
        inp.close()  # on an error here too: the child's write fails and it exits
        _, status = os.waitpid(pid, 0)
    if got is None or status != 0:
        more, n_run = _fleet_rows(theirs, index, False)
        return rows + more, running + n_run
    return rows + [JobRow(*v) for v in got[1]], running + got[0]


@click.command("report")
@click.argument("job_id", required=False)
@click.option("--since", help="Fleet report over this window: 7d, 12h, 2w or a date.")
@click.option("--user", help="Fleet: only this user's jobs.")
@click.option("--account", help="Fleet: only this account's jobs.")
@click.option("--partition", help="Fleet: only this partition's jobs.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option("--series", is_flag=True, help="With --json: include the job's time series.")
@click.option("--jobs", "with_jobs", is_flag=True, help="With --json (fleet): one row per job.")
@click.option("--csv", "as_csv", is_flag=True, help="Fleet: one CSV row per job on stdout.")
@click.option("--reliability", is_flag=True,
              help="Fleet: failures per node and kind, suspect nodes, MTBF, GPU time lost "
                   "(one more sacct query; reads up to 500 jobs' attempts records).")
@click.option("--efficiency", is_flag=True,
              help="Fleet: CPU efficiency, memory used vs requested, time used vs limit per "
                   "job, with verdict counts (one more sacct query over every step row).")
@click.option("--html", "html_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a self-contained HTML report with plots.")
@click.option("--prometheus", "prom_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a Prometheus textfile (node_exporter textfile collector).")
@click.option("--typical-since", metavar="WINDOW",
              help="Job report: judge MFU against the fleet's typical MFU for the model's size "
                   "class over WINDOW (e.g. 30d) instead of the 35 % reference.")
@click.option("--watch", is_flag=True,
              help="Job report: refresh a running job's live figures with a progress line "
                   "until it ends (Ctrl-C stops; without a terminal one line per refresh).")
@click.option("--interval", type=click.FloatRange(1.0, 3600.0), default=10.0,
              show_default=True, help="With --watch: seconds between refreshes.")
@click.option("--count", type=click.IntRange(1, None),
              help="With --watch: stop after this many refreshes.")
@click.option("--site", help="Site file or built-in name, for placement "
                             "(default: $SLURMPOD_SITE, else dgx-h100-superpod).")
@click.option("--spool", envvar="SLURMPOD_SPOOL",
              help="The hooks' spool directory (default $SLURMPOD_SPOOL, the sandbox's spool "
                   "when $SLURMPOD_SANDBOX is set, else /var/spool/slurmpod).")
def report(job_id: str | None, since: str | None, user: str | None, account: str | None,
           partition: str | None, as_json: bool, series: bool, with_jobs: bool, as_csv: bool,
           html_file: Path | None, prom_file: Path | None, typical_since: str | None,
           watch: bool, interval: float, count: int | None, site: str | None,
           spool: str | None, reliability: bool = False, efficiency: bool = False) -> None:
    """Efficiency report of JOB_ID, or of every job since a time (--since)."""
    if (job_id is None) == (since is None):
        raise UsageError("give a JOB_ID or --since WINDOW (not both)",
                         hint="e.g. `slurmpod report 1234` or `slurmpod report --since 7d`")
    if as_json and as_csv:
        raise UsageError("--json and --csv are exclusive")
    spool_dir = _spool_dir(spool)
    if job_id is not None:
        if user or account or partition or as_csv or with_jobs or reliability or efficiency:
            raise UsageError("--user/--account/--partition/--csv/--jobs/--reliability/"
                             "--efficiency are for the fleet report (--since); a job report "
                             "always has its efficiency")
        if watch:
            if as_json or html_file or prom_file or typical_since:
                raise UsageError("--watch shows the report in the terminal: it takes no "
                                 "--json, --html, --prometheus or --typical-since")
            _watch(job_id, site, spool_dir, interval, count)
            return
        if count is not None:
            raise UsageError("--count is for --watch")
        _job(job_id, as_json, series, html_file, prom_file, site, spool_dir, typical_since)
    else:
        if typical_since:
            raise UsageError("--typical-since is for a job report; a fleet report computes "
                             "the typical MFU over its own window")
        if watch or count is not None:
            raise UsageError("--watch is for one running job (slurmpod report JOBID --watch)")
        if reliability and (as_csv or with_jobs or html_file or prom_file):
            raise UsageError("--reliability prints text or --json only")
        if reliability and efficiency:
            raise UsageError("--efficiency adds to the fleet report's rows, not to "
                             "--reliability")
        _fleet(str(since), user, account, partition, as_json, with_jobs, as_csv, html_file,
               prom_file, spool_dir, reliability, efficiency)


def _load(selection: list[str]) -> list[SacctJob]:
    from slurmpod.backends.parse import sacct_delimiter  # lazy: start-up
    from slurmpod.report.sacct import attempts_argv, jobs_from_text, records_argv  # lazy: start-up

    delim = sacct_delimiter()  # chosen now: no job's Comment or name can hold it
    records = _sacct(records_argv(selection, delim))
    attempts = _sacct(attempts_argv(selection, delim)) if records.strip() else ""
    return jobs_from_text(records, attempts, delim)


def load_usage(job_id: str) -> dict[str, Usage]:
    """The job's seff-style usage (every step row); {} when sacct cannot give it: the report
    then says "not measured" rather than failing."""
    return load_usage_of([f"--jobs={job_id}"])


def load_usage_of(selection: list[str], warn: bool = False) -> dict[str, Usage]:
    """The seff-style usage of every job `selection` picks (a fresh delimiter: JobID first and
    JobIDRaw last frame each row, so no job text can plant a field); {} when sacct fails."""
    from slurmpod.backends.parse import sacct_delimiter  # lazy: start-up
    from slurmpod.report.sacct import parse_usage, usage_selection_argv  # lazy: start-up

    delim = sacct_delimiter()
    try:
        return parse_usage(_sacct(usage_selection_argv(selection, delim)), delim)
    except (SlurmError, UsageError) as exc:
        if warn:
            click.echo(f"slurmpod: warning: usage query failed, no efficiency figures: {exc}",
                       err=True)
        return {}


def _job(job_id: str, as_json: bool, series: bool, html_file: Path | None,
         prom_file: Path | None, site: str | None, spool: Path,
         typical_since: str | None = None) -> None:
    if not _JOB_ID.match(job_id):
        raise UsageError(f"{job_id!r} is not a Slurm job id (123, 123_4 or 123+1)")
    jobs = [sj for sj in _load([f"--jobs={job_id}"]) if sj.record.job_id == job_id]
    if not jobs:
        raise SlurmError(f"job {job_id} is not in Slurm's accounting",
                         hint="check the id; a job appears in sacct a few seconds after "
                              "submission")
    typical = None
    fleet = None
    if typical_since:
        window = [f"--starttime={slurm_since(typical_since)}", "--endtime=now", "--allusers"]
        fleet = fleet_of(_load(window), spool, window=typical_since, progress=True)
        typical = fleet.typical_mfu
    site_obj, site_path = _site(site)
    (r,) = build_reports(jobs, spool, site_obj.inventory, with_series=True, hints=True,
                         typical_mfu=typical, usage=load_usage(job_id), site=site_obj,
                         site_path=site_path)
    if html_file is not None:
        from slurmpod.accounting.spool import latest_record_paths  # lazy: start-up
        from slurmpod.report.html import job_html  # lazy: start-up

        rec = read_spool_record(latest_record_paths(spool, compact=False).get(r.job.job_id))
        _write(html_file, job_html(r, generated=_now(), extras=page_extras(r, rec, fleet)),
               "HTML report")
    if prom_file is not None:
        from slurmpod.report.prom import job_exposition  # lazy: start-up

        _write(prom_file, job_exposition([r]), "Prometheus textfile")
    if as_json:

        emit_json(r.to_json(series=series))
    elif html_file is None and prom_file is None:
        from slurmpod.report.text import job_text  # lazy: start-up

        click.echo(job_text(r), nl=False)


def _fleet(since: str, user: str | None, account: str | None, partition: str | None,
           as_json: bool, with_jobs: bool, as_csv: bool, html_file: Path | None,
           prom_file: Path | None, spool: Path, reliability: bool = False,
           efficiency: bool = False) -> None:
    from slurmpod.report.sacct import select  # lazy: start-up

    sel = window_selection(since, user, account, partition)
    # The whole command without the cyclic collector: parsing, 100,000 reports and rows, a
    # 70 MB JSON document are all acyclic (see _no_cyclic_gc).
    with _no_cyclic_gc():
        jobs = select(_load(sel), user=user, account=account, partition=partition)
        # The same selection, every step row: only jobs of `jobs` get their usage attached.
        usage = None
        if efficiency:
            usage = load_usage_of(sel, warn=True) if jobs else {}
        fl = fleet_of(jobs, spool, window=since, progress=True,
                      filters={"user": user, "account": account, "partition": partition},
                      usage=usage)
        if reliability:
            _reliability(jobs, sel, spool, since, fl, as_json)
            return
        _fleet_out(fl, as_json, with_jobs, as_csv, html_file, prom_file)


def _reliability(jobs: list[SacctJob], sel: list[str], spool: Path, since: str,
                 fl: FleetReport, as_json: bool) -> None:
    """The reliability report (resilience/reliability.py): the phases query, then the attempts
    records next to the logs of at most MAX_RECORDS jobs, those that were interrupted first."""
    from slurmpod.backends.parse import sacct_delimiter  # lazy: start-up

    # lazy: start-up
    # lazy: start-up
    from slurmpod.resilience.reliability import (
        MAX_RECORDS,
        build_reliability,
        parse_phases,
        phases_argv,
        reliability_text,
    )
    from slurmpod.runs.local import attempts_of_log  # lazy: start-up

    delim = sacct_delimiter()
    ids = {sj.record.job_id for sj in jobs}
    phases = {k: v for k, v in parse_phases(_sacct(phases_argv(sel, delim)), delim).items()
              if k in ids}
    index = spool_index(spool, compact=True)
    # The jobs with more than one attempt have the most to say; then the newest.
    order = sorted(jobs, key=lambda sj: (-len(sj.attempts), -(sj.record.end_time.timestamp()
                                                                if sj.record.end_time else 0)))
    records: dict[str, Any] = {}
    wanted = [sj for sj in order if sj.record.job_id in index]
    for sj in wanted[:MAX_RECORDS]:
        rec = read_spool_record(index[sj.record.job_id])
        path = str(((rec or {}).get("log") or {}).get("path") or "")
        if path.startswith("/"):
            got = attempts_of_log(path)
            if got:
                records[sj.record.job_id] = got
    rel = build_reliability(jobs, window=since, phases=phases, records=records,
                            records_capped=len(wanted) > MAX_RECORDS,
                            loss_gpu_hours=fl.total.lost)
    if as_json:

        emit_json(rel.to_json())
    else:
        click.echo(reliability_text(rel), nl=False)


def _fleet_out(fl: FleetReport, as_json: bool, with_jobs: bool, as_csv: bool,
               html_file: Path | None, prom_file: Path | None) -> None:
    if html_file is not None:
        from slurmpod.report.html import fleet_html  # lazy: start-up

        _write(html_file, fleet_html(fl, generated=_now()), "HTML report")
    if prom_file is not None:
        from slurmpod.report.prom import fleet_exposition  # lazy: start-up

        _write(prom_file, fleet_exposition(fl), "Prometheus textfile")
    if as_json:

        emit_json(fl.to_json(jobs=with_jobs))
    elif as_csv:
        click.echo(fl.to_csv(), nl=False)
    elif html_file is None and prom_file is None:
        from slurmpod.report.text import fleet_text  # lazy: start-up

        click.echo(fleet_text(fl), nl=False)


LOG_TAIL_BYTES = 256 << 10  # the watch reads only the log's tail: the last iteration lines


def _watch(job_id: str, site: str | None, spool: Path, interval: float,
           count: int | None) -> None:
    """`--watch`: the job report again every `interval` seconds (report/watch.py)."""

    from slurmpod.report.watch import Frame, Progress, watch  # lazy: start-up

    if not _JOB_ID.match(job_id):
        raise UsageError(f"{job_id!r} is not a Slurm job id (123, 123_4 or 123+1)")
    inv = _inventory(site)
    log: list[tuple[str, int] | None] = []  # found once: (path, owner uid) or None

    def fetch() -> Frame:
        jobs = [sj for sj in _load([f"--jobs={job_id}"]) if sj.record.job_id == job_id]
        if not jobs:
            raise SlurmError(f"job {job_id} is not in Slurm's accounting",
                             hint="check the id; a job appears in sacct a few seconds after "
                                  "submission")
        (r,) = build_reports(jobs, spool, inv, with_series=True, hints=False,
                             usage=load_usage(job_id))
        live = _live_job(job_id) if r.job.state.is_active else None
        if live is not None and live.state is not None and live.state != r.job.state:
            # slurmdbd learns of a start or an end after slurmctld does (the controller sends
            # it asynchronously), so a running job can read PENDING in sacct for a while.
            r = replace(r, job=replace(r.job, state=live.state))
        if not log:
            log.append(live.log if live is not None else None)
        prog = _log_progress(*log[0]) if log[0] else None
        if prog is None and r.figures.last_iter is not None:
            prog = Progress(r.figures.last_iter, source="comment")
        return Frame(r, prog, datetime.now().strftime("%H:%M:%S"))

    out = sys.stdout  # not click.get_text_stream: deprecated since click 8.5
    rc = watch(fetch, out, interval_s=interval, count=count, tty=out.isatty(),
               sleep=time.sleep)
    if rc:
        sys.exit(rc)


class _LiveJob(NamedTuple):
    state: JobState | None  # slurmctld's view, ahead of slurmdbd's
    log: tuple[str, int] | None  # stdout file and owner uid


def _live_job(job_id: str) -> _LiveJob | None:
    """The job as slurmctld sees it, from `squeue --json` (JSON: no job text can plant a
    field): its state, and its stdout file expanded as slurmd does. None when squeue does not
    know the job (ended and purged, or an array task/het component, whose raw id differs)."""

    from slurmpod.backends.cli import CliBackend  # lazy: start-up
    from slurmpod.model.jobs import JobState  # lazy: start-up
    from slurmpod.transport.local import LocalRunner  # lazy: start-up

    if not job_id.isdigit():
        return None  # array tasks and het components: their raw id differs
    try:
        text = CliBackend(LocalRunner(), timeout_s=30.0).query(
            ["squeue", "--json", f"--jobs={job_id}"]).stdout
        doc = json.loads(text)
    except (CommandError, SlurmError, ValueError):
        return None
    for job in doc.get("jobs") or [] if isinstance(doc, dict) else []:
        jid = job.get("job_id") if isinstance(job, dict) else None
        jid = jid.get("number") if isinstance(jid, dict) else jid
        if str(jid) != job_id:
            continue
        # job_state: a string on 22.05, a list of state and flags on 23.02 and later
        raw = job.get("job_state")
        raw = raw[0] if isinstance(raw, list) and raw else raw
        state = JobState.parse(raw) if isinstance(raw, str) else None
        uid = job.get("user_id")
        uid = uid.get("number") if isinstance(uid, dict) else uid
        pattern, nodes = job.get("standard_output"), job.get("nodes")
        if not isinstance(uid, int) or not isinstance(pattern, str):
            return _LiveJob(state, None)
        env = {"SLURM_JOB_ID": job_id, "SLURM_JOB_NAME": str(job.get("name") or ""),
               "SLURM_JOB_USER": str(job.get("user_name") or ""),
               "SLURM_JOB_NODELIST": nodes if isinstance(nodes, str) else "",
               "SLURM_JOB_WORK_DIR": str(job.get("current_working_directory") or "")}
        return _LiveJob(state, (expand_output_pattern(pattern, env), uid))
    return None


def _log_progress(path: str, uid: int) -> Any:
    """Progress from the log's tail, read as the epilog reads logs (the job's own regular file,
    no symlink, bounded); None when it cannot be read or holds no iteration yet."""
    from slurmpod.report.watch import progress_from_log  # lazy: start-up

    try:
        got = read_job_file(path, uid, head_bytes=0, tail_bytes=LOG_TAIL_BYTES)
    except (UnsafeFileError, OSError):
        return None
    return progress_from_log(got.tail if got.truncated else got.head)
