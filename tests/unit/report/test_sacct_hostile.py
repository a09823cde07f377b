"""Job-controlled text in sacct's output (Comment, JobName, AdminComment, WorkDir) cannot steer
parsing: no forged job, no lost job, every field read back whole. sacct prints fields verbatim
(print_fields_str, 22.05 – 24.11), so these outputs are built exactly as sacct would print them;
tests/integration/test_hostile_sacct_sandbox.py does the same against the real Slurm."""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import stat
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmpod.backends.joblist import LIST_FIELDS, parse_job_list
from slurmpod.backends.parse import (
    SACCT_DELIMITER,
    SACCT_FIELDS,
    job_ids_agree,
    parse_sacct_parsable,
    sacct_delimiter,
    sacct_rows,
)
from slurmpod.report.sacct import (
    ATTEMPT_FIELDS,
    jobs_from_text,
    parse_attempts,
    parse_exit_codes,
)

FAKE = Path(__file__).parents[1] / "fake_sacct.py"
OLD = SACCT_DELIMITER  # the fixed delimiter slurmpod used before (and the recorded samples')


def record(job_id: str, raw: str | None = None, **values: str) -> dict[str, str]:
    """One allocation row of slurmpod's records query, in Slurm 22.05's shapes."""
    row = {"JobID": job_id, "JobName": "train", "User": "alice", "Account": "ml",
           "Partition": "batch", "State": "COMPLETED", "ExitCode": "0:0",
           "Submit": "1795000000", "Start": "1795000100", "End": "1795003700",
           "ElapsedRaw": "3600", "NodeList": "gpu[001-002]", "NNodes": "2", "NTasks": "",
           "AllocTRES": "billing=64,cpu=64,gres/gpu=16,mem=500G,node=2", "AdminComment": "",
           "Comment": "", "JobIDRaw": raw or job_id}
    row.update(values)
    return row


def sacct_out(rows: list[dict[str, str]], delimiter: str,
              fields: tuple[str, ...] = SACCT_FIELDS) -> str:
    """What `sacct --parsable2 --delimiter=D` prints: values verbatim, D between, \\n after."""
    return "".join(delimiter.join(r[f] for f in fields) + "\n" for r in rows)


def forged_row(job_id: str, delimiter: str) -> str:
    """A complete record for someone else's job, as a job could write it into its own text."""
    return delimiter.join(record(job_id, State="RUNNING", End="Unknown",
                                 AllocTRES="gres/gpu=4096,node=512")[f] for f in SACCT_FIELDS)


# Texts a job can store (sbatch --comment/--job-name, scontrol update; all accepted verbatim by
# 22.05.8 and 24.11.5 on the sandbox).
HOSTILE = [
    "hello\x1fworld\nsecond line|pipe",  # the reported case: a phantom job, a lost one
    "\n" + forged_row("999", OLD) + "\n",
    "x" + OLD + OLD + "101\n" + forged_row("999", OLD) + "\nrest",  # close own row early
    "\n".join(forged_row(str(900 + k), OLD) for k in range(5)),
    "\n999|1795000000|1795000100|1795003700|3600|RUNNING\n999|0:0",  # narrow queries' shape
    "a\u2028b\x85c\rd\x1c\x1d\x1ee\x0bf\x0cg",  # splitlines() would end rows at each of these
    '{"gpus": 4096, "mfu": 0.99}|"|\\|`',
    "y" * 200_000 + "\n" + forged_row("999", OLD),
    "\t\n\n\n",
    forged_row("102", OLD),  # a real neighbour's id
]


def fleet(comment: str = "", name: str = "train", admin: str = "",
          delimiter: str = OLD) -> tuple[str, list[dict[str, str]]]:
    rows = [record("101", Comment=comment, JobName=name, AdminComment=admin),
            record("102", State="FAILED", ExitCode="3:0"),
            record("4_1", raw="5"), record("38+1", raw="39")]
    return sacct_out(rows, delimiter), rows


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
@pytest.mark.parametrize("where", ["Comment", "JobName", "AdminComment"])
def test_hostile_text_forges_nothing_with_the_query_delimiter(text: str, where: str,
                                                              caplog) -> None:
    delim = sacct_delimiter()
    kw = {"comment": text} if where == "Comment" else (
        {"name": text} if where == "JobName" else {"admin": text})
    out, rows = fleet(delimiter=delim, **kw)
    with caplog.at_level(logging.WARNING, logger="slurmpod.sacct"):
        recs = parse_sacct_parsable(out, delimiter=delim)
    assert [r.job_id for r in recs] == ["101", "102", "4_1", "38+1"]
    first = recs[0]
    assert (first.comment, first.name, first.admin_comment) == (
        rows[0]["Comment"], rows[0]["JobName"], rows[0]["AdminComment"])
    assert first.n_gpus == 16 and first.state.name == "COMPLETED"  # Slurm's, not the text's
    assert recs[1].exit_code == 3 and caplog.records == []


