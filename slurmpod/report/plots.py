"""Plots of the HTML reports as inline SVG, written directly (no plotting library).

Why not matplotlib: importing it costs ~0.75 s of CPU on a login node before the first figure,
more than the whole fleet report of 10,000 jobs takes (docs/report.md, *Benchmark*); an SVG of a
few hundred elements is built in milliseconds, stays sharp at any zoom, and its text can be
selected and searched. Each function returns one `<svg>` element as a string (or None when there
is nothing to draw); every piece of text in it is XML-escaped here, because the templates insert
these strings unescaped. Colours are fixed per meaning (the Chromium test looks for them).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

from slurmpod.report.fleet import FleetReport
from slurmpod.report.model import LOSS_CAUSES, JobReport, finite

MFU_COLOUR = "#1d3557"
STEP_COLOUR = "#e76f51"
HIST_COLOUR = "#457b9d"
PLACED_COLOUR = "#2a9d8f"
RESTART_COLOUR = "#e63946"
PEAK_COLOUR = "#6c757d"
BAND_COLOUR = "#d8f3dc"
POWER_RGB = (181, 23, 158)  # #b5179e: the power heatmap, a colour no other plot uses
CAUSE_COLOURS = {"startup": "#f4a261", "checkpoint": PLACED_COLOUR, "restarts": RESTART_COLOUR,
                 "other": "#8d99ae"}
END_COLOURS = {"completed": PLACED_COLOUR, "running": MFU_COLOUR, "timelimit": "#f4a261",
               "preempted": "#9d4edd", "requeued": "#9d4edd", "cancelled": "#8d99ae",
               "node_fail": RESTART_COLOUR, "failure": RESTART_COLOUR, "unknown": "#adb5bd"}
MAX_MAP_SUS = 16
MAX_HEAT_ROWS = 64
MAX_HEAT_COLS = 120
W = 900  # viewBox width of every plot; the page scales it to its column


# --- numbers on axes -----------------------------------------------------------------------

def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About n round tick values covering [lo, hi] (1, 2, 2.5, 5 × 10^k steps)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step + 1e-9) * step
    out = []
    k = 0
    while first + k * step <= hi + step * 1e-6 and k < 50:
        out.append(round(first + k * step, 12))
        k += 1
    return [t for t in out if t >= lo - step * 1e-6]


def tick_label(v: float | None) -> str:
    """An axis label without scientific notation: 64000 -> 64k, 1500000 -> 1.5M, 0.25 -> 0.25."""
    if v is None or not math.isfinite(v):
        return ""
    v = float(v)
    a = abs(v)
    if a >= 1e4 or (a >= 1e3 and (v / 1e3).is_integer()):
        div, suffix = next(d for d in ((1e9, "G"), (1e6, "M"), (1e3, "k")) if a >= d[0])
        return _positional(v / div) + suffix
    return _positional(v)


def _positional(v: float, sig: int = 4) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 10 ** sig:
        return f"{round(v):,}"
    decimals = max(0, sig - 1 - math.floor(math.log10(abs(v))))
    s = f"{v:,.{min(decimals, 9)}f}"
    return s.rstrip("0").rstrip(".") if "." in s else s


def _t(s: Any) -> str:
    return escape(str(s), quote=True)


_f = finite  # one reading of JSON numbers for the report (report.model)


class _Frame:
    """One plot area: data ranges mapped onto a box of the SVG's viewBox."""

    def __init__(self, x0: float, x1: float, y0: float, y1: float, *, left: float = 64,
                 top: float = 30, width: float = W - 64 - 24, height: float = 190) -> None:
        self.x0, self.x1 = x0, (x1 if x1 > x0 else x0 + 1)
        self.y0, self.y1 = y0, (y1 if y1 > y0 else y0 + 1)
        self.left, self.top, self.width, self.height = left, top, width, height

    def x(self, v: float) -> float:
        return self.left + (v - self.x0) / (self.x1 - self.x0) * self.width

    def y(self, v: float) -> float:
        return self.top + self.height - (v - self.y0) / (self.y1 - self.y0) * self.height

    def axes(self, out: list[str], xlabel: str, ylabel: str, *, xticks: bool = True,
             yfmt: Any = tick_label) -> None:
        b = self.top + self.height
        for t in nice_ticks(self.y0, self.y1, 5):
            y = self.y(t)
            out.append(f'<line x1="{self.left}" x2="{self.left + self.width}" y1="{y:.1f}" '
                       f'y2="{y:.1f}" stroke="#e9ecef"/>')
            out.append(f'<text x="{self.left - 6}" y="{y + 4:.1f}" text-anchor="end">'
                       f'{_t(yfmt(t))}</text>')
        if xticks:
            for t in nice_ticks(self.x0, self.x1, 6):
                x = self.x(t)
                out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{b}" y2="{b + 4}" '
                           'stroke="#495057"/>')
                out.append(f'<text x="{x:.1f}" y="{b + 17}" text-anchor="middle">'
                           f'{_t(tick_label(t))}</text>')
        out.append(f'<rect x="{self.left}" y="{self.top}" width="{self.width}" '
                   f'height="{self.height}" fill="none" stroke="#adb5bd"/>')
        out.append(f'<text x="{self.left + self.width / 2}" y="{b + 34}" '
                   f'text-anchor="middle">{_t(xlabel)}</text>')
        cy = self.top + self.height / 2
        out.append(f'<text x="14" y="{cy}" text-anchor="middle" '
                   f'transform="rotate(-90 14 {cy})">{_t(ylabel)}</text>')


