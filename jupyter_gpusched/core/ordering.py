"""The pending queue, kept as one FIFO list per (leaf queue, tier).

Within one list every job has the same tier and fair-share factor, and the age factor only grows
with waiting time, so the list's own order (submit time, then id) is its priority order. The
global order is a merge of the list heads, so a pass costs O(lists + jobs examined), not a sort
of every pending job.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Callable, Iterator

from .jobs import Job


class PendingQueue:
    def __init__(self, by_queue_and_tier: bool = True):
        self.by_queue_and_tier = by_queue_and_tier
        self.lists: dict[tuple, list[tuple[float, str]]] = {}
        self.count = 0

    def _list_key(self, job: Job) -> tuple:
        return (job.queue, job.tier) if self.by_queue_and_tier else ("", 0)

    def add(self, job: Job) -> None:
        insort(self.lists.setdefault(self._list_key(job), []), (job.submit_time, job.id))
        self.count += 1

    def remove(self, job: Job) -> None:
        items = self.lists[self._list_key(job)]
        entry = (job.submit_time, job.id)
        position = bisect_left(items, entry)
        if position < len(items) and items[position] == entry:
            del items[position]
            self.count -= 1

    def list_of(self, job: Job) -> tuple:
        return self._list_key(job)

    def __len__(self) -> int:
        return self.count

    def ordered(self, key: Callable[[str], tuple], skip: set | None = None) -> Iterator[str]:
        """Job ids in priority order (``key`` of a job id; smaller first). Jobs must not be
        removed while the iterator is in use. Adding a job's :meth:`list_of` to ``skip`` stops
        the rest of that list."""
        heap = [(key(items[0][1]), list_key, 0) for list_key, items in self.lists.items() if items]
        heapq.heapify(heap)
        while heap:
            _, list_key, position = heapq.heappop(heap)
            items = self.lists[list_key]
            yield items[position][1]
            if position + 1 < len(items) and (skip is None or list_key not in skip):
                heapq.heappush(heap, (key(items[position + 1][1]), list_key, position + 1))
