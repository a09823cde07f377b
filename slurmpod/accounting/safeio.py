"""Read a job-controlled file from a privileged hook without being tricked into reading another.

`EpilogSlurmctld` runs as SlurmUser (often root) on the controller, but the path it is given
(`SLURM_JOB_STDOUT`) is chosen by the job's user. A user could point it at `/etc/shadow`, at a
symlink to another user's log, at a FIFO that blocks the epilog forever, or at a device. So:

- the path is walked one component at a time with `openat(O_NOFOLLOW)` from `/` (or a trusted
  base), so no symlink is followed and nothing can be swapped in between the check and the open;
  a symlink *directory* is followed only when it is owned by root (an admin's `/home -> /gpfs/home`;
  a user cannot create a root-owned symlink);
- the final component must be a regular file owned by the job's uid (checked with `fstatat` before
  the open, so a device is never opened, and again with `fstat` on the open descriptor);
- it is opened `O_NONBLOCK | O_NOCTTY` (a FIFO swapped in after the check cannot block us);
- at most `head_bytes + tail_bytes` are read: the start (Megatron's arguments dump) and the end.

Every refusal is an `UnsafeFileError` whose `reason` is a short machine-friendly word.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from slurmpod.model.hostlist import expand

MIB = 1024 * 1024
DEFAULT_HEAD_BYTES = 1 * MIB
DEFAULT_TAIL_BYTES = 64 * MIB
_MAX_ROOT_LINKS = 8  # root-owned directory symlinks followed per path (loop guard)


class UnsafeFileError(Exception):
    """The file was refused; nothing was read from it."""

    def __init__(self, path: str, reason: str, detail: str = "") -> None:
        self.path = path
        self.reason = reason
        self.detail = detail
        super().__init__(f"{path}: refused ({reason}){': ' + detail if detail else ''}")


@dataclass(frozen=True)
class CappedRead:
    """What was read: the head, the tail (empty when the head already holds the whole file)."""

    path: str
    size: int
    head: bytes
    tail: bytes
    truncated: bool  # bytes between head and tail were skipped

    def chunks(self, size: int = MIB) -> Iterator[bytes]:
        """`data` in pieces of at most `size` bytes, without building it (half the memory)."""
        parts = [self.head]
        if self.truncated:
            parts += [b"\n[slurmpod: middle of log skipped]\n", self.tail]
        else:
            parts.append(self.tail)
        for part in parts:
            view = memoryview(part)
            for off in range(0, len(view), size):
                yield bytes(view[off:off + size])

    @property
    def data(self) -> bytes:
        """Head and tail joined; a skipped middle is marked by a line that parsers ignore."""
        if not self.truncated:
            return self.head + self.tail
        return self.head + b"\n[slurmpod: middle of log skipped]\n" + self.tail


def _open_dir(name: str, dir_fd: int | None) -> int:
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(name, flags, dir_fd=dir_fd)


def open_job_file(path: str, uid: int, *, root: str = "/") -> int:
    """Open `path` for reading as described in the module docstring; return the descriptor.

    `path` must be absolute. `root` is where the walk starts (tests use a temp dir; in production
    it is `/`). Raises UnsafeFileError; the caller closes the descriptor.
    """
    if not path.startswith("/"):
        raise UnsafeFileError(path, "relative", "an absolute path is required")
    if "\0" in path:
        raise UnsafeFileError(path, "bad-name")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts:
        raise UnsafeFileError(path, "not-regular", "a directory")
    if ".." in parts:
        raise UnsafeFileError(path, "dotdot", "'..' in a job path is not followed")
    links_left = _MAX_ROOT_LINKS
    dir_fd = _open_dir(root, None)
    try:
        i = 0
        while i < len(parts) - 1:
            name = parts[i]
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                raise UnsafeFileError(path, "missing", f"no such directory {name!r}") from None
            if stat.S_ISLNK(st.st_mode):
                if st.st_uid != 0 or links_left == 0:
                    raise UnsafeFileError(path, "symlink", f"component {name!r} is a symlink")
                links_left -= 1
                target = os.readlink(name, dir_fd=dir_fd)
                tparts = [p for p in target.split("/") if p not in ("", ".")]
                if ".." in tparts:
                    raise UnsafeFileError(path, "symlink", f"root symlink {name!r} uses '..'")
                if target.startswith("/"):
                    os.close(dir_fd)
                    dir_fd = _open_dir(root, None)
                parts = tparts + parts[i + 1:]
                i = 0
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise UnsafeFileError(path, "not-dir", f"component {name!r} is not a directory")
            try:
                new_fd = _open_dir(name, dir_fd)
            except OSError as exc:  # swapped for a symlink after the stat: refuse, do not retry
                reason = "symlink" if exc.errno in (errno.ELOOP, errno.ENOTDIR) else "unreadable"
                raise UnsafeFileError(path, reason, exc.strerror or "") from None
            os.close(dir_fd)
            dir_fd = new_fd
            i += 1
        last = parts[-1]
        try:
            st = os.stat(last, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            raise UnsafeFileError(path, "missing") from None
        _check_leaf(path, st, uid)
        try:
            fd = os.open(last, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                         | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError as exc:
            reason = "symlink" if exc.errno == errno.ELOOP else "unreadable"
            raise UnsafeFileError(path, reason, exc.strerror or "") from None
        try:
            fst = os.fstat(fd)
            _check_leaf(path, fst, uid)
            if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
                raise UnsafeFileError(path, "raced", "the file changed between check and open")
        except BaseException:
            os.close(fd)
            raise
        return fd
    finally:
        os.close(dir_fd)


def _check_leaf(path: str, st: os.stat_result, uid: int) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeFileError(path, "symlink", "the log is a symlink")
    if not stat.S_ISREG(st.st_mode):
        kind = ("fifo" if stat.S_ISFIFO(st.st_mode) else "device"
                if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not-regular")
        raise UnsafeFileError(path, kind, "not a regular file")
    if st.st_uid != uid:
        raise UnsafeFileError(path, "owner", f"owned by uid {st.st_uid}, the job's uid is {uid}")


def read_capped(fd: int, path: str = "", *, head_bytes: int = DEFAULT_HEAD_BYTES,
                tail_bytes: int = DEFAULT_TAIL_BYTES) -> CappedRead:
    """Read at most `head_bytes` from the start and `tail_bytes` from the end of an open file."""
    size = os.fstat(fd).st_size
    if size <= head_bytes + tail_bytes:
        data = _pread_all(fd, 0, size)
        return CappedRead(path, size, data, b"", False)
    head = _pread_all(fd, 0, head_bytes)
    tail = _pread_all(fd, size - tail_bytes, tail_bytes)
    # The tail starts mid-line: drop the partial first line so parsers see whole lines only.
    nl = tail.find(b"\n")
    tail = tail[nl + 1:] if nl >= 0 else b""
    return CappedRead(path, size, head, tail, True)


def _pread_all(fd: int, offset: int, length: int) -> bytes:
    chunks: list[bytes] = []
    while length > 0:
        chunk = os.pread(fd, min(length, 4 * MIB), offset)
        if not chunk:  # the file shrank while we read it
            break
        chunks.append(chunk)
        offset += len(chunk)
        length -= len(chunk)
    return b"".join(chunks)


@dataclass(frozen=True)
class StreamedRead:
    """A job file read in pieces from its open descriptor: the head, then (when the file is
    bigger than both caps) the tail; at most one piece in memory at a time."""

    fd: int
    path: str
    size: int
    head_bytes: int
    tail_bytes: int

    @property
    def truncated(self) -> bool:
        return self.size > self.head_bytes + self.tail_bytes

    def chunks(self, size: int = 4 * MIB) -> Iterator[bytes]:
        if not self.truncated:
            yield from self._range(0, self.size, size)
            return
        yield from self._range(0, self.head_bytes, size)
        yield b"\n[slurmpod: middle of log skipped]\n"
        start = self.size - self.tail_bytes
        first = True
        for chunk in self._range(start, self.size, size):
            if first:  # the tail starts mid-line: parsers get whole lines only
                nl = chunk.find(b"\n")
                chunk = chunk[nl + 1:] if nl >= 0 else b""
                first = not chunk and nl < 0
            yield chunk

    def _range(self, start: int, end: int, size: int) -> Iterator[bytes]:
        offset = start
        while offset < end:
            chunk = os.pread(self.fd, min(size, end - offset), offset)
            if not chunk:  # the file shrank while we read it
                return
            offset += len(chunk)
            yield chunk


@contextlib.contextmanager
def stream_job_file(path: str, uid: int, *, head_bytes: int = DEFAULT_HEAD_BYTES,
                    tail_bytes: int = DEFAULT_TAIL_BYTES,
                    root: str = "/") -> Iterator[StreamedRead]:
    """`open_job_file`, then the capped head and tail as a stream (the epilog parses a 64 MiB
    tail without holding it); the descriptor is closed when the block ends."""
    fd = open_job_file(path, uid, root=root)
    try:
        yield StreamedRead(fd, path, os.fstat(fd).st_size, head_bytes, tail_bytes)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def read_job_file(path: str, uid: int, *, head_bytes: int = DEFAULT_HEAD_BYTES,
                  tail_bytes: int = DEFAULT_TAIL_BYTES, root: str = "/") -> CappedRead:
    """`open_job_file` then `read_capped`, closing the descriptor."""
    fd = open_job_file(path, uid, root=root)
    try:
        return read_capped(fd, path, head_bytes=head_bytes, tail_bytes=tail_bytes)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def expand_output_pattern(pattern: str, env: Mapping[str, str]) -> str:
    """Expand Slurm's filename pattern (`--output=logs/%x-%j.out`) the way slurmd does for the
    batch step, then make it absolute against the job's work dir.

    In Slurm 22.05 `SLURM_JOB_STDOUT` in the EpilogSlurmctld environment is the *unexpanded*
    pattern (job_mgr.c `job_common_env_vars` copies `details->std_out`); when the user gave no
    `--output`, it is unset and slurmd writes `slurm-%j.out` (`slurm-%A_%a.out` for an array task)
    in the work dir. Supported: %% %A %a %j %J %N %n %s %t %u %x, with zero-pad widths (%4j).
    """
    job_id = env.get("SLURM_JOB_ID", "")
    array_job = env.get("SLURM_ARRAY_JOB_ID", "")
    array_task = env.get("SLURM_ARRAY_TASK_ID", "")
    nodelist = env.get("SLURM_JOB_NODELIST", "")
    first_node = _first_host(nodelist)
    values = {
        "A": array_job or job_id, "a": array_task or "4294967294", "j": job_id,
        "J": job_id, "N": first_node, "n": "0", "s": "batch", "t": "0",
        "u": env.get("SLURM_JOB_USER", ""), "x": env.get("SLURM_JOB_NAME", ""),
    }
    if not pattern:
        pattern = "slurm-%A_%a.out" if array_task else "slurm-%j.out"
    out: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch != "%":
            out.append(ch)
            i += 1
            continue
        j = i + 1
        while j < len(pattern) and pattern[j].isdigit():
            j += 1
        if j >= len(pattern):
            out.append(pattern[i:])
            break
        key = pattern[j]
        if key == "%":
            out.append("%")
        elif key in values:
            val = values[key]
            width = int(pattern[i + 1:j] or 0)
            if width and val.isdigit():
                val = val.zfill(min(width, 10))
            out.append(val)
        else:
            out.append(pattern[i:j + 1])
        i = j + 1
    expanded = "".join(out)
    if not expanded.startswith("/"):
        work_dir = env.get("SLURM_JOB_WORK_DIR", "")
        expanded = (work_dir.rstrip("/") + "/" + expanded) if work_dir else expanded
    return expanded


def _first_host(nodelist: str) -> str:
    """First host of a Slurm hostlist (`gpu[001-004]` -> `gpu001`); empty when unparsable."""

    try:
        hosts = expand(nodelist) if nodelist else []
    except ValueError:
        return ""
    return hosts[0] if hosts else ""
