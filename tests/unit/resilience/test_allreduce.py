"""The health gate's pairwise all-reduce: nccl-tests' output (tests/data/nccl-tests/), the
ring of pairs and the verdict, and the loopback all-reduce the sandbox runs (two real
processes over TCP)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slurmpod.resilience import allreduce as ar
from tests.helpers import DATA_DIR

DATA = DATA_DIR / "nccl-tests"


def test_nccl_tests_output_is_read() -> None:
    text = (DATA / "all_reduce_perf-2nodes.txt").read_text()
    res = ar.parse_nccl_tests(text)
    assert set(res.hosts.values()) == {"gpu001", "gpu002"} and len(res.hosts) == 16
    assert res.rows == [(67108864, 118.57, 118.83, 0)]
    assert res.avg_busbw == 118.70 and res.busbw == 118.70 and res.wrong == 0
    assert ar.judge_nccl(0, text, 100.0) is None
    assert ar.judge_nccl(0, text, 150.0) == "bus bandwidth 118.7 GB/s < 150 GB/s"
    # srun --label prefixes, no validation (#wrong N/A), no average line
    labelled = "\n".join(f" 3: {ln}" for ln in text.splitlines()
                         if not ln.startswith("# Avg")).replace("      0   ", "    N/A   ")
    res = ar.parse_nccl_tests(labelled)
    assert res.avg_busbw is None and res.busbw == 118.57 and res.wrong == 0


def test_nccl_tests_failures() -> None:
    text = (DATA / "all_reduce_perf-2nodes.txt").read_text()
    wrong = text.replace("118.57      0", "118.57     12")
    assert ar.judge_nccl(0, wrong, None) == "12 wrong values"
    err = ("gpu002: Test NCCL failure common.cu:958 'unhandled system error (run with "
           "NCCL_DEBUG=INFO for details)'\n")
    assert ar.judge_nccl(1, err, None).startswith("gpu002: Test NCCL failure")
    assert ar.judge_nccl(None, "", None) == "did not finish in time"
    assert ar.judge_nccl(0, "# nThread 1\n", None) == "no result row"
    assert ar.judge_nccl(2, "", None) == "all_reduce_perf exited 2"


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_every_node_meets_two_partners_in_disjoint_rounds(n: int) -> None:
    nodes = [f"n{i}" for i in range(n)]
    rounds = ar.plan_rounds(nodes)
    for pairs in rounds:
        used = [x for p in pairs for x in p]
        assert len(used) == len(set(used))  # a node is in one test per round
    partners = {x: {b if a == x else a for r in rounds for a, b in r if x in (a, b)}
                for x in nodes}
    assert all(len(p) == (1 if n == 2 else 2) for p in partners.values())
    assert len(rounds) == (1 if n == 2 else 2 + n % 2)
    assert ar.plan_rounds(["n0"]) == []


def test_verdict_blames_the_node_whose_every_test_failed() -> None:
    nodes = [f"n{i}" for i in range(6)]
    results = {p: ("wrong values" if "n3" in p else None)
               for r in ar.plan_rounds(nodes) for p in r}
    assert ar.verdict(nodes, results) == {
        "n3": "with n2: wrong values; with n4: wrong values"}
    # everything failed: the test is suspect, nobody is blamed
    assert ar.verdict(nodes, dict.fromkeys(results, "timeout")) == {}


def test_gate_with_a_stand_in_runner() -> None:
    nodes = ["a", "b", "c", "d"]
    seen: list[tuple[tuple[str, str], int]] = []

    def runner(pair: tuple[str, str], rnd: int) -> tuple[int | None, str]:
        seen.append((pair, rnd))
        return (None, "") if "c" in pair else (0, "fine")

    failed, _results, took = ar.gate(nodes, runner,
                                     lambda rc, out: None if rc == 0 else "timed out")
    assert failed == {"c": "with b: timed out; with d: timed out"} and took >= 0
    assert sorted(seen) == [(("a", "b"), 0), (("b", "c"), 1), (("c", "d"), 0), (("d", "a"), 1)]
    assert ar._lines(nodes, failed)[2] == "slurmpod-health: c fail all-reduce: with b: timed " \
                                          "out; with d: timed out"


def test_loopback_peers_sum_and_catch_a_corrupt_node(tmp_path: Path) -> None:
    def pair(corrupt: str) -> list[str]:
        rdv = tmp_path / f"rdv-{corrupt or 'none'}"
        procs = [subprocess.Popen(
            [sys.executable, "-m", "slurmpod.resilience.allreduce", "peer", "--rendezvous",
             str(rdv), "--bytes", "65536", "--iters", "3", "--timeout", "20"],
            env={"SLURM_PROCID": str(r), "SLURMD_NODENAME": f"n{r}", "PATH": "/usr/bin:/bin",
                 "SLURMPOD_EMU_ALLREDUCE_CORRUPT": corrupt}, stdout=subprocess.PIPE, text=True)
            for r in (0, 1)]
        return [p.communicate(timeout=30)[0].strip() for p in procs]

    ok = pair("")
    assert ok[0].startswith("slurmpod-allreduce: n0 rank 0 ok busbw ")
    assert ok[1].startswith("slurmpod-allreduce: n1 rank 1 ok busbw ")
    bad = pair("n1")
    assert all(line.endswith("fail wrong values (sum != expected)") for line in bad)


def test_gate_lines_feed_the_health_parser() -> None:
    from slurmpod.resilience.health import failed_nodes

    lines = "\n".join(["slurmpod-health: a ok", "slurmpod-health: b ok",
                       *ar._lines(["a", "b"], {"b": "with a: wrong values"})])
    assert failed_nodes(lines, ["a", "b"]) == {"b": "all-reduce: with a: wrong values"}
    assert ar.healthy_from("slurmpod-health: a ok\nslurmpod-health: b fail x\n",
                           ["a", "b", "c"]) == ["a"]
    assert ar.choose_tool("auto", {"SLURMPOD_EMU_GPU_DIR": "/x"}) == "loopback"
