"""Replay benchmark on the real traces, printing one JSON object.

    .venv/bin/python benchmarks/bench_replay.py            # Philly Sep-Oct + Alibaba pack
    .venv/bin/python benchmarks/bench_replay.py --profile  # + the replay's top 25 functions

Philly: the 52,849-job Sep-Oct log on ``philly:768`` with ``philly:768`` queues and tier mix
10/60/30, replayed with the gpusched policy (target ``sim_wall_s`` <= 20 s on a 2-core machine).
Alibaba: ``pack`` of the default pod list on the full node list with the gpusched placement,
three times, the median wall time (target <= 5 s). ``peak_memory_mb`` is the process's
ru_maxrss (target <= 1,024 MB).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import resource
import statistics
import sys
import time
from pathlib import Path

from jupyter_gpusched.core import PolicySettings, get_policy
from jupyter_gpusched.sim.cluster_loaders import load_cluster_spec, load_queue_spec
from jupyter_gpusched.sim.loaders import WALLTIME_FACTORS, load_trace, parse_tier_mix
from jupyter_gpusched.sim.metrics import metrics
from jupyter_gpusched.sim.pack import pack, read_tasks
from jupyter_gpusched.sim.replay import replay
from jupyter_gpusched.sim.trace import with_walltimes

TRACES = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
PHILLY = TRACES / "philly" / "philly_2017_sep_oct.csv"
ALIBABA_TASKS = TRACES / "alibaba2023" / "openb_pod_list_default.csv"
ALIBABA_NODES = TRACES / "alibaba2023" / "openb_node_list_gpu_node.csv"
TARGETS = {"philly_sim_wall_s": 20, "pack_wall_s": 5, "peak_memory_mb": 1024}
PACK_RUNS = 3


def bench_philly(profile: bool) -> dict:
    started = time.perf_counter()
    trace = load_trace(PHILLY, "philly", parse_tier_mix("10,60,30")).jobs
    trace = with_walltimes(trace, WALLTIME_FACTORS["philly"])
    load_s = time.perf_counter() - started
    cluster = load_cluster_spec("philly:768").cluster
    queues = load_queue_spec("philly:768", cluster, trace, PHILLY)
    profiler = cProfile.Profile() if profile else None
    if profiler:
        profiler.enable()
    result = replay(trace, cluster, queues, PolicySettings(), get_policy("gpusched"))
    if profiler:
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(25)
        print(out.getvalue(), file=sys.stderr)
    figures = metrics(result)
    return {
        "jobs": figures["jobs"],
        "load_s": round(load_s, 3),
        "sim_wall_s": figures["sim_wall_s"],
        "jobs_per_s": figures["jobs_per_s"],
        "passes": result.scheduler.passes,
        "wait_mean_s": figures["wait_s"]["mean"],
        "gang_single_leaf_fraction": figures["gang_single_leaf_fraction"],
    }


def bench_pack(runs: int = PACK_RUNS) -> dict:
    """``pack`` a few times (the runs are identical but for time; this machine's speed drifts
    by 20-30% from minute to minute): the median is the figure, every run is shown."""
    tasks = read_tasks(ALIBABA_TASKS)
    cluster = load_cluster_spec(str(ALIBABA_NODES)).cluster
    results = [pack(tasks, cluster, "gpusched") for _ in range(runs)]
    assert len({r.unallocated_gpu_fraction for r in results}) == 1, "pack is not deterministic"
    return {
        "tasks": len(tasks),
        "wall_s": statistics.median(r.wall_s for r in results),
        "wall_s_runs": [r.wall_s for r in results],
        "unallocated_gpu_fraction": results[0].unallocated_gpu_fraction,
        "tasks_failed": results[0].tasks_failed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="store_true", help="profile the Philly replay")
    args = parser.parse_args()
    if not PHILLY.exists():
        sys.exit(f"the traces are not at {TRACES}")
    philly = bench_philly(args.profile)
    packed = bench_pack()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    figures = {
        "philly": philly,
        "pack": packed,
        "peak_memory_mb": round(peak, 1),
        "targets": TARGETS,
    }
    figures["met"] = {
        "philly_sim_wall_s": philly["sim_wall_s"] <= TARGETS["philly_sim_wall_s"],
        "pack_wall_s": packed["wall_s"] <= TARGETS["pack_wall_s"],
        "peak_memory_mb": peak <= TARGETS["peak_memory_mb"],
    }
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
