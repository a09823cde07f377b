"""`nvidia-smi --query-gpu` samples and the kernel's `NVRM: Xid` lines.

Query (`QUERY_FIELDS`, `--format=csv,noheader,nounits`): one line per GPU, fields in the order
asked, `, `-separated; memory in MiB, power in W, clocks in MHz, temperature in °C. A field the
GPU or driver cannot give prints `[N/A]` or `[Not Supported]` (older drivers: `N/A`).
`total_energy_consumption` (mJ since the driver loaded, NVML's nvmlDeviceGetTotalEnergyConsumption)
is a query field only on some drivers; others reject the whole query with `Field
"total_energy_consumption" is not a valid field to query.`, so `query()` asks once with it and
falls back to the base fields, and energy is then integrated from power samples.

Every value is range-checked here; a line that does not parse completely is dropped, so garbage
gives "not measured", never a number.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from slurmpod.telemetry.schema import HBM_UNKNOWN_GIB, POWER_LIMIT_UNKNOWN_W, POWER_SLACK

QUERY_FIELDS = ("index", "uuid", "utilization.gpu", "utilization.memory", "memory.used",
                "memory.total", "power.draw", "temperature.gpu", "clocks.sm", "clocks.mem")
ENERGY_FIELD = "total_energy_consumption"
NOT_VALID = "is not a valid field to query"
_NA = {"[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]", "[gpu is lost]",
       "[insufficient permissions]", ""}
_UUID = re.compile(r"^GPU-[0-9a-fA-F-]{8,64}$")
MIB = 1 << 20


@dataclass(frozen=True)
class Sample:
    """One GPU at one moment."""

    index: int
    uuid: str | None
    util: float | None
    mem_util: float | None
    mem_gib: float | None
    mem_total_gib: float | None
    power_w: float | None
    temp_c: float | None
    sm_mhz: float | None
    mem_mhz: float | None
    energy_mj: float | None = None


def _num(text: str, lo: float, hi: float) -> float | None:
    t = text.strip()
    if t.lower() in _NA:
        return None
    try:
        v = float(t)
    except ValueError:
        raise ValueError(t) from None
    if not (lo <= v <= hi):  # also rejects nan
        raise ValueError(t)
    return v


def parse_query(text: str, fields: Sequence[str] = QUERY_FIELDS) -> list[Sample]:
    """The samples of a `--query-gpu=<fields> --format=csv,noheader,nounits` output.

    `fields` must start with index and uuid (QUERY_FIELDS, optionally + ENERGY_FIELD). A line
    with another field count, an unparsable or out-of-range value is dropped whole; a
    duplicated GPU index keeps its first line."""
    out: list[Sample] = []
    seen: set[int] = set()
    has_energy = ENERGY_FIELD in fields
    p_hi = POWER_LIMIT_UNKNOWN_W * POWER_SLACK
    for line in text.splitlines():
        parts = line.split(",")
        if len(parts) != len(fields):
            continue
        v = dict(zip(fields, (p.strip() for p in parts), strict=True))
        try:
            idx_s = v["index"]
            if not idx_s.isdigit() or len(idx_s) > 4:
                continue
            uuid = v["uuid"] if _UUID.match(v["uuid"]) else None
            mem = _num(v["memory.used"], 0, HBM_UNKNOWN_GIB * 1024)
            total = _num(v["memory.total"], 0, HBM_UNKNOWN_GIB * 1024)
            s = Sample(
                index=int(idx_s), uuid=uuid,
                util=_num(v["utilization.gpu"], 0, 100),
                mem_util=_num(v["utilization.memory"], 0, 100),
                mem_gib=None if mem is None else mem / 1024,
                mem_total_gib=None if total is None else total / 1024,
                power_w=_num(v["power.draw"], 0, p_hi),
                temp_c=_num(v["temperature.gpu"], 0, 130),
                sm_mhz=_num(v["clocks.sm"], 0, 10000),
                mem_mhz=_num(v["clocks.mem"], 0, 20000),
                energy_mj=_num(v[ENERGY_FIELD], 0, 1e18) if has_energy else None,
            )
        except ValueError:
            continue
        if s.mem_gib is not None and s.mem_total_gib is not None \
                and s.mem_gib > s.mem_total_gib * 1.01:
            continue
        if s.index in seen:
            continue
        seen.add(s.index)
        out.append(s)
    return out


Run = Callable[[list[str], float], tuple[int, str, str]]


def query(run: Run, ids: Sequence[int] | None = None, *, timeout_s: float = 10.0,
          with_energy: bool = True, exe: str = "nvidia-smi") -> tuple[list[Sample], bool]:
    """Sample the GPUs (`ids`: only these indices). Returns (samples, energy field accepted).
    A missing tool, a timeout or a failure gives ([], …): "not measured"."""
    fields = QUERY_FIELDS + ((ENERGY_FIELD,) if with_energy else ())
    argv = [exe, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"]
    if ids:
        argv.append("--id=" + ",".join(str(i) for i in ids))
    try:
        rc, out, err = run(argv, timeout_s)
    except OSError:
        return [], with_energy
    if rc != 0 and with_energy and NOT_VALID in f"{out}\n{err}":
        return query(run, ids, timeout_s=timeout_s, with_energy=False, exe=exe)
    if rc != 0:
        return [], with_energy
    return parse_query(out, fields), with_energy


# Linux kernel log, NVIDIA driver: `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python,
# GPU has fallen off the bus.` (older drivers: `NVRM: Xid (0000:3b:00): 13, …`).
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})"
                  r"(?:\.[0-9a-fA-F])?\): (\d{1,4})\b")


@dataclass(frozen=True)
class XidEvent:
    pci: str  # domain:bus:device, lower case
    code: int


def parse_xid_lines(text: str) -> list[XidEvent]:
    """XID events in kernel log text (`dmesg`, `journalctl -k`); other lines are ignored."""
    return [XidEvent(m.group(1).lower(), int(m.group(2))) for m in _XID.finditer(text)]


def pci_of_bus_id(bus_id: str) -> str:
    """nvidia-smi's `pci.bus_id` (00000000:3B:00.0) -> the kernel log's form (0000:3b:00)."""
    b = bus_id.strip().lower()
    dom, _, rest = b.partition(":")
    return f"{dom[-4:]}:{rest.split('.')[0]}"
