"""What the idle reaper does once core has decided: the notices to a server, the audit events
with their evidence, the metrics, and the cull itself (the hub stops the server).

Apart from :mod:`.reaper` (the sessions, the settings, the measurements and each tick's call of
:func:`jupyter_gpusched.core.reaper.decide`) because this is the reaper's side effects, each
action of core's turned into messages a person reads and calls to the hub and the store:
:meth:`ReaperActions.carry_out` is the one entry. The :class:`~.reaper.Reaper` builds its
``ReaperActions`` itself, from the ``live`` scheduler and the metrics it was given.
"""

from __future__ import annotations

import logging
import time

from ..backends.interface import Exit
from ..core.durations import describe_duration
from ..core.reaper import Cull, Session, ShutdownKernels, Unmonitored, Warn, stop_phrase

log = logging.getLogger("jupyter_gpusched.service")


class ReaperActions:
    """Carries out the reaper's actions (:class:`~jupyter_gpusched.core.reaper.Unmonitored`,
    ``Warn``, ``ShutdownKernels``, ``Cull``) on the live scheduler: its store (audit events),
    its hub (notices, stopping a server) and its engine (the job a cull ends)."""

    def __init__(self, live, metrics=None, reclaimed=None):
        self.live = live
        self.metrics = metrics  # the service's metrics (culls counted), or None
        self.reclaimed = reclaimed  # the reclaimed GPU-hours counter, or None
        self.culling: dict[str, str] = {}  # job id -> why the reaper is stopping its server
        # job id -> (when the warning went out, its notice): a warning's notice that did not
        # reach the server (not up yet), posted again at the next ticks while it stands
        self.undelivered: dict[str, tuple[float | None, dict]] = {}

    def carry_out(self, session: Session, action, settings: dict, now: float) -> None:
        """Do what ``action`` (decided at ``now`` under ``settings``) says about ``session``."""
        if isinstance(action, Unmonitored):
            self._unmonitored(session, action, settings, now)
        elif isinstance(action, Warn):
            self._warn(session, action, settings, now)
        elif isinstance(action, ShutdownKernels):
            self._shutdown_kernels(session, action, settings, now)
        else:
            self._cull(session, action, settings, now)

    def _evidence(self, session: Session, action, settings: dict, now: float) -> dict:
        return {
            "reason": getattr(action, "reason", "idle"),
            "timeout": action.timeout,
            "idle_since": action.idle_since,
            "idle_seconds": now - action.idle_since,
            "profile": session.profile,
            "tier": session.tier,
            "gpus": session.gpus,
            "settings": settings,
            "samples": list(session.samples)[-10:],
        }

    def _unmonitored(self, session: Session, action: Unmonitored, settings: dict, now: float):
        since = _clock(action.since - settings["unmonitored_after"])
        mode = settings["unmonitored"]
        if action.report:
            session.unmonitored_reported = now
            message = f"GPU use not measured since {since}: {action.reason} (unmonitored: {mode})"
            data = {"since": action.since, "reason": action.reason, "unmonitored": mode}
            data["measured_by"] = session.measured_by
            self._tell(session, "reaper-unmonitored", message, data, None, now)
        if action.notify and self.live.hub is not None:
            session.unmonitored_told = now
            message = (
                f"This server's GPU use cannot be measured (since {since}: {action.reason}), so "
                "it is not stopped for idleness; the admins were told."
            )
            notice = {"kind": "unmonitored", "deadline": None, "job_id": session.job_id}
            self.live._spawn(self._notify(session, {**notice, "message": message}))

    async def _notify(self, session: Session, notice: dict) -> None:
        """Post ``notice`` to the server; if it does not arrive (the server is not up yet), the
        next tick sends it again."""
        if not await self.live.hub.post_notice(session.user, session.server_name, notice):
            session.unmonitored_told = None

    def _warn(self, session: Session, action: Warn, settings: dict, now: float) -> None:
        session.warned, session.warn_deadline = now, action.deadline
        if action.reason == "unmonitored":
            idle = (
                f"This server's GPU use cannot be measured ({session.unmonitored_reason}), and "
                "this hub counts unmeasured time as idle"
            )
        elif session.gpus == 0:  # a CPU-only server: the hub's activity, as idle-culler
            idle = f"This server has had no activity since {_clock(action.idle_since)}"
        else:
            idle = f"This server's GPUs have been idle since {_clock(action.idle_since)}"
        use = "it is used" if session.gpus == 0 else "its GPUs are used"
        message = (
            f"{idle}. It will be stopped {stop_phrase(action.deadline, now)} unless {use}; "
            "save your work."
        )
        data = self._evidence(session, action, settings, now)
        notice = {"kind": "idle", "deadline": action.deadline}
        self._tell(session, "reaper-warning", message, data, notice, now)

    def _shutdown_kernels(
        self, session: Session, action: ShutdownKernels, settings: dict, now: float
    ) -> None:
        session.kernels_shut = now
        count = len(action.kernel_ids)
        message = (
            f"This server's GPUs have been idle for {describe_duration(now - action.idle_since)}: "
            f"{count} kernel{'s' if count > 1 else ''} holding GPU memory "
            f"{'were' if count > 1 else 'was'} shut down. The server will be stopped "
            f"{stop_phrase(action.deadline, now)} unless its GPUs are used."
        )
        kernels = list(action.kernel_ids)
        data = {**self._evidence(session, action, settings, now), "kernel_ids": kernels}
        notice = {"kind": "shutdown-kernels", "kernel_ids": kernels, "deadline": action.deadline}
        self._tell(session, "reaper-kernels", message, data, notice, now)

    def _tell(self, session: Session, event_kind: str, message: str, data: dict, notice, now):
        """Audit ``event_kind`` with its evidence, log it, and post the ``notice`` (None: none)
        to the server: one message for all three. The event's time is ``now``, the decision's
        (the one its lead and deadline count from), not the moment it was written."""
        job = self.live.engine.jobs[session.job_id]
        log.info("reaper: %s of %s (%s): %s", event_kind, job.id, job.user, message)
        event = self.live._event(event_kind, job, "reaper", message)
        event["time"], event["data"] = now, data
        self.live.store.add_event(event)
        if self.live.hub is not None and notice is not None:
            notice = {**notice, "job_id": session.job_id, "message": message}
            self.live._spawn(self._deliver(session, session.warned, notice))

    async def _deliver(self, session: Session, warned: float | None, notice: dict) -> None:
        """Post a warning's ``notice`` to the server; kept to post again (:meth:`resend`) when
        it did not arrive. The stop does not wait for it (the server's owner could keep it from
        arriving): the warning counts from when it was decided, as its audit event says."""
        if await self.live.hub.post_notice(session.user, session.server_name, notice):
            self.undelivered.pop(session.job_id, None)
        else:
            self.undelivered[session.job_id] = (warned, notice)

    def resend(self, session: Session) -> None:
        """At each tick: post again the notice of a warning that still stands and has not
        reached the server yet."""
        held = self.undelivered.pop(session.job_id, None)
        if held is not None and held[0] == session.warned and session.warned is not None:
            self.live._spawn(self._deliver(session, *held))

    def _cull(self, session: Session, action: Cull, settings: dict, now: float) -> None:
        job = self.live.engine.jobs[session.job_id]
        if action.reason in ("idle", "unmonitored"):
            idle = "no activity" if session.gpus == 0 else "GPUs idle"
            why = f"{idle} for {describe_duration(now - action.idle_since)} (timeout "
            why += f"{describe_duration(action.timeout)})"
            if action.reason == "unmonitored":
                why += ", as far as measured: unmeasured time counts as idle (unmonitored: cull)"
        else:
            why = f"ran past the maximum lifetime of {describe_duration(action.timeout)}"
        message = f"culled by the reaper: {why}"
        log.info("reaper: reaper-cull of %s (%s): %s", job.id, job.user, message)
        event = self.live._event("reaper-cull", job, "reaper", message)
        event["time"], event["data"] = now, self._evidence(session, action, settings, now)
        self.live.store.add_event(event)
        if self.metrics is not None:
            self.metrics.culls.inc()
        if self.reclaimed is not None and action.reason != "max-lifetime":
            self.reclaimed.inc(session.gpus * max(0.0, now - action.idle_since) / 3600)
        self.culling[job.id] = message
        self.live._spawn(self._stop(job, job.runs, session.server_name, message))

    async def _stop(self, job, run: int, server_name: str, message: str) -> None:
        """The hub stops the server; its spawner releases the allocation. Without a hub, or if
        the release does not come, the allocation ends here once nothing of the server is left
        (service/server_stops.py)."""
        live = self.live
        try:
            if live.hub is not None:
                # tell the user's open JupyterLab why first (the server extension answers once
                # the Lab has fetched it, or after a few seconds: serverext/notices.py)
                cull = {"kind": "reaper-cull", "message": message, "job_id": job.id}
                await live.hub.post_notice(job.user, server_name, {**cull, "deadline": None})
            await live.server_stops.stop_and_wait(job, run, server_name)
            live.process_exited(job.id, run, Exit(0, "completed", message))
        finally:
            self.culling.pop(job.id, None)


def _clock(moment: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(moment))
