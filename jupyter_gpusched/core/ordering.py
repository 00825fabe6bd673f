"""The pending queue, kept as one FIFO list per (leaf queue, tier), and the priority order.

Priority (policy ``gpusched``): strictly by tier, then by the score
``fair_share.weight * F(queue) + age.weight * min(age, max_age) / max_age``, then submit time, then
job id. Ages grow at the same rate for every job, so while no job is capped at ``max_age`` the
order of two jobs never changes between fair-share recomputations: the engine orders by the
time-invariant equivalent ``fair_share.weight * F - age.weight * submit / max_age`` (capped jobs are
exact as of the last recomputation, which runs every ``fair_share.recalc_interval``).

An admin's priority override (``Job.priority``, higher first) ranks a job within its tier; jobs
with an override get lists of their own. An urgent job with a deadline (:mod:`.deadlines`) gets a
list of its own too: it goes ahead of its tier's other jobs, least slack first.

Within one list every job has the same tier, priority and fair-share factor, so the list's own order
(submit time, then id) is its priority order. The global order is a merge of the list heads whose
keys are kept up to date as heads change, so a pass costs O(lists + jobs examined).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from .copying import copy_parts
from .jobs import Job


class Smallest:
    """The smallest of a changing set of entries (``(walltime, job id)``): a heap from which
    entries leave lazily, so that adding and removing cost O(log n), not a list's O(n)."""

    def __init__(self):
        self.heap: list = []
        self.gone: dict = {}  # entry -> copies removed but still in the heap
        self.count = 0

    def __deepcopy__(self, memo):  # (core/copying.py: the entries are tuples)
        return copy_parts(self, memo, flat=("heap", "gone"))

    def add(self, entry) -> None:
        heapq.heappush(self.heap, entry)
        self.count += 1

    def remove(self, entry) -> None:
        self.gone[entry] = self.gone.get(entry, 0) + 1
        self.count -= 1
        if len(self.heap) > 64 and len(self.heap) > 2 * self.count:  # mostly gone: rebuild
            kept = []
            for item in self.heap:
                if self.gone.get(item):
                    self.gone[item] -= 1
                else:
                    kept.append(item)
            heapq.heapify(kept)
            self.heap, self.gone = kept, {}

    def first(self):
        """The smallest entry, or None."""
        heap, gone = self.heap, self.gone
        while heap and heap[0] in gone:
            entry = heapq.heappop(heap)
            gone[entry] -= 1
            if not gone[entry]:
                del gone[entry]
        return heap[0] if heap else None


