"""The hub's ``last_activity`` of notebook servers: what the reaper judges CPU-only servers by.

A server with no GPU has no GPU samples to judge it idle or busy by; like jupyterhub-idle-culler,
the reaper uses the activity the hub records for it instead (JupyterHub updates a server's
``last_activity`` when requests pass through the proxy to it and when the server reports
activity). At most every ``GPUSchedService.hub_activity_interval`` seconds, from the service's
poll, :class:`HubActivity` reads ``GET /hub/api/users?state=active`` (all pages) in a task of its
own, and maps each running notebook job (its user and hub server name) to its server's
``last_activity``. The service's hub role needs ``list:users``, ``read:users:activity`` (in
``read:users``) and ``read:servers`` (in ``servers``): see hub_config/README.md.

The service's own notices to a server (the reaper's warning first of all) pass through the
proxy, which records them as the server's activity: a figure that falls within one of them
(:attr:`.hubclient.HubClient.notice_posts`, give or take :data:`NOTICE_SLACK`; one still under
way covers everything since its start) is not taken, the server's previous one stays. Else a
warning would count as the use that cancels it, and an idle CPU-only server would never be
culled. (Use of the server in those moments is masked too, until its next request.)

A failed read keeps the last figures (logged by :class:`~.hubclient.HubClient`); how long
"unknown" may last before a server counts as unmonitored is the reaper's setting.
"""

from __future__ import annotations

import asyncio
import logging
import math
from datetime import datetime, timezone

log = logging.getLogger("jupyter_gpusched.service")

NOTICE_SLACK = 1.0  # seconds around a notice post still taken as its trace (clock rounding)


def parse_hub_time(text) -> float | None:
    """A hub timestamp (ISO 8601, ``2026-12-01T15:51:47.123456Z``) as epoch seconds, or None."""
    if not isinstance(text, str):
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:  # JupyterHub writes UTC; older hubs without the "Z"
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


class HubActivity:
    """The hub's last activity of each running notebook job's server (``latest(job_id)``)."""

    def __init__(self, live, interval: float):
        self.live = live
        self.interval = interval
        self.read_at: float | None = None  # when the last read succeeded (the service's clock)
        self._asked = -math.inf
        self._task: asyncio.Task | None = None
        self._activity: dict[tuple[str, str], float] = {}  # (user, server name) -> epoch

    def tick(self) -> None:
        """Start a read if ``interval`` has passed since the last one and none is under way."""
        if self._task is not None and not self._task.done():
            return
        now = self.live.clock()
        if now - self._asked < self.interval:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # outside the service's loop (tools, tests of the engine)
            return
        self._asked = now
        self._task = loop.create_task(self.read())

    async def read(self) -> None:
        servers = await self.live.hub.server_activity()
        if servers is None:
            return  # the hub could not be read (logged): keep what we had
        posts = getattr(self.live.hub, "notice_posts", {})
        previous, self._activity = self._activity, {}
        for key, text in servers.items():
            moment = parse_hub_time(text)
            if moment is None:
                continue
            if key in previous and _during(moment, posts.get(key, ())):
                moment = previous[key]  # the service's own notice, not the user's use
            self._activity[key] = moment
        self.read_at = self.live.clock()

    def latest(self, job_id: str) -> float | None:
        """The hub's last activity (epoch seconds) of notebook job ``job_id``'s server, or None
        when the hub has not said (no read yet, not a notebook server, no activity recorded)."""
        job = self.live.engine.jobs.get(job_id)
        extra = self.live.extras.get(job_id)
        if job is None or extra is None or job.kind != "notebook":
            return None
        return self._activity.get((job.user, extra.server_name or ""))


def _during(moment: float, posts) -> bool:
    return any(start - NOTICE_SLACK <= moment <= end + NOTICE_SLACK for start, end in posts)