def _svg(pid: str, title: str, height: float, body: list[str]) -> str:
    return (f'<svg id="{_t(pid)}" class="plot" '
            f'viewBox="0 0 {W} {height:.0f}" role="img" aria-label="{_t(title)}" '
            f'font-family="system-ui, sans-serif" font-size="12" fill="#212529">'
            f'<title>{_t(title)}</title>'
            f'<text x="{W / 2}" y="16" text-anchor="middle" font-weight="600" '
            f'font-size="13">{_t(title)}</text>' + "".join(body) + "</svg>")


def _legend(out: list[str], items: Sequence[tuple[str, str]], y: float,
            x: float = 64) -> None:
    for label, colour in items:
        out.append(f'<rect x="{x:.0f}" y="{y - 9}" width="12" height="10" fill="{colour}"/>')
        out.append(f'<text x="{x + 16:.0f}" y="{y}">{_t(label)}</text>')
        x += 30 + 7 * len(label)


def _segments(it: Sequence[Any], seg: Sequence[Any]) -> list[tuple[int, int]]:
    """Index ranges of one launch each: a relaunch resumes from an earlier checkpoint, so its
    iterations overlap the previous launch's (redone work); joining them would zigzag."""
    parts: list[tuple[int, int]] = []
    start = 0
    for k in range(1, len(it) + 1):
        if k == len(it) or seg[k] != seg[k - 1]:
            parts.append((start, k))
            start = k
    return parts


def _path(fr: _Frame, xs: Sequence[Any], ys: Sequence[float | None]) -> str:
    """An SVG path through the finite points; a missing value breaks the line."""
    d: list[str] = []
    pen = False
    for x, y in zip(xs, ys, strict=False):
        fx, fy = _f(x), _f(y)
        if fx is None or fy is None:
            pen = False
            continue
        d.append(f"{'L' if pen else 'M'}{fr.x(fx):.1f},{fr.y(fy):.1f}")
        pen = True
    return "".join(d)


