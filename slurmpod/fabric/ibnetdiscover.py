"""Parse `ibnetdiscover` topology output into switches, channel adapters and their port links.

The format is the one infiniband-diags (rdma-core) prints by default: a block per node, made of
`vendid=`/`devid=`/`sysimgguid=`/`switchguid=`/`caguid=` lines, a node line

    Switch  64 "S-b8cef60300a1b2c0"   # "MF0;su1-r0-leaf:MQM9700/U1" enhanced port 0 lid 3 lmc 0
    Ca      1 "H-0c42a10300f1e2d4"    # "dgx0001 mlx5_0"

and one line per *connected* port (a port whose link is down is simply not printed):

    [1]     "H-0c42a10300f1e2d4"[1](c42a10300f1e2d4)     # "dgx0001 mlx5_0" lid 12 4xNDR
    [1](c42a10300f1e2d4)  "S-b8cef60300a1b2c0"[1]  # lid 12 lmc 0 "MF0;su1-r0-leaf:..." lid 3 4xNDR

Real files vary: descriptions may be missing or empty, long lines get wrapped by whatever saved
them, `-g` adds `[ext N]` port labels, routers print `Rt`, and newer releases may add node types
this parser does not know. All of that is accepted; a line that is none of the above is an error
naming `file:line`. Pure: text in, `Fabric` out (`parse_file` is the one reader).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from slurmpod.errors import ConfigError

NodeKind = Literal["switch", "ca", "router", "unknown"]

_KINDS: dict[str, NodeKind] = {"switch": "switch", "ca": "ca", "rt": "router", "router": "router"}

# Per-lane signalling rate in Gb/s as ibnetdiscover names it (IBTA: FDR is 14.0625, rounded to
# the nominal 56 Gb/s of a 4x link; FDR10 is a Mellanox 10 Gb/s lane).
LANE_GBPS: dict[str, float] = {
    "SDR": 2.5, "DDR": 5.0, "QDR": 10.0, "FDR10": 10.0, "FDR": 14.0, "EDR": 25.0,
    "HDR": 50.0, "NDR": 100.0, "XDR": 200.0,
}


def link_gbps(width: str | None, speed: str | None) -> float | None:
    """`4x` + `NDR` -> 400.0; None when either part is missing or unknown."""
    if not width or not speed:
        return None
    lane = LANE_GBPS.get(speed.upper())
    try:
        lanes = int(width.rstrip("xX"))
    except ValueError:
        return None
    return None if lane is None else lanes * lane


def speed_name(gbps: float) -> str:
    """400 -> `4xNDR`: the 4-lane name of a link rate (what a healthy link reports)."""
    for name, lane in sorted(LANE_GBPS.items(), key=lambda kv: -kv[1]):
        if name != "FDR10" and abs(lane * 4 - gbps) < 0.5:
            return f"4x{name}"
    return f"{gbps:g}G"


@dataclass(slots=True)
class Port:
    """One connected port as seen from its own node.

    The comment after the link (`# "desc" lid 12 4xNDR`) is kept raw and read on demand: every
    link is printed from both ends and a check reads one end, so parsing it eagerly would
    double the cost of the biggest part of a large file.
    """

    num: int
    remote_id: str
    remote_port: int
    tail: str | None
    line: int

    def _tail(self) -> tuple[str | None, int | None, str | None, str | None]:
        if not self.tail:
            return None, None, None, None
        t = _PORT_TAIL.match(self.tail)
        if t is None:  # cannot happen: every part of the pattern is optional
            return None, None, None, None
        _own_lid, desc, rlid, width, speed = t.groups()
        return desc, int(rlid) if rlid else None, f"{width}x" if width else None, speed

    @property
    def remote_desc(self) -> str | None:
        return self._tail()[0]

    @property
    def remote_lid(self) -> int | None:
        return self._tail()[1]

    @property
    def width(self) -> str | None:
        return self._tail()[2]

    @property
    def speed(self) -> str | None:
        return self._tail()[3]

    @property
    def gbps(self) -> float | None:
        _, _, width, speed = self._tail()
        return link_gbps(width, speed)

    @property
    def rate(self) -> str:
        _, _, width, speed = self._tail()
        return f"{width or '?'}{speed or '?'}"


# Node descriptions a CA reports when nobody set one (the driver default), and the SHARP
# aggregation node that Quantum switches expose as a CA: neither names a host.
_DEFAULT_DESC = re.compile(r"Mellanox Technologies|ConnectX|^MT\d+\b|Aggregation Node", re.I)
_SWITCH_NAME = re.compile(r"^[^;:]*;([^;:]+):")


@dataclass(slots=True)
class FabricNode:
    node_id: str
    kind: NodeKind
    type_word: str
    nports: int
    desc: str
    lid: int | None
    line: int
    ids: dict[str, str] = field(default_factory=dict)
    ports: dict[int, Port] = field(default_factory=dict)

    @property
    def guid(self) -> str:
        for key in ("switchguid", "caguid", "rtguid"):
            if key in self.ids:
                return self.ids[key].split("(")[0].removeprefix("0x").zfill(16)
        return self.node_id.split("-", 1)[-1]

    @property
    def name(self) -> str:
        """A switch's host name (`MF0;NAME:MODEL/U1` -> NAME) or the raw description."""
        m = _SWITCH_NAME.match(self.desc)
        return m.group(1) if m else self.desc

    @property
    def is_aggregation_node(self) -> bool:
        return "aggregation node" in self.desc.lower()

    @property
    def host(self) -> str | None:
        """For a CA described `HOST DEVICE`: HOST; None when the description names no host."""
        if not self.desc or _DEFAULT_DESC.search(self.desc):
            return None
        return self.desc.split()[0]

    @property
    def device(self) -> str | None:
        """For a CA described `HOST DEVICE`: DEVICE (e.g. `mlx5_3`)."""
        if self.host is None:
            return None
        parts = self.desc.split()
        return parts[1] if len(parts) > 1 else None


