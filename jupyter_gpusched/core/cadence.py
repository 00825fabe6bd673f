"""How often a deep pass runs (backfill behind the reservation, pre-emption): every
``backfill.interval`` (30 s), or sooner while the jobs that complete are short.

A deep pass costs a millisecond or more on a large cluster, so it does not follow every job
end; the wait that adds, up to one interval, matters against how long jobs run: 30 s is little
beside an hour's job and doubles the wait of a 20-second one. So the interval is at most
``backfill.interval_fraction`` (0.05) of the median run time of the last :data:`SAMPLES` jobs
that completed, and at least :data:`FLOOR` (Slurm's smallest ``bf_interval``); until
:data:`MIN_SAMPLES` jobs have completed it is ``backfill.interval``. Deep passes then come
every second on a cluster of 20-second jobs, as on a Slurm tuned for short jobs
(``bf_interval=1``), and every 30 s where jobs run for minutes or hours. The ``slurm``
baseline keeps a fixed interval, as Slurm's ``bf_interval`` is.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque

SAMPLES = 200  # the recent completions whose median sets the interval
MIN_SAMPLES = 5  # completions before the median is used (until then: backfill.interval)
FLOOR = 1.0  # seconds: the shortest interval the median sets (a smaller configured one holds)


class BackfillCadence:
    """The interval between deep passes, from the run times of recently completed jobs."""

    def __init__(self, longest: float, fraction: float):
        self.longest = longest  # backfill.interval
        self.fraction = fraction  # backfill.interval_fraction (0: always the longest)
        self.interval = longest
        self._recent: deque = deque()  # run times, oldest first
        self._ordered: list = []  # the same, sorted

    @classmethod
    def of(cls, settings, policy) -> BackfillCadence:
        """The cadence of a :class:`~.settings.PolicySettings` under a :class:`~.policies.Policy`
        (fixed where the policy does not follow run times)."""
        fraction = settings.backfill_interval_fraction if policy.cadence_from_run_times else 0.0
        return cls(settings.backfill_interval, fraction)

    def completed(self, run_time: float) -> None:
        """A job completed after running ``run_time`` seconds."""
        if not self.fraction:
            return
        if len(self._recent) == SAMPLES:
            oldest = self._recent.popleft()
            del self._ordered[bisect_left(self._ordered, oldest)]
        self._recent.append(run_time)
        insort(self._ordered, run_time)
        count = len(self._ordered)
        if count >= MIN_SAMPLES:
            median = (self._ordered[(count - 1) // 2] + self._ordered[count // 2]) / 2
            self.interval = min(self.longest, max(FLOOR, self.fraction * median))
