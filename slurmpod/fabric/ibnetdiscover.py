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

import gc
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, NamedTuple

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


class Port(NamedTuple):
    """One connected port as seen from its own node.

    The comment after the link (`# "desc" lid 12 4xNDR`) is kept raw and read on demand: every
    link is printed from both ends and a check reads one end, so parsing it eagerly would
    double the cost of the biggest part of a large file. A NamedTuple: a 100k-GPU fabric has
    600k of them.
    """

    num: int
    remote_id: str
    remote_port: int
    tail: str | None
    line: int

    def _tail(self) -> tuple[str | None, int | None]:
        t = _PORT_TAIL.match(self.tail) if self.tail else None
        if t is None:
            return None, None
        _own_lid, desc, rlid, _width, _speed = t.groups()
        return desc, int(rlid) if rlid else None

    @property
    def remote_desc(self) -> str | None:
        return self._tail()[0]

    @property
    def remote_lid(self) -> int | None:
        return self._tail()[1]

    def _rate(self) -> tuple[str | None, str | None, float | None]:
        # The rate is the comment's last token (`4xNDR`); a check reads it for every link, so
        # it is looked up in a cache rather than matched again.
        if not self.tail:
            return _NO_RATE
        token = self.tail.rsplit(None, 1)[-1]
        got = _RATE_CACHE.get(token)
        if got is None:
            m = _RATE.fullmatch(token)
            got = (f"{m.group(1)}x", m.group(2), link_gbps(f"{m.group(1)}x", m.group(2))) \
                if m else _NO_RATE
            if len(_RATE_CACHE) < 1024:
                _RATE_CACHE[token] = got
        return got

    @property
    def width(self) -> str | None:
        return self._rate()[0]

    @property
    def speed(self) -> str | None:
        return self._rate()[1]

    @property
    def gbps(self) -> float | None:
        return self._rate()[2]

    @property
    def rate(self) -> str:
        width, speed, _ = self._rate()
        return f"{width or '?'}{speed or '?'}"


_NO_RATE: tuple[None, None, None] = (None, None, None)
_RATE = re.compile(r"(\d+)x([A-Za-z0-9?]+)")
_RATE_CACHE: dict[str, tuple[str | None, str | None, float | None]] = {}


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
    id_lines: list[str] = field(default_factory=list)  # `key=value` lines above the node line
    ports: dict[int, Port] = field(default_factory=dict)

    @property
    def ids(self) -> dict[str, str]:
        """`vendid`, `devid`, `sysimgguid`, `switchguid`/`caguid`: read when asked for (400k
        such lines in a 100k-GPU fabric, rarely needed); a `vendid=` line starts a new set."""
        out: dict[str, str] = {}
        for line in self.id_lines:
            key, _, val = line.partition("=")
            key = key.lower()
            if key == "vendid":
                out.clear()
            out[key] = val
        return out

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
        return host_device(self.desc)[0]

    @property
    def device(self) -> str | None:
        """For a CA described `HOST DEVICE`: DEVICE (e.g. `mlx5_3`)."""
        return host_device(self.desc)[1]


# Node descriptions in the forms real fabrics show (rdma-core's rdma-ndd writes "%h %d",
# host and verbs device; DGX OS images write "host HCA-N" for mlx5_(N-1); some sites write the
# FQDN): HCA-N is read as the verbs device it stands for.
_HCA_N = re.compile(r"^HCA-(\d+)$", re.I)
_GUIDISH = re.compile(r"^(?:0x)?[0-9a-fA-F]{16}$|^[HS]-[0-9a-fA-F]+$")


def is_unset_desc(desc: str) -> bool:
    """True for a CA description nobody set: empty, a bare GUID, or the driver's default
    (`MT4129 ConnectX7 Mellanox Technologies`). SHARP aggregation nodes are not unset."""
    d = desc.strip()
    if not d or _GUIDISH.match(d):
        return True
    return ("Aggregation" not in d and ("Mellanox" in d or "ConnectX" in d or d.startswith("MT"))
            and _DEFAULT_DESC.search(d) is not None)


def host_device(desc: str) -> tuple[str | None, str | None]:
    """`"dgx0001 mlx5_3"` -> (dgx0001, mlx5_3); `"dgx0001 HCA-4"` -> (dgx0001, mlx5_3);
    (None, None) for unset descriptions and SHARP aggregation nodes."""
    if not desc or (("Mellanox" in desc or "ConnectX" in desc or desc.startswith("MT")
                    or "Aggregation" in desc) and _DEFAULT_DESC.search(desc)):
        return None, None
    parts = desc.split()
    if not parts or (len(parts) == 1 and _GUIDISH.match(parts[0])):
        return None, None
    if len(parts) < 2:
        return parts[0], None
    dev = parts[1]
    m = _HCA_N.match(dev)
    if m and int(m.group(1)) >= 1:
        dev = f"mlx5_{int(m.group(1)) - 1}"
    return parts[0], dev


