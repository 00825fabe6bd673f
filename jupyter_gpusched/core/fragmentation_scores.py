"""The measure of :mod:`.fragmentation`, and its fast form.

:func:`usable_by` and :func:`fragmentation` are the definitions, one type and one node at a time.
:class:`FragmentationScores` is what the engine uses: per kind of node (GPU model and labels) the
types that may run there are arrays, and ``sum_m w_m A_n(m)`` (``usable_by`` for ``A_n(m)``, with
the weights ``w_m`` of :mod:`.fragmentation`) of many node conditions is one vectorised sum
(numpy): the classes a ranking has not scored yet are scored together. A node's GPUs are padded
to the most GPUs of its kind, always, so that a condition's sums run in the same order, and its
value is the same, whatever batch it is computed in. A job's cost is the usable capacity it takes
away plus the GPU share it strands (see :mod:`.fragmentation`).
"""

from __future__ import annotations

import math
from bisect import insort

import numpy

from .jobs import Job
from .workload import TaskType, Workload

EPS = 1e-9
INF = float("inf")
CACHE_LIMIT = 100_000  # entries per cache; a full one is emptied


def gpu_room_for(gpus: int, share: float, rooms: tuple[float, ...]) -> float:
    """The GPU share that tasks of ``gpus`` GPUs of ``share`` each could take from GPUs with
    free shares ``rooms``, with no limit on their number: whole multiples of ``share`` on each
    GPU for a fraction, whole sets of ``gpus`` free GPUs otherwise."""
    if share < 1.0 - EPS:
        return sum(math.floor((r + EPS) / share) * share for r in rooms if r >= share - EPS)
    full = sum(1 for r in rooms if r >= 1.0 - EPS)
    return float(full // gpus * gpus)


def usable_by(kind: TaskType, rooms: tuple[float, ...], cpus: float, memory_gb: float) -> float:
    """``A_n(m)``: the GPU share of a node (free share of each GPU in ``rooms``, CPUs and memory
    free) that tasks of type ``kind`` could take: as many as its GPUs, CPUs and memory hold.
    (Model and labels are the caller's to check.)"""
    tasks = min(_how_many(cpus, kind.cpus), _how_many(memory_gb, kind.memory_gb))
    return min(gpu_room_for(kind.gpus, kind.share, rooms), tasks * kind.demand)


def _how_many(free: float, need: float) -> float:
    """How many needs of ``need`` fit in ``free`` (infinitely many when nothing is needed or
    the node does not say what it has)."""
    if need <= 0 or free == INF:
        return INF
    return math.floor((free + EPS) / need)


def fragmentation(model, labels, rooms, cpus, memory_gb, types) -> float:
    """The expected fragmentation of one node for ``types`` ((TaskType, popularity) pairs):
    ``sum_m p_m F_n(m)``, where ``F_n(m)`` is the node's unallocated GPU share that tasks of
    type ``m`` could not take (all of it if ``m`` cannot run there)."""
    free = sum(rooms)
    total = 0.0
    for kind, p in types:
        use = usable_by(kind, rooms, cpus, memory_gb) if kind.accepts(model, labels) else 0.0
        total += p * (free - use)
    return total


class _Need:
    """What each type asks of one resource (CPUs or memory) per task, 0 for nothing."""

    def __init__(self, need: numpy.ndarray):
        self.asks = need > 0
        self.need = numpy.where(self.asks, need, 1.0)

    def tasks(self, free: list[float]) -> numpy.ndarray:
        """How many tasks of each type ``free`` holds, per condition (as :func:`_how_many`:
        any number when a type asks nothing or the node does not say)."""
        held = numpy.floor((numpy.array(free)[:, None] + EPS) / self.need)
        return numpy.where(self.asks, held, INF)


class FragmentationScores:
    """What a job costs on a node in a given condition (free share of each GPU, CPUs and memory
    free), for the workload's types. ``kinds`` are the (GPU model, sorted labels) of the nodes,
    ``kind_of`` each node's index into them."""

    def __init__(self, cluster, workload: Workload, kinds: list[tuple], kind_of: list[int]):
        self.cluster, self.workload = cluster, workload
        self.kinds, self.kind_of = kinds, kind_of
        self._rows: list[tuple] = []
        self._cpus_per_share: list[float] = []
        self._widths = [0] * len(kinds)  # per kind: the most GPUs of its nodes
        for node in cluster.nodes:
            kind = kind_of[node.index]
            self._widths[kind] = max(self._widths[kind], node.gpus)

    def refresh(self) -> None:
        """Per node kind: the weighted types that may run there, as arrays (which (GPUs, share)
        group each is in, its weight, CPUs, memory and GPU demand per task), and the CPUs per
        GPU share those types ask for on average."""
        gpus_of_kind = [0] * len(self.kinds)
        for node in self.cluster.nodes:
            gpus_of_kind[self.kind_of[node.index]] += node.gpus
        kinds = [(model, dict(labels)) for model, labels in self.kinds]
        total = float(self.cluster.total_gpus)
        weighted = []  # (type, weight, the kinds it may run on)
        for kind, p in self.workload.types:
            where = [i for i, (model, labels) in enumerate(kinds) if kind.accepts(model, labels)]
            reach = sum(gpus_of_kind[i] for i in where)
            if reach:
                weighted.append((kind, p * total / reach, set(where)))
        self._rows, self._cpus_per_share = [], []
        for kind_index in range(len(kinds)):
            here = sorted(
                ((kind, w) for kind, w, where in weighted if kind_index in where),
                key=lambda kw: kw[0].order(),
            )
            groups: dict[tuple, int] = {}
            for kind, _ in here:
                groups.setdefault((kind.gpus, kind.share), len(groups))
            columns = numpy.array(
                [(groups[(k.gpus, k.share)], w, k.cpus, k.memory_gb, k.demand) for k, w in here],
                dtype=float,
            ).reshape(-1, 5)
            group, weight, cpus, memory, demand = columns.T
            group_gpus = numpy.array([g for g, _ in groups], dtype=float)
            group_share = numpy.array([share for _, share in groups], dtype=float)
            asked = (_Need(cpus), _Need(memory))
            self._rows.append((group_gpus, group_share, group.astype(int), weight, *asked, demand))
            wanted = float((weight * demand).sum())
            self._cpus_per_share.append(float((weight * cpus).sum()) / wanted if wanted else 0.0)

    def usable(self, kind_index: int, rooms: tuple, cpus: float, memory_gb: float) -> float:
        """``sum_m w_m A_n(m)`` over the types that may run on this kind of node: the GPU share
        the type's tasks could take there, given the free share of each GPU (``rooms``, sorted)
        and the CPUs and memory free (as many tasks as those hold, no more)."""
        return float(self._evaluate(kind_index, [(rooms, cpus, memory_gb)])[0][0])

    def stranded(self, kind_index: int, rooms: tuple, cpus: float) -> float:
        """The GPU share of a node its free CPUs cannot feed, at the CPUs per GPU share the
        workload asks for on this kind of node on average."""
        return float(self._evaluate(kind_index, [(rooms, cpus, INF)])[1][0])

    def _evaluate(self, kind_index: int, conditions: list) -> tuple:
        """(:meth:`usable`, :meth:`stranded`) of many node conditions ((rooms, CPUs, memory)) of
        one kind at once: vectorised over conditions and types."""
        group_gpus, group_share, group, weight, need_cpus, need_memory, demand = self._rows[
            kind_index
        ]
        width = self._widths[kind_index]  # the same for every batch: see the module docstring
        rooms = numpy.array([r + (0.0,) * (width - len(r)) for r, _, _ in conditions])
        cpus = [c for _, c, _ in conditions]
        # gpu_room_for, for every (GPUs, share) group: whole multiples of a share on each GPU,
        # whole sets of free GPUs
        room = (rooms[:, :, None] + EPS) / group_share
        shares = (numpy.floor(room) * group_share).sum(axis=1)
        full = (rooms >= 1.0 - EPS).sum(axis=1, keepdims=True)
        room = numpy.where(group_share < 1.0 - EPS, shares, full // group_gpus * group_gpus)
        tasks = numpy.minimum(
            need_cpus.tasks(cpus), need_memory.tasks([m for _, _, m in conditions])
        )
        usable = (numpy.minimum(room[:, group], tasks * demand) * weight).sum(axis=1)
        per_share = self._cpus_per_share[kind_index]
        if per_share:
            stranded = numpy.maximum(0.0, rooms.sum(axis=1) - numpy.array(cpus) / per_share)
        else:
            stranded = numpy.zeros(len(conditions))
        return usable, stranded

    def losses(self, kind_index: int, keys: list, job: Job) -> list[tuple[float, float]]:
        """(cost, free share of the GPU used) of ``job`` on a node of each class in ``keys``
        (of one kind), on its best GPU. The cost is the usable capacity lost plus the GPU share
        newly stranded, rounded so that equal costs tie exactly."""
        ways = [self.outcomes(key, job) for key in keys]
        after = [(rooms, c, m) for options in ways for _, rooms, c, m in options]
        usable, stranded = self._evaluate(kind_index, list(keys) + after)
        count = len(keys)
        owner = numpy.repeat(numpy.arange(count), [len(options) for options in ways])
        lost = usable[owner] - usable[count:]
        lost += numpy.maximum(0.0, stranded[count:] - stranded[owner])  # (never a gain)
        costs = [round(cost, 9) for cost in lost.tolist()]
        out, start = [], 0
        for options in ways:
            out.append(min((costs[start + i], room) for i, (room, *_) in enumerate(options)))
            start += len(options)
        return out

    @staticmethod
    def outcomes(key: tuple, job: Job) -> list[tuple]:
        """The ways ``job`` can go on a node of class ``key``: (free share of the GPU used,
        rooms after, CPUs after, memory after); for a share, one per distinct room that fits."""
        rooms, cpu_free, mem_free = key
        cpus, memory = cpu_free - (job.cpus or 0.0), mem_free - (job.memory_gb or 0.0)
        if not job.fractional:
            return [(1.0, (0.0,) * job.gpus + rooms[: len(rooms) - job.gpus], cpus, memory)]
        out = []
        for room in sorted(set(rooms)):
            # room > EPS: a GPU with no room left (held whole, or full) takes no share, even
            # one so small that the tolerance would let it "fit"
            if room >= job.gpu_fraction - EPS and room > EPS:
                after = list(rooms)
                after.remove(room)
                insort(after, max(0.0, round(room - job.gpu_fraction, 6)))
                out.append((room, tuple(after), cpus, memory))
        return out
