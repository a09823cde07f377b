"""Start, identify and stop the sandbox's own daemons; probe ports.

A started process is remembered as a `ProcRecord` (name, PID, exact argv, kernel start time).
Before a signal is sent, /proc must still show that PID with the same argv and start time, so a
recycled PID or a process someone else started is never touched.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ProcRecord:
    name: str
    pid: int
    argv: tuple[str, ...]
    start_ticks: int
    log: str = ""
    out: str = ""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProcRecord:
        """`d` is one record of the state file's JSON."""
        return cls(str(d["name"]), int(d["pid"]), tuple(d["argv"]),
                   int(d["start_ticks"]), str(d.get("log", "")), str(d.get("out", "")))

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["argv"] = list(self.argv)
        return d


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in clock ticks) of a PID, or None when it does not exist."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError, OSError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = raw[raw.rfind(")") + 2:].split()
    return rest[0], int(rest[19])


def _proc_argv(pid: int) -> tuple[str, ...] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return tuple(a.decode(errors="replace") for a in raw.split(b"\0") if a)


def _settled_argv(proc: subprocess.Popen[bytes], given: tuple[str, ...]) -> tuple[str, ...]:
    """The command line /proc shows for a just-started child, which is what is_ours compares.

    Popen returns once the exec has begun, but the kernel sets the new argument area a moment
    later, so read until two reads agree. For a script it is the interpreter's command line.
    """
    deadline = time.monotonic() + 1.0
    last: tuple[str, ...] | None = None
    while time.monotonic() < deadline and proc.poll() is None:
        now = _proc_argv(proc.pid)
        if now and now == last:
            return now
        last = now
        time.sleep(0.005)
    return last or given


def start_ticks(pid: int) -> int:
    st = _proc_stat(pid)
    return st[1] if st else -1


def is_ours(rec: ProcRecord) -> bool:
    """True when the PID is alive (not a zombie) and still the process we started."""
    st = _proc_stat(rec.pid)
    if st is None or st[0] in ("Z", "X"):
        return False
    return st[1] == rec.start_ticks and _proc_argv(rec.pid) == rec.argv


@dataclass
class Launcher:
    """Starts daemons detached from the caller's terminal, logging their stdout/stderr."""

    env: Mapping[str, str]
    cwd: Path
    children: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, argv: Sequence[str], out: Path, log: Path | None = None
              ) -> ProcRecord:
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "ab") as fh:
            # A new session: Ctrl-C in the shell that ran `up` must not reach the daemons.
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=fh,
                                    stderr=subprocess.STDOUT, env=dict(self.env), cwd=self.cwd,
                                    start_new_session=True, close_fds=True)
        self.children[proc.pid] = proc
        ticks = start_ticks(proc.pid)
        shown = _settled_argv(proc, tuple(argv))
        return ProcRecord(name, proc.pid, shown, ticks, str(log or out), str(out))

    def running(self, rec: ProcRecord) -> bool:
        """Alive? Children started here are asked directly; others are checked in /proc."""
        return _running(rec, self.children) if rec.pid in self.children else is_ours(rec)

    def exit_code(self, rec: ProcRecord) -> int | None:
        """The exit status of a child started here (None if running or not ours)."""
        proc = self.children.get(rec.pid)
        return proc.poll() if proc is not None else None


def _reap(pid: int, children: Mapping[int, subprocess.Popen[bytes]]) -> None:
    """Collect a zombie child of this process (no-op for others' processes). Popen objects
    reap their own child, so they keep its exit status."""
    if pid in children:
        children[pid].poll()
        return
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def stop(records: Sequence[ProcRecord], timeout_s: float = 15.0,
         children: Mapping[int, subprocess.Popen[bytes]] | None = None) -> list[str]:
    """SIGTERM the records that are still ours, wait, SIGKILL stragglers.

    Returns the names of records skipped because their PID no longer matched (already gone or
    reused by another program): those are left alone.
    """
    kids = children or {}
    skipped: list[str] = []
    targets: list[ProcRecord] = []
    for rec in records:
        if is_ours(rec):
            targets.append(rec)
        else:
            _reap(rec.pid, kids)
            skipped.append(rec.name)
    for rec in targets:
        _signal(rec, signal.SIGTERM)
    pending = _wait_gone(targets, timeout_s, kids)
    for rec in pending:
        _signal(rec, signal.SIGKILL)
    _wait_gone(pending, 5.0, kids)
    return skipped


def _running(rec: ProcRecord, kids: Mapping[int, subprocess.Popen[bytes]]) -> bool:
    """Not yet exited. The command line is not consulted: an exiting process already shows an
    empty one, while its PID (same start time) is not free until it is reaped."""
    if rec.pid in kids:
        return kids[rec.pid].poll() is None
    st = _proc_stat(rec.pid)
    return st is not None and st[0] not in ("Z", "X") and st[1] == rec.start_ticks


def _wait_gone(records: Sequence[ProcRecord], timeout_s: float,
               kids: Mapping[int, subprocess.Popen[bytes]]) -> list[ProcRecord]:
    deadline = time.monotonic() + timeout_s
    pending = list(records)
    while pending:
        for rec in pending:
            _reap(rec.pid, kids)
        pending = [r for r in pending if _running(r, kids)]
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return pending


def _signal(rec: ProcRecord, sig: int) -> None:
    # Re-check right before the signal: the window for PID reuse stays as small as it can be.
    if is_ours(rec):
        with contextlib.suppress(ProcessLookupError):
            os.kill(rec.pid, sig)


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when something listens on host:port (a bind test, like the daemons do).

    SO_REUSEADDR, as the daemons set it: connections lingering in TIME_WAIT from a previous run
    do not count, a listener does.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.errno in (errno.EADDRINUSE, errno.EACCES)
    return False


def can_connect(port: int, host: str = "127.0.0.1", timeout_s: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def unix_can_connect(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


def tail(path: str | Path, lines: int = 15) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])
