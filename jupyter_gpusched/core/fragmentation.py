"""Fragmentation Gradient Descent (FGD): where a job that fits on one node should go.

Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation
Gradient Descent" (USENIX ATC'23). A node's *fragmentation* for a task type is the GPU capacity on
it that tasks of the type could not take. The cluster's expected fragmentation weighs the types by
their popularity in the workload. FGD puts each job where that expectation grows least.

Written as ``F_n(m) = U_n - A_n(m)``, with ``U_n`` the node's unallocated GPU share and
``A_n(m)`` the share tasks of type ``m`` could take there, placing a job of demand ``D`` on ``n``
changes the expected fragmentation by ``-D + sum_m w_m (A_n(m) - A'_n(m))``: the first term is the
same on every node, so FGD minimises the *usable capacity lost*, ``sum_m w_m (A_n(m) - A'_n(m))``.

Two departures from the paper, both about CPUs and memory, which strand GPUs on real clusters
(Alibaba's 2023 trace: 8-GPU nodes with 12 CPUs per GPU beside 2-GPU nodes with 52):

- ``A_n(m)`` counts tasks: it is the share of as many tasks of type ``m`` as the node's GPUs,
  CPUs and memory hold together (the paper: all free GPU share if one task fits). Eight free GPUs
  with CPUs for one more task are one usable GPU, not eight.
- A placement also pays for the GPU share it leaves *stranded*: more free GPU share on the node
  than its free CPUs can feed at the CPUs per GPU share the workload asks for there on average.
  A CPU-hungry task costs more on a CPU-poor node than on a CPU-rich one, before any single type
  notices. (Only an increase is paid for; a placement that eases a node is not rewarded, so that
  constrained capacity is not handed to jobs that could run elsewhere.)

On the full Alibaba trace (``jupyter-gpusched pack``) they cut the GPUs left unallocated from
0.060 with the paper's measure to 0.042; best fit leaves 0.075.

The weights ``w_m`` are the popularity of each type divided by the share of the cluster's GPUs it
can use at all (its GPU models and labels): a type confined to a few nodes has nowhere else to go,
so capacity it could use there counts for more. A workload without model constraints gives plain
popularity weights.

The popularity is what the engine has seen: :class:`.workload.Workload` is a decayed histogram
of the shapes of submitted jobs, with a small prior before there are any. Everything is pure and
deterministic (no hashing of strings decides an order).
"""

from __future__ import annotations

from bisect import bisect_left, insort

import numpy

from .jobs import Job
from .state import Part, Placement
from .workload import TaskType, Workload

EPS = 1e-9
INF = float("inf")
TINY = 1e-12  # the CPUs (memory) of a type that asks for none
CACHE_LIMIT = 100_000  # entries per score cache; a full one is emptied


