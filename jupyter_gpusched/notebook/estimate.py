"""What ``POST api/estimate`` answered, as :meth:`.client.Client.estimate` and ``%%gpujob
--estimate`` return it: it prints as one line ("starts now", "about 25 min (at 14:05 UTC)",
"waits: <reason>"), the words of :func:`~jupyter_gpusched.core.wording.estimate_text`.
"""

from __future__ import annotations

import time

from ..core.wording import estimate_text


class Estimate:
    """``start_now``, ``eta`` (epoch seconds or None), ``reason`` (the reason a pending job's
    record would carry, a dict, or None), ``queue`` (the leaf queue it would go to) and
    ``position`` (1-based place in the pending order, or None); ``data``: the whole answer."""

    def __init__(self, data: dict, now: float | None = None):
        self.data = data
        self.start_now: bool = data["start_now"]
        self.eta: float | None = data["eta"]
        self.reason: dict | None = data["reason"]
        self.queue: str = data["queue"]
        self.position: int | None = data["position"]
        self._now = now  # the time to count the wait from (None: when printed)

    def text(self, clock: bool = True) -> str:
        """The answer in words; ``clock``: with the time of day the estimate falls at."""
        now = time.time() if self._now is None else self._now
        message = (self.reason or {}).get("message")
        return estimate_text(self.start_now, self.eta, message, now, clock)

    def line(self) -> str:
        """The words and where: ``starts now (queue team)``, ``waits: ... (#3 in queue
        small)``: what ``%%gpujob --estimate`` and ``jupyter-gpusched estimate`` print."""
        where = f"queue {self.queue}"
        if not self.start_now and self.position is not None:
            where = f"#{self.position} in {where}"
        return f"{self.text()} ({where})"

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return f"<Estimate {self.queue}: {self.text()}>"