@dataclass
class Fabric:
    nodes: dict[str, FabricNode]
    source: str
    sources: tuple[str, ...] = ()  # every file merged into this fabric (see `merge`)

    def switches(self) -> Iterator[FabricNode]:
        return (n for n in self.nodes.values() if n.kind == "switch")

    def cas(self) -> Iterator[FabricNode]:
        return (n for n in self.nodes.values() if n.kind == "ca")

    def peer(self, port: Port) -> FabricNode | None:
        return self.nodes.get(port.remote_id)


_NODE = re.compile(
    r'([A-Za-z?]+)\s+(\d+)\s+(?:"([^"]+)"|([A-Za-z?]-[0-9a-fA-F]+))'  # type, ports, id
    r'(?:\s*\([^)]*\))?\s*(?:#\s*(.*))?$'  # optional "(scp)", comment: "description" rest
)
# Kept simple on purpose (it runs once per port line): what sits between the remote port and
# the comment (`[ext N]`, the remote port GUID, ` (scp)`) is skipped, not checked.
_PORT = re.compile(
    r'\[(\d+)\](?:\[ext \d+\])?(?:\([0-9a-fA-F]+\))?\s*'  # local port, ext label, port GUID
    r'"([^"]+)"\[(\d+)\][^#"]*(?:#\s*(.*))?$'                 # remote id and port, comment
)
_PORT_TAIL = re.compile(
    r'(?:lid (\d+) lmc \d+\s*)?(?:"((?:[^"\\]|\\.)*)")?\s*'   # CA side: own lid; remote desc
    r'(?:lid (\d+))?\s*(?:(\d+)x([A-Za-z0-9?]+))?'                 # remote lid, width x speed
)
_NODE_TAIL = re.compile(r'(?:"((?:[^"\\]|\\.)*)")?(.*)$')
_LID = re.compile(r"\blid (\d+)")


def merge(fabrics: list[Fabric]) -> Fabric:
    """One fabric from several dumps: one per subnet (per-rail planes), or the same subnet seen
    from several hosts. Nodes are keyed by GUID, so a node seen in two dumps is one node with
    the ports of both; a GUID listed as a switch in one file and a CA in another is an error."""
    if len(fabrics) == 1:
        return fabrics[0]
    nodes: dict[str, FabricNode] = {}
    for fab in fabrics:
        for nid, node in fab.nodes.items():
            old = nodes.get(nid)
            if old is None:
                nodes[nid] = node
                continue
            if old.kind != node.kind:
                raise ConfigError(f"node {nid} is a {old.type_word} in {_src(nodes, nid, fabrics)}"
                                  f" but a {node.type_word} here", file=f"{fab.source}:{node.line}")
            for num, port in node.ports.items():
                old.ports.setdefault(num, port)
            if not old.desc:
                old.desc = node.desc
    names = tuple(f.source for f in fabrics)
    return Fabric(nodes, " + ".join(names), names)


def _src(nodes: dict[str, FabricNode], nid: str, fabrics: list[Fabric]) -> str:
    for fab in fabrics:
        if nid in fab.nodes:
            return f"{fab.source}:{fab.nodes[nid].line}"
    return "another file"


def parse_files(paths: list[Path]) -> Fabric:
    """Read every file (each must exist and parse) and merge them."""
    return merge([parse_file(p) for p in paths])


def parse_file(path: Path | str) -> Fabric:
    """Read and parse an ibnetdiscover output file (ConfigError naming the file on failure)."""
    from slurmpod.config import read_input  # lazy: start-up

    path = Path(path)
    raw = read_input(path, "save it with `ibnetdiscover > FILE` on a fabric host")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError("not text (binary data?); expected ibnetdiscover output",
                          file=str(path)) from None
    return parse(text, str(path))


_BARE_PORT = re.compile(r"\[\d+\](?:\[ext \d+\])?(?:\([0-9a-fA-F]+\))?$")


