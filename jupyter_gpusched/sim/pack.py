"""Packing: the experiment of the FGD paper (USENIX ATC'23) on the Alibaba 2023 trace.

Tasks arrive one after another in trace order (then sampled again from the same list, seeded,
when it runs out) and never leave. Each is placed at once or not at all, until the GPU demand that
has arrived reaches 100% of the cluster's GPUs. A task's demand is its GPUs times its GPU fraction.

Figures, per placement policy:
- ``allocation_rate`` at every 5% of arrived demand: allocated demand / arrived demand;
- ``unallocated_gpu_fraction`` at 100%: GPU capacity left unallocated (shares summed) over the
  cluster's GPUs: what fragmentation (and CPU or memory exhaustion) strands.

Policies:
- ``firstfit``: the lowest-numbered node (and GPU) that fits (the engine's topology-blind mode);
- ``bestfit``: the tightest node: the node with the least GPU capacity left (free GPUs plus room
  on shared GPUs) that fits; on it the fullest shared GPU that holds a fraction;
- ``gpusched``: the engine itself (a :class:`Scheduler` with the ``gpusched`` policy): each task is
  submitted and scheduled at once, and cancelled if it does not start. Its placement is FGD
  (:mod:`..core.fragmentation`), on the task shapes the engine has seen so far.
"""

from __future__ import annotations

import csv
import random
import time
from dataclasses import dataclass
from pathlib import Path

from ..core import Cluster, Job, JobState, Scheduler
from ..core.placement import find_placement, node_fits
from ..core.state import ClusterState, Part, Placement
from .trace import TraceError, TraceJob

PACK_POLICIES = ("gpusched", "bestfit", "firstfit")
TASK_COLUMNS = ("num_gpu", "gpu_milli", "cpu_milli", "memory_mib")
STEPS = tuple(range(5, 101, 5))


@dataclass
class PackResult:
    policy: str
    allocation_rate: dict[str, float]
    unallocated_gpu_fraction: float
    tasks_arrived: int
    tasks_failed: int
    wall_s: float


def read_tasks(path) -> list[TraceJob]:
    """The resource columns of an Alibaba 2023 pod list: ``num_gpu, gpu_milli, cpu_milli,
    memory_mib`` and the optional ``gpu_spec``. Every task counts, scheduled or not, and tasks
    without GPUs are left out (they add no GPU demand)."""
    path = Path(path)
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise TraceError(f"cannot read the tasks: {exc.strerror}", source=str(path)) from None
    tasks = []
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in TASK_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"missing column(s) {', '.join(missing)}", source=str(path), line=1)
        for row in reader:
            values = {}
            for column in TASK_COLUMNS:
                try:
                    values[column] = int(row[column])
                except (TypeError, ValueError):
                    raise TraceError(
                        f"{row[column]!r} is not a whole number",
                        source=str(path),
                        line=reader.line_num,
                        field=column,
                    ) from None
                if values[column] < 0:
                    raise TraceError(
                        "must not be negative", source=str(path), line=reader.line_num, field=column
                    )
            gpus, milli = values["num_gpu"], values["gpu_milli"]
            if gpus == 0:
                continue
            if not 0 < milli <= 1000 or (gpus > 1 and milli != 1000):
                raise TraceError(
                    f"{milli} must be 1..1000, and 1000 when num_gpu > 1",
                    source=str(path),
                    line=reader.line_num,
                    field="gpu_milli",
                )
            spec = (row.get("gpu_spec") or "").strip()
            tasks.append(
                TraceJob(
                    id=row.get("name") or f"task{reader.line_num}",
                    submit_time=0.0,
                    duration=0.0,
                    gpus=gpus,
                    gpu_fraction=milli / 1000,
                    gpu_models=frozenset(m for m in spec.split("|") if m) or None,
                    cpus=values["cpu_milli"] / 1000,
                    memory_gb=values["memory_mib"] / 1024,
                )
            )
    return tasks


