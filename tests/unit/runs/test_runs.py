"""`slurmpod runs`, `logs`, `cancel`: attempts.jsonl parsing (hostile lines), name resolution,
attempt slicing, rank filtering, --json shapes, cancel --save; fake backend + local files."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmpod.backends.fake import FakeBackend
from slurmpod.cli import runs as runs_cli
from slurmpod.cli.main import cli
from slurmpod.errors import SlurmError, SlurmpodError, UsageError
from slurmpod.model.jobs import JobState
from slurmpod.runs import ops
from slurmpod.runs.attempts import parse_attempts, parse_line
from slurmpod.runs.files import FileUnreadable, read_piece
from slurmpod.runs.view import JSON_KEYS
from slurmpod.transport.local import LocalRunner

COMMENT = json.dumps({"slurmpod": "0.1", "run": "llama", "flops_per_iter": 1.0e15,
                      "peak_tflops": 1000.0, "gpus": 16}, separators=(",", ":"))


def it_line(i: int, total: int = 100, ms: float = 2000.0, rank: int | None = None) -> str:
    label = "" if rank is None else f"{rank:3d}: "
    return (f"{label} [2024-04-06 03:02:12] iteration {i:8d}/{total:8d} | consumed samples: "
            f"{i * 128:12d} | elapsed time per iteration (ms): {ms} | learning rate: 1.0E-05 | "
            "global batch size:   128 | lm loss: 1.8E+00 | loss scale: 1.0 | number of skipped "
            "iterations:   0 | number of nan iterations:   0 |\n")


def ev(event: str, attempt: int, job_id: str = "1", **kw: object) -> str:
    return json.dumps({"v": 1, "event": event, "job_id": job_id, "attempt": attempt,
                       "restart": attempt - 1, "time": 1_700_000_000 + attempt, **kw}) + "\n"


GARBAGE = [
    '{"v":1,"event":"start","job_id":"1","attempt":',  # cut mid-write
    "not json at all",
    "[1, 2, 3]",
    '{"v":2,"event":"start","job_id":"1","attempt":9}',  # another format version
    '{"v":1,"event":"start","job_id":"1; rm -rf /","attempt":9}',
    '{"v":1,"event":"start","job_id":"1","attempt":true}',
    '{"v":1,"event":"boom","job_id":"1","attempt":9}',
    '{"v":1,"event":"start","job_id":"1","attempt":' + "9" * 5000 + "}",
    "[" * 100_000,
    "\xff\xfe garbage",
]


def make_run(tmp: Path, job_id: str, name: str = "llama") -> tuple[Path, Path]:
    """A run dir with a 3-attempt log (attempt 3 running) and an attempts.jsonl."""
    (tmp / "logs").mkdir(parents=True, exist_ok=True)
    (tmp / ".slurmpod").mkdir(exist_ok=True)
    log = tmp / "logs" / f"{name}-{job_id}.out"
    parts = ["attempt one\n" + it_line(10, rank=0) + it_line(20, rank=1),
             "attempt two\n" + it_line(30, rank=0),
             "attempt three\n" + "".join(it_line(i, ms=2000.0, rank=0) for i in range(40, 61))]
    offsets, size = [], 0
    for p in parts:
        offsets.append(size)
        size += len(p.encode())
    log.write_text("".join(parts))
    nodes = ["gpu001", "gpu002"]
    lines = [
        ev("start", 1, job_id, nodes=nodes, log=str(log), log_offset=offsets[0]),
        GARBAGE[0] + "\n",
        ev("end", 1, job_id, end="timelimit", rc=143, iteration=20, progress=True, failures=0,
           max_restarts=3),
        ev("start", 2, job_id, nodes=nodes, log=str(log), log_offset=offsets[1]),
        "garbage\n",
        ev("end", 2, job_id, end="failure", rc=1, iteration=30, progress=True, failures=0,
           max_restarts=3),
        ev("start", 3, job_id, nodes=["gpu003", "gpu002"], log=str(log), log_offset=offsets[2]),
    ]
    (tmp / ".slurmpod" / "attempts.jsonl").write_text("".join(lines))
    return log, tmp / ".slurmpod" / "attempts.jsonl"


# -- attempts.jsonl ------------------------------------------------------------------------------


def test_garbage_lines_are_skipped_and_counted() -> None:
    good = [ev("start", 1, log="/r/l.out", log_offset=0, nodes=["n1"]),
            ev("end", 1, end="completed", rc=0, iteration=100, progress=True, failures=0,
               max_restarts=3)]
    data = "".join(g + "\n" for g in GARBAGE) + "".join(good)
    log = parse_attempts(data.encode("utf-8", "surrogateescape"))
    assert log.n_skipped == len(GARBAGE)
    (a,) = log.of_job("1")
    assert (a.attempt, a.end, a.rc, a.iteration, a.nodes, a.log_offset) == (
        1, "completed", 0, 100, ("n1",), 0)
    assert all(parse_line(g) is None for g in GARBAGE)


def test_hostile_values_become_none_not_crashes() -> None:
    line = ev("start", 1, nodes=["ok1", "bad host;", 7, "x" * 300] + ["n"] * 10_000,
              log="relative/path", log_offset=-5)
    end = ev("end", 1, end="rm -rf", rc=True, iteration=-1, progress="yes", failures=1.5,
             max_restarts=None)
    (a,) = parse_attempts(line + end).attempts
    assert a.nodes[0] == "ok1" and "bad host;" not in a.nodes and len(a.nodes) <= 4096
    assert a.log is None and a.log_offset is None
    assert (a.end, a.rc, a.iteration, a.progress, a.failures) == ("unknown", None, None, None,
                                                                  None)


def test_log_ranges_run_to_the_next_start_of_the_same_job(tmp_path: Path) -> None:
    _, jsonl = make_run(tmp_path, "7")
    other = ev("start", 1, "8", log=str(tmp_path / "logs/llama-8.out"), log_offset=5)
    jsonl.write_text(jsonl.read_text() + other)
    parsed = ops.load_attempts(LocalRunner(), str(tmp_path))
    a1, a2, a3 = parsed.of_job("7")
    assert a1.log_end == a2.log_offset and a2.log_end == a3.log_offset and a3.log_end is None
    assert parsed.n_skipped == 2 and parsed.latest("8").log_offset == 5
    assert parsed.latest("7").end is None


def test_huge_attempts_file_is_read_from_its_tail(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(ops, "ATTEMPTS_TAIL_BYTES", 4096)
    (tmp_path / ".slurmpod").mkdir()
    lines = "".join(ev("start", i, log="/r/x.out", log_offset=i * 10) for i in range(1, 500))
    (tmp_path / ".slurmpod" / "attempts.jsonl").write_text(lines)
    parsed = ops.load_attempts(LocalRunner(), str(tmp_path))
    assert parsed.truncated and parsed.n_skipped == 0  # the cut first line is dropped, not bad
    assert parsed.latest("1").attempt == 499 and len(parsed.attempts) < 499


# -- files ---------------------------------------------------------------------------------------


def test_piece_reader_handles_hostile_paths_and_binary(tmp_path: Path) -> None:
    d = tmp_path / "a b $(touch x) 'q'"
    d.mkdir()
    f = d / "-log"
    f.write_bytes(b"ab\xff\x00cd\n")
    r = LocalRunner()
    assert read_piece(r, str(f), 2, 3).data == b"\xff\x00c"
    assert read_piece(r, str(f), -3, 3).data == b"cd\n"
    assert read_piece(r, str(f), 100, 3).data == b"" and not (tmp_path / "x").exists()
    with pytest.raises(FileUnreadable):
        read_piece(r, str(d), 0, 1)  # a directory is not a log


# -- rank filter ---------------------------------------------------------------------------------


def test_rank_filter_across_every_chunk_boundary() -> None:
    text = (b"  0: zero\n  1: one\n 11: eleven\nno label\n  1: one again" + b" x" * 40 + b"\n"
            b"  1: last without newline")
    want = b"  1: one\n  1: one again" + b" x" * 40 + b"\n  1: last without newline"
    for size in (1, 2, 3, 7, 31, 32, 33, len(text)):
        f = ops.RankFilter(1)
        out = b"".join(f.feed(text[i:i + size]) for i in range(0, len(text), size)) + f.flush()
        assert out == want, size


# -- fake cluster + CLI --------------------------------------------------------------------------


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> FakeBackend:
    fake = FakeBackend(user="alice")
    monkeypatch.setattr(runs_cli, "_connect", lambda host, env: (LocalRunner(), fake))
    return fake


def submit(fake: FakeBackend, run_dir: Path, name: str = "llama", sleep_s: int = 3600,
           comment: str = COMMENT) -> str:
    script = f"#!/bin/bash\n#SBATCH --job-name={name}\n#SBATCH --nodes=2\nsleep {sleep_s}\n"
    return fake.submit(script, args=[f"--chdir={run_dir}", f"--comment={comment}"])


def invoke(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, list(args), catch_exceptions=True)
    exc = res.exception
    if isinstance(exc, SlurmpodError):
        return exc.exit_code, res.stdout, exc.message
    if exc is not None and not isinstance(exc, SystemExit):
        raise exc
    return res.exit_code, res.stdout, res.stderr


def test_runs_json_shape_and_figures(cluster: FakeBackend, tmp_path: Path) -> None:
    plain = cluster.submit("#!/bin/bash\nsleep 100\n")  # not a slurmpod job: not listed
    jid = submit(cluster, tmp_path)
    make_run(tmp_path, jid)
    rc, out, _ = invoke("runs", "--json")
    assert rc == 0
    (row,) = json.loads(out)
    assert tuple(row) == JSON_KEYS and row["job_id"] == jid != plain
    assert (row["run"], row["state"], row["attempt"], row["attempt_running"]) == (
        "llama", "RUNNING", 3, True)
    assert (row["last_end"], row["last_rc"], row["checkpoint_iteration"]) == ("failure", 1, 30)
    assert (row["iteration"], row["train_iters"], row["iteration_s"]) == (60, 100, 2.0)
    # 1e15 FLOP / (2 s × 16 GPUs × 1000 TFLOP/s) = 0.03125
    assert row["mfu"] == pytest.approx(0.0312, abs=1e-4) and row["mfu_source"] == "log"
    assert row["eta_s"] == 80 and row["nodes"] == "gpu[002-003]"
    assert row["work_dir"] == str(tmp_path) and row["log"].endswith(f"logs/llama-{jid}.out")
    assert row["attempts_skipped_lines"] == 2
    rc, out, _ = invoke("runs")
    assert rc == 0 and "llama" in out and "3 (running)" in out and "failure" in out
    assert "60/100" in out and "1m20s" not in out and "1m" in out


def test_runs_prefers_the_live_monitor_mfu(cluster: FakeBackend, tmp_path: Path) -> None:
    jid = submit(cluster, tmp_path)
    cluster.update_comment(jid, json.dumps({"v": 1, "mfu": 0.41, "iter": 5, "run": "llama",
                                            "slurmpod": "0.1"}))
    (row,) = json.loads(invoke("runs", "--json")[1])
    assert (row["mfu"], row["mfu_source"], row["iteration"], row["attempt"]) == (
        0.41, "comment", 5, None)  # no run files yet: the comment's figures only


def test_runs_without_runs_and_bad_window(cluster: FakeBackend) -> None:
    assert invoke("runs", "--json")[:2] == (0, "[]\n")
    assert invoke("runs", "--since", "forever")[0] == 2


def test_resolve_by_name_takes_the_most_recent_job(cluster: FakeBackend, tmp_path: Path) -> None:
    first = submit(cluster, tmp_path / "a", sleep_s=1)
    second = submit(cluster, tmp_path / "b")
    other = submit(cluster, tmp_path / "c", name="other")
    assert ops.resolve(cluster, "llama").job_id == second != first
    assert ops.resolve(cluster, other).name == "other"
    with pytest.raises(SlurmError, match="no job of yours named 'nope'"):
        ops.resolve(cluster, "nope")
    with pytest.raises(SlurmError, match="job 999 is not known"):
        ops.resolve(cluster, "999")
    with pytest.raises(UsageError):
        ops.resolve(cluster, "  ")


def test_logs_whole_attempt_and_rank(cluster: FakeBackend, tmp_path: Path) -> None:
    jid = submit(cluster, tmp_path)
    log, _ = make_run(tmp_path, jid)
    rc, out, _ = invoke("logs", "llama")
    assert rc == 0 and out == log.read_text()
    rc, out, _ = invoke("logs", jid, "--attempt", "2")
    assert out.startswith("attempt two\n") and "attempt three" not in out and "20/" not in out
    out = invoke("logs", "llama", "--attempt", "1", "--rank", "1")[1]
    assert out.count("\n") == 1 and "iteration       20/" in out
    assert invoke("logs", "llama", "--attempt", "3")[1].startswith("attempt three")
    rc, _, err = invoke("logs", "llama", "--attempt", "9")
    assert rc == 2 and "attempts: 1, 2, 3" in err


def test_logs_streams_in_pieces(tmp_path: Path) -> None:
    log = tmp_path / "big.out"
    log.write_bytes(bytes(range(256)) * 2)
    chunks = list(ops.read_range(LocalRunner(), str(log), 10, 500, piece_bytes=100))
    assert [len(c) for c in chunks] == [100, 100, 100, 100, 90]
    assert b"".join(chunks) == log.read_bytes()[10:500]


def test_follow_stops_when_the_job_ended_and_the_file_stopped_growing(tmp_path: Path) -> None:
    log = tmp_path / "x.out"
    log.write_bytes(b"one\n")
    state = {"polls": 0}

    def sleep(_: float) -> None:  # the job writes while we wait, then ends
        state["polls"] += 1
        if state["polls"] == 1:
            with log.open("ab") as fh:
                fh.write(b"two\n")

    def check() -> tuple[bool, int | None]:
        if state["polls"] >= 2:
            if state["polls"] == 2:  # written as the job ends, after its state changed
                state["polls"] += 1
                with log.open("ab") as fh:
                    fh.write(b"last words\n")
            return True, None
        return False, None

    f = ops.Follow(LocalRunner(), str(log), check, poll_s=0, check_every_s=0, sleep=sleep)
    assert b"".join(f.stream(0, None)) == b"one\ntwo\nlast words\n"


def test_follow_of_an_attempt_stops_at_the_next_attempt(tmp_path: Path) -> None:
    log = tmp_path / "x.out"
    log.write_bytes(b"a1\na2 next attempt\n")
    f = ops.Follow(LocalRunner(), str(log), lambda: (False, 3), poll_s=0, check_every_s=0,
                   sleep=lambda _: None)
    assert b"".join(f.stream(0, None)) == b"a1\n"


def test_logs_of_a_job_without_a_log_yet(cluster: FakeBackend, tmp_path: Path) -> None:
    submit(cluster, tmp_path)
    rc, _, err = invoke("logs", "llama")
    assert rc == 1 and "no such readable file" in err


# -- cancel --------------------------------------------------------------------------------------


def test_cancel_save_writes_the_request_and_signals_steps_only(cluster: FakeBackend,
                                                               tmp_path: Path) -> None:
    jid = submit(cluster, tmp_path)
    rc, out, _ = invoke("cancel", "llama", "--save", "--json")
    assert rc == 0
    doc = json.loads(out)
    request = tmp_path / ".slurmpod" / f"cancel-{jid}"
    assert doc == {"job_id": jid, "run": "llama", "state_before": "RUNNING",
                   "action": "save-then-cancel", "request_file": str(request),
                   "command": ["scancel", "--signal=TERM", jid]}
    job_id, stamp = request.read_text().split()
    assert job_id == jid and abs(int(stamp) - time.time()) < 60
    assert cluster.signals == [(jid, "TERM", True)]
    # the batch script is left alone: it saves, records the end and cancels itself
    assert cluster.status([jid])[jid].state is JobState.RUNNING


def test_plain_cancel_and_refusal_of_an_ended_job(cluster: FakeBackend, tmp_path: Path) -> None:
    jid = submit(cluster, tmp_path)
    rc, out, _ = invoke("cancel", jid)
    assert rc == 0 and out.strip() == f"cancelled job {jid} (run llama): scancel {jid}"
    assert cluster.status([jid])[jid].state is JobState.CANCELLED and cluster.signals == []
    rc, _, err = invoke("cancel", jid, "--save")
    assert rc == 4 and "already ended CANCELLED" in err
    assert not (tmp_path / ".slurmpod").exists()


def test_cancel_save_of_a_pending_job_cancels_outright(cluster: FakeBackend,
                                                       tmp_path: Path) -> None:
    big = cluster.submit("#!/bin/bash\n#SBATCH --nodes=16\nsleep 100\n")
    jid = submit(cluster, tmp_path)
    assert cluster.status([jid])[jid].state is JobState.PENDING
    rc, out, _ = invoke("cancel", "llama", "--save")
    assert rc == 0 and "cancelled job" in out and cluster.signals == []
    assert cluster.status([jid])[jid].state is JobState.CANCELLED
    assert cluster.status([big])[big].state is JobState.RUNNING


def test_runs_lists_each_attempts_faults(cluster: FakeBackend, tmp_path: Path) -> None:
    """A hang, a failed step, nodes shed (one drained, one refused by the bound) and a failed
    health gate reach `runs --json` per attempt and the text view in brief."""
    jid = submit(cluster, tmp_path)
    log, record = make_run(tmp_path, jid)
    lines = [
        ev("start", 1, jid, nodes=["gpu001", "gpu002"], log=str(log), log_offset=0),
        ev("hang", 1, jid, phase="train", silent_s=31.2, bound_s=30.0, iteration=1180,
           step_s=2.9),
        ev("exclude", 1, jid, node="gpu002", evidence="hang: rank 9 (pid 4242) stopped",
           action="excluded"),
        ev("end", 1, jid, end="hang", rc=137, iteration=1150, progress=True, failures=1,
           max_restarts=3),
        ev("health", 2, jid, checked=["gpu001", "gpu003", "gpu004"],
           failed={"gpu004": "no answer"}, duration_s=1.4),
        ev("exclude", 2, jid, node="gpu004", evidence="health: no answer", action="drained"),
        ev("start", 2, jid, nodes=["gpu001", "gpu003"], log=str(log), log_offset=10),
        ev("exclude", 2, jid, node="gpu003", evidence="srun: task 12 Killed",
           action="not_excluded"),
        ev("end", 2, jid, end="failure", rc=1, iteration=1150, progress=False, failures=2,
           max_restarts=3),
        ev("start", 3, jid, nodes=["gpu001", "gpu005"], log=str(log), log_offset=20),
    ]
    record.write_text("".join(lines))
    (row,) = json.loads(invoke("runs", "--json")[1])
    atts = row["attempts"]
    assert [a["attempt"] for a in atts] == [1, 2, 3] and atts[2]["faults"] == []
    assert [f["kind"] for f in atts[0]["faults"]] == ["hang", "excluded"]
    hang, shed = atts[0]["faults"]
    assert (hang["phase"], hang["silent_s"], hang["bound_s"]) == ("train", 31.2, 30.0)
    assert (shed["node"], shed["evidence"]) == ("gpu002", "hang: rank 9 (pid 4242) stopped")
    assert shed["time"] == 1_700_000_001
    assert [f["kind"] for f in atts[1]["faults"]] == ["health", "failure", "drained",
                                                      "not_excluded"]
    assert atts[1]["faults"][0]["failed"] == {"gpu004": "no answer"}
    assert (atts[1]["end"], atts[1]["rc"], atts[1]["nodes"]) == ("failure", 1,
                                                                 ["gpu001", "gpu003"])
    rc, out, _ = invoke("runs")
    assert rc == 0
    assert f"{jid} attempt 1: hang in train after 31 s (bound 30 s); excluded gpu002: " \
           "hang: rank 9 (pid 4242) stopped" in out
    assert f"{jid} attempt 2: health gate failed gpu004 (no answer); step failed (exit 1); " \
           "drained gpu004: health: no answer; not excluded gpu003: srun: task 12 Killed" in out
    assert f"{jid} attempt 3" not in out


def test_fault_lines_keep_the_latest_attempts() -> None:
    from slurmpod.model.jobs import JobStatus
    from slurmpod.runs.view import LogFigures, RunView

    text = "".join(ev("start", i, nodes=["gpu001"]) + ev("end", i, end="failure", rc=1)
                   for i in range(1, 9))
    job = JobStatus(job_id="1", name="x", state=JobState.RUNNING)
    view = RunView(job, parse_attempts(text).of_job("1"), LogFigures())
    lines = view.fault_lines(limit=3)
    assert lines[0].startswith("1: 5 earlier attempts with faults")
    assert [ln.split(":")[0] for ln in lines[1:]] == ["1 attempt 6", "1 attempt 7", "1 attempt 8"]
