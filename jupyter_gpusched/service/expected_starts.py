"""Every pending job's expected start (:mod:`..core.plan`) in ``api/queue`` and the job views:
the engine played forward on a copy of its state, taken at the service's poll and played in a
thread, so that requests are answered meanwhile.

A play is due ``expected_start_interval`` seconds after the last one, if the engine has run a
pass since, or if one of the play's expected starts has passed with its job still waiting (a
running job outran its walltime or its learned estimate: the plan went wrong, and nothing in
the engine may happen for hours). Otherwise an idle cluster's plan stays as it was: its times
are absolute. The reservation's
holder keeps the reservation's start (its reason's ``eta``, the engine's own) unless the play
starts it sooner (by pre-emption: a reclaim of GPUs other queues borrow); every other pending
job the play reached gets the play's start, as its reason's ``eta``, while that is still ahead
(one in the past means the plan went wrong: none is shown until the next play, which that
brings about).
"""

from __future__ import annotations

import asyncio
import logging
import math

from traitlets import Float, HasTraits, Integer

from ..core.copying import snapshot
from ..core.plan import play

log = logging.getLogger("jupyter_gpusched.service")


class ExpectedStartSettings(HasTraits):
    """Traits of ``GPUSchedService`` (``c.GPUSchedService.expected_start_interval``)."""

    expected_start_interval = Float(
        10.0,
        min=0.0,
        help="Seconds between two plays of the engine forward that give every pending job an "
        "expected start (running jobs ending at their walltimes, no new arrivals: docs/engine."
        "md, 'When a waiting job is expected to start'), shown as its reason's eta in "
        "api/queue, the job views, the "
        "page, the Lab and the spawn page. Only after the engine ran a pass since the last "
        "play, or once an expected start has passed while its job still waits. 0: off (only "
        "the first blocked job has an estimated start, its reservation's).",
    ).tag(config=True)
    expected_start_max_ends = Integer(
        2000,
        min=1,
        help="The most job ends a play goes through (each costs about a scheduling pass, in a "
        "thread beside the service's requests): a pending job the play does not reach has no "
        "expected start.",
    ).tag(config=True)


class ExpectedStarts:
    """The latest play's expected starts, and the next play when it is due (:meth:`tick`)."""

    def __init__(self, live, interval: float, max_ends: int):
        self.live, self.interval, self.max_ends = live, interval, max_ends
        self.starts: dict[str, float] = {}  # job id -> expected start (engine time)
        self.earliest = math.inf  # the soonest of them
        self.last: float | None = None  # when the last play began
        self.passes = -1  # the engine's pass count then
        self.playing: asyncio.Task | None = None

    def tick(self) -> None:
        """At each poll: a play in a thread when one is due and none is playing."""
        engine, now = self.live.engine, self.live.clock()
        if not self.interval or self.playing is not None:
            return
        if self.last is not None and now - self.last < self.interval:
            return
        if engine.passes == self.passes and not self._passed(now):
            return
        self.last, self.passes = now, engine.passes
        trial = snapshot(engine)  # here, on the event loop: the state between two passes
        self.playing = asyncio.ensure_future(self._play(trial, now))

    def _passed(self, now: float) -> bool:
        """Has an expected start passed while its job still waits in line?"""
        if self.earliest >= now:
            return False
        jobs, waiting = self.live.engine.jobs, self.live.engine.waiting_in_line
        passed = [job_id for job_id, start in self.starts.items() if start < now]
        if any(job_id in jobs and waiting(jobs[job_id]) for job_id in passed):
            return True
        self.earliest = min((s for s in self.starts.values() if s >= now), default=math.inf)
        return False

    async def _play(self, trial, now: float) -> None:
        try:
            self.starts = await asyncio.to_thread(play, trial, now, max_ends=self.max_ends)
            self.earliest = min(self.starts.values(), default=math.inf)
        except Exception:
            log.exception("playing the engine forward for expected starts failed")
        finally:
            self.playing = None

    def reason(self, reason: dict | None, job_id: str) -> dict | None:
        """``reason`` (its wire form) with the job's expected start as its ``eta`` where it has
        none of its own; where its own has passed and the play's is later (a reservation's
        start on GPUs that a job past its planned end still holds: core/plan.py
        ``played_end``); and where the play's is earlier than its own (the reservation counts
        only running jobs' ends: the play also reclaims and pre-empts, once the victims' minimum
        run times and grace periods are over). A new dict, ``reason`` is not changed."""
        if reason is None:
            return reason
        now, own = self.live.clock(), reason.get("eta")
        start = self.starts.get(job_id)
        if start is None or start < now:
            return reason
        if own is not None and now <= own <= start:
            return reason
        return {**reason, "eta": start}


def with_expected_start(live, reason: dict | None, job_id: str) -> dict | None:
    """:meth:`ExpectedStarts.reason`, or ``reason`` as it is where the service plays none."""
    planner = live.expected_starts
    return reason if planner is None else planner.reason(reason, job_id)