@dataclass
class Fabric:
    nodes: dict[str, FabricNode]
    source: str

    def switches(self) -> Iterator[FabricNode]:
        return (n for n in self.nodes.values() if n.kind == "switch")

    def cas(self) -> Iterator[FabricNode]:
        return (n for n in self.nodes.values() if n.kind == "ca")

    def peer(self, port: Port) -> FabricNode | None:
        return self.nodes.get(port.remote_id)


_NODE = re.compile(
    r'([A-Za-z?]+)\s+(\d+)\s+(?:"([^"]+)"|([A-Za-z?]-[0-9a-fA-F]+))'  # type, ports, id
    r'(?:\s*\([^)]*\))?\s*(?:#\s*(.*))?$'                 # optional "(scp)", comment
)
_PORT = re.compile(
    r'\[(\d+)\](?:\[ext \d+\])?(?:\(([0-9a-fA-F]+)\))?\s*'         # local port, ext, port guid
    r'"([^"]+)"\[(\d+)\](?:\[ext \d+\])?\s*(?:\(([0-9a-fA-F]+)\))?'  # remote id and port
    r'\s*(?:\(scp\))?\s*(?:#\s*(.*))?$'
)
_PORT_TAIL = re.compile(
    r'(?:lid (\d+) lmc \d+\s*)?(?:"((?:[^"\\]|\\.)*)")?\s*'   # CA side: own lid; remote desc
    r'(?:lid (\d+))?\s*(?:(\d+)x([A-Za-z0-9?]+))?'                 # remote lid, width x speed
)
_NODE_TAIL = re.compile(r'(?:"((?:[^"\\]|\\.)*)")?(.*)$')
_LID = re.compile(r"\blid (\d+)")


