"""Learned run-time estimates (core/runtime_estimates.py) against walltimes, printing JSON.

    .venv/bin/python benchmarks/bench_estimates.py                  # both parts, seeds 1-3
    .venv/bin/python benchmarks/bench_estimates.py --part synthetic --seeds 1 2 3 4 5
    .venv/bin/python benchmarks/bench_estimates.py --part synthetic --seeds $(seq 1 30)
    .venv/bin/python benchmarks/bench_estimates.py --part philly --philly-jobs 20000 \
        --philly ../shared/traces/philly/philly_2017_sep_oct.csv   # (from a git worktree)
    .venv/bin/python benchmarks/bench_estimates.py --part philly --philly-jobs 60000 \
        --philly-cluster philly:512                                  # the whole split, heavier

(a) ``philly``: the Philly Sep-Oct log on ``philly:768`` (``--philly-cluster``) with its queues,
tier mix 10/60/30, the gpusched policy (as README's replay), its first ``--philly-jobs`` jobs.
The arms:
``walltime_2x`` (the trace's walltime model: every job gives 2x its real run time, as
``bench_replay.py``), ``no_walltime`` (no job gives one: the policy's 24 h default),
``learned`` (no job gives one; ``walltime.estimate: missing``) and ``learned_always`` (2x
walltimes, ``estimate: always``: an estimate under the walltime replaces it).

(b) ``synthetic``: a seeded workload on 16 nodes of 8 GPUs (two leaf switches) where users give
minute-rounded walltimes: each user runs a few job types (GPUs, typical run time), a run lasts
its type's typical time x a lognormal spread, and its walltime is that x a factor drawn in
[1, 8], rounded up to whole minutes. 1-8 GPU jobs and 2-node gangs (16 GPUs), tiers 2 and 3,
enough load that jobs queue. Arms: ``estimate: never`` (plan with the walltimes) and
``always``.

``synthetic_summary``: over the seeds, each of mean wait, p95 wait and gang mean wait of
``always`` over ``never``, as a geometric mean with a 95 % interval and the range (seeds with no
waits left out). ``--estimate-quantile`` and ``--estimate-margin`` change the model of both
parts (``walltime.estimate_quantile``, ``walltime.estimate_margin``).

Each arm reports mean and p95 wait, the gangs' (multi-node jobs') mean wait, the jobs planned
with an estimate, the fraction of those that ran longer than it, and among jobs that held the
reservation, the fraction that started later than their first reservation's start.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import time
from pathlib import Path

from jupyter_gpusched.core import Cluster, PolicySettings, get_policy
from jupyter_gpusched.sim.cluster_loaders import load_cluster_spec, load_queue_spec
from jupyter_gpusched.sim.loaders import WALLTIME_FACTORS, load_trace, parse_tier_mix
from jupyter_gpusched.sim.metrics import metrics
from jupyter_gpusched.sim.replay import replay
from jupyter_gpusched.sim.trace import TraceJob, with_walltimes

TRACES = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
PHILLY = TRACES / "philly" / "philly_2017_sep_oct.csv"


def figures(result) -> dict:
    m = metrics(result)
    gang_waits = [
        result.job(j).first_start - result.job(j).submit_time
        for j, nodes in result.placements.items()
        if len(nodes) > 1
    ]
    return {
        "wait_mean_s": m["wait_s"]["mean"],
        "wait_p95_s": m["wait_s"]["p95"],
        "gang_jobs": len(gang_waits),
        "gang_wait_mean_s": round(sum(gang_waits) / len(gang_waits), 1) if gang_waits else 0.0,
        "estimated_jobs": m["estimated_jobs"],
        "estimate_too_short_fraction": m["estimate_too_short_fraction"],
        "reserved_jobs": m["reserved_jobs"],
        "reservations_too_short_fraction": m["reservations_too_short_fraction"],
        "preemptions": m["preemptions"],
        "sim_wall_s": m["sim_wall_s"],
    }


MODEL: dict = {}  # estimate_quantile / estimate_margin given on the command line


def settings(mode: str) -> PolicySettings:
    return PolicySettings.from_dict({"walltime": {"estimate": mode, **MODEL}})


RATIOS = ("wait_mean_s", "wait_p95_s", "gang_wait_mean_s")


def synthetic_summary(rows: list[dict]) -> dict:
    """Over the seeds, each figure of ``always`` over ``never``: the geometric mean with a 95 %
    interval (2 standard errors of the mean log ratio), the lowest and highest ratio and the
    seeds counted (those where both are above 0: a seed with no waits says nothing)."""
    out = {}
    for name in RATIOS:
        ratios = [r["always"][name] / r["never"][name] for r in rows
                  if r["never"][name] > 0 and r["always"][name] > 0]  # fmt: skip
        if len(ratios) < 2:
            continue
        logs = [math.log(x) for x in ratios]
        mean = statistics.mean(logs)
        error = 2 * statistics.stdev(logs) / math.sqrt(len(logs))
        out[name] = {
            "geometric_mean": round(math.exp(mean), 3),
            "interval_95": [round(math.exp(mean - error), 3), round(math.exp(mean + error), 3)],
            "range": [round(min(ratios), 3), round(max(ratios), 3)],
            "seeds": len(ratios),
        }
    return out


def bench_philly(jobs: int, path: Path = PHILLY, spec: str = "philly:768") -> dict:
    loaded = load_trace(path, "philly", parse_tier_mix("10,60,30")).jobs[:jobs]
    twice = with_walltimes(loaded, WALLTIME_FACTORS["philly"])
    cluster = load_cluster_spec(spec).cluster
    queues = load_queue_spec(spec, cluster, loaded, path)
    policy = get_policy("gpusched")
    arms = {
        "walltime_2x": (twice, "never"),
        "no_walltime": (loaded, "never"),
        "learned": (loaded, "missing"),
        "learned_always": (twice, "always"),
    }
    out = {"jobs": len(loaded), "cluster": spec}
    for name, (trace, mode) in arms.items():
        out[name] = figures(replay(trace, cluster, queues, settings(mode), policy))
    return out


def synthetic_cluster() -> Cluster:
    nodes = [
        {"name": f"n{leaf}{i:02d}", "gpus": 8, "leaf": f"leaf-{leaf}"}
        for leaf in (1, 2)
        for i in range(8)
    ]
    return Cluster.from_dict({"nodes": nodes})


def synthetic_trace(seed: int, jobs: int = 3000) -> list[TraceJob]:
    rng = random.Random(seed)
    users = []
    for u in range(12):
        types = []
        for _ in range(rng.randint(1, 3)):
            gpus = rng.choice((1, 1, 2, 4, 8, 8, 16))
            typical = math.exp(rng.uniform(math.log(600), math.log(6 * 3600)))
            types.append((gpus, typical))
        users.append((f"user{u}", types))
    trace, t = [], 0.0
    mean_gap = 300.0  # offered load ~90% of the 128 GPUs: the queue builds, and drains
    for n in range(jobs):
        t += rng.expovariate(1 / mean_gap)
        user, types = rng.choice(users)
        gpus, typical = rng.choice(types)
        duration = max(60.0, typical * rng.lognormvariate(0, 0.35))
        walltime = math.ceil(duration * rng.uniform(1, 8) / 60) * 60
        trace.append(
            TraceJob(
                id=f"j{n:05d}",
                submit_time=round(t, 1),
                duration=round(duration, 1),
                gpus=gpus,
                tier=rng.choice((2, 2, 2, 3)),
                user=user,
                gpus_per_node=8 if gpus > 8 else None,
                walltime=float(walltime),
            )
        )
    return trace


def bench_synthetic(seed: int) -> dict:
    trace = synthetic_trace(seed)
    cluster = synthetic_cluster()
    policy = get_policy("gpusched")
    ratio = sum(t.walltime for t in trace) / sum(t.duration for t in trace)
    out = {"seed": seed, "jobs": len(trace), "walltime_over_run_time": round(ratio, 2)}
    for mode in ("never", "always"):
        out[mode] = figures(replay(trace, cluster, None, settings(mode), policy))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", choices=("philly", "synthetic", "both"), default="both")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--philly-jobs", type=int, default=20_000)
    parser.add_argument("--philly", type=Path, default=PHILLY, help="the Philly Sep-Oct CSV")
    parser.add_argument(
        "--philly-cluster", default="philly:768", help="cluster and queues (philly:512: heavier)"
    )
    parser.add_argument("--estimate-quantile", type=float, help="walltime.estimate_quantile")
    parser.add_argument("--estimate-margin", type=float, help="walltime.estimate_margin")
    args = parser.parse_args()
    if args.estimate_quantile is not None:
        MODEL["estimate_quantile"] = args.estimate_quantile
    if args.estimate_margin is not None:
        MODEL["estimate_margin"] = args.estimate_margin
    started = time.perf_counter()
    out: dict = {}
    if args.part in ("synthetic", "both"):
        out["synthetic"] = [bench_synthetic(seed) for seed in args.seeds]
        out["synthetic_summary"] = synthetic_summary(out["synthetic"])
    if args.part in ("philly", "both"):
        out["philly"] = bench_philly(args.philly_jobs, args.philly, args.philly_cluster)
    out["wall_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