@dataclass
class ListShapes:
    """What the jobs of one list ask for, in the terms of a pass's test that none of them can
    start (:func:`.left_out.list_cannot_start`)."""

    # (GPUs on each node, nodes) -> jobs of that shape: one-node jobs and gangs of gpus_per_node
    on_nodes: dict[tuple[int, int], int] = field(default_factory=dict)
    spanning: dict[int, int] = field(default_factory=dict)  # GPUs -> gangs spread as they fit
    other: int = 0  # fractional, CPU-only or GPU-model jobs: the test does not cover them
    # (planned run time, submit time, job id), sorted: the shortest job first (the test, and
    # shortest-first backfill's order within the list, core/shortest_first.py)
    by_run_time: list = field(default_factory=list)

    def __deepcopy__(self, memo):  # (core/copying.py)
        return copy_parts(self, memo, flat=("on_nodes", "spanning", "by_run_time"))

    def count(self, job: Job, walltime: float, node_gpus: int, sign: int) -> None:
        if job.fractional or not job.gpus or job.gpu_models is not None:
            self.other += sign
        else:
            per_node = job.gpus_per_node or (job.gpus if job.gpus <= node_gpus else None)
            if per_node is None:
                sizes, shape = self.spanning, job.gpus
            else:
                sizes, shape = self.on_nodes, (per_node, job.gpus // per_node)
            sizes[shape] = sizes.get(shape, 0) + sign
            if not sizes[shape]:
                del sizes[shape]
        entry = (walltime, job.submit_time, job.id)
        if sign > 0:
            insort(self.by_run_time, entry)
        else:
            del self.by_run_time[bisect_left(self.by_run_time, entry)]


class PendingQueue:
    def __init__(
        self,
        key: Callable[[str], tuple],
        by_queue_and_tier: bool = True,
        node_gpus: int = 8,
        urgent: Callable[[str], bool] | None = None,
    ):
        self.key = key  # priority key of a job id; smaller goes first
        self.by_queue_and_tier = by_queue_and_tier
        # is a job urgent (core/deadlines.py)? Then it has a list of its own, for it goes ahead
        # of the jobs of its list (None: no job ever is)
        self.urgent = urgent
        self.node_gpus = node_gpus  # GPUs of the largest node: a job of more spans nodes
        self.shapes: dict[tuple, ListShapes] = {}
        self.lists: dict[tuple, list[tuple[float, str]]] = {}
        self.heads: dict[tuple, tuple] = {}  # list -> key of its first job
        # (key, list) of every head set since the last rebuild, as a heap: a pass copies it
        # rather than sorting every head again; entries whose list has another head are stale
        self.head_heap: list[tuple] = []
        self.sizes: dict[float, int] = {}  # GPUs asked -> number of pending jobs asking that
        self.list_sizes: dict[tuple, dict[float, int]] = {}  # the same, per list
        self.walltimes = Smallest()  # (walltime estimate, id)
        self.list_of_job: dict[str, tuple] = {}  # job id -> the list it was added to
        self.count = 0

    def __deepcopy__(self, memo):  # (core/copying.py: entries and keys are tuples)
        return copy_parts(
            self,
            memo,
            flat=("heads", "head_heap", "sizes", "list_of_job"),
            nested=("lists", "list_sizes"),
        )

    def list_of(self, job: Job) -> tuple:
        if self.urgent is not None and job.deadline is not None and self.urgent(job.id):
            return (job.queue, job.tier, job.priority, job.id)
        if self.by_queue_and_tier:
            return (job.queue, job.tier, job.priority)
        return ("", 0, job.priority)

    def add(self, job: Job, walltime: float) -> None:
        list_key = self.list_of_job[job.id] = self.list_of(job)
        items = self.lists.setdefault(list_key, [])
        entry = (job.submit_time, job.id)
        insort(items, entry)
        if items[0] == entry:
            self._set_head(list_key, self.key(job.id))
        self.sizes[job.amount] = self.sizes.get(job.amount, 0) + 1
        sizes = self.list_sizes.setdefault(list_key, {})
        sizes[job.amount] = sizes.get(job.amount, 0) + 1
        self.shapes.setdefault(list_key, ListShapes()).count(job, walltime, self.node_gpus, +1)
        self.walltimes.add((walltime, job.id))
        self.count += 1

    def remove(self, job: Job, walltime: float) -> None:
        # the list it was added to: its list key may have changed since (it became urgent)
        list_key = self.list_of_job.pop(job.id, None)
        if list_key is None:
            return  # not in the queue (e.g. held)
        items = self.lists[list_key]
        entry = (job.submit_time, job.id)
        position = bisect_left(items, entry)
        del items[position]
        if position == 0:
            if items:
                self._set_head(list_key, self.key(items[0][1]))
            else:
                del self.heads[list_key]
                del self.lists[list_key]
        self.shapes[list_key].count(job, walltime, self.node_gpus, -1)
        if not items:
            del self.shapes[list_key]
        for sizes in (self.sizes, self.list_sizes[list_key]):
            sizes[job.amount] -= 1
            if not sizes[job.amount]:
                del sizes[job.amount]
        self.walltimes.remove((walltime, job.id))
        self.count -= 1

    def refresh(self) -> None:
        """Recompute every head's key (after the fair-share factors changed)."""
        self.heads = {list_key: self.key(items[0][1]) for list_key, items in self.lists.items()}
        self._rebuild_head_heap()

    def _set_head(self, list_key: tuple, key: tuple) -> None:
        self.heads[list_key] = key
        heapq.heappush(self.head_heap, (key, list_key))
        if len(self.head_heap) > 2 * len(self.heads) + 64:  # mostly stale
            self._rebuild_head_heap()

    def _rebuild_head_heap(self) -> None:
        self.head_heap = sorted((key, list_key) for list_key, key in self.heads.items())

    def smallest_request(self) -> float:
        return min(self.sizes) if self.sizes else 0

    def smallest_in(self, list_key: tuple) -> float:
        sizes = self.list_sizes.get(list_key)
        return min(sizes) if sizes else 0.0

    def shortest_walltime(self) -> float:
        shortest = self.walltimes.first()
        return 0.0 if shortest is None else shortest[0]

    def ahead_of(self, key: tuple) -> int:
        """How many pending jobs have a smaller key than ``key`` (each list is in key order,
        so this is a binary search per list)."""
        return sum(
            bisect_left(items, key, key=lambda entry: self.key(entry[1]))
            for items in self.lists.values()
        )

    def __len__(self) -> int:
        return self.count

    def ordered(self, skip: set | None = None) -> Iterator[str]:
        """Job ids in priority order. Jobs must not be removed while the iterator is in use.
        Adding a job's :meth:`list_of` to ``skip`` drops the rest of that list."""
        heads, started = self.heads.copy(), set()  # (as they are when the pass begins)
        heap = self.head_heap.copy()  # (key, list) for heads, (key, list, position) after
        while heap:
            entry = heapq.heappop(heap)
            if len(entry) == 2:  # a head: current, and its list not started yet?
                key, list_key = entry
                if heads.get(list_key) != key or list_key in started:
                    continue
                started.add(list_key)
                position = 0
            else:
                _, list_key, position = entry
            items = self.lists[list_key]
            yield items[position][1]
            if position + 1 < len(items) and (skip is None or list_key not in skip):
                heapq.heappush(heap, (self.key(items[position + 1][1]), list_key, position + 1))
