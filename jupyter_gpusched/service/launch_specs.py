"""What the launcher is given to start a batch job's run, and how a placement is worded.

A pass's ``Start`` of a batch job becomes a :class:`.launcher.LaunchSpec`: the job's command,
its GPUs on each node of the placement, and the ``GPUSCHED_*`` environment the job reads (the
queue, tier, nodes, run, the signal it gets before pre-emption). Apart from live.py because it
is a translation only: no state, no I/O.
"""

from __future__ import annotations

import os

from ..backends.interface import LaunchSpec
from ..core.jobs import Job
from .records import Extra


def launch_spec(
    job: Job, placement, extra: Extra, cluster, preemption_signal: str, log_dir: str
) -> LaunchSpec:
    """The run of ``job`` on ``placement`` (its first part's node is where its GPUs are)."""
    first = placement.parts[0]
    gpus = [i for i in range(first.mask.bit_length()) if first.mask >> i & 1]
    nodes = ",".join(cluster.nodes[p.node].name for p in placement.parts)
    env = dict(extra.env)
    env.update(
        GPUSCHED_JOB_ID=job.id,
        GPUSCHED_QUEUE=job.queue,
        GPUSCHED_TIER=str(job.tier),
        GPUSCHED_NODES=nodes,
        GPUSCHED_NODE=cluster.nodes[first.node].name,  # its GPUs' node (the first)
        GPUSCHED_RUN=str(job.runs),
        GPUSCHED_PREEMPTION_SIGNAL=preemption_signal,
    )
    if job.array_id is not None:  # a job of an array (core/arrays.py), as Slurm's
        env.update(GPUSCHED_ARRAY_ID=job.array_id, GPUSCHED_ARRAY_INDEX=str(job.array_index))
    return LaunchSpec(
        job_id=job.id,
        user=job.user,
        command=extra.command,
        notebook=extra.notebook,
        gpus=gpus,
        env=env,
        cwd=extra.cwd,
        log_dir=os.path.join(log_dir, job.user or "_"),
        nodes=[
            (
                cluster.nodes[p.node].name,
                [i for i in range(p.mask.bit_length()) if p.mask >> i & 1],
            )
            for p in placement.parts
        ],
    )


def describe(placement, cluster) -> str:
    parts = []
    for part in placement.parts:
        gpus = ",".join(str(i) for i in range(part.mask.bit_length()) if part.mask >> i & 1)
        share = f" ({part.fraction:g} of it)" if part.fraction < 1 else ""
        what = f"GPU {gpus}{share}" if gpus else "no GPU"  # (a CPU-only job)
        parts.append(f"{cluster.nodes[part.node].name} {what}")
    return "; ".join(parts)
