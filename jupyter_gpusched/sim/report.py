"""``report.html``: one self-contained page comparing the replayed policies.

Made for a platform lead deciding in one screen whether to switch policy. It shows first, when
there is a baseline to compare with (a trace's recorded outcome, or the first of several policy
files), the difference per job class (:mod:`.classes`: who gains, who pays); then a headline
(the policies, trace and cluster, and plain sentences comparing each policy with the FIRST
column, the baseline: ``recorded`` when the trace has recorded outcomes); a table of the main
``metrics.json`` figures with each cell's ratio to the baseline (green better, red worse); and
plots: the queue-wait CDF per tier (who waits, and how
long the tail is), allocated GPUs against the cluster size (idle capacity), pending GPUs by
reason (capacity: cluster full; placement: free GPUs in the wrong shape; policy: quotas, limits
or ordering), the top-level queues' running GPUs against their guarantees (are guarantees
honoured), and fairness: Jain's index over leaf queues of mean running GPUs / guarantee (1: every
queue got the same multiple of its guarantee; 1/n: one got it all). The index takes usage from
each job's allocated GPU-seconds (exact, whatever the policy) and leaves out queues guaranteed 0
GPUs: they only borrow, so usage / share is undefined for them. Policies without quotas (``fifo``)
account every job to the root queue, so their queue-usage plot is rebuilt from job start and end
times (a pre-empted job then counts while it waits to resume). The ``recorded`` column has no
replay behind it: its unknown figures read ``n/a``, and of the plots only the wait CDFs show it.

Plots (drawn in :mod:`.report_plots`) are PNGs made with matplotlib's Agg backend and embedded
as base64: no other file, no JavaScript. Each time series is cut to at most ``MAX_POINTS`` points
by time-weighted bin means (GPU-hours stay exact), so the page stays small (about 0.3 MB) and
quick to draw for any trace.
"""

from __future__ import annotations

import html
import math
import sys
from pathlib import Path

from .classes import FIGURES as CLASS_FIGURES
from .classes import cell
from .report_plots import (
    MAX_QUEUES,
    plot_allocation,
    plot_fairness,
    plot_pending,
    plot_queues,
    plot_waits,
)

