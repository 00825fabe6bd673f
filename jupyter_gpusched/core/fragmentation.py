"""Fragmentation Gradient Descent (FGD): where a job that fits on one node should go.

Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation
Gradient Descent" (USENIX ATC'23). A node's *fragmentation* for a task type is the GPU capacity on
it that the type could not use: all of the node's unallocated GPU share if the type cannot run
there at all (GPU model, labels, CPUs, memory, fewer whole free GPUs than it needs, no GPU with
room for its share), else the free shares of its GPUs that are smaller than the type's per-GPU
request. The cluster's expected fragmentation weighs the types by their popularity in the
workload. FGD puts each job where that expectation grows least.

Written as ``F_n(m) = U_n - A_n(m)``, with ``U_n`` the node's unallocated GPU share and
``A_n(m)`` the share type ``m`` could use there, placing a job of demand ``D`` on ``n`` changes the
expected fragmentation by ``-D + sum_m w_m (A_n(m) - A'_n(m))``: the first term is the same on
every node, so FGD minimises the *usable capacity lost*, ``sum_m w_m (A_n(m) - A'_n(m))``.

The weights ``w_m`` are the popularity of each type divided by the share of the cluster's GPUs it
can use at all (its GPU models and labels): a type confined to a few nodes has nowhere else to go,
so capacity it could use there counts for more. A workload without model constraints gives plain
FGD (all types reach the whole cluster).

The popularity is what the engine has seen: :class:`.workload.Workload` is a decayed histogram
of the shapes of submitted jobs, with a small prior before there are any. Everything is pure and
deterministic (no hashing of strings decides an order).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from operator import mul

from .jobs import Job
from .state import Part, Placement
from .workload import TaskType, Workload

EPS = 1e-9
CACHE_LIMIT = 100_000  # entries per score cache; a full one is emptied


def usable_by(kind: TaskType, rooms: tuple[float, ...], cpus: float, memory_gb: float) -> float:
    """``A_n(m)``: the GPU share of a node (free share of each GPU in ``rooms``, CPUs and memory
    free) that a task of type ``kind`` could use; 0 if it cannot run there. (Model and labels
    are the caller's to check.)"""
    if kind.cpus > cpus + EPS or kind.memory_gb > memory_gb + EPS:
        return 0.0
    if kind.gpus == 1:
        return sum(r for r in rooms if r >= kind.share - EPS)
    full = sum(1 for r in rooms if r >= 1.0 - EPS)
    return float(full) if full >= kind.gpus else 0.0


def fragmentation(model, labels, rooms, cpus, memory_gb, types) -> float:
    """FGD's expected fragmentation of one node for ``types`` ((TaskType, popularity) pairs):
    ``sum_m p_m F_n(m)``, where ``F_n(m)`` is all of the node's unallocated GPU share if ``m``
    cannot run there, else the free shares too small for it."""
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
        self._uses: dict[tuple, tuple] = {}  # (group shapes, rooms) -> share each could use
        self._generation = 0  # + 1 whenever a class comes or goes, or the scores change
        self._ranked: dict[tuple, tuple] = {}  # job constraints and shape -> (generation, ranking)
        self._min_level: dict[int, int] = {}

    # -- scoring -----------------------------------------------------------------------------
    def _tables(self) -> None:
        """Per node kind: the weighted types that may run there, grouped by (GPUs, share), and
        the CPU and memory steps at which types stop fitting."""
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
        self._rows = []
        for kind_index in range(len(kinds)):
            here = [(kind, w) for kind, w, where in weighted if kind_index in where]
            cpu_steps = sorted({k.cpus for k, _ in here})
            mem_steps = sorted({k.memory_gb for k, _ in here})
            groups: dict[tuple, list] = {}
            for kind, w in sorted(here, key=lambda kw: kw[0].order()):
                groups.setdefault((kind.gpus, kind.share), []).append(
                    (w, bisect_right(cpu_steps, kind.cpus), bisect_right(mem_steps, kind.memory_gb))
                )
            flat = [(g, w, c, m) for g, group in enumerate(groups.values()) for w, c, m in group]
            self._rows.append((cpu_steps, mem_steps, tuple(groups), flat))
        self._weights: dict[tuple, tuple] = {}
        self._kept.clear()  # scores of conditions seen before
        for kind_and_key, cid in self._ids.items():
            self._scores[cid] = self._kept[kind_and_key] = {}
        self._generation += 1
        self._version = self.workload.version

    def usable(self, kind_index: int, rooms: tuple, cpus: float, memory_gb: float) -> float:
        """``sum_m w_m A_n(m)`` over the types that may run on this kind of node: the weight of
        each (GPUs, share) group that fits the CPUs and memory, times the share it could use."""
        cpu_steps, mem_steps, shapes, flat = self._rows[kind_index]
        level = (
            kind_index,
            bisect_right(cpu_steps, cpus + EPS),
            bisect_right(mem_steps, memory_gb + EPS),
        )
        weights = self._weights.get(level)
        if weights is None:
            if len(self._weights) > CACHE_LIMIT:
                self._weights.clear()
            _, ci, mi = level
            totals = [0.0] * len(shapes)
            for g, w, c, m in flat:
                if c <= ci and m <= mi:
                    totals[g] += w
            weights = self._weights[level] = tuple(totals)
        uses = self._uses.get((shapes, rooms))  # kept while the shapes are the same
        if uses is None:
            if len(self._uses) > CACHE_LIMIT:
                self._uses.clear()
            full = len(rooms) - bisect_left(rooms, 1.0 - EPS)
            uses = self._uses[(shapes, rooms)] = tuple(
                sum(rooms[bisect_left(rooms, share - EPS) :])
                if gpus == 1
                else (float(full) if full >= gpus else 0.0)
                for gpus, share in shapes
            )
        return sum(map(mul, uses, weights))

    def loss(self, kind_index: int, key: tuple, job: Job) -> tuple[float, float]:
        """(usable capacity lost, free share of the GPU used) for ``job`` on a node of class
        ``key``, on its best GPU: rounded so that equal losses tie exactly."""
        rooms, cpu_free, mem_free = key
        before = self.usable(kind_index, rooms, cpu_free, mem_free)
        cpu_after, mem_after = cpu_free - (job.cpus or 0.0), mem_free - (job.memory_gb or 0.0)
        if not job.fractional:
            k = job.gpus
            after = (0.0,) * k + rooms[: len(rooms) - k]
            return round(before - self.usable(kind_index, after, cpu_after, mem_after), 9), 1.0
        best = None
        for room in sorted(set(rooms)):
            if room < job.gpu_fraction - EPS:
                continue
            after = list(rooms)
            after.remove(room)
            insort(after, max(0.0, round(room - job.gpu_fraction, 6)))
            lost = before - self.usable(kind_index, tuple(after), cpu_after, mem_after)
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
            for bucket in sorted(b for b in buckets if b >= lowest):
                for key, cid in buckets[bucket].items():
                    rooms, cpu_free, mem_free = key
                    if cpu_free < cpus or mem_free < memory or rooms[-1] < share:
                        continue
                    known = scores[cid]
                    found = known.get(shape)
                    if found is None:
                        if len(known) > CACHE_LIMIT // 100:
                            known.clear()
                        found = known[shape] = self.loss(kind_index, key, job)
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
