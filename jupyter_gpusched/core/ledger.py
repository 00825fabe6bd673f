"""What the running jobs hold, counted the ways the engine asks about them: GPUs by tier
(what pre-emption could take), by node and tier (where), by user (per-user limits), by job
array (its ``%max_running``), by the end its walltime or the policy's default gives
(reservations) and the recent starts still inside their minimum run time.

The :class:`~.scheduler.Scheduler` records each start and end here; pre-emption
(:mod:`.claims`) and the pass read it. Pure bookkeeping: it decides nothing.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque

from .copying import copy_parts
from .jobs import Job
from .state import Placement


class RunningLedger:
    def __init__(self, nodes: int):
        self.tier_gpus = {1: 0, 2: 0, 3: 0}  # GPUs held by running jobs of each tier
        # GPUs held on each node by tier-3 jobs (what any pre-emption may take), and by tier-2
        # and tier-3 jobs together (what a reclaim of borrowed GPUs may take)
        self.tier3_on_node = [0.0] * nodes
        self.tiers23_on_node = [0.0] * nodes
        # the same, of the jobs already signalled (``preempted_by``: they are leaving and no
        # other claim may take them): what pre-emption could still free is the difference
        self.leaving3_on_node = [0.0] * nodes
        self.leaving23_on_node = [0.0] * nodes
        self.by_user: dict[str, list] = {}  # user -> [running GPUs, running jobs]
        self.by_array: dict[str, int] = {}  # array id -> its running elements
        self.ends: list[tuple[float, str]] = []  # (end by its limit, job id), soonest first
        # (start, job id) of the tier-2 and tier-3 jobs started inside their minimum run time
        self.recent_starts = {2: deque(), 3: deque()}

    def __deepcopy__(self, memo):  # (core/copying.py: ends are tuples, by_user numbers)
        return copy_parts(
            self,
            memo,
            flat=(
                "tier3_on_node",
                "tiers23_on_node",
                "leaving3_on_node",
                "leaving23_on_node",
                "ends",
            ),
            nested=("by_user", "recent_starts"),
        )

    def victim_room(self, reclaim: bool) -> list[float]:
        """Per node, the GPUs pre-emption could free: tier 3, or tiers 2 and 3 to reclaim."""
        return self.tiers23_on_node if reclaim else self.tier3_on_node

    def leaving_room(self, reclaim: bool) -> list[float]:
        """Per node, the part of :meth:`victim_room` held by jobs already signalled."""
        return self.leaving23_on_node if reclaim else self.leaving3_on_node

    def signalled(self, job: Job, placement: Placement, sign: int) -> None:
        """``job`` was signalled to leave for a pre-emption (+1), or is no longer counted as
        leaving (-1: its claim was called off, or it has ended)."""
        self._on_nodes(job, placement, sign, self.leaving3_on_node, self.leaving23_on_node)

    def preemptible_gpus(self, reclaim: bool) -> float:
        """GPUs held by the jobs pre-emption may take (tier 3; tier 2 too to reclaim)."""
        return self.tier_gpus[3] + (self.tier_gpus[2] if reclaim else 0)

    def started(self, job: Job, placement: Placement, end: float, protected: bool) -> None:
        """``job`` runs on ``placement``, planned to end at ``end`` (by its limit); ``protected``:
        it is still inside its minimum run time (no pre-emption may take it yet)."""
        self._on_nodes(job, placement, +1)
        if protected:
            insort(self.recent_starts[job.tier], (job.start_time, job.id))
        self.tier_gpus[job.tier] += job.amount
        insort(self.ends, (end, job.id))
        used = self.by_user.setdefault(job.user, [0.0, 0])
        used[0] += job.amount
        used[1] += 1
        if job.array_id is not None:
            self.by_array[job.array_id] = self.by_array.get(job.array_id, 0) + 1

    def ended(self, job: Job, placement: Placement, end: float) -> None:
        """``job`` has stopped (``end``: the end it was recorded with)."""
        self._on_nodes(job, placement, -1)
        if job.preempted_by is not None:  # a signalled victim: no longer leaving
            self.signalled(job, placement, -1)
        self.tier_gpus[job.tier] -= job.amount
        used = self.by_user[job.user]
        used[0] -= job.amount
        used[1] -= 1
        if job.array_id is not None:
            left = self.by_array[job.array_id] - 1
            if left:
                self.by_array[job.array_id] = left
            else:
                del self.by_array[job.array_id]
        del self.ends[bisect_left(self.ends, (end, job.id))]

    def _on_nodes(self, job: Job, placement: Placement, sign: int, tier3=None, tiers23=None):
        if job.tier == 1:
            return  # tier 1 is never pre-empted: no one needs its GPUs by node
        tier3 = self.tier3_on_node if tier3 is None else tier3
        tiers23 = self.tiers23_on_node if tiers23 is None else tiers23
        for part in placement.parts:
            gpus = sign * part.gpus * part.fraction
            if job.tier == 3:
                tier3[part.node] += gpus
            tiers23[part.node] += gpus
