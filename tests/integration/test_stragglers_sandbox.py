"""A straggler named by Megatron's per-rank timers, end to end on the real sandbox Slurm: a
2-node job of the sandbox workload whose rank 11 is slow (`--emu-slow-rank`) logs Megatron's
timer blocks (`--timing-log-level 2 --timing-log-option all`); the EpilogSlurmctld hook parses
the log into the spool record, and `slurmpod report JOB` names the rank and the node Slurm put
it on (docs/report.md, "Stragglers from Megatron's per-rank timers")."""

from __future__ import annotations

from typing import Any

from tests.integration.test_report_sandbox import report_json, spool_record, wait_finished
from tests.integration.test_submit_sandbox import submit_json, write_run


def test_a_slow_rank_is_named_with_its_node_in_the_job_report(sandbox: Any) -> None:
    d = sandbox.tmp_dir / "straggler"
    d.mkdir(exist_ok=True)
    run = write_run(d / "run.toml", "straggler", 2, train_iters=12,
                    extra='timing_log_level = 2\ntiming_log_option = "all"\n'
                          "emu_slow_rank = 11\nemu_slow_ms = 150")
    jid = submit_json(sandbox, run)["job_id"]
    wait_finished(sandbox, jid)
    timers = spool_record(sandbox, jid)["summary"]["metrics"]["rank_timers"]
    assert timers["option"] == "all" and len(timers["per_rank"]["forward-compute"]) == 16
    nodes = sandbox.nodes_of(jid)
    assert len(nodes) == 2
    r = report_json(sandbox, jid)
    found = r["stragglers"]
    assert found is not None, r["notes"]
    assert [s["rank"] for s in found["stragglers"]] == [11], found
    assert found["stragglers"][0]["node"] == nodes[1]  # ranks 8-15 on the second node
    note = next(n for n in r["notes"] if n["code"] in ("stragglers", "below-predicted"))
    assert f"node {nodes[1]} (rank 11)" in note["text"], note
    assert "--exclude" in note["fix"]
