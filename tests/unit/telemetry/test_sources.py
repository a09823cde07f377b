"""GPU telemetry parsers on recorded tool outputs (tests/data/telemetry, written from the
documented formats of dcgmi, nvidia-smi, the kernel's NVRM lines, sacct and Prometheus)."""

from __future__ import annotations

import json

import pytest

from slurmpod.telemetry import dcgm, nvidia_smi, prometheus, slurm_tres
from slurmpod.telemetry.schema import clean_gpu_summary
from tests.helpers import DATA_DIR

DATA = DATA_DIR / "telemetry"


def text(name: str) -> str:
    return (DATA / name).read_text()


def test_dcgmi_verbose_per_gpu() -> None:
    gpus = dcgm.parse_job_stats(text("dcgmi-stats-verbose.txt"), "gpu001")
    assert [g.index for g in gpus] == [0, 1]
    g0, g1 = gpus
    assert g0.node == "gpu001" and g0.util == 91 and g0.mem_util == 43
    assert g0.energy_j == 1843200 and g0.power_w == 512 and g0.power_max_w == 688.1
    assert g0.mem_gib == pytest.approx(76468715520 / 2**30)
    assert g0.sm_mhz == 1980 and g0.mem_mhz == 2619 and g0.span_s == 3600.12
    assert g0.xid == 0 and g1.xid == 2 and g1.util == 0


def test_dcgmi_summary_box_and_errors() -> None:
    [s] = dcgm.parse_job_stats(text("dcgmi-stats-summary.txt"))
    assert s.index is None and s.util == 88 and s.energy_j == 7200000
    assert dcgm.parse_job_stats(text("dcgmi-stats-notfound.txt")) == []


def test_dcgm_job_stats_needs_every_node() -> None:
    out = text("dcgmi-stats-verbose.txt")

    def run(argv: list[str], timeout_s: float) -> tuple[int, str, str]:
        assert argv[:3] == ["dcgmi", "stats", "--host"] and argv[-3:] == ["-j", "4242", "-v"]
        return (0, out, "") if argv[3] == "gpu001" else (255, "", "Error: connection refused")

    assert dcgm.job_stats(run, "4242", ["gpu001", "gpu002"]) is None
    tel = dcgm.job_stats(run, "4242", ["gpu001"])
    assert tel is not None
    summary = tel.summary(model="h100", max_gpus=2)
    assert summary is not None
    assert summary["src"] == "dcgm" and summary["trust"] == "site" and summary["n"] == 2
    assert summary["util"] == 45.5 and summary["util_min"] == 0 and summary["idle_gpus"] == 1
    assert summary["energy_j"] == 1843200 + 262800 and summary["xid"] == 2


def test_nvidia_smi_query_with_energy() -> None:
    fields = (*nvidia_smi.QUERY_FIELDS, nvidia_smi.ENERGY_FIELD)
    got = nvidia_smi.parse_query(text("nvidia-smi-query-energy.csv"), fields)
    assert [s.index for s in got] == [0, 1, 2, 3]
    s0, s3 = got[0], got[3]
    assert s0.util == 98 and s0.mem_gib == pytest.approx(72123 / 1024)
    assert s0.power_w == 689.42 and s0.energy_mj == 912345678 and s0.uuid.startswith("GPU-")
    assert s3.util is None and s3.mem_util is None and s3.power_w is None  # [N/A] not 0
    assert s3.energy_mj is None and s3.temp_c == 30


def test_nvidia_smi_falls_back_when_energy_field_is_rejected() -> None:
    calls: list[list[str]] = []

    def run(argv: list[str], timeout_s: float) -> tuple[int, str, str]:
        calls.append(argv)
        if nvidia_smi.ENERGY_FIELD in argv[1]:
            return 2, text("nvidia-smi-invalid-field.txt"), ""
        return 0, text("nvidia-smi-query-base.csv"), ""

    got, energy = nvidia_smi.query(run, [0, 1])
    assert len(calls) == 2 and not energy and "--id=0,1" in calls[1]
    assert [s.power_w for s in got] == [701.2, 698.0]


def test_nvidia_smi_missing_or_hanging_tool_is_not_measured() -> None:
    def missing(argv: list[str], timeout_s: float) -> tuple[int, str, str]:
        raise FileNotFoundError(argv[0])

    assert nvidia_smi.query(missing)[0] == []
    assert nvidia_smi.query(lambda a, t: (124, "", "timed out"))[0] == []


def test_nvidia_smi_drops_bad_lines() -> None:
    bad = "\n".join([
        "0, GPU-8f6c1d2a-5b3e-4c71-9a0e-2d4b6f8e1a10, 101, 45, 1, 81559, 600, 70, 1980, 2619",
        "1, GPU-8f6c1d2a-5b3e-4c71-9a0e-2d4b6f8e1a10, 50, 45, 1, 81559, 99999, 70, 1980, 2619",
        "2, GPU-8f6c1d2a-5b3e-4c71-9a0e-2d4b6f8e1a10, nan, 45, 1, 81559, 600, 70, 1980, 2619",
        "3, GPU-8f6c1d2a-5b3e-4c71-9a0e-2d4b6f8e1a10, 50, 45, 90000, 81559, 600, 70, 1980, 2619",
        "4, x, 50, 45, 1, 81559, 600, 70, 1980",
        "-5, x, 50, 45, 1, 81559, 600, 70, 1980, 2619",
    ])
    assert nvidia_smi.parse_query(bad) == []


