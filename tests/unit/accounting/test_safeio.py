"""Safe reading of job-controlled files by the privileged epilog."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from slurmpod.accounting.safeio import (
    UnsafeFileError,
    expand_output_pattern,
    open_job_file,
    read_capped,
    read_job_file,
)

ME = os.getuid()
OTHER = 54321 if ME != 54321 else 54322
needs_root = pytest.mark.skipif(ME != 0, reason="chown to another uid needs root")


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_reads_own_regular_file(tmp_path: Path) -> None:
    log = _write(tmp_path / "job" / "train.log", b"iteration 1\niteration 2\n")
    got = read_job_file(str(log), ME)
    assert got.data == b"iteration 1\niteration 2\n"
    assert not got.truncated and got.size == 24


def test_symlink_leaf_refused_without_reading(tmp_path: Path) -> None:
    secret = _write(tmp_path / "other" / "secret.log", b"SECRET\n")
    link = tmp_path / "job" / "train.log"
    link.parent.mkdir()
    link.symlink_to(secret)
    with pytest.raises(UnsafeFileError) as exc:
        read_job_file(str(link), ME)
    assert exc.value.reason == "symlink"
    assert "SECRET" not in str(exc.value)


def test_symlink_directory_owned_by_user_refused(tmp_path: Path) -> None:
    _write(tmp_path / "real" / "train.log", b"x\n")
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    if os.lstat(tmp_path / "alias").st_uid == 0:
        pytest.skip("running as root: a root-owned directory symlink is trusted by design")
    with pytest.raises(UnsafeFileError) as exc:
        read_job_file(str(tmp_path / "alias" / "train.log"), ME)
    assert exc.value.reason == "symlink"


@needs_root
def test_user_owned_directory_symlink_refused_even_as_root(tmp_path: Path) -> None:
    _write(tmp_path / "real" / "train.log", b"x\n")
    alias = tmp_path / "alias"
    alias.symlink_to(tmp_path / "real")
    os.lchown(alias, OTHER, OTHER)
    with pytest.raises(UnsafeFileError) as exc:
        read_job_file(str(alias / "train.log"), ME)
    assert exc.value.reason == "symlink"


@needs_root
def test_root_owned_directory_symlink_followed(tmp_path: Path) -> None:
    _write(tmp_path / "gpfs" / "home" / "u" / "train.log", b"ok\n")
    (tmp_path / "home").symlink_to(tmp_path / "gpfs" / "home")
    assert read_job_file(str(tmp_path / "home" / "u" / "train.log"), ME).data == b"ok\n"


@needs_root
def test_other_owner_refused(tmp_path: Path) -> None:
    log = _write(tmp_path / "train.log", b"x\n")
    os.chown(log, OTHER, OTHER)
    with pytest.raises(UnsafeFileError) as exc:
        read_job_file(str(log), ME)
    assert exc.value.reason == "owner"
    # and the owner itself may read it
    assert read_job_file(str(log), OTHER).data == b"x\n"


def test_other_owner_refused_by_uid(tmp_path: Path) -> None:
    log = _write(tmp_path / "train.log", b"x\n")
    with pytest.raises(UnsafeFileError) as exc:
        read_job_file(str(log), OTHER)  # the file is ours, the job belongs to OTHER
    assert exc.value.reason == "owner"


def test_fifo_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "train.log"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeFileError) as exc:
        read_job_file(str(fifo), ME)
    assert exc.value.reason == "fifo"


def test_device_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsafeFileError) as exc:
        read_job_file("/dev/null", os.stat("/dev/null").st_uid)
    assert exc.value.reason == "device"


def test_directory_and_missing_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsafeFileError) as exc:
        read_job_file(str(tmp_path), ME)
    assert exc.value.reason == "not-regular"
    with pytest.raises(UnsafeFileError) as exc:
        read_job_file(str(tmp_path / "nope.log"), ME)
    assert exc.value.reason == "missing"
    with pytest.raises(UnsafeFileError) as exc:
        read_job_file(str(tmp_path / "nope" / "x.log"), ME)
    assert exc.value.reason == "missing"


def test_relative_and_dotdot_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsafeFileError) as exc:
        read_job_file("train.log", ME)
    assert exc.value.reason == "relative"
    _write(tmp_path / "a" / "x.log", b"x\n")
    with pytest.raises(UnsafeFileError) as exc:
        read_job_file(str(tmp_path / "a" / ".." / "a" / "x.log"), ME)
    assert exc.value.reason == "dotdot"


def test_oversized_reads_head_and_tail_only(tmp_path: Path) -> None:
    lines = [f"line {i:06d}\n".encode() for i in range(20000)]  # 12 bytes each, 240 000 bytes
    log = _write(tmp_path / "big.log", b"".join(lines))
    got = read_job_file(str(log), ME, head_bytes=1200, tail_bytes=1200)
    assert got.truncated and got.size == 240000
    assert got.head == b"".join(lines[:100])
    # tail: the last 1200 bytes, minus the partial first line (1200 is a multiple of 12: none)
    assert got.tail.endswith(b"line 019999\n")
    assert len(got.tail) <= 1200
    assert b"line 010000" not in got.data  # the middle was not read


def test_tail_drops_partial_first_line(tmp_path: Path) -> None:
    log = _write(tmp_path / "big.log", b"a" * 100 + b"\n" + b"bbbb\n" + b"cccc\n")
    got = read_job_file(str(log), ME, head_bytes=10, tail_bytes=8)
    assert got.tail == b"cccc\n"


def test_read_capped_small_file_is_whole(tmp_path: Path) -> None:
    log = _write(tmp_path / "x.log", b"abc\n")
    fd = os.open(log, os.O_RDONLY)
    try:
        got = read_capped(fd, str(log), head_bytes=2, tail_bytes=2)
    finally:
        os.close(fd)
    assert got.data == b"abc\n" and not got.truncated


def test_open_returns_descriptor_of_checked_file(tmp_path: Path) -> None:
    log = _write(tmp_path / "x.log", b"abc\n")
    fd = open_job_file(str(log), ME)
    try:
        st = os.fstat(fd)
        assert stat.S_ISREG(st.st_mode) and st.st_ino == os.stat(log).st_ino
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("pattern", "env", "want"),
    [
        ("", {"SLURM_JOB_ID": "42", "SLURM_JOB_WORK_DIR": "/home/u"}, "/home/u/slurm-42.out"),
        ("", {"SLURM_JOB_ID": "43", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "3",
              "SLURM_JOB_WORK_DIR": "/w"}, "/w/slurm-40_3.out"),
        ("logs/%x-%j.out", {"SLURM_JOB_ID": "7", "SLURM_JOB_NAME": "train",
                            "SLURM_JOB_WORK_DIR": "/w/"}, "/w/logs/train-7.out"),
        ("/s/%u/%N-%4j-%%.log", {"SLURM_JOB_ID": "7", "SLURM_JOB_USER": "ann",
                                 "SLURM_JOB_NODELIST": "gpu[003-004]"}, "/s/ann/gpu003-0007-%.log"),
        ("/s/%q%", {"SLURM_JOB_ID": "7"}, "/s/%q%"),
    ],
)
def test_expand_output_pattern(pattern: str, env: dict[str, str], want: str) -> None:
    assert expand_output_pattern(pattern, env) == want


def test_chunks_equal_data(tmp_path: Path) -> None:
    log = _write(tmp_path / "big.log", b"".join(f"l{i:05d}\n".encode() for i in range(5000)))
    for head, tail in ((100, 100), (10**6, 10**6)):
        got = read_job_file(str(log), ME, head_bytes=head, tail_bytes=tail)
        pieces = list(got.chunks(size=64))
        assert b"".join(pieces) == got.data and max(len(p) for p in pieces) <= 64


@pytest.mark.parametrize("size,head,tail", [(100, 64, 64), (1000, 64, 64), (5000, 10, 3000)])
def test_streamed_read_gives_the_same_bytes_as_the_capped_read(tmp_path: Path, size: int,
                                                              head: int, tail: int) -> None:
    from slurmpod.accounting.safeio import stream_job_file

    log = tmp_path / "train.log"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(size))[:size * 5])
    want = read_job_file(str(log), ME, head_bytes=head, tail_bytes=tail)
    with stream_job_file(str(log), ME, head_bytes=head, tail_bytes=tail) as got:
        assert got.truncated == want.truncated and got.size == want.size
        assert b"".join(got.chunks(size=7)) == want.data
