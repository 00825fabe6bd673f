"""The workload FGD expects: a decayed histogram of the shapes of the jobs submitted so far.

A job's shape is a :class:`TaskType`: its GPUs per node, the share of each GPU, the GPU models and
labels it accepts, its CPUs and memory per node. The engine calls :meth:`Workload.observe` for
every job it accepts; :attr:`Workload.types` are the popular shapes with their popularity, which
:mod:`.fragmentation` weighs nodes' fragmentation by. Before any job is seen, a small prior of
whole-GPU and half-GPU jobs stands in. Pure and deterministic: no clock, and the order of types is
a total order on their fields (never a hash).
"""

from __future__ import annotations

from dataclasses import dataclass

from .jobs import Job

# the workload assumed before any job was seen: (GPUs per node, share of each GPU, pseudo-jobs)
PRIOR = ((1, 1.0, 4.0), (2, 1.0, 2.0), (4, 1.0, 1.0), (8, 1.0, 1.0), (1, 0.5, 2.0))


@dataclass(frozen=True)
class TaskType:
    """One node's part of a job: ``gpus`` GPUs, ``share`` of each (1.0 = whole), and its
    constraints. ``models`` is a sorted tuple (None = any model)."""

    gpus: int
    share: float
    models: tuple[str, ...] | None
    labels: tuple[tuple[str, str], ...]
    cpus: float
    memory_gb: float

    def accepts(self, model: str, labels: dict) -> bool:
        if self.models is not None and model not in self.models:
            return False
        return all(labels.get(k) == v for k, v in self.labels)

    @property
    def demand(self) -> float:
        """The GPU share one task of this type takes."""
        return self.gpus * self.share

    def order(self) -> tuple:
        """A total order (``models`` None sorts first)."""
        models = (0,) if self.models is None else (1, *self.models)
        return (self.gpus, self.share, models, self.labels, self.cpus, self.memory_gb)


def task_type(job: Job, max_node_gpus: int) -> TaskType:
    """The per-node shape of ``job``: a gang counts once, as one of its nodes (whole nodes when
    it has no ``gpus_per_node``). Shares are rounded to 0.001 (at least 0.001), CPUs to 0.1,
    memory to 0.25 GB."""
    per_node = job.gpus_per_node or job.gpus
    if per_node > max_node_gpus:
        per_node = max_node_gpus
    nodes = max(1, -(-job.gpus // per_node))
    models = None if job.gpu_models is None else tuple(sorted(job.gpu_models))
    return TaskType(
        gpus=per_node,
        share=max(round(job.gpu_fraction, 3), 0.001),  # (never 0: a share of nothing)
        models=models,
        labels=tuple(sorted(job.labels.items())),
        cpus=round((job.cpus or 0.0) / nodes, 1),
        memory_gb=round((job.memory_gb or 0.0) / nodes * 4) / 4,
    )


class Workload:
    """A decayed histogram of the task types submitted: a job's weight halves every
    ``half_life`` later submissions. :attr:`types` are the most popular types that cover
    ``coverage`` of the weight (at most ``max_types``), with their popularity (summing to 1). It
    is recomputed after 1/8 more submissions than seen so far, at least every ``check_every``,
    and replaced (``version`` + 1) only when it has moved by more than ``drift`` (total
    variation distance), which keeps the scores cached meanwhile."""

    def __init__(
        self,
        max_node_gpus: int,
        half_life: float = 2000.0,
        coverage: float = 1.0,
        max_types: int = 256,
        check_every: int = 32,
        drift: float = 0.1,
    ):
        self.max_node_gpus = max_node_gpus
        self.coverage, self.max_types = coverage, max_types
        self.check_every, self.drift = check_every, drift
        self._growth = 2.0 ** (1.0 / half_life)
        self._increment = 1.0
        self._weights: dict[TaskType, float] = {}
        self._shapes: dict[tuple, TaskType] = {}  # a job's request -> its type
        self._since = 0
        self.seen = 0
        self.version = 0
        self.types: tuple[tuple[TaskType, float], ...] = ()
        self.sharing = 0.0  # the popularity of the types that share a GPU (share < 1)
        for gpus, share, count in PRIOR:
            if gpus <= max_node_gpus:
                self._weights[TaskType(gpus, share, None, (), 0.0, 0.0)] = count
        self._refresh(force=True)

    def observe(self, job: Job) -> None:
        request = (
            job.gpus,
            job.gpus_per_node,
            job.gpu_fraction,
            job.gpu_models,
            tuple(job.labels.items()),
            job.cpus,
            job.memory_gb,
        )
        kind = self._shapes.get(request)
        if kind is None:
            if len(self._shapes) > 10_000:
                self._shapes.clear()
            kind = self._shapes[request] = task_type(job, self.max_node_gpus)
        self._weights[kind] = self._weights.get(kind, 0.0) + self._increment
        self._increment *= self._growth
        if self._increment > 1e9:  # renormalise; forget types that have faded away
            scale = self._increment
            self._weights = {k: w / scale for k, w in self._weights.items() if w / scale > 1e-9}
            self._increment = 1.0
        self.seen += 1
        self._since += 1
        if self._since >= min(self.check_every, 1 + self.seen // 8):
            self._since = 0
            self._refresh()

    def _refresh(self, force: bool = False) -> None:
        ranked = sorted(self._weights.items(), key=lambda kw: (-kw[1], kw[0].order()))
        total = sum(w for _, w in ranked)
        chosen, covered = [], 0.0
        for kind, weight in ranked:
            if covered >= self.coverage * total or len(chosen) >= self.max_types:
                break
            chosen.append((kind, weight))
            covered += weight
        types = tuple((kind, weight / covered) for kind, weight in chosen)
        self.sharing = sum(p for kind, p in types if kind.share < 1.0)  # always up to date
        if not force:
            new, old = dict(types), dict(self.types)
            moved = sum(abs(p - old.get(k, 0.0)) for k, p in types)
            moved += sum(p for k, p in self.types if k not in new)
            if moved / 2 <= self.drift:
                return
        self.types = types
        self.version += 1