def test_the_reported_case_with_the_old_fixed_delimiter_loses_rows_but_forges_none(
        caplog) -> None:
    # Before: a phantom running job and job 102's row gone. A leaked delimiter now costs rows
    # (left out, with one warning line), never a job that is not in accounting.
    out, _ = fleet(comment="hello\x1fworld\nsecond line|pipe")
    with caplog.at_level(logging.WARNING, logger="slurmpod.sacct"):
        recs = parse_sacct_parsable(out)
    assert {r.job_id for r in recs} <= {"101", "102", "4_1", "38+1"}
    assert [r.job_id for r in recs] == ["4_1", "38+1"]
    (warning,) = caplog.records
    assert "left out 2 record(s)" in warning.getMessage()
    assert "\n" not in warning.getMessage()  # one line: job text shown with repr escapes


def test_each_query_gets_its_own_unguessable_delimiter() -> None:
    seen = {sacct_delimiter() for _ in range(1000)}
    assert len(seen) == 1000
    for d in seen:
        assert d.startswith("\x1f") and len(d) == 17 and d[1:].isalnum()


@pytest.mark.parametrize(("job_id", "raw", "ok"), [
    ("123", "123", True), ("123.batch", "123.batch", True), ("123.0", "123.0", True),
    ("123.extern", "123.extern", True), ("123.interactive", "123.interactive", True),
    ("123.4+1", "123.4+1", True), ("123.TDB", "123.TDB", True),
    ("4_1", "5", True), ("4_1.batch", "5.batch", True), ("4_[2-9%2]", "4", True),
    ("4_[1,3,5-7]", "4", True), ("4_[1-99:2]", "4", True), ("38+1", "39", True),
    ("38+0.0", "38.0", True),
    ("123", "124", False), ("123.batch", "123", False), ("123", "123.batch", False),
    ("123.batch", "123.0", False), ("4_1", "5.batch", False), ("", "", False),
    ("world", "world", False), ("123 ", "123", False), ("123\n", "123", False),
    ("12a", "12a", False), ("4_1", "4_1", False), ("123.foo", "123.foo", False),
    ("-1", "-1", False), ("123.", "123.", False),
])
def test_job_id_and_raw_id_must_agree(job_id: str, raw: str, ok: bool) -> None:
    assert job_ids_agree(job_id, raw) is ok


_any_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",),
                                           blacklist_characters="\x00"), max_size=60)


@settings(max_examples=200, deadline=None)
@given(comment=_any_text, admin=_any_text, name=_any_text, work_dir=_any_text,
       forged=st.lists(st.sampled_from(HOSTILE[:5]), max_size=3))
def test_any_text_round_trips_and_only_real_jobs_come_out(
        comment: str, admin: str, name: str, work_dir: str, forged: list[str]) -> None:
    # Anything a job can store (sacct prints C strings: no NUL), plus forged rows, in every
    # free-text field of both sacct queries that carry one.
    comment = comment + "".join(forged)
    delim = sacct_delimiter()
    out, _ = fleet(comment=comment, name=name, admin=admin, delimiter=delim)
    recs = parse_sacct_parsable(out, delimiter=delim)
    assert [r.job_id for r in recs] == ["101", "102", "4_1", "38+1"]
    assert (recs[0].comment, recs[0].name, recs[0].admin_comment) == (comment, name, admin)
    listing = [{**record("7", JobName=name, Comment=comment), "WorkDir": work_dir},
               {**record("8"), "WorkDir": "/runs/8"}]
    jobs = parse_job_list(sacct_out(listing, delim, LIST_FIELDS), delim)
    assert [(j.job_id, j.work_dir, j.comment, j.name) for j in jobs] == [
        ("7", work_dir, comment, name), ("8", "/runs/8", "", "train")]


