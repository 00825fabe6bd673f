"""The reservation's walk over running jobs' ends (core/reservation.py ``reserve``) is the
engine's hottest loop at scale, so it is written for speed: additions inlined, the fit tested only
after an end that can change it. This module keeps the plain version it replaced as the
reference, and checks on seeded deep-queue replays (with and without one-leaf reservations,
with GPU models and labels) that every reservation the engine makes is the reference's."""

from __future__ import annotations

import dataclasses
import random

import pytest
from test_incremental_pass import deep_cluster, deep_queues, deep_trace

from jupyter_gpusched.core import Cluster, PolicySettings, get_policy
from jupyter_gpusched.core import passes as passes_module
from jupyter_gpusched.core.reservation import Reservation, _Pool, reserve
from jupyter_gpusched.sim.replay import replay
from jupyter_gpusched.sim.trace import TraceJob


def reference_reserve(state, job, ends, jobs, now, one_leaf_within=None) -> Reservation:
    """``reserve`` as first written: every end adds its GPUs, then the fit is tested."""
    cluster = state.cluster

    def eligible(idx: int) -> bool:
        node = cluster.nodes[idx]
        return (
            state.node_state[idx] == "up"
            and (job.gpu_models is None or node.gpu_model in job.gpu_models)
            and all(node.labels.get(k) == v for k, v in job.labels.items())
        )

    single = (job.gpus_per_node or job.gpus) == job.gpus and job.gpus <= cluster.max_node_gpus
    threshold = job.gpus if single else (job.gpus_per_node or 1)
    pool = _Pool(job, single, threshold)
    leaves: dict | None = {} if one_leaf_within is not None else None

    def add(idx: int, gpus: int) -> None:
        pool.add(idx, gpus)
        if leaves is not None:
            leaf = cluster.nodes[idx].leaf
            if leaf not in leaves:
                leaves[leaf] = _Pool(job, single, threshold)
            leaves[leaf].add(idx, gpus)

    for idx in range(len(cluster.nodes)):
        if state.free[idx] and eligible(idx):
            add(idx, state.free[idx])

    def in_one_leaf(touched):
        fits = [(leaves[leaf].total, leaf) for leaf in touched if leaves[leaf].fits()]
        return leaves[min(fits)[1]].chosen() if fits else None

    found = (pool.chosen(), now) if pool.fits() else None
    if found is not None:
        nodes = in_one_leaf(leaves) if leaves is not None else found[0]
        if nodes is not None:
            return Reservation(job.id, now, nodes)
    for end, job_id in ends:
        if found is not None and end > found[1] + one_leaf_within:
            break
        if jobs[job_id].preempted_by is not None:
            continue
        touched = set()
        for part in state.allocations[job_id].parts:
            if part.fraction == 1.0 and eligible(part.node):
                add(part.node, part.gpus)
                touched.add(cluster.nodes[part.node].leaf)
        start = max(end, now)
        if leaves is not None:
            nodes = in_one_leaf(touched)
            if nodes is not None:
                return Reservation(job.id, start, nodes)
        if found is None and pool.fits():
            if leaves is None:
                return Reservation(job.id, start, pool.chosen())
            found = (pool.chosen(), start)
    if found is not None:
        return Reservation(job.id, found[1], found[0])
    return Reservation(job.id, None, frozenset())


def mixed_cluster() -> Cluster:
    """Four leaves: two of A100 nodes (one leaf labelled ``ib: yes``), two of H100 nodes."""
    nodes = []
    for leaf in range(4):
        model = "A100" if leaf < 2 else "H100"
        entry = {"name": f"n[{leaf * 8 + 1:03d}-{leaf * 8 + 8:03d}]", "gpus": 8}
        entry.update({"leaf": f"leaf-{leaf}", "gpu_model": model})
        if leaf == 1:
            entry["labels"] = {"ib": "yes"}
        nodes.append(entry)
    spine = [f"leaf-{i}" for i in range(4)]
    return Cluster.from_dict({"nodes": nodes, "switches": {"spine": spine}})


def with_constraints(trace, seed: int, monkeypatch) -> list:
    """A fifth of the jobs ask for H100s, a tenth of the one-node ones for label ``ib: yes``."""
    rng = random.Random(seed)
    labelled, out = set(), []
    for job in trace:
        draw = rng.random()
        if draw < 0.2:
            job = dataclasses.replace(job, gpu_models=frozenset({"H100"}))
        elif draw < 0.3 and job.gpus <= 8:
            labelled.add(job.id)
        out.append(job)
    to_job = TraceJob.to_job

    def labelled_job(trace_job):
        job = to_job(trace_job)
        if job.id in labelled:
            job.labels = {"ib": "yes"}
        return job

    monkeypatch.setattr(TraceJob, "to_job", labelled_job)
    return out


@pytest.mark.parametrize(
    "seed,policy,constrained",
    [(1, "gpusched", False), (2, "slurm", False), (3, "gpusched", True), (4, "slurm", True)],
)
def test_every_reservation_is_the_reference_walks(seed, policy, constrained, monkeypatch):
    cluster = mixed_cluster() if constrained else deep_cluster()
    queues, teams = deep_queues(cluster.total_gpus)
    trace = deep_trace(seed, 500, teams)
    if constrained:
        trace = with_constraints(trace, seed, monkeypatch)
    compared = {"all": 0, "one_leaf": 0, "later": 0}

    def checked(state, job, ends, jobs, now, one_leaf_within=None):
        ends = list(ends)
        got = reserve(state, job, ends, jobs, now, one_leaf_within)
        assert got == reference_reserve(state, job, ends, jobs, now, one_leaf_within)
        compared["all"] += 1
        compared["one_leaf"] += one_leaf_within is not None
        compared["later"] += got.start is not None and got.start > now
        return got

    monkeypatch.setattr(passes_module, "reserve", checked)
    result = replay(trace, cluster, queues, PolicySettings(), get_policy(policy))
    assert {j.state.value for j in result.scheduler.jobs.values()} == {"completed"}
    # not vacuous: many reservations, most of them for later, one-leaf ones under gpusched
    assert compared["all"] > 100 and compared["later"] > compared["all"] / 2
    assert (compared["one_leaf"] > 0) == (policy == "gpusched")
