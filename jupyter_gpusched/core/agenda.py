"""What the next :meth:`~.scheduler.Scheduler.schedule` call must look at and hand out: the
decisions not handed to the adapter yet, the jobs to examine, whether something was freed (a
full pass), and when to wake even if nothing happens.

Apart from the scheduler because its collaborators (:mod:`.claims`, :mod:`.admin`) note work
for the next pass too: each is given this one object instead of the whole scheduler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Agenda:
    decisions: list = field(default_factory=list)  # Start / Preempt / Stop, not handed out yet
    new: list[str] = field(default_factory=list)  # jobs to examine at the next pass
    freed: bool = False  # something was freed: the next pass walks the whole queue
    # when a victim passes its minimum run time, a back-off ends, maintenance begins, ...
    wake: float = math.inf

    def wake_at(self, when: float) -> None:
        """Ask :meth:`~.scheduler.Scheduler.schedule` to run at ``when`` at the latest."""
        self.wake = min(self.wake, when)
