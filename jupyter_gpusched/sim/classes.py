"""The difference per job class: what a candidate changes, for whom.

Seed 000's advice is to track queue time *by job class*: a change that helps on average may
still hurt one queue's notebooks. A job's class is ``(tier, queue, kind)``, its queue the one
the engine filed it under (a policy with quotas resolves a queue's short name to its path). For
each class this module computes the figures below for one replay (:func:`replayed_classes`) or
for the trace's recorded outcome (:func:`recorded_classes`), and sets a run beside its baseline
(:func:`difference`): ``baseline -> run (difference)``. Utilization is the class's GPU-seconds /
(cluster GPUs x makespan), so the classes' utilizations add up to the column's GPU utilization;
GPU-hours waited by reason add up to the column's ``wait_gpu_hours_by_reason`` (the replay
integrates the engine's ``pending_gpus_by_class`` the way it integrates the global tally).
A figure a column cannot know (the recorded outcome has no lost work or reasons; a class with no
started job has no wait) is None, shown ``n/a``.
"""

from __future__ import annotations

import math

from ..core import JobState
from . import recorded as rec
from .metrics import percentile, text_table
from .replay import ReplayResult
from .trace import TraceJob

# (key in metrics.json, heading in the tables, +1 higher is better / -1 lower / 0 neither)
FIGURES = (
    ("jobs", "jobs", 0),
    ("wait_mean_s", "wait mean s", -1),
    ("wait_p95_s", "wait p95 s", -1),
    ("jct_mean_s", "JCT mean s", -1),
    ("gpu_utilization", "util.", 1),
    ("preemptions", "pre-empt.", -1),
    ("lost_gpu_hours", "lost GPU-h", -1),
    # GPU-hours waited, by the reason's family
    ("waited_capacity_gpu_hours", "capacity GPU-h", -1),
    ("waited_placement_gpu_hours", "placement GPU-h", -1),
    ("waited_policy_gpu_hours", "policy GPU-h", -1),
)
REASONS = ("capacity", "placement", "policy")
ROUNDING = {"gpu_utilization": 4}  # the others: 3 decimals


def label(key: tuple) -> str:
    """``tier 2 / research/vision / batch``: a class as the tables and metrics.json name it."""
    tier, queue, kind = key
    return f"tier {tier} / {queue or '-'} / {kind}"


def class_of(result: ReplayResult) -> dict[str, tuple]:
    """Job id -> its class in this replay. A job rejected before the engine filed it keeps the
    queue it asked for, resolved to the queue's path where the policy has quotas."""
    scheduler = result.scheduler
    out = {}
    for trace_job in result.trace:
        job = result.job(trace_job.id)
        queue = job.queue
        if scheduler.policy.quotas:
            node = scheduler.tree.get(queue)
            queue = node.path if node is not None else queue
        out[job.id] = (job.tier, queue, job.kind)
    return out


def _aggregate(jobs: list[tuple], gpus: int, span: float, waited: dict | None) -> dict:
    """The figures of each class from per-job ``(class, wait, jct, gpu_s, preemptions,
    lost_gpu_s)`` (None where unknown) and the GPU-seconds waited by class and reason."""
    by_class: dict[tuple, list] = {}
    for row in jobs:
        by_class.setdefault(row[0], []).append(row)
    out = {}
    for key, rows in by_class.items():
        waits = sorted(r[1] for r in rows if r[1] is not None)
        jcts = [r[2] for r in rows if r[2] is not None]
        lost = [r[5] for r in rows]
        figures = {
            "jobs": len(rows),
            "wait_mean_s": sum(waits) / len(waits) if waits else None,
            "wait_p95_s": percentile(waits, 95) if waits else None,
            "jct_mean_s": sum(jcts) / len(jcts) if jcts else None,
            "gpu_utilization": sum(r[3] for r in rows) / (gpus * span) if span else 0.0,
            "preemptions": sum(r[4] for r in rows),
            "lost_gpu_hours": None if None in lost else sum(lost) / 3600,
        }
        for reason in REASONS:
            value = None
            if waited is not None:
                value = waited.get(key, {}).get(reason, 0.0) / 3600
            figures[f"waited_{reason}_gpu_hours"] = value
        out[key] = {k: _rounded(k, v) for k, v in figures.items()}
    return out


def _rounded(key: str, value):
    return value if value is None or isinstance(value, int) else round(value, ROUNDING.get(key, 3))