RECORDED = "recorded"  # the column of a trace's recorded outcome (.recorded.NAME)
# (label, path in a metrics() dict, scale, direction: +1 higher is better, -1 lower, 0 neither);
# "TIERS" expands to the wait mean/p50/p95/p99 of each tier with started jobs
ROWS = (
    ("jobs", ("jobs",), 1, 0),
    ("completed", ("completed",), 1, 1),
    ("rejected", ("rejected",), 1, -1),
    ("makespan (h)", ("makespan_s",), 1 / 3600, -1),
    ("GPU utilization", ("gpu_utilization",), 1, 1),
    ("busy utilization", ("busy_utilization",), 1, 1),
    ("wait mean (s)", ("wait_s", "mean"), 1, -1),
    ("wait p95 (s)", ("wait_s", "p95"), 1, -1),
    ("TIERS", (), 1, -1),
    ("JCT mean (s)", ("jct_s", "mean"), 1, -1),
    ("JCT p95 (s)", ("jct_s", "p95"), 1, -1),
    ("pre-emptions", ("preemptions",), 1, -1),
    ("lost GPU-hours", ("lost_gpu_hours",), 1, -1),
    ("gangs in one leaf (fraction)", ("gang_single_leaf_fraction",), 1, 1),
    ("waited on capacity (GPU-h)", ("wait_gpu_hours_by_reason", "capacity"), 1, -1),
    ("waited on placement (GPU-h)", ("wait_gpu_hours_by_reason", "placement"), 1, -1),
    ("waited on policy (GPU-h)", ("wait_gpu_hours_by_reason", "policy"), 1, -1),
    ("fairness (Jain, leaf queues)", ("jain",), 1, 1),
    ("replay wall time (s)", ("sim_wall_s",), 1, 0),
)
NOTES = {
    "Difference per job class": "Each cell: baseline → run (difference); green is better, red "
    "worse (more than 5% apart). Utilization: the class's GPU-seconds / (cluster GPUs x "
    "makespan). n/a: not known to that column (the recorded outcome has no lost work or "
    "reasons) or no such job.",
    "Queue waits": "Share of started jobs that waited at most x (submit to first start); "
    "jobs that never started are left out.",
    "GPU allocation": "GPUs held by running jobs; the gap to the dashed line is idle capacity.",
    "Pending GPUs by reason": "capacity: the cluster is full; placement: free GPUs in the wrong "
    "shape; policy: quotas, limits or ordering held the job.",
    "Queue usage vs guarantee": f"Dashed lines: guarantees. Top-level queues (at most "
    f"{MAX_QUEUES}, largest guarantee first), sampled every 5 min. * policy without quotas: "
    "rebuilt from job start and end times.",
    "Fairness": "Jain's index over leaf queues of mean running GPUs / guarantee: 1 = every queue "
    "got the same multiple of its guarantee, 1/n = one got it all. Queues guaranteed 0 GPUs are "
    "left out (they only borrow).",
}
CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:20px;margin:0 0 8px}h2{font-size:15px;margin:0 0 6px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(560px,1fr));gap:14px}
.grid{margin-top:14px}
section{border:1px solid #ddd;border-radius:6px;padding:10px}img{width:100%}
table{border-collapse:collapse;font-size:13px}td,th{padding:2px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}tr:nth-child(even){background:#f6f6f6}
.wide{overflow-x:auto}.classes td{white-space:nowrap}h3{font-size:14px;margin:8px 0 4px}
.better{color:#17752e}.worse{color:#b3261e}.muted{color:#666;font-size:12px}"""


def jain_index(values) -> float:
    """Jain's fairness index (sum x)^2 / (n * sum x^2) of non-negative values: 1.0 when all
    are equal, 1/n when one of n is non-zero. NaN (undefined) when there are none or all are 0."""
    values = [float(v) for v in values]
    squares = sum(v * v for v in values)
    return sum(values) ** 2 / (len(values) * squares) if squares else math.nan


def _started(result) -> dict:
    """Arrays over the jobs of ``result`` that started: tier, wait, start, end, GPUs and leaf
    queue (an index into ``leaves``), plus allocated GPU-seconds by leaf queue path (``used``)."""
    import numpy as np

    tree, jobs, records = result.scheduler.tree, result.scheduler.jobs, result.records
    index: dict[str, int] = {}  # job.queue as written -> position in leaves
    leaves: list = []
    rows, used = [], {}
    for trace_job in result.trace:
        job = jobs.get(trace_job.id)
        if job is None or job.first_start is None:
            continue
        if job.queue not in index:
            index[job.queue] = len(leaves)
            leaves.append(tree.get(job.queue))
        queue = leaves[index[job.queue]]
        end = result.last_end if job.end_time is None else job.end_time
        wait = job.first_start - job.submit_time
        rows.append((job.tier, wait, job.first_start, end, job.amount, index[job.queue]))
        record = records.get(trace_job.id)
        if queue is not None and record is not None:
            used[queue.path] = used.get(queue.path, 0.0) + record.allocated_gpu_s
    table = np.array(rows, dtype=float).reshape(-1, 6)
    keys = ("tier", "wait", "start", "end", "gpus", "leaf")
    return {**dict(zip(keys, table.T, strict=True)), "leaves": leaves, "used": used}


def fairness(result, started: dict | None = None) -> float:
    """Jain's index over leaf queues guaranteed > 0 GPUs of mean running GPUs / guarantee, with
    usage from each job's allocated GPU-seconds (exact, and the same whatever the policy)."""
    used = (started or _started(result))["used"]
    span = max(result.last_end - result.first_submit, 1.0)
    leaves = [q for q in result.scheduler.tree.by_path.values() if q.parent is not None]
    return jain_index(
        used.get(q.path, 0.0) / span / q.guaranteed for q in leaves if q.is_leaf and q.guaranteed
    )


def _get(figures: dict, path):
    for key in path:
        figures = figures.get(key) if isinstance(figures, dict) else None
    return figures if isinstance(figures, (int, float)) else None


def _unknown(figures: dict, path) -> bool:
    """Whether the figure at ``path`` is there and None: a figure the column cannot know."""
    for key in path[:-1]:
        figures = figures.get(key) if isinstance(figures, dict) else None
    return isinstance(figures, dict) and path[-1] in figures and figures[path[-1]] is None


def _nan(value) -> bool:
    return value is None or math.isnan(value)


def _num(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, int) or value == 0:
        return f"{round(value):,}"
    size = abs(value)
    return f"{value:,.0f}" if size >= 100 else f"{value:.1f}" if size >= 10 else f"{value:.3g}"


def _ratio(value, base) -> tuple[str, float | None]:
    """`` (0.42x)`` and 0.42; `` (=)`` for 0 vs 0; `` (from 0)`` for a value vs 0."""
    if value is None or base is None or math.isnan(value) or math.isnan(base):
        return "", None
    if base == 0:
        return (" (=)", 1.0) if value == 0 else (" (from 0)", None)
    return f" ({value / base:,.2f}x)", value / base


def _duration(*seconds) -> list[str]:
    """Seconds as text, all in the unit that suits the largest, unless that would show a
    smaller one as 0.0 (60 s beside 2.2 h reads "60 s", not "0.0 h")."""
    top = max(seconds)
    if top < 120:
        return [f"{s:,.0f} s" for s in seconds]
    unit, size = ("min", 60) if top < 7200 else ("h", 3600)
    return [
        f"{s / size:,.1f} {unit}" if s == 0 or s / size >= 0.05 else _duration(s)[0]
        for s in seconds
    ]


def _headline(names, figures, jains, tiers) -> list[str]:
    """Plain sentences comparing each policy with the first (the baseline)."""
    base, lines = names[0], []
    for name in names[1:]:

        def pair(*path, name=name):
            return _get(figures.get(name, {}), path), _get(figures.get(base, {}), path)

        mean, p99 = pair("wait_s", "mean"), pair("wait_s_by_tier", "1", "p99")
        if None not in mean:
            text = f"{name} vs {base}: mean wait {' vs '.join(_duration(*mean))}{_ratio(*mean)[0]}"
            if None not in p99 and 1 in tiers:
                text += f"; tier-1 p99 wait {' vs '.join(_duration(*p99))}"
            lines.append(text + ".")
        util, span = pair("gpu_utilization"), pair("makespan_s")
        if None not in (*util, *span):
            lines.append(
                f"{name}: GPU utilization {util[0]:.2f} vs {util[1]:.2f}; all jobs done after "
                f"{span[0] / 3600:,.1f} h vs {span[1] / 3600:,.1f} h."
            )
        pre, lost = pair("preemptions"), pair("lost_gpu_hours")
        if None not in (*pre, *lost):
            lines.append(
                f"{name}: {pre[0]:,} pre-emptions losing {lost[0]:,.1f} GPU-h of work vs "
                f"{pre[1]:,} losing {lost[1]:,.1f} GPU-h."
            )
        if not (_nan(jains[name]) or _nan(jains[base])):
            lines.append(
                f"{name}: fairness across leaf queues (Jain's index, 1 = each got the same "
                f"multiple of its guarantee) {jains[name]:.2f} vs {jains[base]:.2f}."
            )
    return lines


def _table(names, figures, jains, tiers) -> str:
    rows = []
    for label, path, scale, direction in ROWS:
        if label != "TIERS":
            rows.append((label, path, scale, direction))
            continue
        for tier in tiers:
            for key in ("mean", "p50", "p95", "p99"):
                rows.append(
                    (f"tier-{tier} wait {key} (s)", ("wait_s_by_tier", str(tier), key), 1, -1)
                )
    head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
    out = [f"<table><tr><th>figure</th>{head}</tr>"]
    for label, path, scale, direction in rows:
        cells = []
        for name in names:
            if path == ("jain",):
                value, unknown = jains[name], jains[name] is None
            else:
                value, unknown = (
                    _get(figures.get(name, {}), path),
                    _unknown(figures.get(name, {}), path),
                )
            value = None if value is None else value * scale
            shown = "n/a" if unknown else _num(value)
            if not cells:
                base = value
                cells.append(f"<td>{shown}</td>")
                continue
            text, ratio = _ratio(value, base)
            mood = ""
            if ratio is not None and direction and abs(ratio - 1) > 0.05:
                mood = ' class="better"' if (ratio > 1) == (direction > 0) else ' class="worse"'
            cells.append(f"<td{mood}>{shown}{html.escape(text)}</td>")
        out.append(f"<tr><td>{html.escape(label)}</td>{''.join(cells)}</tr>")
    return "\n".join([*out, "</table>"])


def _class_tables(compared: dict) -> str:
    """The difference per job class of each run from its baseline (:func:`.classes.compare`),
    one table per run: a row per class, each cell ``baseline -> run (difference)``."""
    head = "".join(f"<th>{html.escape(heading)}</th>" for _, heading, _ in CLASS_FIGURES)
    out = []
    for run, comparison in compared.items():
        out.append(f"<h3>{html.escape(run)} vs {html.escape(comparison['baseline'])}</h3>")
        out.append(f'<div class="wide"><table class="classes"><tr><th>class</th>{head}</tr>')
        for name, figures in comparison["classes"].items():
            cells = []
            for key, _, direction in CLASS_FIGURES:
                b, d = figures[key]["baseline"], figures[key]["difference"]
                mood = ""
                if d and direction and (not b or abs(d / b) > 0.05):
                    mood = ' class="better"' if (d > 0) == (direction > 0) else ' class="worse"'
                cells.append(f"<td{mood}>{html.escape(cell(figures[key], '→'))}</td>")
            out.append(f"<tr><td>{html.escape(name)}</td>{''.join(cells)}</tr>")
        out.append("</table></div>")
    return "\n".join(out)


def write_report(
    results: list,
    figures: dict[str, dict],
    path,
    title: str = "",
    recorded: dict | None = None,
    classes: dict | None = None,
) -> None:
    """Write a self-contained ``report.html`` to ``path`` comparing ``results`` (ReplayResults
    of one trace; the first is the baseline) with their ``metrics()`` ``figures`` by name.
    ``recorded``: the trace's recorded waits (:func:`.recorded.recorded_waits`), which make a
    first column ``recorded``, the baseline; ``classes``: :func:`.classes.compare`, shown first."""
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:  # headless; leave an interactive session alone
        matplotlib.use("Agg")
    if not results:
        raise ValueError("write_report needs at least one replay result")
    policies = [r.policy for r in results]
    started = {r.policy: _started(r) for r in results}
    jains = {r.policy: fairness(r, started[r.policy]) for r in results}
    names = policies
    if recorded is not None:
        names = [RECORDED, *policies]
        started[RECORDED], jains[RECORDED] = recorded, None
    tiers = sorted({int(t) for s in started.values() for t in set(s["tier"].tolist())})
    first = results[0]
    gpus, origin = first.scheduler.cluster.total_gpus, first.first_submit
    title = title or "GPU scheduling replay: " + " vs ".join(names)
    what = " (recorded: the trace's recorded outcome)" if recorded is not None else ""
    intro = (
        f"Compared: {', '.join(names)}{what}; baseline: {names[0]}. Trace: "
        f"{len(first.trace):,} jobs over {_duration(max(first.last_end - origin, 0.0))[0]}; "
        f"cluster: {gpus:,} GPUs."
    )
    plots = {
        "Queue waits": plot_waits(names, started, tiers),
        "GPU allocation": plot_allocation(results, gpus, origin),
        "Pending GPUs by reason": plot_pending(results, origin),
        "Queue usage vs guarantee": plot_queues(results, origin, started),
        "Fairness": plot_fairness(policies, jains),
    }
    body = [f"<h1>{html.escape(title)}</h1>"]
    if classes:
        body += [
            "<section><h2>Difference per job class</h2>",
            _class_tables(classes),
            f'<p class="muted">{html.escape(NOTES["Difference per job class"])}</p></section>',
        ]
    body += [
        f"<section><h2>Summary</h2><p>{html.escape(intro)}</p><ul>",
        *(f"<li>{html.escape(s)}</li>" for s in _headline(names, figures, jains, tiers)),
        "</ul></section>",
        '<div class="grid"><section><h2>Metrics</h2>',
        _table(names, figures, jains, tiers),
        f'<p class="muted">Ratios are to {html.escape(names[0])}; green is better, red worse '
        "(more than 5% apart). Waits in seconds from submit to first start.</p></section>",
    ]
    for heading, png in plots.items():
        body.append(
            f'<section><h2>{html.escape(heading)}</h2><img alt="{html.escape(heading)}" '
            f'src="data:image/png;base64,{png}"><p class="muted">{html.escape(NOTES[heading])}'
            "</p></section>"
        )
    page = (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>'
        f"{html.escape(title)}</title><style>{CSS}</style></head><body>\n"
        + "\n".join(body)
        + "</div></body></html>\n"
    )
    Path(path).write_text(page, encoding="utf-8")
