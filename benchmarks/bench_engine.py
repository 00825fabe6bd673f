"""Engine benchmark: a synthetic 1,024-node x 8-GPU cluster and a 10,000-job burst.

Run from the project root::

    .venv/bin/python benchmarks/bench_engine.py              # full size, JSON on stdout
    .venv/bin/python benchmarks/bench_engine.py --jobs 2000  # a quick run
    .venv/bin/python benchmarks/bench_engine.py --profile    # + top 30 cumulative on stderr
    .venv/bin/python benchmarks/bench_engine.py --workload deep                   # issue 18
    .venv/bin/python benchmarks/bench_engine.py --workload deep --nodes 16384 --jobs 160000

Cluster: 1,024 nodes of 8 GPUs, 32 leaves of 32 nodes, 4 spines of 8 leaves. Queues: 4 orgs x
4 departments x 4 teams = 64 leaf teams, each guaranteed 128 GPUs with a limit of 256 (the orgs
and departments guarantee their children's sum and have no limit). Jobs (seeded, deterministic):
submitted uniformly in [0, 10) s; 70% 1 GPU, 15% 2-4, 10% 8, 5% 16/32/64; every job of 8 or
more GPUs asks for ``gpus_per_node=8`` (whole nodes), smaller ones leave the shape to the engine;
tiers 1/2/3 in 10/60/30%; durations lognormal around 1 h, clipped to [10 min, 6 h]; walltime
estimate = duration x U(1, 3).

``--workload deep`` (issue 18, seed 2): durations uniform in [10 min, 10 h] and team limits 8x
the guarantee, so the queue stays thousands deep for a simulated day and jobs wait on capacity,
not on their quota. ``--nodes N`` scales the cluster (leaves of 32 nodes, spines of 8 leaves;
the teams' guarantees are 1/64 of it). Targets: the burst's (below); the deep queue's on 1,024
nodes (replay <= 4 s, steady state >= 8,000 placements/s); 16,384 nodes and 160,000 jobs
(replay <= 30 s, peak memory <= 1 GB).

Figures: ``sim_wall_s`` and ``passes`` come from a full replay with the gpusched policy.
``first_fill_s`` is one ``schedule(0)`` call on a fresh scheduler holding every job (submitted
at time 0) and an empty cluster. ``placements_per_s`` is the steady state: Start decisions made
by the passes after the last submission (the churn phase: jobs end, queued jobs start) divided
by the wall time spent inside those ``schedule`` calls. ``placements_per_s_overall`` is every
Start of the replay over ``sim_wall_s``. ``peak_memory_mb`` is the process's ru_maxrss.
``passes_by_kind``: every pass of the replay by kind (see :class:`PassTimer`), with its count,
wall time, the jobs it started and its mean cost: where the time goes as the cluster grows.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import dataclasses
import io
import json
import math
import pstats
import random
import resource
import sys
import time

from jupyter_gpusched.core import Cluster, PolicySettings, QueueTree, Scheduler, Start, get_policy
from jupyter_gpusched.sim.metrics import metrics
from jupyter_gpusched.sim.replay import replay
from jupyter_gpusched.sim.trace import TraceJob

TARGETS = {"sim_wall_s": 5, "first_fill_s": 1, "placements_per_s": 5000, "peak_memory_mb": 1024}
DEEP_TARGETS = {"sim_wall_s": 4, "placements_per_s": 8000, "peak_memory_mb": 1024}  # issue 18
SCALE_TARGETS = {"sim_wall_s": 30, "peak_memory_mb": 1024}  # 16,384 nodes, 160,000 jobs


def targets(workload: str, nodes: int) -> dict:
    """The figures to reach: the burst's, the deep queue's on 1,024 nodes, the scale run's."""
    if nodes >= 16_384:
        return SCALE_TARGETS
    return DEEP_TARGETS if workload == "deep" else TARGETS


SUBMIT_WINDOW_S = 10.0