def parse(text: str, source: str = "<ibnetdiscover>") -> Fabric:
    """Parse ibnetdiscover output. Raises ConfigError(`source:line`) on lines it cannot read.

    Wrapped lines are joined back: a line with an unclosed quote continues on the next one, a
    bare `[N]` port label continues with its remote end, and an indented `# ...` comment belongs
    to the port or node line above it when that line has none.
    """
    gc_was_on = gc.isenabled()
    gc.disable()  # ~10^6 small objects and no cycles: the collector only costs time here
    try:
        return _parse(text, source)
    finally:
        if gc_was_on:
            gc.enable()


def _parse(text: str, source: str) -> Fabric:
    nodes: dict[str, FabricNode] = {}
    ids: list[str] = []
    node: FabricNode | None = None
    last_port: tuple[FabricNode, int] | None = None  # the last port line, while it has no comment
    buf: tuple[int, str] | None = None
    port_match = _PORT.match
    new_port = tuple.__new__  # skips NamedTuple's Python-level __new__
    for lineno, raw in enumerate(text.splitlines(), 1):
        s = raw.strip()
        if not s:
            if buf is not None:
                raise ConfigError(f"unterminated line {_snip(buf[1])}", file=f"{source}:{buf[0]}")
            continue
        if buf is not None:
            lineno, s = buf[0], f"{buf[1]} {s}"
            buf = None
        c = s[0]
        if c == "[":
            if node is None:
                raise ConfigError("port line before any Switch/Ca line; is the file cut at the "
                                  "top?", file=f"{source}:{lineno}")
            m = port_match(s)
            if m is None:
                if _BARE_PORT.match(s):
                    buf = (lineno, s)
                    continue
                raise ConfigError(f"cannot parse port line {_snip(s)}; expected "
                                  '[N] "S-<guid>"[M] # "description" lid L 4xNDR',
                                  file=f"{source}:{lineno}")
            num, rid, rport, tail = m.groups()
            if tail is not None and tail.count('"') & 1:
                buf = (lineno, s)  # a description wrapped onto the next line
                continue
            num = int(num)
            node.ports[num] = new_port(Port, (num, rid, int(rport), tail or None, lineno))
            last_port = (node, num) if tail is None else None
            continue
        if c == "#" or (c == "i" and s.startswith(("ibwarn", "ibdebug"))):
            # Comments, stderr saved with `2>&1`, or the wrapped comment of the line above.
            if c == "#" and raw[0] in " \t":
                if last_port is not None:
                    owner, num = last_port
                    owner.ports[num] = owner.ports[num]._replace(tail=s[1:].strip())
                    last_port = None
                elif node is not None and not node.desc and not node.ports:
                    _node_comment(node, s[1:].strip())
            continue
        if "=" in s and '"' not in s and " " not in s and s[0] != "=":
            ids.append(s)
            last_port = None
            continue
        last_port = None
        if s.count('"') & 1:
            buf = (lineno, s)  # inside a quoted description: the line was wrapped
            continue
        m = _NODE.match(s)
        if m is None:
            raise ConfigError(f"cannot parse {_snip(s)}; expected a node line (Switch/Ca N "
                              '"<id>" # "description"), a port line ([N] "<id>"[M] ...) or '
                              "key=value; is this ibnetdiscover output?",
                              file=f"{source}:{lineno}")
        word, nports, qid, uid, tail = m.groups()
        node_id = qid or uid
        kind = _KINDS.get(word.lower(), "unknown")
        old = nodes.get(node_id)
        if old is not None:
            if old.kind != kind:
                raise ConfigError(f"node {node_id} is listed as {old.type_word} at line "
                                  f"{old.line} and as {word} here; one of the two is wrong",
                                  file=f"{source}:{lineno}")
            node = old  # a repeated block (concatenated outputs): merge its ports
            continue
        node = FabricNode(node_id, kind, word, int(nports), "", None, lineno, ids)
        if tail:
            if tail[0] == '"' and tail.endswith('"') and tail.count('"') == 2:
                node.desc = tail[1:-1]  # the common CA line: just the description
            else:
                _node_comment(node, tail)
        nodes[node_id] = node
        ids = []
    if buf is not None:
        raise ConfigError(f"unterminated line {_snip(buf[1])}", file=f"{source}:{buf[0]}")
    if not nodes:
        raise ConfigError("no Switch or Ca lines found; expected the output of `ibnetdiscover`",
                          file=source)
    return Fabric(nodes, source, (source,))


def _node_comment(node: FabricNode, tail: str) -> None:
    t = _NODE_TAIL.match(tail)
    if t:
        node.desc = t.group(1) or ""
        lm = _LID.search(t.group(2) or "")
        node.lid = int(lm.group(1)) if lm else None


def _snip(s: str, n: int = 60) -> str:
    return repr(s if len(s) <= n else s[: n - 3] + "...")