def gpu_room_for(gpus: int, share: float, rooms: tuple[float, ...]) -> float:
    """The GPU share that tasks of ``gpus`` GPUs of ``share`` each could take from GPUs with
    free shares ``rooms``, with no limit on their number: whole multiples of ``share`` on each
    GPU for a fraction, whole sets of ``gpus`` free GPUs otherwise."""
    if share < 1.0 - EPS:
        return sum(((r + EPS) // share) * share for r in rooms if r >= share - EPS)
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
    return (free + EPS) // need


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


class Fragmentation:
    """FGD placement over a :class:`ClusterState`. Nodes in the same condition (model, labels,
    free share of each GPU, CPUs and memory free) are one *class*, scored once per job shape;
    the state marks the nodes it changes (``state.touched``) and the classes are brought up to
    date lazily. All scores are cached until the workload's typical types change."""

    def __init__(self, cluster, workload: Workload):
        self.cluster, self.workload = cluster, workload
        nodes = cluster.nodes
        kinds: dict[tuple, int] = {}
        self._kind_of = [
            kinds.setdefault((n.gpu_model, tuple(sorted(n.labels.items()))), len(kinds))
            for n in nodes
        ]
        self._kinds = list(kinds)
        # per kind: bucket (see _bucket) -> {key: class id} of the classes with a node in them
        self._classes: list[dict[int, dict[tuple, int]]] = [{} for _ in self._kinds]
        self._ids: dict[tuple, int] = {}  # (kind, key) -> class id, while a node is in it
        self._free_ids: list[int] = []  # ids of classes no node is in
        self._members: list[set[int]] = []
        self._key_of: list[tuple] = []  # class id -> its key
        self._scores: list[dict] = []  # per class id: job shape -> (loss, room)
        self._kept: dict[tuple, dict] = {}  # (kind, key) -> its scores, also once it is empty
        self.class_of: list[int | None] = [None] * len(nodes)  # class id of each node
        self._version = -1
        self._accepting: dict[tuple, list[int]] = {}
        self._whole: dict[tuple, tuple] = {}
        self._generation = 0  # + 1 whenever a class comes or goes, or the scores change
        self._ranked: dict[tuple, tuple] = {}  # job constraints and shape -> (generation, ranking)
        self._min_level: dict[int, int] = {}

    # -- scoring -----------------------------------------------------------------------------
    def _tables(self) -> None:
        """Per node kind: the weighted types that may run there, as arrays (which (GPUs, share)
        group each is in, its weight, CPUs, memory and GPU demand per task), and the CPUs per
        GPU share those types ask for on average."""
        gpus_of_kind = [0] * len(self._kinds)
        for node in self.cluster.nodes:
            gpus_of_kind[self._kind_of[node.index]] += node.gpus
        kinds = [(model, dict(labels)) for model, labels in self._kinds]
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
            # a type that asks for no CPUs (memory) is never short of them: a tiny need stands in
            columns = numpy.array(
                [
                    (groups[(k.gpus, k.share)], w, k.cpus or TINY, k.memory_gb or TINY, k.demand)
                    for k, w in here
                ],
                dtype=float,
            ).reshape(-1, 5)
            group, weight, cpus, memory, demand = columns.T
            group_gpus = numpy.array([g for g, _ in groups], dtype=float)
            group_share = numpy.array([share for _, share in groups], dtype=float)
            self._rows.append(
                (group_gpus, group_share, group.astype(int), weight, cpus, memory, demand)
            )
            wanted = float(weight @ demand)
            self._cpus_per_share.append(
                float(weight @ numpy.where(cpus > TINY, cpus, 0.0)) / wanted if wanted else 0.0
            )
        self._usable_cache: dict[tuple, float] = {}
        self._kept.clear()  # scores of conditions seen before
        for kind_and_key, cid in self._ids.items():
            self._scores[cid] = self._kept[kind_and_key] = {}
        self._generation += 1
        self._version = self.workload.version

    def usable(self, kind_index: int, rooms: tuple, cpus: float, memory_gb: float) -> float:
        """``sum_m w_m A_n(m)`` over the types that may run on this kind of node: the GPU share
        the type's tasks could take there, given the free share of each GPU (``rooms``, sorted)
        and the CPUs and memory free (as many tasks as those hold, no more)."""
        value = self._usable_cache.get((kind_index, rooms, cpus, memory_gb))
        if value is None:
            self.prepare(kind_index, [(rooms, cpus, memory_gb)])
            value = self._usable_cache[(kind_index, rooms, cpus, memory_gb)]
        return value

    def prepare(self, kind_index: int, conditions) -> None:
        """Compute :meth:`usable` for many node conditions ((rooms, CPUs, memory)) of one kind
        at once (one vectorised sum over conditions and types) and cache it."""
        cache = self._usable_cache
        todo = list(dict.fromkeys(c for c in conditions if (kind_index, *c) not in cache))
        if not todo:
            return
        group_gpus, group_share, group, weight, need_cpus, need_memory, demand = self._rows[
            kind_index
        ]
        width = max(len(rooms) for rooms, _, _ in todo)
        rooms = numpy.array([r + (0.0,) * (width - len(r)) for r, _, _ in todo])[:, :, None]
        # gpu_room_for, for every (GPUs, share) group: whole multiples of a share on each GPU,
        # whole sets of free GPUs
        shares = (numpy.floor((rooms + EPS) / group_share) * group_share).sum(axis=1)
        full = (rooms >= 1.0 - EPS).sum(axis=1)
        room = numpy.where(group_share < 1.0 - EPS, shares, full // group_gpus * group_gpus)
        cpus = numpy.array([c for _, c, _ in todo])[:, None] + EPS
        memory = numpy.array([m for _, _, m in todo])[:, None] + EPS
        # as many tasks as the CPUs and memory hold (any number where the node does not say)
        tasks = numpy.minimum(numpy.floor(cpus / need_cpus), numpy.floor(memory / need_memory))
        values = numpy.minimum(room[:, group], tasks * demand) @ weight
        if len(cache) + len(todo) > CACHE_LIMIT:
            cache.clear()
        for condition, value in zip(todo, values.tolist(), strict=True):
            cache[(kind_index, *condition)] = value

    def stranded(self, kind_index: int, rooms: tuple, cpus: float) -> float:
        """The GPU share of a node its free CPUs cannot feed, at the CPUs per GPU share the
        workload asks for on this kind of node on average."""
        per_share = self._cpus_per_share[kind_index]
        if not per_share:
            return 0.0
        return max(0.0, sum(rooms) - cpus / per_share)

    def _stranding(self, kind_index, rooms, cpus, rooms_after, cpus_after) -> float:
        """How much more GPU share a placement leaves without CPUs to feed it (never less)."""
        more = self.stranded(kind_index, rooms_after, cpus_after)
        return max(0.0, more - self.stranded(kind_index, rooms, cpus))

    @staticmethod
    def _outcomes(key: tuple, job: Job) -> list[tuple]:
        """The ways ``job`` can go on a node of class ``key``: (free share of the GPU used,
        rooms after, CPUs after, memory after); for a share, one per distinct room that fits."""
        rooms, cpu_free, mem_free = key
        cpus, memory = cpu_free - (job.cpus or 0.0), mem_free - (job.memory_gb or 0.0)
        if not job.fractional:
            return [(1.0, (0.0,) * job.gpus + rooms[: len(rooms) - job.gpus], cpus, memory)]
        out = []
        for room in sorted(set(rooms)):
            if room >= job.gpu_fraction - EPS:
                after = list(rooms)
                after.remove(room)
                insort(after, max(0.0, round(room - job.gpu_fraction, 6)))
                out.append((room, tuple(after), cpus, memory))
        return out

    def loss(self, kind_index: int, key: tuple, job: Job, outcomes=None) -> tuple[float, float]:
        """(usable capacity lost, free share of the GPU used) for ``job`` on a node of class
        ``key``, on its best GPU: rounded so that equal losses tie exactly."""
        rooms, cpu_free, mem_free = key
        before = self.usable(kind_index, rooms, cpu_free, mem_free)
        best = None
        for room, after, cpu_after, mem_after in outcomes or self._outcomes(key, job):
            lost = before - self.usable(kind_index, after, cpu_after, mem_after)
            lost += self._stranding(kind_index, rooms, cpu_free, after, cpu_after)
            candidate = (round(lost, 9), room)
            if best is None or candidate < best:
                best = candidate
        return best

    # -- node classes ------------------------------------------------------------------------
    def sync(self, state) -> None:
        if self.workload.version != self._version:
            self._tables()
        touched = state.touched
        if not touched:
            return
        for idx in touched:  # (the order changes no choice: ids only order equal losses)
            old, key = self.class_of[idx], self._node_key(state, idx)
            kind = self._kind_of[idx]
            new = None if key is None else self._ids.get((kind, key))
            if new is None and key is not None:
                new = self._new_class(kind, key)
            if old == new:
                continue
            if old is not None:
                members = self._members[old]
                members.discard(idx)
                if not members:
                    self._drop_class(kind, old)
            if new is not None:
                self._members[new].add(idx)
            self.class_of[idx] = new
        touched.clear()

    def _new_class(self, kind: int, key: tuple) -> int:
        if len(self._kept) > CACHE_LIMIT:
            self._kept.clear()
        scores = self._kept.setdefault((kind, key), {})  # a condition seen before keeps its scores
        if self._free_ids:
            cid = self._free_ids.pop()
            self._key_of[cid] = key
            self._scores[cid] = scores
        else:
            cid = len(self._members)
            self._members.append(set())
            self._key_of.append(key)
            self._scores.append(scores)
        self._ids[(kind, key)] = cid
        self._classes[kind].setdefault(_bucket(key[0]), {})[key] = cid
        self._generation += 1
        return cid

    def _drop_class(self, kind: int, cid: int) -> None:
        """No node is in this condition any more: forget it (its id is used again)."""
        key = self._key_of[cid]
        buckets = self._classes[kind]
        bucket = buckets[_bucket(key[0])]
        del bucket[key]
        if not bucket:
            del buckets[_bucket(key[0])]
        del self._ids[(kind, key)]
        self._free_ids.append(cid)
        self._generation += 1

    def _node_key(self, state, idx: int) -> tuple | None:
        if state.node_state[idx] != "up":
            return None
        free, shared = state.free[idx], state.shared[idx]
        gpus = self.cluster.nodes[idx].gpus
        if shared:
            rooms = sorted(round(1.0 - used, 6) for used in shared.values())
            if not free and rooms[-1] <= EPS:
                return None  # nothing left to place on
            rooms = (0.0,) * (gpus - free - len(rooms)) + tuple(rooms) + (1.0,) * free
        elif free:
            rooms = self._whole.get((gpus, free))
            if rooms is None:
                rooms = self._whole[(gpus, free)] = (0.0,) * (gpus - free) + (1.0,) * free
        else:
            return None
        return rooms, round(state.cpu_free[idx], 6), round(state.mem_free[idx], 6)

    def tiers(self, state, job: Job) -> list[tuple]:
        """The classes that can take ``job`` now in runs of equal loss, cheapest first: lists of
        (loss, room, class id)."""
        if state.touched or self.workload.version != self._version:
            self.sync(state)
        wanted = (job.gpu_models, frozenset(job.labels.items()) if job.labels else None)
        cpus, memory = (job.cpus or 0.0) - EPS, (job.memory_gb or 0.0) - EPS
        k = job.gpus
        shape = (k, job.gpu_fraction, cpus, memory)
        last = self._ranked.get((wanted, shape))
        if last is not None and last[0] == self._generation:
            return last[1]  # no class came or went since: the same ranking
        kinds = self._accepting.get(wanted)
        if kinds is None:
            kinds = self._accepting[wanted] = [
                i
                for i, (model, labels) in enumerate(self._kinds)
                if (job.gpu_models is None or model in job.gpu_models)
                and all(dict(labels).get(k) == v for k, v in job.labels.items())
            ]
        share = job.gpu_fraction - EPS
        fractional = job.fractional
        scores = self._scores
        lowest = _bucket((job.gpu_fraction,)) if fractional else FULL + k
        out = []
        for kind_index in kinds:
            buckets = self._classes[kind_index]
            unscored = []
            for bucket in sorted(b for b in buckets if b >= lowest):
                for key, cid in buckets[bucket].items():
                    rooms, cpu_free, mem_free = key
                    if cpu_free < cpus or mem_free < memory or rooms[-1] < share:
                        continue
                    found = scores[cid].get(shape)
                    if found is None:
                        unscored.append((key, cid))
                    else:
                        out.append((found[0], found[1], cid))
            if unscored:  # score the new classes together: one vectorised sum
                outcomes = [self._outcomes(key, job) for key, _ in unscored]
                self.prepare(
                    kind_index,
                    [key for key, _ in unscored]
                    + [(rooms, c, m) for ways in outcomes for _, rooms, c, m in ways],
                )
                for (key, cid), ways in zip(unscored, outcomes, strict=True):
                    known = scores[cid]
                    if len(known) > CACHE_LIMIT // 100:
                        known.clear()
                    found = known[shape] = self.loss(kind_index, key, job, ways)
                    out.append((found[0], found[1], cid))
        out.sort()
        runs = []
        start = 0
        while start < len(out):
            end = start + 1
            while end < len(out) and out[end][0] == out[start][0]:
                end += 1
            runs.append(out[start:end])
            start = end
        if len(self._ranked) > CACHE_LIMIT // 100:
            self._ranked.clear()
        self._ranked[(wanted, shape)] = (self._generation, runs)
        return runs

    def members(self, cid: int) -> set[int]:
        return self._members[cid]

    def free_count(self, cid: int) -> int:
        rooms = self._key_of[cid][0]
        return len(rooms) - bisect_left(rooms, 1.0 - EPS)

    def min_level(self, k: int, level_floor) -> int:
        """The tightest level (see :func:`placement.pick_gpus`) ``k`` GPUs can have anywhere."""
        level = self._min_level.get(k)
        if level is None:
            nodes = [n for n in self.cluster.nodes if n.gpus >= k]
            level = min((level_floor(n, k) for n in nodes), default=2)
            self._min_level[k] = level
        return level


FULL = 100  # buckets FULL + n: classes with n whole free GPUs


def _bucket(rooms: tuple) -> int:
    """Classes are filed by whole free GPUs (FULL + n), or without any, by their largest free
    share in twentieths, so that a job looks only at classes with room for it."""
    full = len(rooms) - bisect_left(rooms, 1.0 - EPS)
    return FULL + full if full else int(rooms[-1] * 20 + EPS)


def place_fractional(state, fgd: Fragmentation, job: Job, exclude, pick_gpus) -> Placement | None:
    """The cheapest class; among its nodes (and equally cheap ones) the tightest GPU, then the
    fullest leaf, then the lowest index."""
    nodes = state.cluster.nodes
    for entries in fgd.tiers(state, job):
        best = None
        for _, room, cid in entries:
            for idx in fgd.members(cid):
                if idx in exclude:
                    continue
                leaf = nodes[idx].leaf
                candidate = (room, state.leaf_free[leaf], leaf, idx)
                if best is None or candidate < best:
                    best = candidate
        if best is None:
            continue
        room, _, _, idx = best
        if room >= 1.0 - EPS:
            bit = pick_gpus(nodes[idx], state.free_mask[idx], 1)[0]
        else:
            bit = min(b for b, used in state.shared[idx].items() if abs(1.0 - used - room) < 1e-6)
        cpus, memory = job.cpus or 0.0, job.memory_gb or 0.0
        return Placement((Part(idx, bit, cpus, memory, job.gpu_fraction),))
    return None
