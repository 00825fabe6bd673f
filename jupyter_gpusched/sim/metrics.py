"""What a replay measured: ``jobs.csv`` rows, ``metrics.json`` figures and the stdout table.

A figure may be None where a column cannot know it (the ``recorded`` column of
:mod:`.recorded`: no replay, so no lost work or reasons); the table shows it as ``n/a``."""

from __future__ import annotations

import csv
import math

from ..core import JobState
from .replay import ReplayResult

JOB_COLUMNS = (
    "policy",
    "job_id",
    "queue",
    "user",
    "tier",
    "kind",
    "gpus",
    "submit_time",
    "start_time",
    "end_time",
    "wait_s",
    "runs",
    "state",
    "nodes",
    "leaves",
    "first_reason",
    "first_reason_detail",
)


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default); ``values`` sorted."""
    if not values:
        return 0.0
    position = (len(values) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def summary(values: list[float], keys=("mean", "p50", "p95", "p99", "max")) -> dict:
    ordered = sorted(values)
    out = {}
    for key in keys:
        if key == "mean":
            out[key] = sum(ordered) / len(ordered) if ordered else 0.0
        elif key == "max":
            out[key] = ordered[-1] if ordered else 0.0
        else:
            out[key] = percentile(ordered, float(key[1:]))
    return {k: round(v, 3) for k, v in out.items()}


def _number(value):
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return round(value, 3) if isinstance(value, float) else value


def job_rows(result: ReplayResult):
    cluster = result.scheduler.cluster
    for trace_job in result.trace:
        job = result.job(trace_job.id)
        nodes = result.placements.get(job.id, ())
        wait = None if job.first_start is None else job.first_start - job.submit_time
        yield {
            "policy": result.policy,
            "job_id": job.id,
            "queue": job.queue,  # the queue the engine filed it under, as in the job classes
            "user": job.user,
            "tier": job.tier,
            "kind": job.kind,
            "gpus": job.gpus,
            "submit_time": _number(job.submit_time),
            "start_time": _number(job.first_start),
            "end_time": _number(job.end_time),
            "wait_s": _number(wait),
            "runs": job.runs,
            "state": job.state.value,
            "nodes": "|".join(cluster.nodes[i].name for i in nodes),
            "leaves": len({cluster.nodes[i].leaf for i in nodes}) if nodes else "",
            "first_reason": job.first_reason.family if job.first_reason else "",
            "first_reason_detail": job.first_reason.detail if job.first_reason else "",
        }


def write_jobs_csv(results: list[ReplayResult], path, first_rows=()) -> None:
    """One row per job and replay; ``first_rows`` (e.g. the recorded outcome's) go first."""
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=JOB_COLUMNS)
        writer.writeheader()
        writer.writerows(first_rows)
        for result in results:
            writer.writerows(job_rows(result))


def deadline_figures(outcomes) -> dict:
    """The deadline figures of the jobs with a deadline that were not rejected, given as
    ``(deadline, end time or None, completed, cancelled for its deadline)``: how many,
    the fraction that completed by their deadline, how late the late ones ended (mean, p95;
    those cancelled for their deadline are missed but not late), and how many were cancelled."""
    outcomes = list(outcomes)
    met = sum(1 for deadline, end, done, _ in outcomes if done and end <= deadline + 1e-9)
    late = [end - deadline for deadline, end, _, gone in outcomes if end and end > deadline + 1e-9]
    return {
        "deadline_jobs": len(outcomes),
        "deadline_met_fraction": round(met / len(outcomes), 4) if outcomes else None,
        "deadline_miss_s": summary(late, ("mean", "p95")),
        "deadline_cancelled": sum(1 for *_, gone in outcomes if gone),
    }


def metrics(result: ReplayResult) -> dict:
    scheduler = result.scheduler
    jobs = [result.job(t.id) for t in result.trace]
    started = [j for j in jobs if j.first_start is not None]
    completed = [j for j in jobs if j.state == JobState.COMPLETED]
    makespan = max(result.last_end - result.first_submit, 0.0)
    gpus = scheduler.cluster.total_gpus
    allocated = sum(r.allocated_gpu_s for r in result.records.values())
    leaf_size = max(
        sum(scheduler.cluster.nodes[i].gpus for i in members)
        for members in scheduler.cluster.leaves.values()
    )
    gangs = [j for j in started if len(result.placements.get(j.id, ())) > 1]
    fit_one_leaf = [j for j in gangs if j.gpus <= leaf_size]
    one_leaf = [
        j
        for j in fit_one_leaf
        if len({scheduler.cluster.nodes[i].leaf for i in result.placements[j.id]}) == 1
    ]
    waits_by_tier = {
        str(tier): summary([j.first_start - j.submit_time for j in started if j.tier == tier])
        for tier in (1, 2, 3)
    }
    wall = result.sim_wall_s
    return {
        "jobs": len(jobs),
        "completed": len(completed),
        "rejected": sum(1 for j in jobs if j.state == JobState.REJECTED),
        "makespan_s": round(makespan, 3),
        "gpu_utilization": round(allocated / (gpus * makespan), 4) if makespan else 0.0,
        "busy_utilization": (
            round(result.busy_allocated_gpu_s / (gpus * result.busy_s), 4) if result.busy_s else 1.0
        ),
        "wait_s": summary([j.first_start - j.submit_time for j in started]),
        "wait_s_by_tier": waits_by_tier,
        "jct_s": summary(
            [j.end_time - j.submit_time for j in completed], ("mean", "p50", "p95", "p99")
        ),
        "preemptions": result.preemptions,
        "lost_gpu_hours": round(sum(r.lost_gpu_s for r in result.records.values()) / 3600, 3),
        "gang_jobs": len(gangs),
        "gang_single_leaf_fraction": round(len(one_leaf) / len(fit_one_leaf), 4)
        if fit_one_leaf
        else 1.0,
        "wait_gpu_hours_by_reason": {
            family: round(value / 3600, 3) for family, value in result.wait_gpu_s_by_reason.items()
        },
        **deadline_figures(
            (
                j.deadline,
                j.end_time,
                j.state == JobState.COMPLETED,
                j.state == JobState.CANCELLED and j.deadline_missed,
            )
            for j in jobs
            if j.deadline is not None and j.state != JobState.REJECTED
        ),
        **estimate_metrics(result, jobs),
        "sim_wall_s": round(wall, 3),
        "jobs_per_s": round(len(jobs) / wall, 1) if wall else 0.0,
    }


