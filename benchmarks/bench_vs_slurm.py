"""gpusched against a real Slurm: one seeded workload submitted to Slurm and replayed.

Run from the project root, as root (``scripts/slurm.sh`` starts a private Slurm 22.05 cluster
under DIR: nodes n1 and n2 of 4 fake GPUs each, one leaf switch)::

    .venv/bin/python benchmarks/bench_vs_slurm.py --dir /tmp/slurm18 --save run.json
    .venv/bin/python benchmarks/bench_vs_slurm.py --replay-only run.json   # no Slurm needed

Workload (seeded): ``--jobs`` jobs of 1, 2 or 4 GPUs on one node, or 8 GPUs as a gang of 2 nodes
x 4 GPUs (``--nodes=2 --gres=gpu:4``); a burst at time 0, the rest spread uniformly over
``--tail`` seconds; each runs ``sleep D`` with D log-uniform in [DURATION_S]; its walltime is
D x U(1, 3) rounded up to whole minutes (Slurm keeps ``--time`` in minutes).

Slurm is tuned for short jobs: ``SchedulerParameters`` comes from ``--scheduler-parameters``
(default ``bf_interval=1,sched_interval=5``), passed to slurm.sh as
GPUSCHED_SLURM_SCHEDULER_PARAMETERS. Each job's submit, start and end come from ``squeue
--states=all`` (whole seconds; there is no sacct). Slurm takes a moment to notice that a job
ended and to start the next: that is part of what is measured.

The replay gets the identical jobs: submit times as Slurm recorded them (relative to the
first), durations as they actually ran (end - start), the same walltime minutes, on a
2-node x 4-GPU cluster under one leaf, with the policies of :data:`VARIANTS`. Printed JSON:
per variant and for the real Slurm, mean / p95 / gang (8-GPU) waits, mean JCT and makespan;
for each replay, its ratio to the real Slurm's mean and gang waits (``_vs_real``) and to the
first replay's (``_vs_replay``: the ``slurm`` baseline at bf_interval 1, so decisions alone are
compared, without Slurm's own delays), and its per-job wait correlation r with the real Slurm
(the ``slurm`` baseline's r says whether it is honest).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from jupyter_gpusched.core import Cluster, PolicySettings, get_policy
from jupyter_gpusched.sim.metrics import percentile
from jupyter_gpusched.sim.replay import replay
from jupyter_gpusched.sim.trace import TraceJob

ROOT = Path(__file__).resolve().parents[1]
SLURM_SH = ROOT / "scripts" / "slurm.sh"
GPUS_PER_NODE = 4
GPU_MIX = ((1, 0.45), (2, 0.25), (4, 0.18), (8, 0.12))  # GPUs, share of the jobs
DURATION_S = (8.0, 45.0)
TUNED = "bf_interval=1,sched_interval=5"
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
GANG_GPUS = 8

# name -> (policy, settings changes): the replay's policies. slurm_bf1 is the honesty check (the
# real Slurm's bf_interval); slurm_bf30 is Slurm's default cadence. gpusched_default is as
# shipped: deep passes every backfill.interval (30 s), sooner while completed jobs are short
# (backfill.interval_fraction, core/cadence.py), backfilling shortest first (backfill.order,
# core/shortest_first.py); gpusched_fixed30 keeps 30 s (the default before the cadence),
# gpusched_priority_order backfills in priority order (the default before shortest first); the
# depth variant plans behind more blocked jobs.
VARIANTS = {
    "slurm_bf1": ("slurm", {"backfill_interval": 1.0}),
    "slurm_bf30": ("slurm", {"backfill_interval": 30.0}),
    "gpusched_default": ("gpusched", {}),
    "gpusched_fixed30": ("gpusched", {"backfill_interval_fraction": 0.0}),
    "gpusched_priority_order": ("gpusched", {"backfill_order": "priority"}),
    "gpusched_bf1": ("gpusched", {"backfill_interval": 1.0}),
    "gpusched_bf0": ("gpusched", {"backfill_interval": 0.0}),  # a deep pass at every pass
    "gpusched_bf0_depth1000": ("gpusched", {"backfill_interval": 0.0, "backfill_depth": 1000}),
}


def make_workload(seed: int, count: int = 120, burst: int = 40, tail_s: float = 240.0):
    """The jobs to submit, sorted by submit offset: dicts of id, offset (s after the first),
    gpus, nodes, duration (s, whole) and walltime_min."""
    rng = random.Random(seed)
    sizes, weights = zip(*GPU_MIX, strict=True)
    low, high = DURATION_S
    jobs = []
    for i in range(count):
        gpus = rng.choices(sizes, weights)[0]
        duration = round(low * (high / low) ** rng.random())
        jobs.append(
            {
                "id": f"j{i:03d}",
                "offset": 0.0 if i < burst else round(rng.uniform(0, tail_s), 1),
                "gpus": gpus,
                "nodes": 2 if gpus == GANG_GPUS else 1,
                "duration": duration,
                "walltime_min": math.ceil(duration * rng.uniform(1.0, 3.0) / 60),
            }
        )
    jobs.sort(key=lambda j: (j["offset"], j["id"]))
    return jobs


def sbatch_argv(job: dict) -> list[str]:
    per_node = job["gpus"] // job["nodes"]
    return [
        "sbatch",
        "--parsable",
        f"--job-name={job['id']}",
        "--output=/dev/null",
        f"--nodes={job['nodes']}",
        "--ntasks-per-node=1",
        f"--gres=gpu:{per_node}",
        f"--time={job['walltime_min']}",
        f"--wrap=sleep {job['duration']}",
    ]


def _seconds(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S").timestamp()


def run_slurm(jobs: list[dict], directory: str, parameters: str) -> dict:
    """Start the private cluster, submit ``jobs`` on their schedule, wait for every end, stop
    it; the record: the settings and each job with Slurm's submit, start and end (epoch s)."""
    env = {**os.environ, "GPUSCHED_SLURM_SCHEDULER_PARAMETERS": parameters}
    started = subprocess.run(
        ["bash", str(SLURM_SH), "start", directory], env=env, capture_output=True, text=True
    )
    if started.returncode != 0:
        sys.exit(f"slurm.sh start failed ({started.returncode}): {started.stderr[-2000:]}")
    conf = next(
        v for k, _, v in (x.partition("=") for x in started.stdout.split()) if k == "SLURM_CONF"
    )
    env["SLURM_CONF"] = conf
    try:
        ids = {}
        begin = time.monotonic()
        for job in jobs:
            time.sleep(max(0.0, begin + job["offset"] - time.monotonic()))
            out = subprocess.run(
                sbatch_argv(job), env=env, check=True, capture_output=True, text=True
            )
            ids[out.stdout.strip().split(";")[0]] = job
        rows = {}
        while len(rows) < len(ids):
            time.sleep(2)
            out = subprocess.run(
                ["squeue", "--noheader", "--states=all", "--format=%i|%T|%V|%S|%e"],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            for line in out.splitlines():
                slurm_id, state, submit, start, end = line.strip().split("|")
                if slurm_id in ids and state in FINISHED:
                    rows[slurm_id] = (state, submit, start, end)
            print(f"{len(rows)}/{len(ids)} finished", file=sys.stderr, flush=True)
    finally:
        subprocess.run(["bash", str(SLURM_SH), "stop", directory], env=env, check=False)
    record = []
    for slurm_id, job in ids.items():
        state, submit, start, end = rows[slurm_id]
        record.append(
            {
                **job,
                "slurm_id": slurm_id,
                "state": state,
                "submit": _seconds(submit),
                "start": _seconds(start),
                "end": _seconds(end),
            }
        )
    return {"scheduler_parameters": parameters, "jobs": record}


# a saved record's columns: one list per job, times in seconds after the first submission
SAVED = ("id", "gpus", "nodes", "walltime_min", "duration", "state", "submit", "start", "end")


def save_record(record: dict, path) -> None:
    """``record`` as compact JSON (about 5 KB for 120 jobs): one row per job."""
    first = min(j["submit"] for j in record["jobs"])
    times = ("submit", "start", "end")
    rows = [[j[c] - first if c in times else j[c] for c in SAVED] for j in record["jobs"]]
    body = {k: v for k, v in record.items() if k != "jobs"}
    body.update(first_submit=first, columns=SAVED, jobs=rows)
    text = json.dumps(body, separators=(",", ":")).replace("],[", "],\n[")
    Path(path).write_text(text + "\n")


def load_record(path) -> dict:
    """A record written by :func:`save_record`, as :func:`run_slurm` returned it."""
    body = json.loads(Path(path).read_text())
    columns, first = body.pop("columns"), body.pop("first_submit")
    jobs = [dict(zip(columns, row, strict=True)) for row in body["jobs"]]
    for job in jobs:
        for key in ("submit", "start", "end"):
            job[key] += first
    return {**body, "jobs": jobs}


def to_trace(record: dict) -> list[TraceJob]:
    """The real run's jobs as a trace: Slurm's submit times relative to the first, the time
    each really ran (at least 1 s), the same walltime minutes and node shape."""
    jobs = record["jobs"]
    first = min(j["submit"] for j in jobs)
    trace = [
        TraceJob(
            id=j["id"],
            submit_time=j["submit"] - first,
            duration=max(j["end"] - j["start"], 1.0),
            gpus=j["gpus"],
            user="bench",
            gpus_per_node=j["gpus"] // j["nodes"],
            walltime=j["walltime_min"] * 60.0,
        )
        for j in jobs
    ]
    trace.sort(key=lambda t: (t.submit_time, t.id))
    return trace


def bench_cluster() -> Cluster:
    return Cluster.from_dict(
        {"nodes": [{"name": f"n{i}", "gpus": GPUS_PER_NODE, "leaf": "leaf1"} for i in (1, 2)]}
    )


def figures(rows: list[tuple[float, float, float, int]]) -> dict:
    """Summary of (submit, start, end, gpus) rows."""
    waits = [start - submit for submit, start, _, _ in rows]
    gang = [start - submit for submit, start, _, gpus in rows if gpus == GANG_GPUS]
    return {
        "wait_mean_s": round(sum(waits) / len(waits), 2),
        "wait_p95_s": round(percentile(sorted(waits), 95), 2),
        "gang_wait_mean_s": round(sum(gang) / len(gang), 2) if gang else None,
        "gang_jobs": len(gang),
        "jct_mean_s": round(sum(end - submit for submit, _, end, _ in rows) / len(rows), 2),
        "makespan_s": round(max(r[2] for r in rows) - min(r[0] for r in rows), 1),
    }


def correlation(xs: list[float], ys: list[float]) -> float | None:
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return round(sxy / math.sqrt(sxx * syy), 4) if sxx and syy else None


def compare(record: dict, variants=VARIANTS) -> dict:
    """The real Slurm's figures, each replay's, and the replays' ratios and r to the real."""
    trace = to_trace(record)
    first = min(j["submit"] for j in record["jobs"])
    real = {
        j["id"]: (j["submit"] - first, j["start"] - first, j["end"] - first, j["gpus"])
        for j in record["jobs"]
    }
    out = {"real_slurm": figures(list(real.values()))}
    real_waits = [real[t.id][1] - real[t.id][0] for t in trace]
    for name, (policy, changes) in variants.items():
        result = replay(
            trace, bench_cluster(), None, PolicySettings().replace(**changes), get_policy(policy)
        )
        jobs = [result.job(t.id) for t in trace]
        rows = [(j.submit_time, j.first_start, j.end_time, j.gpus) for j in jobs]
        mine = figures(rows)
        # against the real Slurm, and against the first replay (the slurm baseline at the real
        # bf_interval): the second ratio compares decisions alone, on the replay's terms
        for versus, against in (("real", "real_slurm"), ("replay", next(iter(variants)))):
            for key in ("wait_mean_s", "gang_wait_mean_s"):
                base = out.get(against, mine)[key]
                mine[f"{key}_vs_{versus}"] = (
                    round(mine[key] / base, 3) if base and mine[key] is not None else None
                )
        mine["wait_r_vs_real"] = correlation([s - q for q, s, _, _ in rows], real_waits)
        mine["policy"], mine["settings"] = policy, changes
        out[name] = mine
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=120)
    parser.add_argument("--tail", type=float, default=240.0, help="seconds the tail spans")
    parser.add_argument("--dir", default="/tmp/slurm-bench", help="the private cluster's DIR")
    parser.add_argument("--scheduler-parameters", default=TUNED)
    parser.add_argument("--save", help="write the real run's record (JSON) here")
    parser.add_argument("--replay-only", metavar="FILE", help="replay a saved record, no Slurm")
    args = parser.parse_args(argv)

    if args.replay_only:
        record = load_record(args.replay_only)
    else:
        jobs = make_workload(args.seed, args.jobs, tail_s=args.tail)
        record = run_slurm(jobs, args.dir, args.scheduler_parameters)
        record.update(seed=args.seed, count=args.jobs, tail_s=args.tail)
        if args.save:
            save_record(record, args.save)
    out = {
        "seed": record.get("seed"),
        "jobs": len(record["jobs"]),
        "scheduler_parameters": record["scheduler_parameters"],
        **compare(record),
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
