"""Deadlines on the Philly trace, printing one JSON object: how many deadlines each policy meets.

    .venv/bin/python benchmarks/bench_deadlines.py                       # philly:512, 20 %
    .venv/bin/python benchmarks/bench_deadlines.py --cluster philly:384 --percent 10

The Philly Sep-Oct log (52,849 jobs; tier mix 10/60/30, walltime 2x the run time as in
bench_replay.py) on a smaller cluster than its own, so that jobs queue (fifo's mean wait is
thousands of seconds); ``--percent`` of the jobs (by a hash of their id:
``sim.trace.with_deadlines``) must finish within 1.5-4x their walltime of their submission.
Each policy replays the same trace: ``gpusched`` (urgency, reclaim), ``gpusched-ignore``
(the same without urgency or reclaim), ``slurm`` (Slurm's
``--deadline``: a pending job is cancelled once it can no longer end in time) and ``fifo``
(deadlines ignored). The figures: ``deadline_met_fraction``, ``deadline_miss_s`` (how late the
late ones ended), ``deadline_cancelled``, and, so that what deadlines cost the other jobs shows
too, the mean and p95 wait of the jobs without a deadline.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from jupyter_gpusched.core import PolicySettings, get_policy
from jupyter_gpusched.sim.cluster_loaders import load_cluster_spec, load_queue_spec
from jupyter_gpusched.sim.loaders import WALLTIME_FACTORS, load_trace, parse_tier_mix
from jupyter_gpusched.sim.metrics import metrics, summary
from jupyter_gpusched.sim.replay import replay
from jupyter_gpusched.sim.trace import with_deadlines, with_walltimes

TRACES = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"
PHILLY = TRACES / "philly" / "philly_2017_sep_oct.csv"


def policy_named(name: str):
    """A policy by name; ``gpusched-ignore``: gpusched with deadlines ignored (no urgency, no
    reclaim: what urgency itself buys, and costs the jobs without a deadline)."""
    if name == "gpusched-ignore":
        return dataclasses.replace(get_policy("gpusched"), name=name, deadlines="ignore")
    return get_policy(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cluster", default="philly:512")
    parser.add_argument("--percent", type=float, default=20.0)
    parser.add_argument("--policies", default="gpusched,gpusched-ignore,slurm,fifo")
    parser.add_argument("--jobs", type=int, default=0, help="the first N jobs only (0: all)")
    args = parser.parse_args()
    trace = load_trace(PHILLY, "philly", parse_tier_mix("10,60,30")).jobs
    if args.jobs:
        trace = trace[: args.jobs]
    trace = with_deadlines(with_walltimes(trace, WALLTIME_FACTORS["philly"]), args.percent)
    cluster = load_cluster_spec(args.cluster).cluster
    out = {"cluster": args.cluster, "jobs": len(trace), "percent": args.percent, "policies": {}}
    for name in args.policies.split(","):
        queues = load_queue_spec(args.cluster, cluster, trace, PHILLY)
        started = time.perf_counter()
        result = replay(trace, cluster, queues, PolicySettings(), policy_named(name))
        figures = metrics(result)
        others = [result.job(t.id) for t in trace if t.deadline is None]
        waits = [j.first_start - j.submit_time for j in others if j.first_start is not None]
        out["policies"][name] = {
            key: figures[key]
            for key in (
                "deadline_jobs",
                "deadline_met_fraction",
                "deadline_miss_s",
                "deadline_cancelled",
                "wait_s",
                "gang_single_leaf_fraction",
            )
        } | {
            "others_wait_s": summary(waits, ("mean", "p95")),
            "replay_s": round(time.perf_counter() - started, 1),
        }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
