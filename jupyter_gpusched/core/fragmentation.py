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

from bisect import bisect_left
from itertools import groupby
from operator import itemgetter

from .fragmentation_scores import CACHE_LIMIT, EPS, FragmentationScores
from .jobs import Job
from .state import Part, Placement
from .workload import Workload


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
        # the measure: what a job costs on a node in a given condition
        self.measure = FragmentationScores(cluster, workload, self._kinds, self._kind_of)

    def _refresh(self) -> None:
        """The workload's types changed: new weights, and every class's scores are forgotten."""
        self.measure.refresh()
        self._kept.clear()  # scores of conditions seen before
        for kind_and_key, cid in self._ids.items():
            self._scores[cid] = self._kept[kind_and_key] = {}
        self._generation += 1
        self._version = self.workload.version

    # -- node classes ------------------------------------------------------------------------
    def sync(self, state) -> None:
        if self.workload.version != self._version:
            self._refresh()
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

    def tiers(self, state, job: Job) -> list[list[tuple]]:
        """The classes that can take ``job`` now in runs of equal loss, cheapest first: lists of
        (loss, room, class id)."""
        if state.touched or self.workload.version != self._version:
            self.sync(state)
        wanted = (job.gpu_models, frozenset(job.labels.items()) if job.labels else None)
        cpus, memory = (job.cpus or 0.0) - EPS, (job.memory_gb or 0.0) - EPS
        shape = (job.gpus, job.gpu_fraction, cpus, memory)
        last = self._ranked.get((wanted, shape))
        if last is not None and last[0] == self._generation:
            return last[1]  # no class came or went since: the same ranking
        share = job.gpu_fraction - EPS
        lowest = _bucket((job.gpu_fraction,)) if job.fractional else FULL + job.gpus
        out = []
        for kind_index in self._accepting_kinds(wanted, job):
            buckets = self._classes[kind_index]
            found = [
                (key, cid)
                for bucket in sorted(b for b in buckets if b >= lowest)
                for key, cid in buckets[bucket].items()
                if key[1] >= cpus and key[2] >= memory and key[0][-1] >= share
            ]
            out.extend(self._scored(kind_index, found, shape, job))
        out.sort()
        runs = [list(group) for _, group in groupby(out, key=itemgetter(0))]
        if len(self._ranked) > CACHE_LIMIT // 100:
            self._ranked.clear()
        self._ranked[(wanted, shape)] = (self._generation, runs)
        return runs

    def _accepting_kinds(self, wanted: tuple, job: Job) -> list[int]:
        kinds = self._accepting.get(wanted)
        if kinds is None:
            kinds = self._accepting[wanted] = [
                i
                for i, (model, labels) in enumerate(self._kinds)
                if (job.gpu_models is None or model in job.gpu_models)
                and all(dict(labels).get(k) == v for k, v in job.labels.items())
            ]
        return kinds

    def _scored(self, kind_index: int, found: list, shape: tuple, job: Job) -> list[tuple]:
        """(loss, room, class id) of the classes ``found`` ((key, class id)) for ``shape``;
        those not scored yet are scored together (one vectorised sum)."""
        scores = self._scores
        out, unscored = [], []
        for key, cid in found:
            score = scores[cid].get(shape)
            if score is None:
                unscored.append((key, cid))
            else:
                out.append((score[0], score[1], cid))
        if unscored:
            costs = self.measure.losses(kind_index, [key for key, _ in unscored], job)
            for (_, cid), score in zip(unscored, costs, strict=True):
                known = scores[cid]
                if len(known) > CACHE_LIMIT // 100:
                    known.clear()
                known[shape] = score
                out.append((score[0], score[1], cid))
        return out

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
            # a shared GPU with that room left; none when the room is a GPU held whole (a share
            # too small to tell from nothing, which admission refuses): not here, then
            bits = [b for b, used in state.shared[idx].items() if abs(1.0 - used - room) < 1e-6]
            if room <= EPS or not bits:
                continue
            bit = min(bits)
        cpus, memory = job.cpus or 0.0, job.memory_gb or 0.0
        return Placement((Part(idx, bit, cpus, memory, job.gpu_fraction),))
    return None