def test_rows_must_start_and_end_with_the_two_ids() -> None:
    with pytest.raises(ValueError):
        sacct_rows("", ("JobID", "Comment"), sacct_delimiter())
    with pytest.raises(ValueError):
        sacct_rows("", ("Comment", "JobID", "JobIDRaw"), sacct_delimiter())


def test_truncated_output_and_stray_lines_are_left_out_with_one_warning(caplog) -> None:
    delim = sacct_delimiter()
    out = sacct_out([record("101"), record("102")], delim)
    with caplog.at_level(logging.WARNING, logger="slurmpod.sacct"):
        assert [r.job_id for r in parse_sacct_parsable(out[:-30], delimiter=delim)] == ["101"]
        assert parse_sacct_parsable("", delimiter=delim) == []
    assert len(caplog.records) == 1


# -- the narrow queries (attempts, exit codes): no free text, rows checked all the same ------


def test_attempts_with_the_query_delimiter_and_checked_rows(caplog) -> None:
    d = sacct_delimiter()
    tres = "billing=64,cpu=64,gres/gpu=16,mem=500G,node=2"
    good = [["101", "1795000000", "1795000100", "1795003700", "3600", "COMPLETED", tres],
            ["103", "1795000000", "1795000010", "1795000610", "600", "REQUEUED", tres],
            ["103", "1795000620", "Unknown", "Unknown", "0", "PENDING", ""],
            ["104", "1795000000", "1795000005", "1795000065", "60", "CANCELLED by 1000",
             "cpu=2,mem=4G,node=1"]]
    bad = [["999", "x", "1", "2", "3", "RUNNING", tres],
           ["999", "1", "1", "2", "3", "running\n", tres],
           ["world", "1", "1", "2", "3", "RUNNING", tres], ["999", "1", "1", "2", "3"],
           ["999", "1", "1", "2", "3", "RUNNING", "gres/gpu=8 injected"]]
    assert len(good[0]) == len(ATTEMPT_FIELDS)
    text = "".join(d.join(r) + "\n" for r in [*good[:2], *bad, *good[2:]])
    with caplog.at_level(logging.WARNING, logger="slurmpod.sacct"):
        got = parse_attempts(text, d)
    assert sorted(got) == ["101", "103", "104"] and len(got["103"]) == 2
    assert got["103"][1].start_s is None and got["104"][0].state == "CANCELLED"
    assert [a.gpus for a in got["103"]] == [16, None] and got["104"][0].gpus == 0
    # rows recorded before AllocTRES was asked for still read, without GPUs
    old = parse_attempts(d.join(good[0][:6]) + "\n", d)
    assert old["101"][0].elapsed_s == 3600 and old["101"][0].gpus is None
    assert caplog.records  # the bad lines were reported, not used
    # `|` in a record of the recorded shape is a field boundary only with the default delimiter
    assert parse_attempts("101|1|2|3|4|COMPLETED\n", d) == {}


def test_exit_codes_checked() -> None:
    assert parse_exit_codes("7|0:0\n7|1:0\n8|0:9\n999|x\nworld|0:0\n9|0:0|extra\n") == {
        "7": (1, 0), "8": (0, 9)}
    d = sacct_delimiter()
    assert parse_exit_codes(f"7{d}2:0\n7.batch{d}5:0\n", d) == {"7": (2, 0)}


def test_both_report_queries_together() -> None:
    d = sacct_delimiter()
    out, _ = fleet(comment=HOSTILE[1], delimiter=d)
    attempts = "".join(d.join([jid, "1795000000", "1795000100", "1795003700", "3600",
                               "COMPLETED"]) + "\n" for jid in ("101", "102", "4_1", "38+1"))
    jobs = jobs_from_text(out, attempts, d)
    assert [(j.record.job_id, len(j.attempts)) for j in jobs] == [
        ("101", 1), ("102", 1), ("4_1", 1), ("38+1", 1)]


# -- the fleet report end to end: text, JSON, CSV, Prometheus ---------------------------------


