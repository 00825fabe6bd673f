"""The plots of ``report.html``: each a PNG drawn with matplotlib's Agg backend, returned as
base64 for the page to embed, and the series they draw.

Apart from :mod:`.report` (the page: headline, metrics table, fairness figures and the HTML)
because drawing is a separate craft: matplotlib figures, axes, ticks and legends, and cutting each
time series to at most ``MAX_POINTS`` points by time-weighted bin means (GPU-hours stay exact), so
the page stays small for any trace. The page decides what to show; this module how it looks.
"""

from __future__ import annotations

import base64
import io
import math

MAX_POINTS = 2000  # per plotted line
MAX_QUEUES = 8
DPI = 90
REASONS = ("capacity", "placement", "policy")  # timeline columns 2, 3, 4
WAIT_TICKS = ((1, "≤1s"), (60, "1m"), (600, "10m"), (3600, "1h"), (86400, "1d"), (604800, "1w"))
WAIT_TICKS += ((2592000, "30d"), (31536000, "1y"))
HOURS = "time since first submit (h)"


def _steps(times, values, end):
    """A piecewise-constant series (each value holds until the next time, the last until
    ``end``) as step-plot points (``where="post"``): as given when short, else the time-weighted
    means of ``MAX_POINTS`` equal bins."""
    import numpy as np

    t, v = np.asarray(times, dtype=float), np.asarray(values, dtype=float)
    end = max(float(end), float(t[-1]))
    if len(t) <= MAX_POINTS or end <= t[0]:
        return np.append(t, end), np.append(v, v[-1])
    bounds = np.append(t, end)
    integral = np.concatenate(([0.0], np.cumsum(v * np.diff(bounds))))
    edges = np.linspace(t[0], end, MAX_POINTS + 1)
    means = np.diff(np.interp(edges, bounds, integral)) / np.diff(edges)
    return edges, np.append(means, means[-1])


def _tracked(tree) -> list:
    """The queues to plot against their guarantees: the top-level ones, at most the 8 largest."""
    queues = [q for q in tree.by_path.values() if q.parent is not None]
    top = [q for q in queues if q.parent.parent is None] or queues
    return sorted(top, key=lambda q: (-q.guaranteed, q.path))[:MAX_QUEUES]


def _usage(result, queues, started: dict) -> tuple[dict, bool]:
    """``{queue path: (times, running GPUs)}`` for ``queues``, and whether it was rebuilt from job
    start and end times (the policy left the sampled usage all zero: no quotas)."""
    import numpy as np

    sampled = {q.path: result.queue_usage.get(q.path) or [] for q in queues}
    if any(gpus for samples in sampled.values() for _, gpus in samples):
        return {p: np.asarray(s, dtype=float).T for p, s in sampled.items() if s}, False
    out = {}
    for queue in queues:
        inside = [i for i, q in enumerate(started["leaves"]) if q and queue in q.chain()]
        mask = np.isin(started["leaf"], inside)
        if not mask.any():
            continue
        times = np.concatenate((started["start"][mask], started["end"][mask]))
        deltas = np.concatenate((started["gpus"][mask], -started["gpus"][mask]))
        order = np.argsort(times, kind="stable")
        times, level = times[order], np.cumsum(deltas[order])
        last = np.append(times[1:] != times[:-1], True)  # the level after each instant
        out[queue.path] = (times[last], level[last])
    return out, True


def _figure(cols: int, height: float = 3.0, sharey: bool = False):
    from matplotlib.figure import Figure  # no pyplot: no global figure list to leak into

    fig = Figure(figsize=(max(6.4, 4.2 * cols), height), layout="constrained")
    return fig, fig.subplots(1, cols, squeeze=False, sharey=sharey).ravel()