def estimate_metrics(result: ReplayResult, jobs: list) -> dict:
    """How learned run-time estimates (core/runtime_estimates.py) fared: the jobs planned
    with one, the fraction of those whose real run time was longer (their reservation-time
    ends were too early), and among the jobs that held the reservation at the end of a pass,
    the fraction that first started later than the first such reservation's start."""
    durations = {t.id: t.duration for t in result.trace}
    estimated = [j for j in jobs if j.estimated]
    short = sum(1 for j in estimated if durations[j.id] > j.planned_run_time)
    reserved = result.first_reservation
    late = sum(
        1
        for job_id, start in reserved.items()
        if (first := result.job(job_id).first_start) is None or first > start + 1e-6
    )
    return {
        "estimated_jobs": len(estimated),
        "estimate_too_short_fraction": round(short / len(estimated), 4) if estimated else 0.0,
        "reserved_jobs": len(reserved),
        "reservations_too_short_fraction": round(late / len(reserved), 4) if reserved else 0.0,
    }


TABLE_ROWS = (
    ("jobs", ("jobs",)),
    ("completed", ("completed",)),
    ("rejected", ("rejected",)),
    ("makespan (h)", ("makespan_s",), 1 / 3600),
    ("GPU utilization", ("gpu_utilization",)),
    ("busy utilization", ("busy_utilization",)),
    ("wait mean (s)", ("wait_s", "mean")),
    ("wait p95 (s)", ("wait_s", "p95")),
    ("tier-1 wait p99 (s)", ("wait_s_by_tier", "1", "p99")),
    ("tier-2 wait mean (s)", ("wait_s_by_tier", "2", "mean")),
    ("tier-3 wait mean (s)", ("wait_s_by_tier", "3", "mean")),
    ("JCT mean (s)", ("jct_s", "mean")),
    ("pre-emptions", ("preemptions",)),
    ("lost GPU-hours", ("lost_gpu_hours",)),
    ("gangs in one leaf", ("gang_single_leaf_fraction",)),
    ("jobs planned by estimate", ("estimated_jobs",)),
    ("estimates too short", ("estimate_too_short_fraction",)),
    ("reservations started late", ("reservations_too_short_fraction",)),
    ("waited on capacity (GPU-h)", ("wait_gpu_hours_by_reason", "capacity")),
    ("waited on placement (GPU-h)", ("wait_gpu_hours_by_reason", "placement")),
    ("waited on policy (GPU-h)", ("wait_gpu_hours_by_reason", "policy")),
    ("deadlines met", ("deadline_met_fraction",)),
    ("deadline miss mean (s)", ("deadline_miss_s", "mean")),
    ("replay wall time (s)", ("sim_wall_s",)),
)


def comparison_table(all_metrics: dict[str, dict]) -> str:
    """A plain-text table: one row per figure, one column per policy (None: ``n/a``)."""
    names = list(all_metrics)
    rows = [["", *names]]
    with_deadlines = any(m.get("deadline_jobs") for m in all_metrics.values())
    for label, path, *scale in TABLE_ROWS:
        if path[0].startswith("deadline") and not with_deadlines:
            continue  # a trace without deadlines: no such rows
        row = [label]
        for name in names:
            value = all_metrics[name]
            for key in path:
                value = value[key]
            if scale and value is not None:
                value = value * scale[0]
            row.append(
                "n/a"
                if value is None
                else f"{value:,.3f}".rstrip("0").rstrip(".")
                if isinstance(value, float)
                else f"{value:,}"
            )
        rows.append(row)
    return text_table(rows)


def text_table(rows: list[list[str]]) -> str:
    """``rows`` (the first one the heading) as plain-text columns: the first left-aligned, the
    others right-aligned, the heading underlined."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)
