"""The health gate's optional all-reduce between the job's nodes: pairs of nodes, two rounds.

One all-reduce over every node cannot say which node is bad, so the gate runs one between each
pair of nodes, all pairs at once, in two rounds with different partners:

    round 1: (n0, n1) (n2, n3) (n4, n5) ...      round 2: (n1, n2) (n3, n4) (n5, n0) ...

(the ring of the nodes: each node meets two partners; an odd count needs a third round for
the pair that closes the ring). A node fails when every test it took
failed while some other test passed (its partners are fine elsewhere); when every test failed
the test itself is suspect (no fabric, a wrong launcher) and nobody is excluded, as with the
per-node checks. Each pair test is bounded (`--timeout`); a pair that does not finish fails.

Tests by where the job runs:
- **nccl-tests** (`all_reduce_perf` on PATH): `srun --nodes=2 --ntasks-per-node=GPUS --mpi=MPI
  all_reduce_perf -b SIZE -e SIZE -g 1 -n ITERS -w 5 -c 1` per pair; its output is parsed
  (`parse_nccl_tests`: the ranks' hosts, each size's out-of-place and in-place bus bandwidth and
  wrong-value count, the "Avg bus bandwidth" line). A pair fails on a non-zero exit, an
  `NCCL failure`/`Test failure` line, wrong values, no result row, or a bus bandwidth below
  `--min-busbw` (GB/s).
- **loopback** (the sandbox, where `SLURMPOD_EMU_GPU_DIR` is set: the emulated nodes share one
  host): `srun --nodes=2 --ntasks-per-node=1 python -m slurmpod.resilience.allreduce peer`, a
  two-rank all-reduce of float32 vectors over TCP (the stand-in for NCCL that the emulated
  trainer uses too), checked element by element. `SLURMPOD_EMU_ALLREDUCE_CORRUPT=NODE` makes
  NODE's peer add a wrong value (sandbox tests only).

Output: for the health gate's parser (`health.failed_nodes`), one line per node,
`slurmpod-health: NODE ok` or `slurmpod-health: NODE fail all-reduce: WHY`, plus a summary on
stderr with the gate's duration.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from slurmpod.resilience import stepargs
from slurmpod.resilience.health import failed_nodes

Pair = tuple[str, str]
DEFAULT_BYTES = 64 << 20  # large enough for bus bandwidth, ~1 ms on NVLink, ~0.2 s at 400 Gb/s
DEFAULT_ITERS = 20
DEFAULT_TIMEOUT_S = 60.0
LOOPBACK_BYTES = 1 << 20


# -- nccl-tests' output ----------------------------------------------------------------------

@dataclass
class NcclResult:
    """What one all_reduce_perf run printed."""

    hosts: dict[int, str] = field(default_factory=dict)  # rank -> host
    rows: list[tuple[int, float | None, float | None, int]] = field(default_factory=list)
    avg_busbw: float | None = None  # GB/s, the "Avg bus bandwidth" line
    errors: list[str] = field(default_factory=list)

    @property
    def wrong(self) -> int:
        return sum(r[3] for r in self.rows)

    @property
    def busbw(self) -> float | None:
        """The average bus bandwidth (GB/s): its own line, else the rows' out-of-place mean."""
        if self.avg_busbw is not None:
            return self.avg_busbw
        vals = [r[1] for r in self.rows if r[1] is not None]
        return sum(vals) / len(vals) if vals else None


