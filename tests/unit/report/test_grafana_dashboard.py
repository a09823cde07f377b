"""templates/grafana/slurmpod-dashboard.json against what slurmpod's exporter writes.

Every metric a panel queries must be in the exposition `slurmpod report --prometheus` writes
(job and fleet), with the labels the query matches on; the exposition itself passes
`promtool check metrics`; the dashboard has the structure Grafana's dashboard model (schema
version 39) needs: panels with unique ids, a grid position inside the 24 columns without
overlaps, the `${datasource}` variable as datasource, targets with an expression and a unique
refId, and every `$variable` a query uses defined under templating."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from slurmpod.report.fleet import build_fleet
from slurmpod.report.prom import fleet_exposition, job_exposition
from tests.helpers import promtool_check
from tests.unit.report.test_html import job_report, record, sacct_job

DASHBOARD = Path(__file__).parents[3] / "templates" / "grafana" / "slurmpod-dashboard.json"

# JSON-schema-style description of what the test requires of the dashboard (a subset of
# Grafana's dashboard model: the keys the import and the panels need).
DATASOURCE = {"type": "object", "required": {"type": str, "uid": str}}
TARGET = {"type": "object", "required": {"refId": str, "expr": str, "datasource": DATASOURCE}}
PANEL = {"type": "object", "required": {
    "id": int, "type": str, "title": str,
    "gridPos": {"type": "object", "required": {"x": int, "y": int, "w": int, "h": int}}}}
SCHEMA = {"type": "object", "required": {
    "title": str, "uid": str, "schemaVersion": int, "time": dict,
    "templating": {"type": "object", "required": {"list": list}},
    "panels": {"type": "array", "items": PANEL}}}
PANEL_TYPES = {"row", "stat", "timeseries", "bargauge", "table", "gauge", "heatmap"}


def validate(doc: Any, schema: Any, path: str = "$") -> list[str]:
    """Errors of `doc` against the small schema language above."""
    if isinstance(schema, type):
        return [] if isinstance(doc, schema) and not isinstance(doc, bool) else [
            f"{path}: expected {schema.__name__}, got {type(doc).__name__}"]
    if schema["type"] == "object":
        if not isinstance(doc, Mapping):
            return [f"{path}: expected an object"]
        errs = []
        for key, sub in schema["required"].items():
            if key not in doc:
                errs.append(f"{path}.{key}: missing")
            else:
                errs += validate(doc[key], sub, f"{path}.{key}")
        return errs
    if not isinstance(doc, list):
        return [f"{path}: expected an array"]
    return [e for k, item in enumerate(doc) for e in validate(item, schema["items"],
                                                              f"{path}[{k}]")]


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def exposition() -> str:
    from slurmpod.report.build import build_job_report
    from slurmpod.report.sacct import SacctJob

    r = job_report()  # a job report: GPU telemetry and energy included
    sj = sacct_job()
    rows = [build_job_report(SacctJob(replace(sj.record, job_id=str(200 + k),
                                              partition=p), sj.attempts),
                             spool_record=record(), with_series=False, with_notes=False)
            for k, p in enumerate(("batch", "long", "batch"))]
    fleet = build_fleet(rows, window="7d")
    return job_exposition([r]) + fleet_exposition(fleet)


def families(text: str) -> dict[str, set[str]]:
    """metric name -> label names seen on its samples."""
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? ", line)
        assert m, line
        labels = set(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="', m.group(3) or ""))
        out.setdefault(m.group(1), set()).update(labels)
    return out


def targets(dash: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]


SELECTOR = re.compile(r"\b(slurmpod_[a-zA-Z0-9_]+)\s*(\{([^}]*)\})?")


def test_every_queried_metric_and_label_is_exported(dashboard: dict, exposition: str) -> None:
    fams = families(exposition)
    used = set()
    for title, expr in targets(dashboard):
        for m in SELECTOR.finditer(expr):
            name = m.group(1)
            used.add(name)
            assert name in fams, f"{title}: {name} is not in the exposition"
            for label in re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*=~?", m.group(3) or ""):
                assert label in fams[name], f"{title}: {name} has no label {label}"
        for label in re.findall(r"by \(([^)]*)\)", expr):
            for lab in (s.strip() for s in label.split(",")):
                assert any(lab in fams[n] for n in used), f"{title}: by ({lab})"
    # The dashboard shows the figures the issue asks for: MFU, goodput, GPU telemetry, energy,
    # and per user, account and partition.
    for name in ("slurmpod_fleet_mfu_ratio", "slurmpod_job_goodput_ratio",
                 "slurmpod_job_gpu_utilization_ratio", "slurmpod_job_gpu_power_watts",
                 "slurmpod_job_energy_per_token_joules", "slurmpod_user_mfu_ratio",
                 "slurmpod_account_allocated_gpu_seconds", "slurmpod_partition_mfu_ratio"):
        assert name in used, name


def test_template_variables_come_from_exported_labels(dashboard: dict, exposition: str) -> None:
    fams = families(exposition)
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    for title, expr in targets(dashboard):
        for var in re.findall(r"\$\{?([a-zA-Z_]+)", expr):
            assert var in defined, f"{title}: ${var} is not a dashboard variable"
    for v in dashboard["templating"]["list"]:
        if v["type"] != "query":
            continue
        m = re.match(r"label_values\((\w+)(\{.*\})?,\s*(\w+)\)$", v["query"]["query"])
        assert m, v["query"]
        assert m.group(3) in fams[m.group(1)], v["name"]


def test_dashboard_structure(dashboard: dict) -> None:
    assert validate(dashboard, SCHEMA) == []
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    boxes = []
    for p in dashboard["panels"]:
        assert p["type"] in PANEL_TYPES, p["type"]
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        for (x, y, w, h), t in boxes:
            assert (g["x"] >= x + w or x >= g["x"] + g["w"] or g["y"] >= y + h
                    or y >= g["y"] + g["h"]), f"{p['title']} overlaps {t}"
        boxes.append(((g["x"], g["y"], g["w"], g["h"]), p["title"]))
        if p["type"] == "row":
            continue
        assert validate(p["datasource"], DATASOURCE) == [] and p["datasource"]["uid"] == (
            "${datasource}")
        assert p["targets"], p["title"]
        assert validate(p["targets"], {"type": "array", "items": TARGET}) == [], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
    ds = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert ds and ds[0]["name"] == "datasource" and ds[0]["query"] == "prometheus"


def test_a_broken_dashboard_is_caught() -> None:
    """The checks above can fail: a misspelt metric, a missing refId, a panel past column 24."""
    bad = {"title": "x", "uid": "x", "schemaVersion": 39, "time": {}, "templating": {"list": []},
           "panels": [{"id": 1, "type": "stat", "title": "t",
                       "gridPos": {"x": 20, "y": 0, "w": 6, "h": 4},
                       "targets": [{"expr": "slurmpod_job_mfu_ration", "datasource": {}}]}]}
    assert validate(bad, SCHEMA) == []
    errs = validate(bad["panels"][0]["targets"], {"type": "array", "items": TARGET})
    assert "$[0].refId: missing" in errs and "$[0].datasource.type: missing" in errs
    assert validate({"panels": "no"}, SCHEMA)[0] == "$.title: missing"


def test_exposition_passes_promtool(exposition: str) -> None:
    fams = families(exposition)
    assert "slurmpod_job_gpu_utilization_ratio" in fams and "slurmpod_partition_jobs" in fams
    promtool_check(exposition)