def test_xid_lines() -> None:
    ev = nvidia_smi.parse_xid_lines(text("dmesg-xid.txt"))
    assert [(e.pci, e.code) for e in ev] == [("0000:3b:00", 79), ("0000:86:00", 48),
                                             ("0000:86:00", 63)]  # SXid (NVSwitch) is not one
    assert nvidia_smi.pci_of_bus_id("00000000:3B:00.0") == "0000:3b:00"


def test_sacct_tres_gpu_and_without() -> None:
    tel = slurm_tres.parse_steps(text("sacct-tres-gpu.txt"))
    assert tel is not None
    [g] = tel.gpus
    assert g.util == 88  # the srun step's, not diluted by the batch step's 0 %
    assert g.mem_gib == 75 and tel.span_s == 3600
    assert slurm_tres.parse_steps(text("sacct-tres-nogpu.txt")) is None
    assert slurm_tres.size_bytes("1.5G") == 1.5 * 2**30 and slurm_tres.size_bytes("x") is None


def _prom_answers(job: str) -> dict[str, str]:
    g = [{"gpu": str(i), "UUID": f"GPU-{i}", "Hostname": "gpu001", "hpc_job": job}
         for i in range(2)]
    return {
        "DCGM_FI_DEV_GPU_UTIL": prometheus.answer([(g[0], 95.0), (g[1], 2.0)]),
        "DCGM_FI_PROF_SM_ACTIVE": prometheus.answer([(g[0], 0.61), (g[1], 0.01)]),
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": prometheus.answer([(g[0], 0.33), (g[1], 0.0)]),
        "DCGM_FI_DEV_FB_USED": prometheus.answer([(g[0], 71000.0), (g[1], 500.0)]),
        "DCGM_FI_DEV_POWER_USAGE": prometheus.answer([(g[0], 650.0), (g[1], 5000.0)]),
        "max_over_time(DCGM_FI_DEV_TOTAL_ENERGY": prometheus.answer([(g[0], 3.6e9),
                                                                     (g[1], 1.0e9)]),
        "min_over_time(DCGM_FI_DEV_TOTAL_ENERGY": prometheus.answer([(g[0], 1.0e9),
                                                                     (g[1], 0.8e9)]),
        "DCGM_FI_DEV_XID_ERRORS": prometheus.answer([(g[0], 0.0), (g[1], 79.0)]),
    }


def test_prometheus_by_job_label() -> None:
    answers = _prom_answers("777")
    urls: list[str] = []

    def fetch(url: str, timeout_s: float) -> bytes:
        from urllib.parse import parse_qs, urlparse

        urls.append(url)
        q = parse_qs(urlparse(url).query)["query"][0]
        assert 'hpc_job="777"' in q and "[3600s]" in q
        for key, body in answers.items():
            if key in q:
                return body.encode()
        return prometheus.answer([]).encode()

    tel = prometheus.job_telemetry("http://prom:9090", "777", 1000, 4600, fetch=fetch)
    assert tel is not None and urls[0].startswith("http://prom:9090/api/v1/query?")
    g0, g1 = sorted(tel.gpus, key=lambda g: g.index or 0)
    assert g0.util == 95 and g0.sm == 61 and g0.tensor == 33
    assert g0.mem_gib == pytest.approx(71000 / 1024) and g0.energy_j == pytest.approx(2.6e6)
    assert g1.power_w is None  # 5000 W is no GPU's reading: dropped, not clamped
    assert g1.xid == 1 and g1.xid_codes == (79,)
    summary = tel.summary(model="h100", max_gpus=2)
    assert summary is not None and summary["xid_codes"] == "79" and summary["tensor"] == 16.5


def test_prometheus_down_or_garbage_is_not_measured() -> None:
    def down(url: str, timeout_s: float) -> bytes:
        raise OSError("connection refused")

    assert prometheus.job_telemetry("http://p:9090", "1", 0, 60, fetch=down) is None
    assert prometheus.job_telemetry("http://p:9090", "1", 0, 60,
                                    fetch=lambda u, t: b"<html>502</html>") is None
    assert prometheus.parse_vector('{"status":"error","error":"bad"}') == []
    with pytest.raises(ValueError):
        prometheus.promql("avg", "X", '1"}or vector(1)#', 60)


def test_summary_range_checks_drop_not_clamp() -> None:
    doc = {"v": 1, "src": "nvidia-smi", "trust": "job", "n": 8, "span_s": 100.0,
           "util": 140, "power_w": 900.0, "mem_gib": 200.0, "energy_j": 1e12, "temp_max_c": 70,
           "xid_codes": "79;rm -rf"}
    out = clean_gpu_summary(doc, model="h100", max_gpus=8)
    assert out == {"v": 1, "src": "nvidia-smi", "trust": "job", "n": 8, "span_s": 100.0,
                   "temp_max_c": 70}
    assert clean_gpu_summary({"v": 1, "n": 9, "util": 50}, max_gpus=8) == {"v": 1, "util": 50}
    assert clean_gpu_summary({"v": 2, "util": 50}) is None
    assert clean_gpu_summary(json.loads('{"v":1,"util":NaN}')) is None
