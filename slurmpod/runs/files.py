"""Read a run's files where the run lives (here or over SSH) in bounded pieces.

Everything goes through a CommandRunner, so `slurmpod logs --host login1` reads exactly what
`slurmpod logs` reads on the login node. One command per piece returns the file's size and at
most `length` bytes from `offset` (or the last bytes), base64-encoded so any byte (a job's log
is not always UTF-8) crosses a text channel intact. Logs can be many GB: nothing here reads a
whole file, callers loop over pieces.

The shell snippet gets the path and numbers as positional arguments (`sh -c SCRIPT sh PATH ...`),
never interpolated: a run directory with spaces, quotes or `$(...)` is just a string.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

from slurmpod.errors import CommandError, SlurmpodError
from slurmpod.transport.base import CommandRunner

PIECE_BYTES = 4 << 20  # one round trip: ~5.6 MB of base64 on the wire
READ_TIMEOUT_S = 60.0
_NOT_READABLE = 66  # EX_NOINPUT

# $1 path, $2 offset (negative: that many bytes before the end), $3 length
_READ = r"""
[ -f "$1" ] && [ -r "$1" ] || exit 66
s=$(wc -c < "$1") || exit 66
s=$((s + 0)); o=$(($2))
if [ "$o" -lt 0 ]; then o=$((s + o)); [ "$o" -lt 0 ] && o=0; fi
echo "$s $o"
if [ "$3" -gt 0 ] && [ "$o" -lt "$s" ]; then
  tail -c +"$((o + 1))" -- "$1" | head -c "$3" | base64
fi
"""


class FileUnreadable(SlurmpodError):
    """The file does not exist (yet), is not a regular file, or this user cannot read it."""


@dataclass(frozen=True)
class Piece:
    size: int  # the file's size when the piece was read
    offset: int  # where `data` starts
    data: bytes


def read_piece(runner: CommandRunner, path: str, offset: int, length: int) -> Piece:
    """At most `length` bytes of `path` from `offset` (negative: from `size + offset`)."""
    try:
        res = runner.run(["sh", "-c", _READ, "sh", path, str(int(offset)), str(max(0, length))],
                         timeout_s=READ_TIMEOUT_S)
    except CommandError as exc:
        if exc.returncode == _NOT_READABLE:
            raise FileUnreadable(f"{path}: no such readable file on {runner.where}") from None
        raise
    head, _, body = res.stdout.partition("\n")
    try:
        size_s, off_s = head.split()
        data = base64.b64decode(body) if body.strip() else b""
        return Piece(int(size_s), int(off_s), data)
    except (ValueError, binascii.Error):
        raise SlurmpodError(f"{path}: unexpected answer from the file reader on "
                            f"{runner.where}: {head[:80]!r}",
                            hint="is this a POSIX shell with coreutils (wc, tail, head, "
                                 "base64)?") from None


def file_size(runner: CommandRunner, path: str) -> int:
    return read_piece(runner, path, 0, 0).size


def read_tail(runner: CommandRunner, path: str, max_bytes: int) -> Piece:
    """The last `max_bytes` of `path` (the whole file when it is smaller)."""
    return read_piece(runner, path, -max_bytes, max_bytes)


def try_tail(runner: CommandRunner, path: str, max_bytes: int) -> Piece | None:
    """`read_tail`, or None when the file is not there (a run that has not started)."""
    try:
        return read_tail(runner, path, max_bytes)
    except FileUnreadable:
        return None