def mfu_over_run(series: Mapping[str, Sequence[Any]], peak: float | None = None, *,
                 band: tuple[float, float, str] | None = None) -> str | None:
    """MFU (%) against the iteration: the 100 % line (the site's peak), the typical band, one
    line per launch, restarts dashed. TFLOP/s per GPU when the job has no peak."""
    it = list(series.get("iter") or [])
    key = "mfu" if series.get("mfu") else "tflops" if series.get("tflops") else None
    if len(it) < 2 or key is None or len(series[key]) != len(it):
        return None
    scale = 100.0 if key == "mfu" else 1.0
    ys = [None if _f(v) is None else _f(v) * scale for v in series[key]]  # type: ignore[operator]
    finite = [v for v in ys if v is not None]
    if not finite:
        return None
    top = max(max(finite), 100.0) * 1.05 if key == "mfu" else max(finite) * 1.15
    fr = _Frame(min(it), max(it), 0.0, top)
    out: list[str] = []
    if key == "mfu" and band is not None:
        lo, hi, _ = band
        out.append(f'<rect class="band" x="{fr.left}" y="{fr.y(100 * hi):.1f}" '
                   f'width="{fr.width}" height="{fr.y(100 * lo) - fr.y(100 * hi):.1f}" '
                   f'fill="{BAND_COLOUR}"/>')
    fr.axes(out, "iteration", "MFU (%)" if key == "mfu" else "TFLOP/s per GPU")
    if key == "mfu":
        y = fr.y(100.0)
        out.append(f'<line class="peak" x1="{fr.left}" x2="{fr.left + fr.width}" y1="{y:.1f}" '
                   f'y2="{y:.1f}" stroke="{PEAK_COLOUR}" stroke-width="1.5" '
                   'stroke-dasharray="6 3"/>')
        label = f"100 % = peak {tick_label(peak)} TFLOP/s per GPU" if peak else "100 % = peak"
        out.append(f'<text x="{fr.left + fr.width - 4}" y="{y - 4:.1f}" text-anchor="end" '
                   f'fill="{PEAK_COLOUR}">{_t(label)}</text>')
    seg = list(series.get("segment") or [0] * len(it))
    parts = _segments(it, seg)
    for n, (a, b) in enumerate(parts):
        op = "1" if n == len(parts) - 1 else "0.55"
        out.append(f'<path d="{_path(fr, it[a:b], ys[a:b])}" fill="none" stroke="{MFU_COLOUR}" '
                   f'stroke-width="1.6" stroke-opacity="{op}"/>')
        if n > 0:
            x = fr.x(it[a])
            out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{fr.top}" '
                       f'y2="{fr.top + fr.height}" stroke="{RESTART_COLOUR}" '
                       'stroke-dasharray="4 3"/>')
    items = [("MFU" if key == "mfu" else "TFLOP/s per GPU", MFU_COLOUR)]
    if key == "mfu" and band is not None:
        items.append((band[2], BAND_COLOUR))
    if len(parts) > 1:
        items.append(("restart", RESTART_COLOUR))
    _legend(out, items, fr.top + fr.height + 56)
    title = "MFU over the run" if key == "mfu" else "Model TFLOP/s per GPU over the run"
    return _svg("plot-mfu", title, fr.top + fr.height + 66, out)


