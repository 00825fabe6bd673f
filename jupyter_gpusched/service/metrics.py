"""Prometheus metrics of the live scheduler (``GET /metrics``).

Counters and histograms are updated as decisions are carried out; gauges of the current state
(queue lengths, allocated GPUs, utilization) are read from the engine at scrape time, so they
are never stale and cost nothing between scrapes. The measured utilization comes from the
notebook servers' GPU monitors (their latest reports, kept by the reaper).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

WAIT_BUCKETS = (1, 10, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 86400, 7 * 86400)


class Metrics:
    def __init__(self, live=None):
        self.registry = CollectorRegistry()
        self.wait = Histogram(
            "gpusched_wait_seconds",
            "Time from submission (or requeue) to start, by tier",
            ["tier"],
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self.preemptions = Counter(
            "gpusched_preemptions", "Jobs pre-empted, by tier", ["tier"], registry=self.registry
        )
        self.culls = Counter(
            "gpusched_culls", "Idle sessions reclaimed by the reaper", registry=self.registry
        )
        self.decisions = Counter(
            "gpusched_decisions",
            "Scheduling decisions carried out (start, preempt, stop); rate() gives per second",
            ["kind"],
            registry=self.registry,
        )
        self.refusals = Counter(
            "gpusched_refused_jobs",
            "Job requests refused because they could never run here, by the field that says why",
            ["field"],
            registry=self.registry,
        )
        self.deadline_misses = Counter(
            "gpusched_deadline_misses",
            "Jobs unfinished at their deadline, by what was done: kept (left to go on) or "
            "cancelled (the policy's deadlines.on_miss)",
            ["action"],
            registry=self.registry,
        )
        for action in ("kept", "cancelled"):  # both series from the start, at 0
            self.deadline_misses.labels(action=action)
        self.live = live
        self.registry.register(_StateCollector(self))

    def started(self, job, now: float) -> None:
        waited = now - (job.pending_since if job.pending_since is not None else job.submit_time)
        self.wait.labels(tier=str(job.tier)).observe(max(0.0, waited))

    def preempted(self, job) -> None:
        self.preemptions.labels(tier=str(job.tier)).inc()

    def decided(self, kind: str) -> None:
        self.decisions.labels(kind=kind).inc()

    def refused(self, field: str | None) -> None:
        self.refusals.labels(field=field or "").inc()

    def deadline_missed(self, action: str) -> None:
        self.deadline_misses.labels(action=action).inc()


class _StateCollector:
    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def collect(self):
        live = self.metrics.live
        if live is None:
            return
        engine = live.engine
        pending = GaugeMetricFamily(
            "gpusched_queue_length", "Pending jobs, by tier", labels=["tier"]
        )
        by_tier = {1: 0, 2: 0, 3: 0}
        for job_id in engine.pending.ordered():
            by_tier[engine.jobs[job_id].tier] += 1
        for tier, count in by_tier.items():
            pending.add_metric([str(tier)], count)
        yield pending
        allocated = GaugeMetricFamily(
            "gpusched_allocated_gpus", "GPUs held by running jobs", labels=["queue", "tier"]
        )
        totals: dict[tuple[str, str], float] = {}
        for job in engine.running.values():
            key = (job.queue or "root", str(job.tier))
            totals[key] = totals.get(key, 0.0) + job.amount
        for key, gpus in sorted(totals.items()):
            allocated.add_metric(list(key), gpus)
        yield allocated
        total = live.cluster.total_gpus
        used = sum(totals.values())
        utilization = GaugeMetricFamily(
            "gpusched_gpu_allocation_ratio", "Allocated GPUs / all GPUs of the cluster"
        )
        utilization.add_metric([], used / total if total else 0.0)
        yield utilization
        if live.reaper is not None:
            yield from _measured(live.reaper.measured())
        nodes = GaugeMetricFamily("gpusched_nodes", "Nodes by state", labels=["state"])
        states: dict[str, int] = {}
        for state in engine.state.node_state:
            states[state] = states.get(state, 0) + 1
        for state, count in sorted(states.items()):
            nodes.add_metric([state], count)
        yield nodes


def _measured(by_tier: dict[int, tuple[float, float]]):
    """The GPU monitors' figures (notebook servers reporting within the reaper's stale_after)."""
    gpus = GaugeMetricFamily(
        "gpusched_measured_gpus",
        "GPUs of notebook servers whose GPU monitor reported recently, by tier",
        labels=["tier"],
    )
    utilization = GaugeMetricFamily(
        "gpusched_measured_gpu_utilization_percent",
        "Mean measured utilization of those GPUs (weighted by GPUs), by tier",
        labels=["tier"],
    )
    for tier in (1, 2, 3):
        count, mean = by_tier.get(tier, (0.0, 0.0))
        gpus.add_metric([str(tier)], count)
        utilization.add_metric([str(tier)], mean)
    yield gpus
    yield utilization
