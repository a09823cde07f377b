"""The switch-to-switch part of the fabric check: leaf->spine and spine->core cables.

Driven by the plan: each planned cable is looked up at its lower end in the fabric (one dict
lookup per cable, no index of the whole fabric), so a clean 100k-GPU fabric costs one pass.
Only switches that show a problem, or whose count of switch-facing ports differs from the
plan, are scanned for cables the plan does not have. Findings: `missing-link`,
`wrong-uplink`, `swapped-cables` (two uplinks in each other's upper ports), `wrong-port` (a cable
in the wrong lower port), `unexpected-link`, `degraded-link`.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from operator import itemgetter
from typing import TYPE_CHECKING

from slurmpod.fabric.ibnetdiscover import Port, speed_name

if TYPE_CHECKING:
    from slurmpod.fabric.check import _Ctx

Pos = tuple[str, int]


def is_slow(gbps: float | None, planned: int) -> bool:
    return gbps is not None and gbps + 0.5 < planned


def check_switch_links(ctx: _Ctx, apart: set[str], gone: set[str]) -> None:
    plan = ctx.plan
    want = plan.link_gbps
    nodes = ctx.fabric.nodes
    to_fabric = ctx.to_fabric
    names = {sw.node_id: ctx.name(sw) for sw in ctx.fabric.switches()}
    links = plan.switch_links

    misplaced: dict[Pos, tuple[Pos, Pos]] = {}
    missing: dict[str, list[Pos]] = defaultdict(list)
    slow: list[tuple[Pos, Pos, Port]] = []
    # Counted in C (Counter over an iterable), not link by link in the loop below.
    uplinks: Counter[str] = Counter(map(itemgetter(0), links))
    planned_degree: Counter[str] = uplinks + Counter(map(itemgetter(2), links))
    suspects: set[str] = set()  # plan/fabric names of switches to scan for unplanned cables
    healthy = " " + speed_name(want)  # a healthy link's comment ends with its rate
    for lower, lp, upper, upp in links:
        if lower in gone:
            continue
        port = to_fabric[lower].ports.get(lp)
        peer = nodes.get(port.remote_id) if port is not None else None
        if port is None or peer is None or peer.kind != "switch":
            if upper not in gone:
                missing[lower].append((lower, lp))
                suspects.update((lower, upper))
            continue
        got = names[peer.node_id]
        tail = port.tail
        if not (tail and tail.endswith(healthy)) and is_slow(port.gbps, want):
            slow.append(((lower, lp), (got, port.remote_port), port))
        if got != upper or port.remote_port != upp:
            misplaced[(lower, lp)] = ((got, port.remote_port), (upper, upp))
            suspects.update((lower, upper, got))
    for sw in ctx.fabric.switches():
        if sw.node_id not in apart and ctx.degree.get(sw.node_id, 0) != planned_degree.get(
                names[sw.node_id], 0):
            suspects.add(names[sw.node_id])

    extra = _unplanned(ctx, links, suspects, names, apart) if suspects else {}
    expected = {(sl.lower, sl.lower_port): (sl.upper, sl.upper_port)
                for sl in links if sl.lower in missing} if missing else {}
    _wrong_lower_ports(ctx, missing, extra, expected)
    for lower, ports in sorted(missing.items()):
        if len(ports) == uplinks[lower] and len(ports) > 1:
            ctx.add("missing-link", lower,
                    f"none of the {len(ports)} uplinks of {ctx.role(lower)} is up",
                    f"check {lower}'s uplink cables and the switches above it")
            continue
        for lo in ports:
            up = expected[lo]
            ctx.add("missing-link", f"{lo[0]} port {lo[1]}",
                    f"no link from {lo[0]} port {lo[1]} to {up[0]} port {up[1]}",
                    f"reseat or replace the cable {lo[0]} port {lo[1]} <-> {up[0]} port {up[1]}")
    _misplaced_uplinks(ctx, misplaced)
    for a, (b, _port) in sorted(extra.items()):
        ctx.add("unexpected-link", f"{a[0]} port {a[1]}",
                f"{a[0]} port {a[1]} is cabled to {b[0]} port {b[1]}, which the plan does not "
                "have", "unplug it, or fix the plan if the cable is intended")

    if slow and len(slow) == len(links) > 10:
        rates = sorted({p.rate for *_x, p in slow})
        ctx.add("degraded-link", "all switch links",
                f"all {len(slow)} switch-to-switch links run at {', '.join(rates)}, below "
                f"fabric.link_gbps = {want}", "set fabric.link_gbps if that is the real rate")
        return
    for lower, actual, port in slow:
        ctx.add("degraded-link", f"{lower[0]} port {lower[1]}",
                f"{lower[0]} port {lower[1]} -> {actual[0]} port {actual[1]} runs at {port.rate} "
                f"({port.gbps:g} Gb/s), planned {speed_name(want)} ({want} Gb/s)",
                f"reseat or replace the cable/transceiver {lower[0]} port {lower[1]}")


def _unplanned(ctx: _Ctx, links: tuple, suspects: set[str], names: dict[str, str],
               apart: set[str]) -> dict[Pos, tuple[Pos, Port]]:
    """Cables at the suspect switches that the plan does not have, keyed by their lower end."""
    lowers: set[Pos] = set()  # planned lower ends: the plan-driven pass judged those cables
    uppers: set[Pos] = set()
    for lower, lp, upper, upp in links:
        if lower in suspects or upper in suspects:
            lowers.add((lower, lp))
            uppers.add((upper, upp))
    nodes = ctx.fabric.nodes
    extra: dict[Pos, tuple[Pos, Port]] = {}
    for sw in ctx.fabric.switches():
        if names[sw.node_id] not in suspects or sw.node_id in apart:
            continue
        for port in sw.ports.values():
            peer = nodes.get(port.remote_id)
            if peer is None or peer.kind != "switch" or peer.node_id in apart:
                continue
            a = (names[sw.node_id], port.num)
            b = (names[peer.node_id], port.remote_port)
            if a in lowers or b in lowers:
                continue
            # Every link is printed from both ends: key it by its lower end.
            if b in uppers or (a not in uppers and a < b):
                extra[a] = (b, port)
            else:
                extra[b] = (a, port)
    return extra


def _wrong_lower_ports(ctx: _Ctx, missing: dict[str, list[Pos]],
                       extra: dict[Pos, tuple[Pos, Port]], expected: dict[Pos, Pos]) -> None:
    """A cable in the wrong port of its lower switch: missing at one port, unplanned at another
    port of the same switch, both ending at the same upper port."""
    by_upper = {b: a for a, (b, _p) in extra.items()}
    for lower, ports in list(missing.items()):
        for lo in list(ports):
            up = expected[lo]
            moved = by_upper.get(up)
            if moved is None or moved[0] != lo[0]:
                continue
            ports.remove(lo)
            extra.pop(moved, None)
            ctx.add("wrong-port", f"{lo[0]} port {lo[1]}",
                    f"the uplink planned from {lo[0]} port {lo[1]} to {up[0]} port {up[1]} "
                    f"is in {lo[0]} port {moved[1]}",
                    f"move it from {lo[0]} port {moved[1]} to {lo[0]} port {lo[1]}",
                    severity="warning")
        if not ports:
            del missing[lower]


def _misplaced_uplinks(ctx: _Ctx, misplaced: dict[Pos, tuple[Pos, Pos]]) -> None:
    occupant = {actual: lower for lower, (actual, _u) in misplaced.items()}
    done: set[Pos] = set()
    for lower, (actual, upper) in sorted(misplaced.items()):
        if lower in done:
            continue
        other = occupant.get(upper)
        if other is not None and other != lower and misplaced[other][1] == actual:
            done.update((lower, other))
            ctx.add("swapped-cables", f"{lower[0]} port {lower[1]} / {other[0]} port {other[1]}",
                    f"the uplinks from {lower[0]} port {lower[1]} and {other[0]} port "
                    f"{other[1]} are in each other's ports on {actual[0]} port {actual[1]} and "
                    f"{upper[0]} port {upper[1]}",
                    f"swap the cables in {actual[0]} port {actual[1]} and {upper[0]} port "
                    f"{upper[1]}")
            continue
        got_sw = ctx.planned.get(actual[0])
        exp_sw = ctx.planned[upper[0]]
        cross = (got_sw is not None and got_sw.group != exp_sw.group
                 and ctx.plan.spine_groups == "per_rail")
        why = " — it crosses rail groups, so rail traffic leaves its rail" if cross else ""
        ctx.add("wrong-uplink", f"{lower[0]} port {lower[1]}",
                f"{lower[0]} port {lower[1]} goes to {actual[0]} port {actual[1]}; planned: "
                f"{upper[0]} port {upper[1]}{why}",
                f"move the cable's upper end from {actual[0]} port {actual[1]} to {upper[0]} "
                f"port {upper[1]}")