def replayed_classes(result: ReplayResult) -> dict[tuple, dict]:
    """The figures of each job class in one replay (GPU-hours waited by reason None unless it
    was replayed with ``by_class``)."""
    classes = class_of(result)
    rows = []
    for trace_job in result.trace:
        job, record = result.job(trace_job.id), result.records[trace_job.id]
        wait = None if job.first_start is None else job.first_start - job.submit_time
        jct = job.end_time - job.submit_time if job.state == JobState.COMPLETED else None
        rows.append(
            (
                classes[job.id],
                wait,
                jct,
                record.allocated_gpu_s,
                job.preemptions,
                record.lost_gpu_s,
            )
        )
    span = max(result.last_end - result.first_submit, 0.0)
    gpus = result.scheduler.cluster.total_gpus
    return _aggregate(rows, gpus, span, result.wait_gpu_s_by_class)


def recorded_classes(trace: list[TraceJob], classes: dict[str, tuple], gpus: int) -> dict:
    """The figures of each job class as the trace recorded them, the jobs classed as in the
    replay they are compared with (``classes``: :func:`class_of`); what the recording cannot
    know (lost work, waits by reason) is None."""
    rows = [
        (
            classes[job.id],
            rec.wait(job),
            rec.jct(job),
            rec.gpu_seconds(job),
            0 if job.recorded is None else job.recorded.preemptions,
            None,
        )
        for job in trace
    ]
    return _aggregate(rows, gpus, rec.makespan(trace), None)


def difference(baseline: dict[tuple, dict], run: dict[tuple, dict]) -> dict[str, dict]:
    """``{class label: {figure: {"baseline", "run", "difference"}}}`` over the classes of
    either side (a class one side lacks has 0 jobs there and no other figures)."""
    out = {}
    for key in sorted(set(baseline) | set(run), key=lambda k: (k[0], k[1], k[2])):
        before, after = baseline.get(key, {"jobs": 0}), run.get(key, {"jobs": 0})
        cells = {}
        for name, _, _ in FIGURES:
            b, r = before.get(name), after.get(name)
            change = None if b is None or r is None else _rounded(name, r - b)
            cells[name] = {"baseline": b, "run": r, "difference": change}
        out[label(key)] = cells
    return out


def short(value) -> str:
    """A figure as short text: ``n/a`` for None, whole numbers with separators, else three
    significant digits or none after the point from 100."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, int) or (value == int(value) and abs(value) >= 1):
        return f"{round(value):,}"
    size = abs(value)
    return f"{value:,.0f}" if size >= 100 else f"{value:.1f}" if size >= 10 else f"{value:.3g}"


def cell(figure: dict, arrow: str = "->") -> str:
    """``baseline -> run (difference)``, or ``value (=)`` when they are equal."""
    b, r, d = figure["baseline"], figure["run"], figure["difference"]
    if d == 0 or (b is None and r is None):
        return f"{short(b)} (=)"
    text = f"{short(b)} {arrow} {short(r)}"
    return text if d is None else f"{text} ({'+' if d > 0 else '-'}{short(abs(d))})"


def class_table(run: str, baseline: str, classes: dict[str, dict]) -> str:
    """A plain-text table, one row per job class, each figure ``baseline -> run (difference)``."""
    rows = [["class", *(heading for _, heading, _ in FIGURES)]]
    for name, figures in classes.items():
        rows.append([name, *(cell(figures[key]) for key, _, _ in FIGURES)])
    title = (
        f"Difference per job class: {run} vs {baseline} (baseline -> run (difference); "
        "s: seconds; util.: share of the cluster's GPU time; GPU-h: GPU-hours waited by reason)"
    )
    return title + "\n" + text_table(rows)


def compare(runs: list[tuple[ReplayResult, ReplayResult | None]], trace: list[TraceJob]) -> dict:
    """``{run name: {"baseline": its baseline's name, "classes": difference(...)}}`` for each
    ``(run, baseline)``; a baseline None is the trace's recorded outcome."""
    out = {}
    for run, baseline in runs:
        figures = replayed_classes(run)
        if baseline is None:
            gpus = run.scheduler.cluster.total_gpus
            before, name = recorded_classes(trace, class_of(run), gpus), rec.NAME
        else:
            before, name = replayed_classes(baseline), baseline.policy
        out[run.policy] = {"baseline": name, "classes": difference(before, figures)}
    return out