def build_cluster(node_count: int = 1024) -> Cluster:
    """``node_count`` nodes of 8 GPUs (a multiple of 32): leaves of 32 nodes, spines of 8."""
    nodes, spines = [], {}
    for leaf in range(node_count // 32):
        first = leaf * 32 + 1
        name = f"n[{first:04d}-{first + 31:04d}]"
        nodes.append({"name": name, "gpus": 8, "leaf": f"leaf-{leaf + 1:02d}"})
        spines.setdefault(f"spine-{leaf // 8 + 1}", []).append(f"leaf-{leaf + 1:02d}")
    return Cluster.from_dict({"nodes": nodes, "switches": spines})


def build_queues(cluster_gpus: int, limit_factor: int = 2) -> tuple[QueueTree, list[str]]:
    """64 leaf teams, each guaranteed 1/64 of the cluster, with a limit of ``limit_factor``
    times that."""
    guaranteed = cluster_gpus // 64
    team = {"guaranteed": guaranteed, "limit": guaranteed * limit_factor, "weight": 1}
    tree = {
        f"org{o}": {
            "children": {
                f"dept{d}": {"children": {f"team{t}": dict(team) for t in range(4)}}
                for d in range(4)
            }
        }
        for o in range(4)
    }
    paths = [f"org{o}/dept{d}/team{t}" for o in range(4) for d in range(4) for t in range(4)]
    return QueueTree.from_dict({"queues": tree}, cluster_gpus), paths


def make_trace(count: int, teams: list[str], seed: int, deep: bool = False) -> list[TraceJob]:
    """The burst; ``deep``: durations uniform in [10 min, 10 h] instead (the queue stays
    thousands deep for a simulated day)."""
    rng = random.Random(seed)
    jobs = []
    for i in range(count):
        draw = rng.random()
        if draw < 0.70:
            gpus = 1
        elif draw < 0.85:
            gpus = rng.randint(2, 4)
        elif draw < 0.95:
            gpus = 8
        else:
            gpus = rng.choice((16, 32, 64))
        team = rng.randrange(len(teams))
        if deep:
            duration = round(rng.uniform(600, 10 * 3600))
        else:
            duration = round(min(max(rng.lognormvariate(math.log(3600), 0.8), 600), 6 * 3600))
        jobs.append(
            TraceJob(
                id=f"job{i:05d}",
                submit_time=rng.uniform(0, SUBMIT_WINDOW_S),
                duration=float(duration),
                gpus=gpus,
                tier=rng.choices((1, 2, 3), weights=(10, 60, 30))[0],
                queue=teams[team],
                user=f"user{team}-{rng.randrange(4)}",
                kind="batch",
                gpus_per_node=8 if gpus >= 8 else None,
                walltime=float(round(duration * rng.uniform(1.0, 3.0))),
            )
        )
    jobs.sort(key=lambda j: j.submit_time)
    return jobs


PASS_KINDS = ("deep", "deep_woken_early", "other")


class PassTimer:
    """Wraps Scheduler.schedule to time the passes of the replay's steady state, and every
    pass by kind: ``deep`` (a deep pass ``backfill.interval`` or more after the last one),
    ``deep_woken_early`` (a deep pass sooner, woken by a victim passing its minimum run time,
    a gang's leaf patience ending, a deadline ...), ``other`` (a quick pass, or one over new
    jobs only)."""

    def __init__(self, after: float):
        self.after, self.starts, self.seconds, self.all_starts = after, 0, 0.0, 0
        self.original = Scheduler.schedule
        self.by_kind = {kind: [0, 0.0, 0] for kind in PASS_KINDS}  # passes, seconds, starts

    def kinds(self) -> dict:
        return {
            kind: {
                "passes": n,
                "seconds": round(seconds, 3),
                "starts": starts,
                "mean_us": round(seconds / n * 1e6) if n else 0,
            }
            for kind, (n, seconds, starts) in self.by_kind.items()
        }

    def __enter__(self):
        timer, original = self, self.original

        def schedule(scheduler, now):
            passes, last_deep = scheduler.passes, scheduler._last_deep  # (the engine's own)
            begin = time.perf_counter()
            decisions = original(scheduler, now)
            spent = time.perf_counter() - begin
            starts = sum(1 for d in decisions if isinstance(d, Start))
            timer.all_starts += starts
            if now >= timer.after:
                timer.starts += starts
                timer.seconds += spent
            if scheduler.passes > passes:
                if scheduler._last_deep != last_deep:
                    early = now - last_deep < scheduler.cadence.interval
                    kind = "deep_woken_early" if early else "deep"
                else:
                    kind = "other"
                counts = timer.by_kind[kind]
                counts[0] += 1
                counts[1] += spent
                counts[2] += starts
            return decisions

        Scheduler.schedule = schedule
        return self

    def __exit__(self, *exc):
        Scheduler.schedule = self.original


def first_fill(trace, cluster, queues, settings, policy) -> dict:
    scheduler = Scheduler(cluster, copy.deepcopy(queues), settings, policy)
    begin = time.perf_counter()
    for t in trace:
        scheduler.submit(dataclasses.replace(t, submit_time=0.0).to_job(), 0.0)
    submitted = time.perf_counter()
    decisions = scheduler.schedule(0.0)
    done = time.perf_counter()
    return {
        "first_fill_s": round(done - submitted, 4),
        "first_fill_placements": sum(1 for d in decisions if isinstance(d, Start)),
        "first_fill_submit_s": round(submitted - begin, 4),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs in the trace")
    parser.add_argument("--nodes", type=int, default=1024, help="8-GPU nodes (a multiple of 32)")
    parser.add_argument(
        "--workload",
        choices=("burst", "deep"),
        default="burst",
        help="burst: lognormal durations around 1 h, team limit 2x the guarantee; deep: "
        "durations uniform in [10 min, 10 h], team limit 8x the guarantee (jobs wait on "
        "capacity, not quota, for a simulated day or more)",
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed (burst 1, deep 2)")
    parser.add_argument("--profile", action="store_true", help="cProfile the replay (stderr)")
    args = parser.parse_args(argv)

    deep = args.workload == "deep"
    seed = args.seed if args.seed is not None else (2 if deep else 1)
    cluster = build_cluster(args.nodes)
    queues, teams = build_queues(cluster.total_gpus, 8 if deep else 2)
    settings, policy = PolicySettings(), get_policy("gpusched")
    trace = make_trace(args.jobs, teams, seed, deep)
    last_submit = trace[-1].submit_time if trace else 0.0

    profiler = cProfile.Profile() if args.profile else None
    with PassTimer(after=last_submit + 1e-9) as timer:
        if profiler:
            profiler.enable()
        result = replay(trace, cluster, queues, settings, policy)
        if profiler:
            profiler.disable()
    figures = metrics(result)
    passes = result.scheduler.passes
    del result
    fill = first_fill(trace, cluster, queues, settings, policy)

    out = {
        "jobs": args.jobs,
        "gpus": cluster.total_gpus,
        "workload": args.workload,
        "seed": seed,
        "profiled": args.profile,
        "sim_wall_s": figures["sim_wall_s"],
        "passes": passes,
        "passes_by_kind": timer.kinds(),
        **fill,
        "placements_per_s": round(timer.starts / timer.seconds, 1) if timer.seconds else 0.0,
        "steady_placements": timer.starts,
        "steady_schedule_s": round(timer.seconds, 4),
        "placements_per_s_overall": round(timer.all_starts / figures["sim_wall_s"], 1)
        if figures["sim_wall_s"]
        else 0.0,
        "peak_memory_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "completed": figures["completed"],
        "rejected": figures["rejected"],
        "preemptions": figures["preemptions"],
        "targets": targets(args.workload, args.nodes),
    }
    out["met"] = {
        name: out[name] >= target if name == "placements_per_s" else out[name] <= target
        for name, target in out["targets"].items()
    }
    print(json.dumps(out, indent=2))
    if profiler:
        buffer = io.StringIO()
        pstats.Stats(profiler, stream=buffer).sort_stats("cumulative").print_stats(30)
        print(buffer.getvalue(), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
