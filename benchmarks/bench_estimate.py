"""Estimate benchmark: what one ``POST api/estimate`` costs the engine (core/estimate.py: a copy
of the scheduler, one submission, one pass), at the demo's size and on a large replay state.

Run from the project root::

    .venv/bin/python benchmarks/bench_estimate.py                 # both sizes below
    .venv/bin/python benchmarks/bench_estimate.py --nodes 256 --pending 2000 --estimates 200

Two states are measured:

* ``demo``: the demo's cluster (hub_config/cluster.yaml: 24 GPUs) with the cluster full and
  ``--demo-pending`` jobs waiting;
* ``large``: bench_engine's cluster of ``--nodes`` 8-GPU nodes (256: 2,048 GPUs) and 64 teams,
  filled with its deep-queue workload, then ``--pending`` more jobs waiting (a replay's state).

For each, ``--estimates`` estimates of jobs of 1 to 16 GPUs from random teams are timed, and,
apart, the copy alone (``snapshot``). Figures (JSON on stdout): p50 / p95 / max milliseconds,
the running and pending jobs, ``peak_memory_mb`` (ru_maxrss).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_engine import build_cluster, build_queues, make_trace

from jupyter_gpusched.core import Job, Scheduler
from jupyter_gpusched.core.estimate import estimate, snapshot
from jupyter_gpusched.files import load_cluster

ROOT = Path(__file__).resolve().parent.parent
TARGET_P95_MS = 50.0
OPTIONS = (  # (flag, default, what it sets): whole numbers all
    ("--nodes", 256, "8-GPU nodes of the large state (a multiple of 32)"),
    ("--pending", 2000, "jobs waiting in the large state"),
    ("--demo-pending", 20, "jobs waiting in the demo state"),
    ("--estimates", 200, "estimates timed per state"),
)  # an estimate per spawn-form profile: a form of 4 profiles in 0.2 s


def figures(values: list[float]) -> dict:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(ordered), 3),
        "p95_ms": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 3),
        "max_ms": round(ordered[-1], 3),
    }


def fill(scheduler: Scheduler, jobs: list[Job], pending: int) -> None:
    """Submit ``jobs`` at time 0, a pass after each batch, until ``pending`` wait."""
    batch = max(1, min(100, pending // 10))
    for start in range(0, len(jobs), batch):
        for job in jobs[start : start + batch]:
            scheduler.submit(job, 0.0)
        scheduler.schedule(0.0)
        if len(scheduler.pending) >= pending:
            return


def measure(scheduler: Scheduler, users: list[tuple[str, str | None]], count: int) -> dict:
    rng = random.Random(7)
    now = 60.0
    estimates, copies = [], []
    for i in range(count):
        user, queue = rng.choice(users)
        job = Job(
            id=f"estimate-{i}",
            gpus=rng.choice([1, 1, 2, 4, 8, 16]),
            submit_time=now,
            user=user,
            queue=queue,
            walltime=rng.choice([600.0, 3600.0, 36000.0]),
        )
        start = time.perf_counter()
        estimate(scheduler, job, now)
        estimates.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        snapshot(scheduler)
        copies.append((time.perf_counter() - start) * 1000)
    return {
        "gpus": scheduler.cluster.total_gpus,
        "running": len(scheduler.running),
        "pending": len(scheduler.pending),
        "estimate": figures(estimates),
        "snapshot": figures(copies),
    }


def demo_state(pending: int) -> tuple[Scheduler, list]:
    cluster = load_cluster(str(ROOT / "hub_config" / "cluster.yaml"))
    scheduler = Scheduler(cluster)
    rng = random.Random(1)
    jobs = [
        Job(id=f"j{i}", gpus=rng.choice([1, 2, 4, 8]), submit_time=0.0, user=f"user{i % 5}")
        for i in range(10 * pending + 100)
    ]
    fill(scheduler, jobs, pending)
    return scheduler, [(f"user{i}", None) for i in range(5)]


def large_state(nodes: int, pending: int) -> tuple[Scheduler, list]:
    cluster = build_cluster(nodes)
    queues, teams = build_queues(cluster.total_gpus, 8)
    scheduler = Scheduler(cluster, queues)
    trace = make_trace(cluster.total_gpus // 3 + 2 * pending, teams, 3, True)
    fill(scheduler, [t.to_job() for t in trace], pending)
    users = sorted({(job.user, job.queue) for job in scheduler.jobs.values()})
    return scheduler, users


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for flag, default, what in OPTIONS:
        parser.add_argument(flag, type=int, default=default, help=what)
    args = parser.parse_args(argv)
    out = {
        "demo": measure(*demo_state(args.demo_pending), args.estimates),
        "large": measure(*large_state(args.nodes, args.pending), args.estimates),
        "target_p95_ms": TARGET_P95_MS,
    }
    out["met"] = all(out[k]["estimate"]["p95_ms"] <= TARGET_P95_MS for k in ("demo", "large"))
    out["peak_memory_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
