"""The ``recorded`` column of a replay: what really happened, from a trace's recorded columns.

A trace exported from the live service (``export-trace``) carries, besides each request, what
the service saw happen to it (:class:`~.trace.Recorded`: first start, end, run time,
pre-emptions, outcome). Computed from those cells alone, not replayed, the figures below are the
baseline a replayed policy is judged against, the way the Alibaba trace's real scheduled times
are the production baseline: does the replay of the current policy reproduce the recorded
waits, and what would a candidate change?

The figures have the keys of :func:`.metrics.metrics` so the table, ``metrics.json`` and the
report treat ``recorded`` as one more column. What a trace does not record is None (``n/a`` in
the tables): lost GPU-hours, GPU-hours waited by reason, gang placement, busy utilization,
replay wall time. The definitions:

* a job *started* when its row has a ``start_time``; its wait is ``start_time - submit_time``;
* it *completed* when its ``outcome`` is ``completed``, or it has an ``end_time`` and no
  ``outcome`` (a trace of times only);
* its JCT is ``end_time - submit_time`` for every job that *ended*, however (completed, failed,
  cancelled, culled, pre-empted for good): the replay runs such a job for as long as it ran and
  then counts it completed, so the two JCTs are over the same jobs;
* its GPU-seconds are ``run_time`` (else ``duration``) x ``gpus`` x ``gpu_fraction``;
* the makespan runs from the first submission to the last end, a job still running at the
  export ending at ``start_time + run_time``;
* GPU utilization: all jobs' GPU-seconds / (cluster GPUs x makespan), as in the replay.
"""

from __future__ import annotations

from collections.abc import Iterator

from .metrics import JOB_COLUMNS, _number, deadline_figures, summary
from .trace import TraceJob

NAME = "recorded"  # the column's name beside the policies


def has_recorded(trace: list[TraceJob]) -> bool:
    """Whether the trace carries recorded outcomes (some row has a ``start_time``)."""
    return any(job.recorded is not None for job in trace)


def wait(job: TraceJob) -> float | None:
    """Seconds from submission to the recorded first start (None: it never started)."""
    return None if job.recorded is None else job.recorded.start_time - job.submit_time


def completed(job: TraceJob) -> bool:
    recorded = job.recorded
    if recorded is None:
        return False
    if recorded.outcome is None:
        return recorded.end_time is not None
    return recorded.outcome == "completed"


def jct(job: TraceJob) -> float | None:
    """Seconds from submission to the recorded end of a job that ended (else None)."""
    recorded = job.recorded
    if recorded is None or recorded.end_time is None:
        return None
    return recorded.end_time - job.submit_time


def gpu_seconds(job: TraceJob) -> float:
    """GPU-seconds the job held, as recorded (0 for a job that never started)."""
    if job.recorded is None:
        return 0.0
    run_time = job.recorded.run_time
    return (job.duration if run_time is None else run_time) * job.gpus * job.gpu_fraction


def end(job: TraceJob) -> float | None:
    """The recorded end, or for a job still running at the export its start + run time."""
    recorded = job.recorded
    if recorded is None:
        return None
    if recorded.end_time is not None:
        return recorded.end_time
    return recorded.start_time + (job.duration if recorded.run_time is None else recorded.run_time)


def makespan(trace: list[TraceJob]) -> float:
    """Seconds from the first submission to the last recorded end."""
    ends = [e for e in map(end, trace) if e is not None]
    if not trace or not ends:
        return 0.0
    return max(max(ends) - min(job.submit_time for job in trace), 0.0)


def recorded_metrics(trace: list[TraceJob], cluster_gpus: int) -> dict:
    """The :func:`.metrics.metrics` figures of what the trace recorded (None where unknown)."""
    started = [job for job in trace if job.recorded is not None]
    waits = [wait(job) for job in started]
    span = makespan(trace)
    used = sum(gpu_seconds(job) for job in trace)
    return {
        "jobs": len(trace),
        "completed": sum(1 for job in trace if completed(job)),
        "rejected": 0,
        "makespan_s": round(span, 3),
        "gpu_utilization": round(used / (cluster_gpus * span), 4) if span else 0.0,
        "busy_utilization": None,
        "wait_s": summary(waits),
        "wait_s_by_tier": {
            str(tier): summary([wait(job) for job in started if job.tier == tier])
            for tier in (1, 2, 3)
        },
        "jct_s": summary(
            [j for j in map(jct, trace) if j is not None], ("mean", "p50", "p95", "p99")
        ),
        "preemptions": sum(job.recorded.preemptions for job in started),
        "lost_gpu_hours": None,
        "gang_jobs": None,
        "gang_single_leaf_fraction": None,
        "wait_gpu_hours_by_reason": dict.fromkeys(("capacity", "placement", "policy")),
        **deadline_figures(
            (job.deadline, job.recorded and job.recorded.end_time, completed(job), False)
            for job in trace
            if job.deadline is not None
        ),
        "estimated_jobs": None,  # no engine planned these jobs
        "estimate_too_short_fraction": None,
        "reserved_jobs": None,
        "reservations_too_short_fraction": None,
        "sim_wall_s": None,
        "jobs_per_s": None,
    }


def recorded_rows(trace: list[TraceJob]) -> Iterator[dict]:
    """``jobs.csv`` rows of policy ``recorded``: the recorded times and outcome (the state
    column); what a trace does not record (runs, nodes, reasons) is left empty."""
    for job in trace:
        recorded = job.recorded
        row = dict.fromkeys(JOB_COLUMNS, "")
        row.update(
            policy=NAME,
            job_id=job.id,
            queue=job.queue,
            user=job.user,
            tier=job.tier,
            kind=job.kind,
            gpus=job.gpus,
            submit_time=_number(job.submit_time),
        )
        if recorded is not None:
            row.update(
                start_time=_number(recorded.start_time),
                end_time=_number(recorded.end_time),
                wait_s=_number(wait(job)),
                state=recorded.outcome or "",
            )
        yield row


def recorded_waits(trace: list[TraceJob]) -> dict:
    """Arrays of the started jobs' tier and wait, the shape the report's wait CDFs take."""
    import numpy as np

    started = [job for job in trace if job.recorded is not None]
    return {
        "tier": np.array([job.tier for job in started], dtype=float),
        "wait": np.array([wait(job) for job in started], dtype=float),
    }
