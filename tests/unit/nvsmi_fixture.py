"""`nvidia-smi -q` output of a GB200 compute tray, written from the documented layout (driver
R570: two-space-free key column padded to 42, nested sections indented by 4), with the Fabric
section that `slurmpod topo check --nvlink` reads. Only the fields around Fabric are shown in
full; the rest is the usual shape so the parser has to skip it."""

from __future__ import annotations

import uuid

BUS_IDS = ("00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0")


def _kv(indent: int, key: str, value: str) -> str:
    return f"{' ' * indent}{key:<{42 - indent}}: {value}"


def gpu_block(bus_id: str, minor: int, *, state: str = "Completed", status: str = "Success",
              clique: int = 32766, cluster: str = "", bandwidth: str = "Full") -> list[str]:
    lines = [
        f"GPU {bus_id}",
        _kv(4, "Product Name", "NVIDIA GB200"),
        _kv(4, "Product Brand", "NVIDIA"),
        _kv(4, "Product Architecture", "Blackwell"),
        _kv(4, "Persistence Mode", "Enabled"),
        _kv(4, "Addressing Mode", "ATS"),
        _kv(4, "MIG Mode", ""),
        _kv(8, "Current", "Disabled"),
        _kv(8, "Pending", "Disabled"),
        _kv(4, "Serial Number", f"16524240{minor:05d}"),
        _kv(4, "GPU UUID", f"GPU-{uuid.UUID(int=minor + 7).hex[:8]}-0000-0000-0000-000000000000"),
        _kv(4, "Minor Number", str(minor)),
        _kv(4, "MultiGPU Board", "No"),
        _kv(4, "Module ID", str(minor + 1)),
        "    Platform Info",
        _kv(8, "Chassis Serial Number", "1821224000123"),
        _kv(8, "Slot Number", "7"),
        _kv(8, "Tray Index", "6"),
        _kv(8, "Host ID", "1"),
        _kv(8, "Peer Type", "Switch Connected"),
        _kv(8, "Module Id", str(minor + 1)),
        "    PCI",
        _kv(8, "Bus", "0x01"),
        _kv(8, "Device", "0x00"),
        _kv(8, "Domain", f"0x{bus_id[4:8]}"),
        _kv(8, "Bus Id", bus_id),
        "    Fabric",
        _kv(8, "State", state),
        _kv(8, "Status", status),
    ]
    if state != "Not Supported":
        lines += [_kv(8, "CliqueId", str(clique)), _kv(8, "ClusterUUID", cluster or "N/A")]
    lines += [
        "        Health",
        _kv(12, "Bandwidth", bandwidth),
        _kv(12, "Route Recovery in progress", "False"),
        _kv(12, "Route Unhealthy", "False"),
        _kv(12, "Access Timeout Recovery", "False"),
        "    Processes                             : None",
    ]
    return lines


def node_output(cluster: str, *, gpus: int = 4, overrides: dict[int, dict] | None = None) -> str:
    """One tray's `nvidia-smi -q`; `overrides[i]` changes GPU i's Fabric fields."""
    lines = [
        "",
        "==============NVSMI LOG==============",
        "",
        _kv(0, "Timestamp", "Tue Mar  4 10:12:01 2025"),
        _kv(0, "Driver Version", "570.124.06"),
        _kv(0, "CUDA Version", "12.8"),
        "",
        _kv(0, "Attached GPUs", str(gpus)),
    ]
    for i in range(gpus):
        kw = {"cluster": cluster, **(overrides or {}).get(i, {})}
        lines += gpu_block(BUS_IDS[i], i, **kw)
        lines.append("")
    return "\n".join(lines) + "\n"


def rack_uuid(rack: int) -> str:
    return str(uuid.UUID(int=0x5F0C2E4C_7B1D_4C0E_9A55_3E9D2F410000 + rack))
