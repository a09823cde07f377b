"""The switch-to-switch part of the fabric check: leaf->spine and spine->core cables.

A link between tiers is judged by *how many* links each lower switch has to each upper switch of
its group, whatever ports carry them: the subnet manager routes over any port, and real sites
cable twin-port OSFP cages in pairs, singly, or in whatever order the optics allowed, so the
plan's port numbers above the leaves are a suggestion, not a rule (the ports of node cables are
checked exactly, in check.py). One pass over the switches' ports counts the links; findings:

* `wrong-uplink`    a switch has too few links to one upper switch and too many to another
                    (a cable landed on the wrong spine): move one cable
* `swapped-cables`  two switches each have the other's spine: two cables crossed, one finding
* `missing-link`    fewer links to an upper switch than planned (cable out or port down);
                    all uplinks of a switch missing is one finding
* `unexpected-link` more links than planned, a link inside one tier, or to an unplanned spine
* `degraded-link`   a link slower than fabric.link_gbps
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Protocol

from slurmpod.fabric.ibnetdiscover import Fabric, FabricNode, Port, speed_name

if TYPE_CHECKING:
    from slurmpod.topology.fabric_plan import FabricPlan, Switch


class _Ctx(Protocol):
    """What this pass reads and adds to in the check's working state (check.py's `_Ctx`),
    named here so that check.py imports this module and not the other way round."""

    plan: FabricPlan
    fabric: Fabric
    planned: dict[str, Switch]
    to_plan: dict[str, str]
    to_fabric: dict[str, FabricNode]

    def add(self, kind: str, subject: str, message: str, fix: str, *,
            severity: str = "error", node: str | None = None, hca: str | None = None,
            guid: str | None = None, rail: int | None = None, switch: str | None = None,
            port: int | None = None, cage: int | None = None,
            cable: str | None = None) -> None: ...

    def role(self, name: str) -> str: ...


Pos = tuple[str, int]
_RANK = {"leaf": 0, "spine": 1, "core": 2}


def is_slow(gbps: float | None, planned: int) -> bool:
    return gbps is not None and gbps + 0.5 < planned


class _Link:
    __slots__ = ("lower", "lport", "port", "uport", "upper")

    def __init__(self, lower: str, lport: int, upper: str, uport: int, port: Port) -> None:
        self.lower, self.lport, self.upper, self.uport, self.port = \
            lower, lport, upper, uport, port


def check_switch_links(ctx: _Ctx, apart: set[str], gone: set[str]) -> None:
    need, planned_ports = _planned_uplinks(ctx.plan)
    have, odd, slow = _seen_uplinks(ctx, apart)
    short, extra = _shortfalls_and_surpluses(need, have, planned_ports, gone)
    _swaps(ctx, short, extra, planned_ports)
    for lower in sorted(set(short) | set(extra)):
        _judge_uplinks_of(ctx, lower, short.get(lower, {}), extra.get(lower, {}), need, have,
                          planned_ports)
    for link in odd.values():
        _unexpected(ctx, link, f"{link.lower} and {link.upper} are both "
                    f"{ctx.planned[link.lower].tier}s; the plan has no links within a tier")
    _judge_slow_links(ctx, slow)


def _planned_uplinks(plan: FabricPlan) -> tuple[dict[str, Counter[str]],
                                                dict[tuple[str, str], list[int]]]:
    """Planned link counts per (lower, upper), and the planned lower ports (for the fixes)."""
    need: dict[str, Counter[str]] = defaultdict(Counter)
    planned_ports: dict[tuple[str, str], list[int]] = defaultdict(list)
    for lower, lp, upper, _up in plan.switch_links:
        need[lower][upper] += 1
        planned_ports[(lower, upper)].append(lp)
    return need, planned_ports


def _seen_uplinks(ctx: _Ctx, apart: set[str]) -> tuple[dict[str, dict[str, list[_Link]]],
                                                      dict[tuple[Pos, Pos], _Link], list[_Link]]:
    """Actual links between planned switches, each counted once from its lower end; the
    same-tier ones apart, and those slower than planned."""
    want = ctx.plan.link_gbps
    nodes = ctx.fabric.nodes
    planned = ctx.planned
    to_plan = ctx.to_plan
    have: dict[str, dict[str, list[_Link]]] = defaultdict(lambda: defaultdict(list))
    odd: dict[tuple[Pos, Pos], _Link] = {}  # same-tier links and links to unplanned switches
    slow: list[_Link] = []
    healthy = " " + speed_name(want)  # a healthy link's comment ends with its rate
    for sw in ctx.fabric.switches():
        if sw.node_id in apart:
            continue
        a = to_plan.get(sw.node_id)
        if a is None:
            continue  # an unknown switch: its own finding; its links are not judged
        ra = _RANK[planned[a].tier]
        for port in sw.ports.values():
            peer = nodes.get(port.remote_id)
            if peer is None or peer.kind != "switch" or peer.node_id in apart:
                continue
            b = to_plan.get(peer.node_id)
            if b is None:
                continue
            rb = _RANK[planned[b].tier]
            if rb < ra:
                continue  # judged from the lower end
            link = _Link(a, port.num, b, port.remote_port, port)
            if rb == ra:
                key = min(((a, port.num), (b, port.remote_port)),
                          ((b, port.remote_port), (a, port.num)))
                odd.setdefault(key, link)
                continue
            have[a][b].append(link)
            tail = port.tail
            if not (tail and tail.endswith(healthy)) and is_slow(port.gbps, want):
                slow.append(link)
    return have, odd, slow


def _shortfalls_and_surpluses(
        need: dict[str, Counter[str]], have: dict[str, dict[str, list[_Link]]],
        planned_ports: dict[tuple[str, str], list[int]], gone: set[str],
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, list[_Link]]]]:
    """Per lower switch: links missing, and links in surplus, by upper switch."""
    short: dict[str, dict[str, int]] = {}
    extra: dict[str, dict[str, list[_Link]]] = {}
    for lower in sorted(set(need) | set(have)):
        if lower in gone:
            continue
        wanted = need.get(lower, Counter())
        got = have.get(lower, {})
        s = {u: n - len(got.get(u, ())) for u, n in wanted.items()
             if u not in gone and n > len(got.get(u, ()))}
        x: dict[str, list[_Link]] = {}
        for u, links in got.items():
            if len(links) > wanted.get(u, 0):
                # Keep the links in ports the plan gives this upper switch; the surplus is the
                # rest (the cables that moved), so a finding names the moved cable's port.
                own = set(planned_ports.get((lower, u), ()))
                links[:] = ([lk for lk in links if lk.lport in own]
                            + [lk for lk in links if lk.lport not in own])
                x[u] = links[wanted.get(u, 0):]
        if s:
            short[lower] = s
        if x:
            extra[lower] = x
    return short, extra


def _judge_uplinks_of(ctx: _Ctx, lower: str, s: dict[str, int], x: dict[str, list[_Link]],
                      need: dict[str, Counter[str]], have: dict[str, dict[str, list[_Link]]],
                      planned_ports: dict[tuple[str, str], list[int]]) -> None:
    """One lower switch's shortfalls `s` and surpluses `x`: wrong uplinks, missing links,
    unexpected links."""
    # A cable on the wrong upper switch: one too few here, one too many there.
    for up_short in sorted(s):
        while s[up_short] and x:
            up_extra = min(x)
            link = _pick(x[up_extra], planned_ports[(lower, up_short)])
            if not x[up_extra]:
                del x[up_extra]
            s[up_short] -= 1
            _wrong_uplink(ctx, link, up_short, len(have[lower].get(up_short, ())),
                          need[lower][up_short], len(have[lower][up_extra]),
                          need[lower].get(up_extra, 0))
    _judge_missing_uplinks(ctx, lower, {u: n for u, n in s.items() if n}, need, have,
                           planned_ports)
    for up, links in sorted(x.items()):
        for link in links:
            _unexpected(ctx, link, f"{lower} already has the {need[lower].get(up, 0)} "
                        f"planned links to {up}" if need[lower].get(up) else
                        f"the plan has no link {lower} <-> {up}")


def _judge_missing_uplinks(ctx: _Ctx, lower: str, missing: dict[str, int],
                           need: dict[str, Counter[str]], have: dict[str, dict[str, list[_Link]]],
                           planned_ports: dict[tuple[str, str], list[int]]) -> None:
    """Links still missing once moved cables are accounted for: one finding for a switch
    with none of its uplinks, else one per upper switch, naming a free planned port."""
    plan = ctx.plan
    planned = ctx.planned
    label = plan.port_label
    total = sum(need[lower].values())
    if missing and sum(missing.values()) == total > 1:
        ctx.add("missing-link", lower,
                f"none of the {total} uplinks of {ctx.role(lower)} is up",
                f"check {lower}'s uplink cables and the switches above it",
                switch=lower, rail=planned[lower].rail)
        return
    for up, n in sorted(missing.items()):
        n_got = len(have[lower].get(up, ()))
        empty = _free_planned_ports(ctx, lower, planned_ports[(lower, up)]) or \
            _free_planned_ports(ctx, lower, sorted(
                p for (lo, _u), ps in planned_ports.items() if lo == lower for p in ps))
        hint = f" (planned in {_ports(plan, lower, empty)})" if empty else ""
        ctx.add("missing-link", f"{lower} -> {up}",
                f"{lower} has {n_got} of the {need[lower][up]} planned links to {up}: "
                f"{_plural(n, 'link')} missing{hint}",
                f"reseat or replace {_plural(n, 'cable')} {lower} <-> {up}" + (
                    f", e.g. {label(lower, empty[0])}" if empty else "")
                + " (a port down on either end looks the same)",
                switch=lower, port=empty[0] if empty else None,
                cage=plan.cage(empty[0]) if empty else None, rail=planned[lower].rail,
                cable=f"{lower} <-> {up}")


def _judge_slow_links(ctx: _Ctx, slow: list[_Link]) -> None:
    """Links below fabric.link_gbps: one finding when all are (the site file's rate is wrong),
    else one per link."""
    plan = ctx.plan
    want = plan.link_gbps
    label = plan.port_label
    if slow and len(slow) == len(plan.switch_links) > 10:
        rates = sorted({lk.port.rate for lk in slow})
        ctx.add("degraded-link", "all switch links",
                f"all {len(slow)} switch-to-switch links run at {', '.join(rates)}, below "
                f"fabric.link_gbps = {want}", "set fabric.link_gbps if that is the real rate")
        return
    for lk in slow:
        p = lk.port
        a, b = label(lk.lower, lk.lport), label(lk.upper, lk.uport)
        ctx.add("degraded-link", a,
                f"{a} -> {b} runs at {p.rate} ({p.gbps:g} Gb/s), planned {speed_name(want)} "
                f"({want} Gb/s)", f"reseat or replace the cable/transceiver {a} <-> {b}",
                switch=lk.lower, port=lk.lport, cage=plan.cage(lk.lport),
                rail=ctx.planned[lk.lower].rail, cable=f"{a} <-> {b}")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _ports(plan: object, switch: str, ports: list[int]) -> str:
    shown = ", ".join(str(p) for p in ports[:4]) + (" ..." if len(ports) > 4 else "")
    return f"{switch} port{'s' if len(ports) > 1 else ''} {shown}"


def _free_planned_ports(ctx: _Ctx, lower: str, ports: list[int]) -> list[int]:
    """Planned lower ports of these links that carry nothing now (where a cable would go)."""
    sw = ctx.to_fabric.get(lower)
    used = sw.ports if sw is not None else {}
    return [p for p in ports if p not in used]


def _wrong_uplink(ctx: _Ctx, link: _Link, up_short: str, n_short: int, need_short: int,
                  n_extra: int, need_extra: int) -> None:
    plan = ctx.plan
    got_sw = ctx.planned.get(link.upper)
    exp_sw = ctx.planned[up_short]
    cross = (got_sw is not None and got_sw.group != exp_sw.group
             and plan.spine_groups == "per_rail")
    why = " — it crosses rail groups, so rail traffic leaves its rail" if cross else ""
    a, b = plan.port_label(link.lower, link.lport), plan.port_label(link.upper, link.uport)
    ctx.add("wrong-uplink", a,
            f"{link.lower} has {n_short} of {need_short} planned links to {up_short} and "
            f"{n_extra} (planned {need_extra}) to {link.upper}: the cable {a} <-> {b} belongs "
            f"on {up_short}{why}",
            f"move the upper end of the cable at {a} from {b} to a free port of {up_short}",
            switch=link.lower, port=link.lport, cage=plan.cage(link.lport),
            rail=ctx.planned[link.lower].rail, cable=f"{a} <-> {b}")


def _unexpected(ctx: _Ctx, link: _Link, why: str) -> None:
    plan = ctx.plan
    a, b = plan.port_label(link.lower, link.lport), plan.port_label(link.upper, link.uport)
    ctx.add("unexpected-link", a, f"{a} is cabled to {b}, which the plan does not have: {why}",
            "unplug it, or fix the plan if the cable is intended",
            switch=link.lower, port=link.lport, cage=plan.cage(link.lport),
            rail=ctx.planned[link.lower].rail, cable=f"{a} <-> {b}")


def _swaps(ctx: _Ctx, short: dict[str, dict[str, int]],
           extra: dict[str, dict[str, list[_Link]]],
           planned_ports: dict[tuple[str, str], list[int]]) -> None:
    """Two lower switches that each hold a cable the other one lacks: one crossed pair."""
    # (wants, has) -> lower switches with a link on `has` that belongs on `wants`.
    offers: dict[tuple[str, str], list[str]] = defaultdict(list)
    for lower in sorted(short):
        for want in sorted(short[lower]):
            for has in sorted(extra.get(lower, {})):
                offers[(want, has)].append(lower)
    plan = ctx.plan
    for (want, has), lowers in sorted(offers.items()):
        if want >= has:
            continue
        partners = offers.get((has, want), [])
        for l1 in lowers:
            for l2 in partners:
                if l1 == l2 or not _can(short, extra, l1, want, has) \
                        or not _can(short, extra, l2, has, want):
                    continue
                k1 = _take(short, extra, l1, want, has, planned_ports[(l1, want)])
                k2 = _take(short, extra, l2, has, want, planned_ports[(l2, has)])
                a1, a2 = plan.port_label(k1.lower, k1.lport), plan.port_label(k2.lower, k2.lport)
                b1, b2 = plan.port_label(k1.upper, k1.uport), plan.port_label(k2.upper, k2.uport)
                ctx.add("swapped-cables", f"{a1} / {a2}",
                        f"the uplinks {a1} <-> {b1} and {a2} <-> {b2} are crossed: {l1} "
                        f"belongs on {want} and {l2} on {has}",
                        f"swap the cables in {b1} and {b2}",
                        switch=l1, port=k1.lport, cage=plan.cage(k1.lport),
                        rail=ctx.planned[l1].rail, cable=f"{a1} <-> {b1}")
                break


def _pick(links: list[_Link], ports: list[int]) -> _Link:
    """The surplus link to blame: one in a port the plan gives the short upper switch (the
    cable that moved), else the last one."""
    want = set(ports)
    for i, link in enumerate(links):
        if link.lport in want:
            return links.pop(i)
    return links.pop()


def _can(short: dict[str, dict[str, int]], extra: dict[str, dict[str, list[_Link]]],
         lower: str, want: str, has: str) -> bool:
    return short.get(lower, {}).get(want, 0) > 0 and bool(extra.get(lower, {}).get(has))


def _take(short: dict[str, dict[str, int]], extra: dict[str, dict[str, list[_Link]]],
          lower: str, want: str, has: str, ports: list[int]) -> _Link:
    short[lower][want] -= 1
    if not short[lower][want]:
        del short[lower][want]
    link = _pick(extra[lower][has], ports)
    if not extra[lower][has]:
        del extra[lower][has]
    return link