def plot_pack(results: list[PackResult], path) -> None:
    """Allocation rate against arrived demand, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(7, 4))
    for result in results:
        steps = [int(s) for s in result.allocation_rate]
        axes.plot(
            steps,
            list(result.allocation_rate.values()),
            marker="o",
            label=(f"{result.policy} (unallocated {result.unallocated_gpu_fraction:.1%})"),
        )
    axes.set_xlabel("arrived GPU demand (% of the cluster's GPUs)")
    axes.set_ylabel("allocation rate")
    axes.set_title("Packing: tasks arrive and never leave")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def pack(tasks: list[TraceJob], cluster: Cluster, policy: str, seed: int = 0) -> PackResult:
    """Run the packing experiment for one policy."""
    if policy not in PACK_POLICIES:
        raise ValueError(f"unknown packing policy {policy!r}; known: {', '.join(PACK_POLICIES)}")
    gpu_tasks = [t for t in tasks if t.gpus > 0]
    if not gpu_tasks:
        raise ValueError("no task asks for a GPU")
    started = time.perf_counter()
    engine = Scheduler(cluster, policy="gpusched") if policy == "gpusched" else None
    state = engine.state if engine is not None else ClusterState(cluster)
    rng = random.Random(seed)
    total = float(cluster.total_gpus)
    arrived = allocated = 0.0
    failed = count = 0
    rates: dict[str, float] = {}
    step = 0
    while step < len(STEPS):
        task = gpu_tasks[count] if count < len(gpu_tasks) else rng.choice(gpu_tasks)
        count += 1
        demand = task.gpus * task.gpu_fraction
        job = Job(
            id=f"t{count}",
            gpus=task.gpus,
            submit_time=0.0,
            gpus_per_node=task.gpus,
            gpu_models=task.gpu_models,
            cpus=task.cpus,
            memory_gb=task.memory_gb,
            gpu_fraction=task.gpu_fraction,
        )
        if engine is not None:
            placed = _submit(engine, job)
        else:
            placement = _place(state, job, policy)
            placed = placement is not None
            if placed:
                state.take(job.id, placement)
        if placed:
            allocated += demand
        else:
            failed += 1
        arrived += demand
        while step < len(STEPS) and arrived >= total * STEPS[step] / 100 - 1e-9:
            rates[str(STEPS[step])] = round(allocated / arrived, 4)
            step += 1
    used = sum(cluster.nodes[i].gpus - state.free[i] for i in range(len(cluster.nodes)))
    used -= sum(1.0 - u for on_node in state.shared for u in on_node.values())
    return PackResult(
        policy=policy,
        allocation_rate=rates,
        unallocated_gpu_fraction=round((total - used) / total, 4),
        tasks_arrived=count,
        tasks_failed=failed,
        wall_s=round(time.perf_counter() - started, 3),
    )


def _submit(engine: Scheduler, job: Job) -> bool:
    """Submit ``job`` and run a pass; a job that does not start is cancelled (it fails)."""
    engine.submit(job, 0.0)
    engine.schedule(0.0)
    if job.state == JobState.RUNNING:
        return True
    if job.state == JobState.PENDING:
        engine.cancel(job.id, 0.0)
    return False


def _place(state: ClusterState, job: Job, policy: str) -> Placement | None:
    if policy == "firstfit":
        return find_placement(state, job, topology=False)
    return _best_fit(state, job)


def _best_fit(state: ClusterState, job: Job) -> Placement | None:
    """The node with the least GPU capacity left that fits the task."""
    cluster = state.cluster
    best = None
    for idx, node in enumerate(cluster.nodes):
        if job.gpu_models is not None and node.gpu_model not in job.gpu_models:
            continue
        on_node = state.shared[idx]
        if job.fractional:
            if not state.free[idx] and not any(
                used + job.gpu_fraction <= 1.0 + 1e-9 for used in on_node.values()
            ):
                continue
        elif state.free[idx] < job.gpus:
            continue
        if not node_fits(state, job, idx, 1.0):
            continue
        capacity = state.free[idx] + sum(1.0 - used for used in on_node.values())
        if best is None or (capacity, idx) < best:
            best = (capacity, idx)
    if best is None:
        return None
    idx = best[1]
    cpus, memory = job.cpus or 0.0, job.memory_gb or 0.0
    if job.fractional:
        fits = [
            (used, bit)
            for bit, used in state.shared[idx].items()
            if used + job.gpu_fraction <= 1.0 + 1e-9
        ]
        bit = max(fits)[1] if fits else state.free_mask[idx] & -state.free_mask[idx]
        return Placement((Part(idx, bit, cpus, memory, job.gpu_fraction),))
    mask, remaining = 0, state.free_mask[idx]
    for _ in range(job.gpus):
        bit = remaining & -remaining
        mask |= bit
        remaining ^= bit
    return Placement((Part(idx, mask, cpus, memory),))
