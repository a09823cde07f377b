"""Fabric health: port error counters (`ibqueryerrors`, `perfquery`) and SHARP aggregation nodes.

Both formats are infiniband-diags' (rdma-core; checked against infiniband-diags 44.0 on Debian
12 driving an ibsim 0.10 fabric, tests/data/counters):

`ibqueryerrors` (errors above its thresholds, per node, then per port; `-r` adds `Link info`,
`--data` adds data counters, which are ignored here)::

    Errors for 0x200000 "MF0;leaf-su1-rail0:MQM9700/U1"     # switches: node GUID, description
       GUID 0x200000 port ALL: [SymbolErrorCounter == 1234] [LinkDownedCounter == 7]
       GUID 0x200000 port 2: [SymbolErrorCounter == 1234] [LinkDownedCounter == 7]
         Link info: 1 2[  ] ==( 4X 2.5 Gbps Active/ LinkUp)==>  0x..03  12  1[  ] "gpu002 mlx5_0"
    Errors for "gpu001 mlx5_1"                             # CAs: description only; the GUID
       GUID 0x100005 port 1: [LinkErrorRecoveryCounter == 3]  # below is the *port* GUID

`perfquery LID PORT` (one block per call; concatenate them)::

    # Port counters: Lid 1 port 2 (CapMask: 0x1300)
    SymbolErrorCounter:..............1234

`port ALL` and `perfquery -a` (port 255) are sums over the switch's ports and name no cable;
port 0 is a switch's management port. Both are skipped. A port is placed in the fabric (the
`ibnetdiscover` of the same check) by GUID, node description or LID; the cable's other end comes
from the fabric, or from `Link info` when the port is not in it. Both ends of one cable make one
finding.

Thresholds default to the values infiniband-diags suggests in its
`/etc/infiniband-diags/error_thresholds` (44.0), except PortXmitWait (a congestion tick count,
large on any busy link), which is only checked when given. `--threshold NAME=N` or a file in
that format overrides them; a counter above its threshold is reported.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmpod.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from slurmpod.fabric.check import Finding
    from slurmpod.fabric.ibnetdiscover import Fabric, FabricNode
    from slurmpod.topology.fabric_plan import FabricPlan

# Physical-layer counters: a dirty or failing cable/transceiver (IBTA PortCounters).
PHYSICAL = ("SymbolErrorCounter", "LinkErrorRecoveryCounter", "LinkDownedCounter",
            "PortRcvErrors", "PortRcvRemotePhysicalErrors", "LocalLinkIntegrityErrors",
            "ExcessiveBufferOverrunErrors")
# Drops that are not the cable's fault: congestion, routing, partitions, QoS.
DISCARDS = ("PortXmitDiscards", "PortRcvSwitchRelayErrors", "PortXmitConstraintErrors",
            "PortRcvConstraintErrors", "VL15Dropped", "PortXmitWait")

# infiniband-diags 44.0, /etc/infiniband-diags/error_thresholds (shipped commented out, as the
# suggested values); None: not checked unless a threshold is given.
DEFAULT_THRESHOLDS: dict[str, int | None] = {
    "SymbolErrorCounter": 10, "LinkErrorRecoveryCounter": 10, "LinkDownedCounter": 10,
    "PortRcvErrors": 10, "PortRcvRemotePhysicalErrors": 100, "PortRcvSwitchRelayErrors": 100,
    "PortXmitDiscards": 100, "PortXmitConstraintErrors": 100, "PortRcvConstraintErrors": 100,
    "LocalLinkIntegrityErrors": 10, "ExcessiveBufferOverrunErrors": 10, "VL15Dropped": 100,
    "PortXmitWait": None,
}
KNOWN = set(DEFAULT_THRESHOLDS) | {"QP1Dropped"}

COUNTERS_FINDING_KINDS: dict[str, str] = {
    "link-errors": "a cable's error counters (symbol errors, link downed, receive errors...) "
                   "are above their thresholds",
    "port-discards": "a port drops packets (discards, relay/constraint errors): congestion or "
                     "routing, not the cable",
    "sharp-an-missing": "a switch of a SHARP site has no SHARP aggregation node",
}


@dataclass
class PortRecord:
    """Error counters of one port, as one tool printed them."""

    tool: str  # ibqueryerrors | perfquery
    where: str  # file:line
    port: int
    guid: str | None = None  # 16 hex digits
    desc: str | None = None
    lid: int | None = None
    counters: dict[str, int] = field(default_factory=dict)
    remote: tuple[str | None, int | None, int, str] | None = None  # guid, lid, port, desc


def _guid(text: str) -> str:
    return text.lower().removeprefix("0x").zfill(16)


_ERRORS_FOR = re.compile(r'Errors for (?:(0x[0-9a-fA-F]+) )?"(.*)"\s*$')
_GUID_PORT = re.compile(r"GUID (0x[0-9a-fA-F]+) port (\w+):(.*)$")
_COUNTER = re.compile(r"\[(\w+) == (\d+)(?: \([^)]*\))?\]")
_LINK_INFO = re.compile(
    r"Link info:\s+(\d+)\s+(\d+)\[[^\]]*\]\s*==\(.*?\)==>\s*(?:(0x[0-9a-fA-F]+)\s+(\d+)\s+"
    r'(\d+)\[[^\]]*\]\s+"(.*)")?')
_PQ_HEAD = re.compile(r"# Port (extended )?counters: Lid (\d+) port (\d+)")
_PQ_LINE = re.compile(r"(\w+):\.*(\S+)$")


def parse_counters(text: str, source: str) -> list[PortRecord]:
    """Records of every port in `ibqueryerrors` and/or `perfquery` output (either, or both
    concatenated). ConfigError naming `source:line` on a line of neither format."""
    out: list[PortRecord] = []
    node: tuple[str | None, str] | None = None
    last: PortRecord | None = None
    pq: PortRecord | None = None
    extended = False  # inside a `perfquery -x` block: data counters only, skipped
    for n, raw in enumerate(text.splitlines(), 1):
        s = raw.strip()
        if not s or s.startswith(("##", "ibwarn", "ibpanic")):
            continue
        where = f"{source}:{n}"
        if m := _PQ_HEAD.match(s):
            ext, lid, port = m.groups()
            pq = None if ext else PortRecord("perfquery", where, int(port), lid=int(lid))
            extended = pq is None
            if pq is not None:
                out.append(pq)
            node = last = None
            continue
        if m := _ERRORS_FOR.match(s):
            node = (_guid(m.group(1)) if m.group(1) else None, m.group(2))
            pq = last = None
            extended = False
            continue
        if m := _GUID_PORT.match(s):
            if node is None:
                raise ConfigError(f"port line before any 'Errors for' line: {s[:60]!r}",
                                  file=where)
            guid, port, rest = m.groups()
            last = None
            if port.isdigit():
                last = PortRecord("ibqueryerrors", where, int(port), guid=_guid(guid),
                                  desc=node[1])
                last.counters = {k: int(v) for k, v in _COUNTER.findall(rest)}
                out.append(last)
            continue
        if s.startswith("Link info:"):
            m = _LINK_INFO.match(s)
            if last is not None and m is not None:
                last.lid = int(m.group(1))
                if m.group(3):
                    last.remote = (_guid(m.group(3)), int(m.group(4)), int(m.group(5)),
                                   m.group(6))
            continue
        if s.startswith("[") and last is not None:  # --details: more counters of the port
            last.counters.update({k: int(v) for k, v in _COUNTER.findall(s)})
            continue
        if pq is not None and (m := _PQ_LINE.match(s)):
            key, val = m.groups()
            if key in KNOWN:
                try:
                    pq.counters[key] = int(val, 0)
                except ValueError:
                    raise ConfigError(f"{key}: not a number: {val!r}", file=where) from None
            continue
        if extended and _PQ_LINE.match(s):
            continue
        raise ConfigError(f"cannot parse {s[:60]!r}; expected ibqueryerrors output ('Errors "
                          "for ...', 'GUID ... port N: [Counter == V]') or perfquery output "
                          "('# Port counters: Lid L port P', 'Counter:....V')", file=where)
    return out


def read_counters(paths: Sequence[Path]) -> tuple[list[PortRecord], str]:
    from slurmpod.config import read_input  # lazy: start-up

    records: list[PortRecord] = []
    for path in paths:
        raw = read_input(path, "save it with `ibqueryerrors -r > FILE` (or perfquery LID PORT)")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError("not text (binary data?); expected ibqueryerrors or perfquery "
                              "output", file=str(path)) from None
        got = parse_counters(text, str(path))
        if not got and "Port extended counters" in text and "Port counters" not in text:
            raise ConfigError("only `perfquery -x` blocks (data counters, no errors); run "
                              "perfquery without -x", file=str(path))
        if not got and "Errors for" not in text and "Port counters" not in text \
                and "## Summary" not in text:
            raise ConfigError("no ibqueryerrors or perfquery records found", file=str(path))
        records.extend(got)
    return records, ", ".join(str(p) for p in paths)


def thresholds(overrides: Iterable[str] = (), files: Iterable[Path] = ()) -> dict[str, int | None]:
    """Defaults, then files in infiniband-diags' `error_thresholds` format (`Name=N`, `#`
    comments), then `--threshold Name=N` options."""
    from slurmpod.config import read_input  # lazy: start-up

    out = dict(DEFAULT_THRESHOLDS)

    def put(item: str, where: str) -> None:
        name, sep, val = item.partition("=")
        name, val = name.strip(), val.strip()
        if not sep or name not in KNOWN or not val.isdigit():
            raise UsageError(f"{where}: {item.strip()!r}: expected COUNTER=N with a counter "
                             f"of {', '.join(sorted(KNOWN))}")
        out[name] = int(val)

    for path in files:
        for n, line in enumerate(read_input(path).decode("utf-8", "replace").splitlines(), 1):
            line = line.split("#", 1)[0].strip()
            if line:
                put(line, f"{path}:{n}")
    for item in overrides:
        put(item, "--threshold")
    return out


# --- placing records in the fabric ----------------------------------------------------------

@dataclass(frozen=True)
class End:
    """One end of a cable: a switch port or a CA port."""

    node_id: str | None
    name: str  # switch name or CA description
    port: int
    is_switch: bool
    guid: str | None

    def label(self) -> str:
        return f"{self.name} port {self.port}" if self.is_switch else self.name


class _Index:
    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self.by_guid: dict[str, FabricNode] = {}
        self.by_desc: dict[str, FabricNode | None] = {}
        self.by_lid: dict[int, FabricNode] = {}
        lid_re = re.compile(r"^lid (\d+) lmc")
        for node in fabric.nodes.values():
            self.by_guid[node.guid] = node
            if node.desc:
                self.by_desc[node.desc] = None if node.desc in self.by_desc else node
            if node.lid is not None:
                self.by_lid[node.lid] = node
            if node.kind == "ca":
                for port in node.ports.values():  # a CA's own LID leads its port comment
                    if port.tail and (m := lid_re.match(port.tail)):
                        self.by_lid.setdefault(int(m.group(1)), node)

    def find(self, rec: PortRecord) -> FabricNode | None:
        if rec.guid and (n := self.by_guid.get(rec.guid)) is not None:
            return n
        if rec.desc and (n := self.by_desc.get(rec.desc)) is not None:
            return n
        return self.by_lid.get(rec.lid) if rec.lid is not None else None

    def end(self, node: FabricNode, port: int) -> End:
        return End(node.node_id, node.name if node.kind == "switch" else node.desc or
                   node.node_id, port, node.kind == "switch", node.guid)


def _name_of(desc: str) -> str:
    m = re.match(r"^[^;:]*;([^;:]+):", desc)
    return m.group(1) if m else desc


def check_counters(records: Sequence[PortRecord], fabric: Fabric, limits: dict[str, int | None],
                   plan: FabricPlan | None = None) -> tuple[list[Finding], list[str]]:
    """One finding per cable whose counters (either end) exceed `limits`; notes."""
    from slurmpod.fabric.check import Finding  # lazy: start-up
    from slurmpod.fabric.ibnetdiscover import host_device  # lazy: start-up

    idx = _Index(fabric)
    links: dict[tuple[End, End], dict[End, dict[str, int]]] = {}
    unplaced: list[str] = []
    sums = 0
    for rec in records:
        if rec.port in (0, 255):  # a switch's management port; perfquery -a's sum over ports
            sums += rec.port == 255
            continue
        over = {k: v for k, v in rec.counters.items()
                if (lim := limits.get(k)) is not None and v > lim}
        if not over:
            continue
        node = idx.find(rec)
        here: End
        there: End | None = None
        if node is not None:
            here = idx.end(node, rec.port)
            port = node.ports.get(rec.port)
            peer = fabric.nodes.get(port.remote_id) if port is not None else None
            if peer is not None and port is not None:
                there = idx.end(peer, port.remote_port)
        else:
            unplaced.append(rec.where)
            here = End(None, _name_of(rec.desc) if rec.desc else f"lid {rec.lid}", rec.port,
                       rec.desc is None or ";" in (rec.desc or ""), rec.guid)
        if there is None and rec.remote is not None:
            rguid, _rlid, rport, rdesc = rec.remote
            rnode = idx.by_guid.get(rguid or "")
            there = idx.end(rnode, rport) if rnode is not None else End(
                None, _name_of(rdesc), rport, ";" in rdesc, rguid)
        if there is None:  # a port the fabric shows unlinked, and no Link info
            there = End(None, "(no link in the ibnetdiscover file)", 0, False, None)
        # The CA end first ("gpu002 mlx5_0 <-> leaf port 2"), then switches by name; an
        # unknown far end last.
        a, b = sorted((here, there), key=lambda e: (e.node_id is None and e.port == 0,
                                                    e.is_switch, e.name, e.port))
        key = (a, b)
        seen = links.setdefault(key, {})
        got = seen.setdefault(here, {})
        for k, v in over.items():
            got[k] = max(v, got.get(k, 0))

    findings: list[Finding] = []
    for (a, b), per_end in sorted(links.items(), key=lambda kv: (kv[0][0].name, kv[0][0].port)):
        ca = next((e for e in (a, b) if not e.is_switch and e.port), None)
        # The switch end that counted the errors (either, when both did).
        sw = next((e for e in per_end if e.is_switch), None) or next(
            (e for e in (a, b) if e.is_switch), None)
        host, dev = host_device(ca.name) if ca is not None else (None, None)
        cable = f"{_label(a, plan)} <-> {_label(b, plan)}"
        counts = "; ".join(
            f"{_label(end, plan)} sees " + ", ".join(f"{k} {v} (> {limits[k]})"
                                                      for k, v in sorted(c.items()))
            for end, c in per_end.items())
        names = {k for c in per_end.values() for k in c}
        physical = sorted(names & set(PHYSICAL))
        cage = plan.cage(sw.port) if plan is not None and sw is not None else None
        nl = plan.node_port.get((host, dev or "")) if plan is not None and host else None
        where: dict[str, Any] = dict(
            node=host, hca=dev, rail=nl.rail if nl is not None else None,
            guid=ca.guid if ca else (sw.guid if sw else None), switch=sw.name if sw else None,
            port=sw.port if sw else None, cage=cage, cable=cable)
        if physical:
            flap = "LinkDownedCounter" in physical
            findings.append(Finding(
                "link-errors", "error", cable,
                f"cable {cable}: {counts}" + (" — the link went down and retrained" if flap
                                               else ""),
                f"clean and reseat both ends of {cable}, replace the cable or transceiver if "
                f"errors return; clear the counters (`perfquery -R LID PORT`) and check again",
                **where))
        else:
            findings.append(Finding(
                "port-discards", "warning", cable, f"{cable}: {counts}",
                "not a cable fault: look at congestion (PortXmitWait), the subnet manager's "
                "routing and partitions/QoS; clear the counters and watch whether they grow",
                **where))
    notes = []
    if sums:
        notes.append(f"{sums} `perfquery -a` sums (port 255) skipped: they name no cable; "
                     "query ports one by one (perfquery LID PORT)")
    if unplaced:
        notes.append(f"{len(unplaced)} counter records name a port not in the ibnetdiscover "
                     f"file (e.g. {unplaced[0]}); reported from the counters file alone")
    return findings, notes


def _label(end: End, plan: FabricPlan | None) -> str:
    if end.is_switch and plan is not None and end.name in plan.by_name:
        return plan.port_label(end.name, end.port)
    return end.label()


# --- SHARP -----------------------------------------------------------------------------------

def check_sharp(fabric: Fabric, skip: Iterable[str] = ()) -> list[Finding]:
    """On a SHARP site every switch of the compute fabric exposes its aggregation node: a CA
    described `Mellanox Technologies Aggregation Node` on a port of its own (ibdiagnet's
    "IB Aggregation Nodes" count equals the switch count; SHARP 3.x "Testing NVIDIA SHARP
    Setup"). `skip`: switch node ids kept apart (storage)."""
    from slurmpod.fabric.check import Finding  # lazy: start-up

    skipped = set(skip)
    switches = [s for s in fabric.switches() if s.node_id not in skipped]
    missing = []
    for sw in switches:
        has = any((peer := fabric.nodes.get(p.remote_id)) is not None and peer.kind == "ca"
                  and peer.is_aggregation_node for p in sw.ports.values())
        if not has:
            missing.append(sw)
    if not missing:
        return []
    if len(missing) == len(switches) and len(switches) > 1:
        return [Finding(
            "sharp-an-missing", "error", "all switches",
            f"none of the {len(switches)} switches shows a SHARP aggregation node, but the site "
            "sets fabric.sharp = true",
            "enable SHARP on the switches (firmware/OS setting) and start the aggregation "
            "manager (sharp_am, or UFM's), then rerun ibnetdiscover; or set fabric.sharp = "
            "false")]
    return [Finding(
        "sharp-an-missing", "error", sw.name or sw.node_id,
        f"switch {sw.name or sw.node_id} shows no SHARP aggregation node: SHARP trees through "
        "it fail and jobs fall back to host reductions",
        f"enable SHARP on {sw.name or sw.node_id} (its firmware must support it: `ibdiagnet "
        "--sharp` lists aggregation nodes), then rerun ibnetdiscover",
        switch=sw.name or sw.node_id, guid=sw.guid) for sw in missing]


def apart_switch_ids(kept_apart: Iterable[dict[str, str]]) -> set[str]:
    return {d["id"] for d in kept_apart if d.get("what") == "switch" and "id" in d}


def summarise(records: Sequence[PortRecord]) -> dict[str, int]:
    tools: dict[str, int] = defaultdict(int)
    for r in records:
        tools[r.tool] += 1
    return dict(tools)


# --- rehearsal -------------------------------------------------------------------------------

def render_ibqueryerrors(fabric: Fabric, errors: dict[tuple[str, int], dict[str, int]]) -> str:
    """What `ibqueryerrors` (infiniband-diags 44.0, no options) prints for `fabric` when the
    ports `errors` names ((node id, port) -> counters) count errors: a switch by node GUID and
    description with a `port ALL` sum first, a CA by description; the summary block."""
    by_node: dict[str, dict[int, dict[str, int]]] = defaultdict(dict)
    for (node_id, port), counters in errors.items():
        by_node[node_id][port] = counters
    lines = []
    for node_id, ports in by_node.items():
        node = fabric.nodes[node_id]
        guid = "0x" + node.guid.lstrip("0")
        if node.kind == "switch":
            lines.append(f'Errors for {guid} "{node.desc}"')
            total: dict[str, int] = defaultdict(int)
            for c in ports.values():
                for k, v in c.items():
                    total[k] += v
            lines.append(f"   GUID {guid} port ALL: " + _brackets(total))
        else:
            lines.append(f'Errors for "{node.desc}"')
        for port, c in sorted(ports.items()):
            lines.append(f"   GUID {guid} port {port}: " + _brackets(c))
    nports = sum(len(n.ports) for n in fabric.nodes.values())
    bad = sum(len(p) for p in by_node.values())
    lines += ["", f"## Summary: {len(fabric.nodes)} nodes checked, {len(by_node)} bad nodes found",
              f"##          {nports} ports checked, {bad} ports have errors beyond threshold",
              "## Thresholds: ", "## Suppressed:"]
    return "\n".join(lines) + "\n"


def _brackets(counters: dict[str, int]) -> str:
    return " ".join(f"[{k} == {v}]" for k, v in counters.items())
