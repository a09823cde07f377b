"""matplotlib figures for the HTML reports, returned as `data:image/png;base64,...` URIs so the
HTML file is self-contained (no network, no side files). matplotlib is imported lazily with
the Agg backend (no display needed); `slurmpod report` without `--html` never loads it.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

from slurmpod.report.fleet import FleetReport
from slurmpod.report.model import LOSS_CAUSES, JobReport

DPI = 90
CAUSE_COLOURS = {"startup": "#f4a261", "checkpoint": "#2a9d8f", "restarts": "#e63946",
                 "other": "#8d99ae"}
MAX_MAP_SUS = 16


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _uri(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    _plt().close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _finite(xs: Sequence[Any]) -> list[float]:
    return [float("nan") if x is None else float(x) for x in xs]


def mfu_over_run(series: Mapping[str, Sequence[Any]], peak: float | None) -> str | None:
    """MFU (or TFLOP/s) and iteration time against the iteration number; restarts marked."""
    it = series.get("iter") or []
    ms = series.get("iter_ms") or []
    if len(it) < 2 or len(ms) != len(it):
        return None
    plt = _plt()
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(9, 5), sharex=True)
    seg = list(series.get("segment") or [0] * len(it))
    # One line per launch: a relaunch resumes from an earlier checkpoint, so its iterations
    # overlap the previous launch's (those were redone); joining them would zigzag.
    parts: list[tuple[int, int]] = []
    start = 0
    for k in range(1, len(it) + 1):
        if k == len(it) or seg[k] != seg[k - 1]:
            parts.append((start, k))
            start = k
    top_key = "mfu" if series.get("mfu") else "tflops" if series.get("tflops") else None
    top = _finite(series[top_key]) if top_key else []
    if top_key == "mfu":
        top = [100 * v for v in top]
    for n, (a, b) in enumerate(parts):
        alpha = 1.0 if n == len(parts) - 1 else 0.55
        label = f"launch {n + 1}" if len(parts) > 1 else None
        if top:
            ax1.plot(it[a:b], top[a:b], color="#1d3557", lw=1.2, alpha=alpha, label=label)
        ax2.plot(it[a:b], _finite(ms[a:b]), color="#e76f51", lw=1.3, alpha=alpha)
        if n > 0:
            for ax in (ax1, ax2):
                ax.axvline(it[a], color="#e63946", ls="--", lw=1)
    if top_key is None:
        ax1.text(0.5, 0.5, "no FLOPs figure for this job", ha="center", transform=ax1.transAxes)
    ax1.set_ylabel("MFU (%)" if top_key == "mfu" else "TFLOP/s per GPU")
    if len(parts) > 1 and top:
        ax1.legend(fontsize=8)
    ax2.set_ylabel("iteration time (ms)")
    ax2.set_xlabel("iteration")
    ax1.set_title("MFU and iteration time over the run (dashed: restart)")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    return _uri(fig)


def iteration_histogram(series: Mapping[str, Sequence[Any]], spike_factor: float) -> str | None:
    ms = [v for v, s in zip(_finite(series.get("iter_ms") or []),
                            series.get("steady") or [], strict=False) if s and math.isfinite(v)]
    if len(ms) < 2:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3))
    ax.hist(ms, bins=min(50, max(5, len(ms) // 3)), color="#457b9d")
    med = sorted(ms)[len(ms) // 2]
    ax.axvline(med * spike_factor, color="#e63946", ls="--", lw=1,
               label=f"{spike_factor:g}x median (spike)")
    ax.set_xlabel("iteration time (ms), steady state")
    ax.set_ylabel("records")
    ax.legend()
    ax.set_title("Iteration-time histogram")
    return _uri(fig)


def timeline(r: JobReport) -> str | None:
    """Queue, start-up, training, checkpoints and restarts on one time axis."""
    j = r.job
    attempts = [a for a in r.attempts if a.start_s] or []
    first_submit = r.attempts[0].submit_s if r.attempts and r.attempts[0].submit_s else None
    if first_submit is None and j.submit_time is None:
        return None
    t0 = float(first_submit) if first_submit else j.submit_time.timestamp()
    if not attempts and j.start_time is not None:
        end = j.end_time.timestamp() if j.end_time else j.start_time.timestamp() + j.elapsed_s
        attempts = [type("A", (), {"start_s": j.start_time.timestamp(), "end_s": end})()]
    if not attempts:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 1.9))
    first = attempts[0].start_s - t0
    ax.barh(0, first, left=0, color="#adb5bd", label="queue")
    ttfi = r.figures.ttfi_s if r.figures.ttfi_s and r.figures.ttfi_s > 0 else 0.0
    for k, a in enumerate(attempts):
        s = a.start_s - t0
        e = (a.end_s or (a.start_s + j.elapsed_s)) - t0
        if k > 0:
            prev_end = (attempts[k - 1].end_s or a.start_s) - t0
            ax.barh(0, s - prev_end, left=prev_end, color="#adb5bd")
            ax.axvline(s, color="#e63946", ls="--", lw=1)
        su = min(ttfi, e - s) if k == 0 else 0.0
        ax.barh(0, su, left=s, color=CAUSE_COLOURS["startup"], label="start-up" if k == 0
                else None)
        ax.barh(0, e - s - su, left=s + su, color="#1d3557",
                label="training" if k == 0 else None)
    # Checkpoints: iteration -> time through the series clock (log times, relative).
    it, ts = r.series.get("iter") or [], r.series.get("t") or []
    pts = [(i, t) for i, t in zip(it, ts, strict=False) if t is not None]
    if r.figures.checkpoints and len(pts) >= 2 and ttfi:
        base = attempts[0].start_s - t0 + ttfi - pts[0][1]
        for n, (ci, dur) in enumerate(r.figures.checkpoints):
            after = next((t for i, t in pts if i >= ci), pts[-1][1])
            ax.barh(0, max(dur, 0.2), left=base + after, color=CAUSE_COLOURS["checkpoint"],
                    label="checkpoint" if n == 0 else None)
    ax.set_yticks([])
    ax.set_xlabel("seconds since submission (dashed: restart)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.55), ncol=4, frameon=False)
    ax.set_title("Job timeline")
    return _uri(fig)


def placement_map(r: JobReport) -> str | None:
    """The site's SUs and racks as columns of node cells; the job's nodes filled."""
    p = r.placement
    if p is None or not p.site_sus:
        return None
    mine = {n.rack: set() for n in p.nodes}
    for n in p.nodes:
        mine[n.rack].add(n.slot)
    sizes = dict(p.rack_sizes)
    sus = list(p.site_sus)
    if len(sus) > MAX_MAP_SUS:
        sus = [s for s in sus if s[0] in set(p.sus)]
    plt = _plt()
    from matplotlib.patches import Rectangle

    n_racks = sum(len(racks) for _, racks in sus)
    height = max(sizes.values()) if sizes else 1
    fig, ax = plt.subplots(figsize=(min(12, 1 + 0.45 * n_racks + 0.3 * len(sus)),
                                    min(6, 1.2 + 0.18 * height)))
    x = 0.0
    for su, racks in sus:
        x0 = x
        for rack in racks:
            for slot in range(sizes.get(rack, 0)):
                used = slot in mine.get(rack, set())
                ax.add_patch(Rectangle((x, slot), 0.9, 0.9,
                                       color="#2a9d8f" if used else "#e9ecef", ec="#6c757d"))
            x += 1
        ax.text((x0 + x - 1) / 2 + 0.45, -1.2, su, ha="center", va="top", fontsize=8,
                fontweight="bold" if su in p.sus else "normal")
        x += 0.6
    ax.set_xlim(-0.3, x)
    ax.set_ylim(-2.2, height + 0.3)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"Placement: {len(p.sus)} SU(s) of min {p.min_sus}, {len(p.racks)} rack(s) of "
                 f"min {p.min_racks} (filled: this job's nodes; columns are racks)", fontsize=9)
    return _uri(fig)


def fleet_mfu_distribution(fl: FleetReport) -> str | None:
    bins = [(lo, n, h) for lo, n, h in fl.mfu_hist]
    if not any(n for _, n, _ in bins):
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3))
    ax.bar([100 * lo for lo, _, _ in bins], [h for _, _, h in bins], width=4.5, align="edge",
           color="#457b9d")
    ax.set_xlabel("MFU (%)")
    ax.set_ylabel("GPU-hours")
    if fl.total.mfu is not None:
        ax.axvline(100 * fl.total.mfu, color="#e63946", ls="--",
                   label=f"weighted MFU {100 * fl.total.mfu:.1f} %")
        ax.legend()
    ax.set_title("MFU distribution (GPU-hours per 5 % bin)")
    return _uri(fig)


def fleet_lost_over_time(fl: FleetReport) -> str | None:
    if not fl.lost_over_time:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 3))
    labels = [t for t, _ in fl.lost_over_time]
    bottom = [0.0] * len(labels)
    for cause in LOSS_CAUSES:
        vals = [c.get(cause, 0.0) for _, c in fl.lost_over_time]
        ax.bar(range(len(labels)), vals, bottom=bottom, color=CAUSE_COLOURS[cause], label=cause)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("lost GPU-hours")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(f"Lost GPU-hours by cause, per {fl.bucket}")
    return _uri(fig)
