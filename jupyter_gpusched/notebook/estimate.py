"""What ``POST api/estimate`` answered, as :meth:`.client.Client.estimate` and ``%%gpujob
--estimate`` return it: it prints as one line ("starts now", "about 25 min (at 14:05 UTC)",
"waits: <reason>"), the words of :func:`~jupyter_gpusched.core.wording.estimate_text`; a job
with a deadline adds the earliest it can finish ("; can finish at 16:10 UTC").
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from ..core.wording import estimate_text


class Estimate:
    """``start_now``, ``eta`` (epoch seconds or None), ``reason`` (the reason a pending job's
    record would carry, a dict, or None), ``queue`` (the leaf queue it would go to) and
    ``position`` (1-based place in the pending order, or None), ``earliest_finish`` (a job
    with a deadline: the earliest it can finish, epoch seconds; else None); ``data``: the whole
    answer."""

    def __init__(self, data: dict, now: float | None = None):
        self.data = data
        self.start_now: bool = data["start_now"]
        self.eta: float | None = data["eta"]
        self.reason: dict | None = data["reason"]
        self.queue: str = data["queue"]
        self.position: int | None = data["position"]
        self.earliest_finish: float | None = data.get("earliest_finish")
        # how long the engine would plan it to run, in words ("planned to run 2 min, estimated
        # from earlier runs like it"; its walltime; the default), or None
        self.planned: str | None = (data.get("planned_run_time") or {}).get("message")
        self._now = now  # the time to count the wait from (None: when printed)

    def text(self, clock: bool = True) -> str:
        """The answer in words; ``clock``: with the time of day the estimate falls at."""
        now = time.time() if self._now is None else self._now
        message = (self.reason or {}).get("message")
        return estimate_text(self.start_now, self.eta, message, now, clock)

    def line(self) -> str:
        """The words and where, and for a job that would wait the run time it would be planned
        with: ``starts now (queue team)``, ``waits: ... (#3 in line, queue small); planned to run
        1 h, its walltime``: what ``%%gpujob --estimate`` and ``jupyter-gpusched estimate``
        print."""
        where = f"queue {self.queue}"
        if not self.start_now and self.position is not None:
            where = f"#{self.position} in line, {where}"  # (the cluster's pending order)
        finish = ""
        if self.earliest_finish is not None:
            finish = f"; can finish at {utc_clock(self.earliest_finish, self._now)}"
        # what it would be planned with decides whether it may start in front of a reservation
        planned = f"; {self.planned}" if self.planned and not self.start_now else ""
        return f"{self.text()}{finish} ({where}){planned}"

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return f"<Estimate {self.queue}: {self.text()}>"


def utc_clock(epoch: float, now: float | None = None) -> str:
    """``16:10 UTC``, or ``2026-12-24 16:10 UTC`` on another day than ``now``'s (UTC), as
    :func:`~jupyter_gpusched.core.wording.estimate_text` gives the time of a start."""
    moment = datetime.fromtimestamp(epoch, timezone.utc)
    today = datetime.fromtimestamp(time.time() if now is None else now, timezone.utc).date()
    return moment.strftime("%H:%M UTC" if moment.date() == today else "%Y-%m-%d %H:%M UTC")
