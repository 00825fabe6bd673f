"""Small builders for hand-made clusters, queue trees and engine drivers."""

from __future__ import annotations

from jupyter_gpusched.core import (
    Cluster,
    Job,
    Preempt,
    QueueTree,
    Scheduler,
    Start,
)


def cluster(*groups, switches=None) -> Cluster:
    """``cluster(("n[1-2]", 8, "leaf-1"), ...)``; a group may add a dict of extra fields."""
    nodes = []
    for group in groups:
        name, gpus, leaf, *extra = group
        entry = {"name": name, "gpus": gpus, "leaf": leaf}
        if extra:
            entry.update(extra[0])
        nodes.append(entry)
    data = {"nodes": nodes}
    if switches:
        data["switches"] = switches
    return Cluster.from_dict(data)


def queues(spec: dict, cluster: Cluster) -> QueueTree:
    return QueueTree.from_dict({"queues": spec}, cluster.total_gpus)


def job(job_id, gpus, t=0.0, **fields) -> Job:
    return Job(id=job_id, gpus=gpus, submit_time=t, **fields)


def started(decisions) -> dict:
    return {d.job_id: d.placement for d in decisions if isinstance(d, Start)}


def preempted(decisions) -> list:
    return [d for d in decisions if isinstance(d, Preempt)]


def names(scheduler: Scheduler, placement) -> list[str]:
    return [scheduler.cluster.nodes[i].name for i in placement.nodes]


def leaves(scheduler: Scheduler, placement) -> set[str]:
    return {scheduler.cluster.nodes[i].leaf for i in placement.nodes}


def run_replay(trace_jobs, c, tree=None, settings=None, policy="gpusched"):
    """Replay TraceJobs; return (result, {job_id: jobs.csv row})."""
    from jupyter_gpusched.core import PolicySettings, get_policy
    from jupyter_gpusched.sim.metrics import job_rows
    from jupyter_gpusched.sim.replay import replay

    result = replay(
        sorted(trace_jobs, key=lambda t: t.submit_time),
        c,
        tree,
        settings or PolicySettings(),
        get_policy(policy),
    )
    return result, {row["job_id"]: row for row in job_rows(result)}


def trace_job(job_id, submit, duration, gpus, **fields):
    from jupyter_gpusched.sim.trace import TraceJob

    return TraceJob(id=job_id, submit_time=submit, duration=duration, gpus=gpus, **fields)