def step_time(series: Mapping[str, Sequence[Any]], spike_factor: float) -> str | None:
    """Iteration (step) time against the iteration; the spike threshold dashed."""
    it = list(series.get("iter") or [])
    ms = [_f(v) for v in series.get("iter_ms") or []]
    finite = sorted(v for v in ms if v is not None)
    if len(it) < 2 or len(ms) != len(it) or len(finite) < 2:
        return None
    steady = [v for v, s in zip(ms, series.get("steady") or [True] * len(ms), strict=False)
              if s and v is not None]
    med = sorted(steady)[len(steady) // 2] if steady else finite[len(finite) // 2]
    # Scale to the bulk of the run, not to the first iteration's compile/warm-up outlier.
    p98 = finite[min(len(finite) - 1, int(0.98 * len(finite)))]
    top = max(p98, med * spike_factor) * 1.15
    fr = _Frame(min(it), max(it), 0.0, top)
    out: list[str] = []
    fr.axes(out, "iteration", "step time (ms)")
    clipped = [None if v is None else min(v, top) for v in ms]
    seg = list(series.get("segment") or [0] * len(it))
    for a, b in _segments(it, seg):
        out.append(f'<path d="{_path(fr, it[a:b], clipped[a:b])}" fill="none" '
                   f'stroke="{STEP_COLOUR}" stroke-width="1.4"/>')
    y = fr.y(med * spike_factor)
    out.append(f'<line x1="{fr.left}" x2="{fr.left + fr.width}" y1="{y:.1f}" y2="{y:.1f}" '
               f'stroke="{RESTART_COLOUR}" stroke-dasharray="5 3"/>')
    _legend(out, [("step time", STEP_COLOUR),
                  (f"spike threshold ({spike_factor:g} × median {tick_label(med)} ms)",
                   RESTART_COLOUR)], fr.top + fr.height + 56)
    return _svg("plot-step", "Step time over the run", fr.top + fr.height + 66, out)


def iteration_histogram(series: Mapping[str, Sequence[Any]], spike_factor: float) -> str | None:
    ms = sorted(v for v, s in zip((_f(x) for x in series.get("iter_ms") or []),
                                  series.get("steady") or [], strict=False)
                if s and v is not None)
    if len(ms) < 2:
        return None
    med = ms[len(ms) // 2]
    lo, hi = ms[0], max(ms[-1], med * spike_factor)
    n_bins = min(50, max(5, len(ms) // 3))
    width = (hi - lo) / n_bins or 1.0
    counts = [0] * n_bins
    for v in ms:
        counts[min(n_bins - 1, int((v - lo) / width))] += 1
    fr = _Frame(lo, lo + width * n_bins, 0.0, max(counts) * 1.1, height=150)
    out: list[str] = []
    fr.axes(out, "step time (ms), steady state", "records")
    bw = fr.width / n_bins
    for k, c in enumerate(counts):
        if c:
            y = fr.y(c)
            out.append(f'<rect x="{fr.x(lo + k * width):.1f}" y="{y:.1f}" '
                       f'width="{max(bw - 1, 1):.1f}" height="{fr.top + fr.height - y:.1f}" '
                       f'fill="{HIST_COLOUR}"/>')
    x = fr.x(min(med * spike_factor, fr.x1))
    out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{fr.top}" y2="{fr.top + fr.height}" '
               f'stroke="{RESTART_COLOUR}" stroke-dasharray="5 3"/>')
    return _svg("plot-hist", "Step-time histogram (dashed: spike threshold)",
                fr.top + fr.height + 44, out)


def attempts_timeline(rows: Sequence[Mapping[str, Any]], t0: float) -> str | None:
    """Queue and run time of each attempt on one axis: one bar per attempt, coloured by how it
    ended. `rows`: {"label", "submit", "start", "end" (epoch seconds), "end_kind" (a key of
    END_COLOURS), "end_text" (words for the legend)}."""
    rows = [r for r in rows if _f(r.get("start")) is not None]
    if not rows:
        return None
    ends = [_f(r.get("end")) or _f(r.get("start")) for r in rows]
    span_s = max(e for e in ends if e is not None) - t0
    unit, div = (("hours", 3600.0) if span_s > 3 * 3600 else ("minutes", 60.0)
                 if span_s > 180 else ("seconds", 1.0))
    row_h = 24
    fr = _Frame(0.0, max(span_s / div, 1e-9), 0.0, 1.0, left=90, height=row_h * len(rows))
    out: list[str] = []
    fr.axes(out, f"{unit} since submission", "", yfmt=lambda _: "")
    for k, r in enumerate(rows):
        y = fr.top + k * row_h + 4
        sub = _f(r.get("submit"))
        st = float(r["start"])
        en = _f(r.get("end")) or st
        if sub is not None and st > sub:
            out.append(f'<rect x="{fr.x((sub - t0) / div):.1f}" y="{y}" '
                       f'width="{max(fr.x((st - t0) / div) - fr.x((sub - t0) / div), 0.5):.1f}" '
                       f'height="{row_h - 8}" fill="#dee2e6"/>')
        colour = END_COLOURS.get(str(r.get("end_kind")), END_COLOURS["unknown"])
        out.append(f'<rect class="attempt" x="{fr.x((st - t0) / div):.1f}" y="{y}" '
                   f'width="{max(fr.x((en - t0) / div) - fr.x((st - t0) / div), 1.5):.1f}" '
                   f'height="{row_h - 8}" fill="{colour}"><title>{_t(r.get("label", ""))}: '
                   f'{_t(r.get("end_text", ""))}</title></rect>')
        out.append(f'<text x="{fr.left - 6}" y="{y + 12}" text-anchor="end">'
                   f'{_t(r.get("label", ""))}</text>')
    kinds = dict.fromkeys((str(r.get("end_kind")), str(r.get("end_text", ""))) for r in rows)
    _legend(out, [("queued", "#dee2e6")]
            + [(text, END_COLOURS.get(k, END_COLOURS["unknown"])) for k, text in kinds],
            fr.top + fr.height + 56, x=90)
    return _svg("plot-attempts", "Attempts: queued and running, coloured by how each ended",
                fr.top + fr.height + 66, out)


def placement_map(r: JobReport) -> str | None:
    """The site's SUs and racks as columns of node cells; the job's nodes filled."""
    p = r.placement
    if p is None or not p.site_sus:
        return None
    mine: dict[str, set[int]] = {}
    for n in p.nodes:
        mine.setdefault(n.rack, set()).add(n.slot)
    sizes = dict(p.rack_sizes)
    sus = list(p.site_sus)
    if len(sus) > MAX_MAP_SUS:
        sus = [s for s in sus if s[0] in set(p.sus)]
    height = max(sizes.values()) if sizes else 1
    n_racks = sum(len(racks) for _, racks in sus)
    cell = max(6.0, min(22.0, (W - 40) / max(n_racks + 0.7 * len(sus), 1)))
    out: list[str] = []
    x = 20.0
    top = 30.0
    for su, racks in sus:
        x0 = x
        for rack in racks:
            used = mine.get(rack, set())
            for slot in range(sizes.get(rack, 0)):
                fill = PLACED_COLOUR if slot in used else "#e9ecef"
                out.append(f'<rect x="{x:.1f}" y="{top + (height - 1 - slot) * cell:.1f}" '
                           f'width="{cell * 0.85:.1f}" height="{cell * 0.85:.1f}" '
                           f'fill="{fill}" stroke="#6c757d" stroke-width="0.5"/>')
            x += cell
        weight = "700" if su in p.sus else "400"
        out.append(f'<text x="{(x0 + x - cell * 0.15) / 2:.1f}" y="{top + height * cell + 14:.1f}"'
                   f' text-anchor="middle" font-size="11" font-weight="{weight}">{_t(su)}</text>')
        x += cell * 0.7
    title = (f"Placement: {len(p.sus)} SU(s), fewest possible {p.min_sus}; {len(p.racks)} "
             f"rack(s), fewest possible {p.min_racks} (filled: this job's nodes; columns: racks)")
    return _svg("plot-placement", title, top + height * cell + 24, out)


def heatmap(pid: str, title: str, rows: Sequence[str], t: Sequence[float],
            values: Sequence[Sequence[float | None]], *, vmax: float, unit: str,
            colour: tuple[int, int, int] = (29, 53, 87)) -> str | None:
    """Rows (nodes or GPUs) × time cells, darker = higher; white = not measured. Long series
    are averaged into at most MAX_HEAT_COLS columns, many rows cut to MAX_HEAT_ROWS."""
    rows = list(rows)[:MAX_HEAT_ROWS]
    if not rows or len(t) < 1 or vmax <= 0:
        return None
    n = len(t)
    cols = min(n, MAX_HEAT_COLS)
    row_h = max(8, min(18, 360 // len(rows)))
    left, width = 110, W - 110 - 80
    top = 30
    cw = width / cols
    out: list[str] = []
    for k, name in enumerate(rows):
        vals = list(values[k]) if k < len(values) else []
        y = top + k * row_h
        out.append(f'<text x="{left - 6}" y="{y + row_h - 4}" text-anchor="end" '
                   f'font-size="{min(11, row_h - 1)}">{_t(name)}</text>')
        for c in range(cols):
            a, b = c * n // cols, max((c + 1) * n // cols, c * n // cols + 1)
            got = [v for v in (_f(x) for x in vals[a:b]) if v is not None]
            if not got:
                continue
            level = min(max(sum(got) / len(got) / vmax, 0.0), 1.0)
            rgb = tuple(round(255 - (255 - ch) * (0.08 + 0.92 * level)) for ch in colour)
            out.append(f'<rect x="{left + c * cw:.1f}" y="{y}" width="{cw + 0.3:.1f}" '
                       f'height="{row_h - 1}" fill="rgb{rgb}"/>')
    b = top + len(rows) * row_h
    t0, t1 = float(t[0]), float(t[-1])
    fr = _Frame(0.0, max((t1 - t0) / 60.0, 1e-9), 0, 1, left=left, top=top, width=width,
                height=b - top)
    for tick in nice_ticks(fr.x0, fr.x1, 6):
        out.append(f'<text x="{fr.x(tick):.1f}" y="{b + 15}" text-anchor="middle">'
                   f'{_t(tick_label(tick))}</text>')
    out.append(f'<text x="{left + width / 2}" y="{b + 31}" text-anchor="middle">'
               'minutes since the first sample</text>')
    for k in range(5):  # colour scale
        level = k / 4
        rgb = tuple(round(255 - (255 - ch) * (0.08 + 0.92 * level)) for ch in colour)
        out.append(f'<rect x="{left + width + 14}" y="{top + (4 - k) * 14}" width="14" '
                   f'height="14" fill="rgb{rgb}"/><text x="{left + width + 32}" '
                   f'y="{top + (4 - k) * 14 + 11}" font-size="10">'
                   f'{_t(tick_label(vmax * level))}</text>')
    out.append(f'<text x="{left + width + 14}" y="{top + 84}" font-size="10">{_t(unit)}</text>')
    return _svg(pid, title, b + 40, out)


def fleet_mfu_distribution(fl: FleetReport) -> str | None:
    bins = list(fl.mfu_hist)
    if not any(n for _, n, _ in bins):
        return None
    hmax = max(h for _, _, h in bins) or 1.0
    top_edge = max(100.0 * (bins[-1][0] + 0.05), 100.0)
    fr = _Frame(0.0, top_edge, 0.0, hmax * 1.1, height=160)
    out: list[str] = []
    fr.axes(out, "MFU (%)", "GPU-hours")
    for lo, _, h in bins:
        if h > 0:
            y = fr.y(h)
            out.append(f'<rect x="{fr.x(100 * lo) + 1:.1f}" y="{y:.1f}" '
                       f'width="{fr.x(100 * lo + 5) - fr.x(100 * lo) - 2:.1f}" '
                       f'height="{fr.top + fr.height - y:.1f}" fill="{HIST_COLOUR}"/>')
    if fl.total.mfu is not None:
        x = fr.x(100 * fl.total.mfu)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{fr.top}" y2="{fr.top + fr.height}" '
                   f'stroke="{RESTART_COLOUR}" stroke-dasharray="5 3"/>')
        _legend(out, [(f"GPU-hour-weighted MFU {100 * fl.total.mfu:.1f} %", RESTART_COLOUR)],
                fr.top + fr.height + 56)
    return _svg("plot-fleet-mfu", "MFU distribution (GPU-hours per 5 % bin)",
                fr.top + fr.height + 66, out)


def fleet_lost_over_time(fl: FleetReport) -> str | None:
    if not fl.lost_over_time:
        return None
    labels = [t for t, _ in fl.lost_over_time]
    totals = [sum(c.get(k, 0.0) for k in LOSS_CAUSES) for _, c in fl.lost_over_time]
    fr = _Frame(0.0, float(len(labels)), 0.0, (max(totals) or 1.0) * 1.1, height=160)
    out: list[str] = []
    fr.axes(out, "", "lost GPU-hours", xticks=False)
    bw = fr.width / len(labels)
    every = max(1, math.ceil(len(labels) / 12))
    for k, (label, causes) in enumerate(fl.lost_over_time):
        base = 0.0
        for cause in LOSS_CAUSES:
            v = causes.get(cause, 0.0)
            if v > 0:
                y1, y0 = fr.y(base + v), fr.y(base)
                out.append(f'<rect x="{fr.left + k * bw + 1:.1f}" y="{y1:.1f}" '
                           f'width="{max(bw - 2, 1):.1f}" height="{y0 - y1:.1f}" '
                           f'fill="{CAUSE_COLOURS[cause]}"/>')
            base += v
        if k % every == 0:
            out.append(f'<text x="{fr.left + (k + 0.5) * bw:.1f}" y="{fr.top + fr.height + 15}"'
                       f' text-anchor="middle" font-size="10">{_t(label)}</text>')
    _legend(out, [(c, CAUSE_COLOURS[c]) for c in LOSS_CAUSES], fr.top + fr.height + 56)
    return _svg("plot-fleet-lost", f"Lost GPU-hours by cause, per {fl.bucket}",
                fr.top + fr.height + 66, out)