# `#  Rank  0 Group  0 Pid  41234 on     gpu001 device  0 [0x18] NVIDIA H100 80GB HBM3`
_RANK = re.compile(r"^#\s+Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
_ERROR = re.compile(r"(NCCL failure|Test failure|Test NCCL failure|CUDA failure|"
                    r"Out of bounds values\s*:\s*[1-9])")


def _num(text: str) -> float | None:
    try:
        v = float(text)
    except ValueError:
        return None
    return v if v == v and v >= 0 else None  # not NaN


def parse_nccl_tests(text: str) -> NcclResult:
    """all_reduce_perf's output (nccl-tests 2.x: a `#` header with each rank's host, one row per
    size `size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong`
    (out-of-place, then in-place), `# Avg bus bandwidth : X`). srun's `--label` prefixes and
    other lines are ignored; `#wrong` is `N/A` without validation (-c 0)."""
    res = NcclResult()
    for raw in text.splitlines():
        line = re.sub(r"^\s*\d+:\s", "", raw).strip()  # srun --label
        if m := _RANK.match(line):
            res.hosts[int(m.group(1))] = m.group(2)
        elif m := _AVG.match(line):
            res.avg_busbw = _num(m.group(1))
        elif _ERROR.search(line):
            res.errors.append(line[:200])
        elif line and not line.startswith("#"):
            tok = line.split()
            if len(tok) >= 10 and tok[0].isdigit() and tok[1].isdigit():
                wrong = [t for t in (tok[-5], tok[-1]) if t.isdigit()]
                res.rows.append((int(tok[0]), _num(tok[-6]), _num(tok[-2]),
                                 sum(int(w) for w in wrong)))
    return res


def judge_nccl(rc: int | None, text: str, min_busbw: float | None) -> str | None:
    """Why one pair's all_reduce_perf failed, or None when it passed."""
    res = parse_nccl_tests(text)
    if rc is None:
        return "did not finish in time"
    if res.errors:
        return res.errors[0]
    if rc != 0:
        return f"all_reduce_perf exited {rc}"
    if not res.rows:
        return "no result row"
    if res.wrong:
        return f"{res.wrong} wrong values"
    bw = res.busbw
    if min_busbw is not None and (bw is None or bw < min_busbw):
        return f"bus bandwidth {bw if bw is not None else '?'} GB/s < {min_busbw:g} GB/s"
    return None


# -- pairs and the verdict -------------------------------------------------------------------

def plan_rounds(nodes: Sequence[str]) -> list[list[Pair]]:
    """The ring's pairs (n_i, n_i+1), every node in two tests with different partners: even i
    in the first round, odd i in the second, and for an odd count the closing pair (which
    shares the first node with the first pair) in a third. Two nodes: one test."""
    n = len(nodes)
    if n < 2:
        return []
    if n == 2:
        return [[(nodes[0], nodes[1])]]
    ring = [(nodes[i], nodes[(i + 1) % n]) for i in range(n)]
    rounds = [ring[0:n - n % 2:2], ring[1::2]]
    if n % 2:
        rounds.append([ring[-1]])
    return rounds


def verdict(nodes: Sequence[str], results: Mapping[Pair, str | None]) -> dict[str, str]:
    """node -> why, for nodes every one of whose tests failed while another test passed."""
    if results and all(why is not None for why in results.values()):
        return {}  # every pair failed: the test is suspect, not the nodes
    out: dict[str, str] = {}
    for node in nodes:
        mine = sorted((a if b == node else b, why) for (a, b), why in results.items()
                      if node in (a, b))
        if mine and all(why is not None for _, why in mine):
            out[node] = "; ".join(f"with {other}: {why}" for other, why in mine)
    return out


# -- running the pairs -----------------------------------------------------------------------

Runner = Callable[[Pair, int], tuple[int | None, str]]


MAX_PARALLEL = 256  # srun processes on the batch host at once (~5-10 MB each)


def run_rounds(nodes: Sequence[str], test: Runner, *, parallel: int = MAX_PARALLEL
               ) -> dict[Pair, tuple[int | None, str]]:
    """Every round's pairs at once, up to `parallel` (round after round): pair -> (exit status
    or None on timeout, output)."""
    out: dict[Pair, tuple[int | None, str]] = {}
    for r, pairs in enumerate(plan_rounds(nodes)):
        with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(pairs)))) as pool:
            for pair, got in zip(pairs, pool.map(lambda p, r=r: test(p, r), pairs),
                                 strict=True):
                out[pair] = got
    return out


def srun_test(argv_of: Callable[[Pair, int], list[str]], timeout_s: float) -> Runner:
    def run(pair: Pair, rnd: int) -> tuple[int | None, str]:
        try:
            cp = subprocess.run(argv_of(pair, rnd), capture_output=True, text=True,
                                timeout=timeout_s, stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) \
                else (exc.stdout or "")
            return None, out
        except OSError as exc:
            return 127, str(exc)
        return cp.returncode, cp.stdout + cp.stderr
    return run


def _srun_pair(pair: Pair, tasks_per_node: int, name: str) -> list[str]:
    # --exact keeps each step to what it asks for, so the pairs of a round run side by side in
    # the allocation; --overlap lets them start while the gate's other steps hold the nodes.
    return ["srun", "--overlap", "--exact", "--nodes=2", f"--nodelist={pair[0]},{pair[1]}",
            f"--ntasks-per-node={tasks_per_node}", "--ntasks", str(2 * tasks_per_node),
            "--kill-on-bad-exit=1", f"--job-name={name}"]


