"""Expected-start benchmark: what one play of the engine forward costs the service (core/plan.py:
a copy of the scheduler, then up to ``--max-ends`` job ends, a pass each), and how many pending
jobs it reaches.

Run from the project root::

    .venv/bin/python benchmarks/bench_plan.py                       # the three states below
    .venv/bin/python benchmarks/bench_plan.py --max-ends 500 --runs 5 --sizes 256:2000

States (bench_estimate.py's): ``demo`` (the demo's 24 GPUs, full, 20 jobs waiting), then one per
``--sizes`` entry NODES:PENDING (default 128:600 and 1024:6000): bench_engine's cluster of NODES
8-GPU nodes and 64 teams, its deep-queue workload, PENDING jobs waiting. Figures (JSON on
stdout), per state: running and pending jobs, the jobs the play gave a start (``reached``), and
the seconds of one play (copy included) over ``--runs`` runs: min, median, max. The service
plays in a thread every ``expected_start_interval`` (10 s) after a pass, at most
``expected_start_max_ends`` (2,000).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_estimate import demo_state, large_state

from jupyter_gpusched.core.plan import expected_starts


def measure(scheduler, runs: int, max_ends: int) -> dict:
    seconds, reached = [], 0
    for _ in range(runs):
        start = time.perf_counter()
        reached = len(expected_starts(scheduler, 60.0, max_ends=max_ends))
        seconds.append(time.perf_counter() - start)
    return {
        "running": len(scheduler.running),
        "pending": len(scheduler.pending),
        "reached": reached,
        "seconds": {
            "min": round(min(seconds), 3),
            "median": round(statistics.median(seconds), 3),
            "max": round(max(seconds), 3),
        },
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-ends", type=int, default=2000, help="job ends a play goes through")
    parser.add_argument("--runs", type=int, default=3, help="plays timed per state")
    parser.add_argument("--sizes", default="128:600,1024:6000", help="NODES:PENDING,...")
    args = parser.parse_args(argv)
    out: dict = {"max_ends": args.max_ends, "runs": args.runs}
    out["demo"] = measure(demo_state(20)[0], args.runs, args.max_ends)
    for size in args.sizes.split(","):
        nodes, pending = (int(part) for part in size.split(":"))
        scheduler, _ = large_state(nodes, pending)
        out[f"{nodes * 8} GPUs"] = measure(scheduler, args.runs, args.max_ends)
    out["peak_memory_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