def parse_file(path: Path | str) -> Fabric:
    """Read and parse an ibnetdiscover output file (ConfigError naming the file on failure)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError("file not found", file=str(path),
                          hint="save it with `ibnetdiscover > FILE` on a fabric host") from None
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", file=str(path)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError("not text (binary data?); expected ibnetdiscover output",
                          file=str(path)) from None
    return parse(text, str(path))


def _is_continuation(pending: str, raw: str, stripped: str) -> bool:
    """Does `stripped` continue the logical line `pending` (a line wrapped by an editor/pager)?"""
    if pending.count('"') & 1:
        return True  # inside a quoted description
    if stripped[0] == "#":
        starts_entry = pending[0] == "[" or pending[0].isupper()
        return raw[0] in " \t" and "#" not in pending and starts_entry
    if stripped[0] == '"':
        return pending[0] == "[" and '"' not in pending
    if stripped.startswith(("lid ", "enhanced", "base ")):
        return "#" in pending
    return False


def parse(text: str, source: str = "<ibnetdiscover>") -> Fabric:
    """Parse ibnetdiscover output. Raises ConfigError(`source:line`) on lines it cannot read."""
    nodes: dict[str, FabricNode] = {}
    ids: dict[str, str] = {}
    current: list[FabricNode | None] = [None]

    def handle(lineno: int, s: str) -> None:
        c = s[0]
        if c == "#" or s.startswith(("ibwarn", "ibdebug")):
            return  # comments; stderr diagnostics saved with `2>&1`
        if c == "[":
            node = current[0]
            if node is None:
                raise ConfigError("port line before any Switch/Ca line; is the file cut at the "
                                  "top?", file=f"{source}:{lineno}")
            m = _PORT.match(s)
            if m is None:
                raise ConfigError(f"cannot parse port line {_snip(s)}; expected "
                                  '[N] "S-<guid>"[M] # "description" lid L 4xNDR',
                                  file=f"{source}:{lineno}")
            num, _lguid, rid, rport, _rguid, tail = m.groups()
            node.ports[int(num)] = Port(int(num), rid, int(rport), tail, lineno)
            return
        if "=" in s:
            key, _, val = s.partition("=")
            if key.isidentifier() and val and " " not in val:
                key = key.lower()
                if key == "vendid":
                    ids.clear()
                ids[key] = val
                return
        m = _NODE.match(s)
        if m is None:
            raise ConfigError(f"cannot parse {_snip(s)}; expected a node line (Switch/Ca N "
                              '"<id>" # "description"), a port line ([N] "<id>"[M] ...) or '
                              "key=value; is this ibnetdiscover output?",
                              file=f"{source}:{lineno}")
        word, nports, qid, uid, tail = m.groups()
        node_id = qid or uid
        kind = _KINDS.get(word.lower(), "unknown")
        desc, lid = "", None
        if tail:
            t = _NODE_TAIL.match(tail)
            if t:
                desc = t.group(1) or ""
                lm = _LID.search(t.group(2) or "")
                lid = int(lm.group(1)) if lm else None
        old = nodes.get(node_id)
        if old is not None:
            if old.kind != kind:
                raise ConfigError(f"node {node_id} is listed as {old.type_word} at line "
                                  f"{old.line} and as {word} here; one of the two is wrong",
                                  file=f"{source}:{lineno}")
            current[0] = old  # a repeated block (concatenated outputs): merge its ports
            return
        node = FabricNode(node_id, kind, word, int(nports), desc, lid, lineno, dict(ids))
        nodes[node_id] = node
        current[0] = node
        ids.clear()

    pending: str | None = None
    pending_no = 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        s = raw.strip()
        if not s:
            if pending is not None:
                handle(pending_no, pending)
                pending = None
            continue
        if pending is not None:
            if _is_continuation(pending, raw, s):
                pending = f"{pending} {s}"
                continue
            handle(pending_no, pending)
        pending, pending_no = s, lineno
    if pending is not None:
        handle(pending_no, pending)
    if not nodes:
        raise ConfigError("no Switch or Ca lines found; expected the output of `ibnetdiscover`",
                          file=source)
    return Fabric(nodes, source)


def _snip(s: str, n: int = 60) -> str:
    return repr(s if len(s) <= n else s[: n - 3] + "...")
