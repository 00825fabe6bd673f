"""The cluster over time: what one row of the service's history holds, and how rows add up.

The live service records a :func:`snapshot` of its engine every ``history_interval`` seconds
(``service/history.py``); the web page draws them (utilization over 24 h, per-queue use, and
"did it wait on hardware, policy or placement?": the pending GPUs by reason family). Pure: the
caller passes the engine, the measured utilization and the time.

A row is a plain dict that JSON holds as is (the database stores it in one column, the API
answers it unchanged)::

    {"time": 1700000000.0, "total_gpus": 24,
     "allocated": {"1": 2.0, "2": 8.0},          # GPUs of running jobs, by tier
     "queues": {"research/vision": 8.0, ...},    # GPUs of running jobs, by leaf queue
     "pending": {"capacity": 4, "placement": 0, "policy": 8},  # GPUs waiting, by family
     "measured": {"2": {"gpus": 2.0, "utilization": 37.5}}}    # notebook servers measured

``measured`` covers only the GPUs of notebook servers with a fresh sample (the idle reaper's
measurements, by tier): batch jobs are not sampled, and nothing measured is not read as idle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from .quotas import ROOT

if TYPE_CHECKING:
    from .scheduler import Scheduler

FAMILIES = ("capacity", "placement", "policy")  # the reason families a pending job waits on


def snapshot(scheduler: Scheduler, measured: Mapping[int, tuple[float, float]], now: float) -> dict:
    """One history row of ``scheduler`` at ``now``; ``measured``: by tier, (GPUs measured,
    their mean utilization in percent), as ``Reaper.measured`` gives it."""
    allocated: dict[str, float] = {}
    queues: dict[str, float] = {}
    tree = scheduler.tree
    for job in scheduler.running.values():
        tier = str(job.tier)
        allocated[tier] = allocated.get(tier, 0.0) + job.amount
        queue = tree.by_path.get(job.queue)
        label = queue.label() if queue is not None else (job.queue or ROOT)
        queues[label] = queues.get(label, 0.0) + job.amount
    waiting = scheduler.pending_gpus_by_reason
    return {
        "time": now,
        "total_gpus": scheduler.cluster.total_gpus,
        "allocated": allocated,
        "queues": queues,
        "pending": {family: waiting.get(family, 0) for family in FAMILIES},
        "measured": {
            str(tier): {"gpus": gpus, "utilization": round(utilization, 1)}
            for tier, (gpus, utilization) in sorted(measured.items())
        },
    }


def waited_gpu_hours(rows: Iterable[Mapping], until: float) -> dict[str, float]:
    """GPU-hours spent waiting, by reason family, over ``rows`` (oldest first): each row's
    pending GPUs count until the next row (the last one's until ``until``), as a step chart
    draws them. The page's answer to "did it wait on hardware, policy or placement?"."""
    hours = dict.fromkeys(FAMILIES, 0.0)
    rows = list(rows)
    for i, row in enumerate(rows):
        end = rows[i + 1]["time"] if i + 1 < len(rows) else max(until, row["time"])
        for family in FAMILIES:
            hours[family] += row["pending"].get(family, 0) * (end - row["time"]) / 3600.0
    return hours


def thin(rows: list, most: int) -> list:
    """At most ``most`` of ``rows``, evenly spaced, the last one always kept (a chart of a
    long period needs no more points than it has pixels)."""
    if len(rows) <= most:
        return list(rows)
    step = len(rows) / most
    picked = [rows[int(i * step)] for i in range(most - 1)]
    return [*picked, rows[-1]]