def nccl_argv(gpus: int, mpi: str, nbytes: int, iters: int) -> Callable[[Pair, int], list[str]]:
    def argv(pair: Pair, _rnd: int) -> list[str]:
        return [*_srun_pair(pair, gpus, "slurmpod-allreduce"), f"--mpi={mpi}",
                "all_reduce_perf", "-b", str(nbytes), "-e", str(nbytes), "-g", "1",
                "-n", str(iters), "-w", "5", "-c", "1"]
    return argv


def loopback_argv(python: str, workdir: Path, nbytes: int, iters: int, timeout_s: float
                  ) -> Callable[[Pair, int], list[str]]:
    def argv(pair: Pair, rnd: int) -> list[str]:
        rdv = workdir / f"rdv-{rnd}-{pair[0]}-{pair[1]}"
        return [*_srun_pair(pair, 1, "slurmpod-allreduce"), python, "-m",
                "slurmpod.resilience.allreduce", "peer", "--rendezvous", str(rdv),
                "--bytes", str(nbytes), "--iters", str(iters), "--timeout", str(timeout_s)]
    return argv


# -- the sandbox's loopback all-reduce (one task per node of a pair) --------------------------

def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(1 << 20, n - len(buf)))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        buf += chunk
    return bytes(buf)


def peer(rank: int, rendezvous: Path, nbytes: int, iters: int, timeout_s: float,
         corrupt: bool = False) -> tuple[bool, float, str]:
    """Two ranks sum float32 vectors (rank + 1 everywhere) `iters` times over TCP and check every
    element (= 3): (ok, bus bandwidth GB/s, why). Rank 0 listens and writes its port to
    `rendezvous` (a shared directory's file, as torch's file:// rendezvous); rank 1 connects."""
    import numpy as np  # lazy: start-up (numpy only when used)

    n = max(1, nbytes // 4)
    mine = np.full(n, rank + 1.0 + (1.0 if corrupt else 0.0), np.float32)
    deadline = time.monotonic() + timeout_s
    if rank == 0:
        srv = socket.create_server(("127.0.0.1", 0))
        srv.settimeout(timeout_s)
        tmp = rendezvous.with_suffix(".tmp")
        tmp.write_text(str(srv.getsockname()[1]))
        tmp.replace(rendezvous)
        try:
            conn, _ = srv.accept()
        finally:
            srv.close()
    else:
        while not rendezvous.exists():
            if time.monotonic() > deadline:
                return False, 0.0, "no partner at the rendezvous"
            time.sleep(0.02)
        conn = socket.create_connection(("127.0.0.1", int(rendezvous.read_text())),
                                        timeout=timeout_s)
    with conn:
        conn.settimeout(max(1.0, deadline - time.monotonic()))
        t0 = time.perf_counter()
        ok = True
        for _ in range(iters):
            conn.sendall(mine.tobytes())
            other = np.frombuffer(_recv_exact(conn, mine.nbytes), np.float32)
            ok = ok and bool(np.all(mine + other == 3.0))
        dt = time.perf_counter() - t0
    if rank == 0:
        with contextlib.suppress(OSError):
            rendezvous.unlink()
    # Two ranks: bus bandwidth = algorithm bandwidth = bytes / time per all-reduce.
    bw = mine.nbytes * iters / dt / 1e9 if dt > 0 else 0.0
    return ok, bw, "" if ok else "wrong values (sum != expected)"


# -- the gate --------------------------------------------------------------------------------

def healthy_from(health_output: str, nodes: Sequence[str]) -> list[str]:
    """The candidates the per-node checks passed (their `slurmpod-health: NODE ok` lines)."""

    bad = failed_nodes(health_output, nodes)
    return [n for n in nodes if n not in bad]


def gate(nodes: Sequence[str], test: Runner, judge: Callable[[int | None, str], str | None],
         parallel: int = MAX_PARALLEL) -> tuple[dict[str, str], dict[Pair, str | None], float]:
    """(failed node -> why, pair -> why or None, seconds) for `nodes`."""
    t0 = time.monotonic()
    raw = run_rounds(nodes, test, parallel=parallel)
    results = {p: judge(rc, out) for p, (rc, out) in raw.items()}
    return verdict(nodes, results), results, time.monotonic() - t0


def choose_tool(tool: str, env: Mapping[str, str]) -> str | None:
    if tool != "auto":
        return tool
    if env.get("SLURMPOD_EMU_GPU_DIR"):
        return "loopback"
    return "nccl-tests" if shutil.which("all_reduce_perf") else None


def _lines(nodes: Iterable[str], failed: Mapping[str, str]) -> list[str]:
    return [f"slurmpod-health: {n} fail all-reduce: {failed[n]}" if n in failed
            else f"slurmpod-health: {n} ok" for n in nodes]


def build_parser() -> argparse.ArgumentParser:
    """The one parser of both sides (`gate` in the job script, `peer` inside its srun steps):
    argparse, as it runs with the job's Python, starts fast and needs no `slurmpod` on PATH
    (slurmpod.resilience.stepargs)."""
    p = stepargs.parser("allreduce")
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gate", help="pair tests between the nodes; health lines on stdout")
    stepargs.add_nodes(g, required=True, help="candidates, comma-separated")
    g.add_argument("--health", help="the per-node gate's output: only nodes it passed")
    g.add_argument("--dir", required=True, help="a directory every node sees (rendezvous)")
    g.add_argument("--tool", choices=("auto", "nccl-tests", "loopback"), default="auto")
    g.add_argument("--gpus", type=int, default=8, help="ranks per node for nccl-tests")
    g.add_argument("--mpi", default=os.environ.get("SLURMPOD_ALLREDUCE_MPI", "pmix"))
    g.add_argument("--bytes", type=int, default=None)
    g.add_argument("--iters", type=int, default=DEFAULT_ITERS)
    g.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
    g.add_argument("--min-busbw", type=float, default=None, help="GB/s a pair must reach")
    g.add_argument("--parallel", type=int, default=MAX_PARALLEL, help="pair tests at once")
    q = sub.add_parser("peer", help="one rank of the loopback all-reduce (inside srun)")
    q.add_argument("--rendezvous", required=True)
    q.add_argument("--bytes", type=int, default=LOOPBACK_BYTES)
    q.add_argument("--iters", type=int, default=DEFAULT_ITERS)
    q.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "peer":
        node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        rank = int(os.environ.get("SLURM_PROCID", "0"))
        try:
            ok, bw, why = peer(rank, Path(args.rendezvous), args.bytes, args.iters, args.timeout,
                               corrupt=os.environ.get("SLURMPOD_EMU_ALLREDUCE_CORRUPT") == node)
        except (OSError, ValueError) as exc:
            ok, bw, why = False, 0.0, f"{type(exc).__name__}: {exc}"
        print(f"slurmpod-allreduce: {node} rank {rank} "
              + (f"ok busbw {bw:.3f} GB/s" if ok else f"fail {why}"))
        return 0 if ok else 1
    nodes = stepargs.node_list(args.nodes)
    if args.health:
        try:
            text = Path(args.health).read_text(errors="replace")[: 4 << 20]
        except OSError:
            text = ""
        nodes = healthy_from(text, nodes)
    tool = choose_tool(args.tool, os.environ)
    if tool is None or len(nodes) < 2:
        why = "no all_reduce_perf on PATH" if tool is None else "fewer than two nodes"
        print(f"slurmpod: health gate: all-reduce skipped ({why})", file=sys.stderr)
        return 0
    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    if tool == "loopback":
        test = srun_test(loopback_argv(sys.executable, work, args.bytes or LOOPBACK_BYTES,
                                       args.iters, args.timeout), args.timeout + 10)

        def judge(rc: int | None, out: str) -> str | None:
            if rc is None:
                return "did not finish in time"
            bad = re.findall(r"slurmpod-allreduce: \S+ rank \d+ fail (.*)", out)
            return bad[0] if bad else (None if rc == 0 else f"srun exited {rc}")
    else:
        test = srun_test(nccl_argv(args.gpus, args.mpi, args.bytes or DEFAULT_BYTES,
                                   args.iters), args.timeout)

        def judge(rc: int | None, out: str) -> str | None:
            return judge_nccl(rc, out, args.min_busbw)
    failed, results, took = gate(nodes, test, judge, max(1, args.parallel))
    for line in _lines(nodes, failed):
        print(line)
    print(f"slurmpod: health gate: all-reduce ({tool}) on {len(nodes)} nodes, "
          f"{len(results)} pair tests in {len(plan_rounds(nodes))} rounds: {took:.2f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