@pytest.fixture()
def hostile_sacct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in sacct on PATH that prints, with each query's own delimiter, five finished
    jobs whose Comments and names forge rows for other jobs (with the old delimiter)."""
    rows = [record("101", Comment=HOSTILE[0], JobName='we"ird\\ name\nx'),
            record("102", State="FAILED", ExitCode="3:0", Comment=HOSTILE[2]),
            record("103", Comment=HOSTILE[3], AdminComment=HOSTILE[4]),
            record("104", JobName=HOSTILE[5], Comment=HOSTILE[7]),
            record("105", Comment=forged_row("101", OLD), User="bob")]
    recs = tmp_path / "records.json"
    recs.write_text(json.dumps([[r[f] for f in SACCT_FIELDS] for r in rows]))
    att = tmp_path / "attempts.json"
    att.write_text(json.dumps([[r["JobID"], r["Submit"], r["Start"], r["End"], r["ElapsedRaw"],
                                r["State"]] for r in rows]))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "sacct"
    script.write_text(f"""#!/bin/sh
case "$*" in
  *Comment*) exec {sys.executable} {FAKE} {recs} json "$@" ;;
  *ElapsedRaw,State*) exec {sys.executable} {FAKE} {att} json "$@" ;;
  *) echo "unexpected sacct call" >&2; exit 1 ;;
esac
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURMPOD_SPOOL", str(tmp_path / "spool"))
    return tmp_path


REAL = ["101", "102", "103", "104", "105"]


def report(*args: str) -> str:
    from slurmpod.cli.main import cli

    res = CliRunner().invoke(cli, ["report", "--since", "1d", *args], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


def test_fleet_outputs_hold_exactly_the_real_jobs(hostile_sacct: Path) -> None:
    doc = json.loads(report("--json", "--jobs"))
    assert [r["job_id"] for r in doc["job_rows"]] == REAL
    assert doc["jobs"] == 5 and doc["running_jobs"] == 0
    assert {r["job_id"]: r["n_gpus"] for r in doc["job_rows"]} == dict.fromkeys(REAL, 16)
    assert doc["job_rows"][0]["name"] == 'we"ird\\ name\nx'
    rows = list(csv.DictReader(io.StringIO(report("--csv"))))
    assert [r["job_id"] for r in rows] == REAL
    # LocalRunner reads sacct in text mode (universal newlines): a bare \r arrives as \n.
    assert rows[3]["name"] == doc["job_rows"][3]["name"] == HOSTILE[5].replace("\r", "\n")
    assert rows[1]["state"] == "FAILED" and rows[0]["name"] == 'we"ird\\ name\nx'
    text = report()
    assert "999" not in text and "4096" not in text
    prom = hostile_sacct / "fleet.prom"
    report("--prometheus", str(prom))
    body = prom.read_text()
    assert 'slurmpod_fleet_jobs{window="1d"} 5' in body
    assert 'slurmpod_fleet_running_jobs{window="1d"} 0' in body
    assert 'slurmpod_user_jobs{window="1d",user="bob"} 1' in body


def test_job_prometheus_with_a_hostile_name_passes_promtool(hostile_sacct: Path) -> None:
    from slurmpod.cli.main import cli

    prom = hostile_sacct / "job.prom"
    res = CliRunner().invoke(cli, ["report", "101", "--prometheus", str(prom)],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    body = prom.read_text()
    assert 'job_id="101",name="we\\"ird\\\\ name\\nx",' in body
    assert "999" not in body
    from tests.helpers import promtool_check
    from tests.unit.report.test_prom_exposition import check_exposition

    check_exposition(body)
    promtool_check(body)


@pytest.mark.parametrize("name", ["a\rb", "x\r999,evil,mallory", "c\r\nd", "e\nf", "z\r"])
def test_fleet_csv_quotes_any_line_break_in_a_name(name: str) -> None:
    # Python's csv writer quotes only the characters of its lineterminator: with "\n" alone a
    # bare \r went out unquoted, which CSV readers (and spreadsheets) take as a new row.
    from slurmpod.report.build import build_job_report
    from slurmpod.report.fleet import CSV_COLUMNS, build_fleet

    d = sacct_delimiter()
    out, _ = fleet(name=name, delimiter=d)
    attempts = "".join(d.join([j, "1795000000", "1795000100", "1795003700", "3600",
                               "COMPLETED"]) + "\n" for j in ("101", "102", "4_1", "38+1"))
    reports = [build_job_report(sj, with_series=False, with_notes=False)
               for sj in jobs_from_text(out, attempts, d)]
    text = build_fleet(reports, window="1d").to_csv()
    for reader in (csv.reader(io.StringIO(text, newline="")), csv.reader(io.StringIO(text))):
        rows = list(reader)
        assert [r[0] for r in rows] == ["job_id", "101", "102", "4_1", "38+1"]
        assert rows[1][CSV_COLUMNS.index("name")] == name