def _png(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _empty(ax, what: str) -> None:
    ax.text(0.5, 0.5, f"no {what} recorded", ha="center", va="center", transform=ax.transAxes)


def _label(text: str) -> str:
    return text.replace("$", r"\$").lstrip("_") or "?"  # matplotlib hides labels starting "_"


def plot_waits(names, started, tiers) -> str:
    """The queue-wait CDF per tier of each column ``names`` (its ``started`` arrays: tier and
    wait of the jobs that started, the recorded outcome's too)."""
    import numpy as np
    from matplotlib.ticker import NullLocator

    fig, axes = _figure(max(len(tiers), 1), sharey=True)
    for ax, tier in zip(axes, tiers or [None], strict=True):
        top = 1.0
        for name in names:
            jobs = started[name]
            values = np.sort(np.maximum(jobs["wait"][jobs["tier"] == tier], 1.0))
            if not len(values):
                continue
            pick = np.unique(np.linspace(0, len(values) - 1, MAX_POINTS).astype(int))
            label = f"{_label(name)} ({np.mean(values <= 1.0):.0%} at once)"
            ax.step(values[pick], (pick + 1) / len(values), where="post", label=label)
            top = max(top, values[-1])
        ax.set_xscale("log")
        ax.xaxis.set_minor_locator(NullLocator())
        ticks = [(t, n) for t, n in WAIT_TICKS if t == 1 or t <= top]
        ax.set_xticks([t for t, _ in ticks], [n for _, n in ticks])
        ax.set(title=f"tier {tier} queue wait (CDF)", xlabel="wait (log; 0 shown as 1 s)")
        ax.set(ylabel="fraction of started jobs", ylim=(0, 1.02))
        if ax.lines:
            ax.legend(fontsize=8)
        else:
            _empty(ax, "started jobs")
    return _png(fig)


def plot_allocation(results, gpus, origin) -> str:
    fig, (ax,) = _figure(1)
    for result in results:
        if result.timeline:
            times, allocated = [p[0] for p in result.timeline], [p[1] for p in result.timeline]
            x, y = _steps(times, allocated, result.last_end)
            ax.step((x - origin) / 3600, y, where="post", label=_label(result.policy), lw=1)
    ax.axhline(gpus, color="black", ls="--", lw=1, label=f"cluster GPUs ({gpus:,})")
    ax.set(title="Allocated GPUs over time", xlabel=HOURS, ylabel="allocated GPUs")
    ax.set_ylim(0, gpus * 1.08)
    ax.legend(fontsize=8, loc="lower right")
    if not any(r.timeline for r in results):
        _empty(ax, "timeline")
    return _png(fig)


def plot_pending(results, origin) -> str:
    fig, axes = _figure(len(results), sharey=True)
    for ax, result in zip(axes, results, strict=True):
        ax.set(title=f"{result.policy}: pending GPUs by reason", xlabel=HOURS, ylabel="GPUs")
        if not result.timeline:
            _empty(ax, "timeline")
            continue
        times, low = [p[0] for p in result.timeline], 0.0
        for column, reason in enumerate(REASONS, start=2):
            x, y = _steps(times, [p[column] for p in result.timeline], result.last_end)
            ax.fill_between((x - origin) / 3600, low, low + y, step="post", label=reason, lw=0)
            low = low + y
        ax.legend(fontsize=8, loc="upper left")
    return _png(fig)


def plot_queues(results, origin, started) -> str:
    shown = results[:2]
    fig, axes = _figure(len(shown), sharey=True)
    for ax, result in zip(axes, shown, strict=True):
        tracked = _tracked(result.scheduler.tree)
        usage, rebuilt = _usage(result, tracked, started[result.policy])
        star = " *" if rebuilt and usage else ""
        ax.set(title=f"{result.policy}: running GPUs vs guarantee{star}")
        ax.set(xlabel=HOURS, ylabel="running GPUs")
        for n, queue in enumerate(tracked):
            if queue.path in usage:
                x, y = _steps(*usage[queue.path], result.last_end)
                color, label = f"C{n % 10}", _label(queue.label())
                ax.step((x - origin) / 3600, y, where="post", color=color, lw=1, label=label)
                ax.axhline(queue.guaranteed, color=color, ls="--", lw=0.8)
        if ax.lines:
            ax.legend(fontsize=8, loc="upper left")
        else:
            _empty(ax, "queue usage")
    return _png(fig)


def plot_fairness(names, jains) -> str:
    fig, (ax,) = _figure(1, height=2.4)
    heights = [0.0 if math.isnan(jains[n]) else jains[n] for n in names]
    bars = ax.bar([_label(n) for n in names], heights, color=[f"C{i}" for i in range(len(names))])
    ax.bar_label(bars, labels=["n/a" if math.isnan(jains[n]) else f"{jains[n]:.2f}" for n in names])
    ax.set(title="Fairness across leaf queues", xlabel="policy", ylabel="Jain's index (1 = fair)")
    ax.set_ylim(0, 1.12)
    return _png(fig)
