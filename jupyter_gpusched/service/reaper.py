"""The idle reaper: notebook servers whose GPUs stay idle are warned, then stopped.

The GPU monitor of each notebook server (``serverext/monitor.py``) reports every few seconds
(``POST api/usage-samples``); the service keeps the last report and the idle stretch of each
notebook job. A session is *GPU-idle* when the utilization of every GPU of the server (and the sum
over its processes) is below ``idle_threshold``, whatever the CPU or the browser does. Each
``poll()`` of the service calls :meth:`Reaper.tick`, which asks :func:`decide` (one plain
function, in the style of jupyterhub-idle-culler) what to do and carries it out:

* :class:`Warn` at ``timeout - warning_lead`` idle: a notice to the server (``kind: "idle"``),
  once per idle stretch; GPU activity ends the stretch (and so cancels the warning). Always
  before a cull for idleness, with a whole ``warning_lead``: a server found past its timeout
  (the timeout lowered, the service restarted) is warned now and stopped a lead later;
* :class:`ShutdownKernels` at ``timeout`` idle, when ``shutdown_kernels_first`` is set and some
  of the server's kernels hold GPU memory: a notice (``kind: "shutdown-kernels"``) tells the
  server extension to shut down just those kernels; the server is culled if it stays GPU-idle
  ``warning_lead`` longer;
* :class:`Cull` at ``timeout`` idle, or past ``max_lifetime``: the hub stops the server (its
  spawner then releases the GPUs); audited with the evidence (recent samples, timeout, settings),
  counted in ``gpusched_culls`` and ``gpusched_reaper_reclaimed_gpu_hours`` (GPUs x idle time
  ended by the cull). Just before, a notice (``kind: "reaper-cull"``, the cull's message) tells
  the server's open JupyterLab why it is going.

The policy itself (settings, :func:`decide`) is :mod:`.reaper_policy`.

Only measured samples count: a report is acted on when its ``backend`` is ``nvml``, or
``simulated`` where the service itself runs the simulated cluster (``GPUSchedService.gpu_backend
= "simulated"``, as the demo and the tests do). Any other report (simulated numbers on a real
cluster, a monitor without telemetry, no backend named) is counted (``ignored_reports`` in
``api/reaper``), answered with the reason (``ignored``) and otherwise treated as no report.

Settings (``GET/PUT api/reaper``, ``jupyter-gpusched reaper show|set``): defaults from the policy
file's ``reaper:`` section, run-time overrides stored in the database (setting ``reaper``), audited
(event ``reaper-settings``), read at every tick: no restart.
"""

from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client import Counter

from ..core.durations import describe_duration
from ..core.jobs import JobState
from .launcher import Exit
from .reaper_policy import (  # noqa: F401 (the policy's names are importable from here too)
    DEFAULTS,
    Cull,
    Session,
    ShutdownKernels,
    Warn,
    as_dict,
    as_number,
    busy,
    decide,
    exempt,
    idle_kernels_holding_memory,
    next_moment,
    reported_devices,
    stop_at,
    stop_phrase,
    timeout_for,
    trusted_backends,
    untrusted_reason,
    validate,
    with_profile_idle_timeouts,
)
from .requests import RequestError, check_reaper_changes, check_usage_report, quote

log = logging.getLogger("jupyter_gpusched.service")


class Reaper:
    def __init__(
        self,
        live,
        defaults: dict | None = None,
        metrics=None,
        gpu_backend: str = "auto",
        profile_idle_timeouts: dict | None = None,
    ):
        self.live = live
        # the policy file's reaper: section, and the hub profiles' own idle timeouts
        self.defaults = with_profile_idle_timeouts(validate(defaults or {}), profile_idle_timeouts)
        self.trusted_backends = trusted_backends(gpu_backend)  # whose samples count
        self.sessions: dict[str, Session] = {}
        self.since = live.clock()  # servers running before this (a restart): no history
        self.reclaimed = None
        if metrics is not None:
            self.reclaimed = Counter(
                "gpusched_reaper_reclaimed_gpu_hours",
                "GPU-hours of idleness ended by the reaper's culls (GPUs x idle time)",
                registry=metrics.registry,
            )
        self.metrics = metrics
        self._culling: dict[str, str] = {}  # job id -> why the reaper is stopping its server
        self._timer: asyncio.TimerHandle | None = None  # the next tick due before the poll's
        self._closed = False

    # -- settings ----------------------------------------------------------------------------
    def overrides(self) -> dict:
        return dict(self.live.store.get_setting("reaper", {}) or {})

    def settings(self) -> dict:
        try:
            return validate(self.overrides(), self.defaults)
        except RequestError:  # a stored value no longer valid: the defaults
            log.exception("stored reaper settings are invalid; using the policy file's")
            return dict(self.defaults)

    def update(self, changes: dict, actor: str) -> dict:
        validate(changes, self.settings())  # 400 naming the field
        overrides = {**self.overrides(), **changes}
        effective = validate(overrides, self.defaults)
        event = self.live._event("reaper-settings", None, actor, f"reaper settings by {actor}")
        event["data"] = {"changes": changes, "settings": effective}
        self.live.store.set_setting("reaper", overrides, by=actor, event=event)
        return effective

    # -- reports -----------------------------------------------------------------------------
    def report(self, who, report: dict) -> Session:
        """Take one monitor report; RequestError if it is not about a running notebook of
        ``who``."""
        job_id = report.get("job_id")
        job = self.live.engine.jobs.get(job_id) if isinstance(job_id, str) else None
        if (
            job is None
            or job.kind != "notebook"
            or job.state != JobState.RUNNING
            # another user's server is answered as an unknown one: no telling that it exists
            or (job.user != who.name and not who.admin)
        ):
            raise RequestError(f"no running notebook server {quote(job_id)}", "job_id", 404)
        now = self.live.clock()
        session = self._session(job)
        if job.user == who.name:
            session.groups = who.groups
        profile = report.get("profile")
        if isinstance(profile, str):
            session.profile = profile
        backend = report.get("backend")
        session.backend = backend if isinstance(backend, str) else None
        why = untrusted_reason(report, self.trusted_backends)
        if why is not None:  # not a measurement to act on: as if it had not come
            if session.ignored_reports == 0 or why != session.ignored_reason:
                log.warning("reaper: not acting on the reports of %s: %s", job.id, why)
            session.ignored_reports += 1
            session.ignored_reason = why
            return session
        settings = self.settings()
        server = as_dict(report.get("server"))
        sample = {
            "time": now,
            "backend": backend,
            "utilization": as_number(server.get("utilization")),
            "memory_gb": as_number(server.get("memory_gb")),
            "devices": [
                {"index": d.get("index"), "utilization": as_number(d.get("utilization"))}
                for d in reported_devices(report)
            ],
            "kernels": {
                str(k)[:100]: {
                    "utilization": as_number(v.get("utilization")),
                    "memory_gb": as_number(v.get("memory_gb")),
                }
                for k, v in list(as_dict(report.get("kernels")).items())[:100]
                if isinstance(v, dict)
            },
        }
        session.samples.append(sample)
        session.last_report = now
        if session.first_report is None:
            session.first_report = now
        if busy(report, settings["idle_threshold"]):
            session.last_busy = now
            # GPU activity cancels the warning
            session.warned = session.warn_deadline = session.kernels_shut = None
        return session

    def _session(self, job) -> Session:
        session = self.sessions.get(job.id)
        if session is None or session.started != (job.start_time or 0.0):
            extra = self.live.extras.get(job.id)
            session = self.sessions[job.id] = Session(
                job_id=job.id,
                user=job.user,
                gpus=job.amount,
                tier=job.tier,
                started=job.start_time or self.live.clock(),
                server_name=(extra.server_name or "") if extra else "",
            )
            if session.started < self.since:  # its idle time before a restart is unknown:
                session.last_busy = self.live.clock()  # count from now, warning first
            if self.live.hub is not None:  # its groups, for exemptions before its first report
                self.live._spawn(self._read_groups(session))
        return session

    async def _read_groups(self, session: Session) -> None:
        groups = await self.live.hub.user_groups(session.user)
        if groups is not None and session.last_report is None:  # a report's groups win
            session.groups = groups

    def view(self, session: Session, settings: dict) -> dict:
        timeout = timeout_for(session, settings)
        return {
            "job_id": session.job_id,
            "user": session.user,
            "profile": session.profile,
            "tier": session.tier,
            "gpus": session.gpus,
            "started": session.started,
            "last_report": session.last_report,
            "idle_since": session.idle_since,
            "timeout": timeout,
            "exempt": exempt(session, settings),
            "warned": session.warned,
            "stop_at": stop_at(session, settings, self.live.clock()),
            "last_sample": session.samples[-1] if session.samples else None,
            "backend": session.backend,
            "ignored_reports": session.ignored_reports,
            "ignored_reason": session.ignored_reason,
        }

    def stop_reason(self, job_id: str) -> str | None:
        """Why the reaper is stopping this server, while it is (the spawner's release that
        follows is recorded with it)."""
        return self._culling.get(job_id)

    def latest_sample(self, job_id: str) -> tuple[dict, float] | None:
        """The last sample a notebook server's monitor reported and the server's GPUs, or None
        (no report since it, or the service, started)."""
        session = self.sessions.get(job_id)
        if session is None or not session.samples:
            return None
        return session.samples[-1], session.gpus

    def measured(self) -> dict[int, tuple[float, float]]:
        """By tier: (GPUs of notebook servers with a fresh monitor report, their mean measured
        utilization in percent, weighted by GPUs): the cluster utilization metric."""
        now, stale = self.live.clock(), self.settings()["stale_after"]
        sums: dict[int, list[float]] = {}
        for session in self.sessions.values():
            if not session.samples or session.last_report is None:
                continue
            if now - session.last_report > stale:
                continue
            sample = session.samples[-1]
            devices = [d["utilization"] for d in sample["devices"] if d["utilization"] is not None]
            if devices:
                utilization = sum(devices) / len(devices)
            elif sample["utilization"] is not None:
                utilization = min(100.0, sample["utilization"])
            else:
                continue
            tier = sums.setdefault(session.tier, [0.0, 0.0])
            tier[0] += session.gpus
            tier[1] += session.gpus * utilization
        return {t: (gpus, used / gpus if gpus else 0.0) for t, (gpus, used) in sums.items()}

    # -- each poll ---------------------------------------------------------------------------
    def tick(self) -> list:
        engine = self.live.engine
        for job_id in list(self.sessions):
            job = engine.jobs.get(job_id)
            if job is None or job.state != JobState.RUNNING:
                del self.sessions[job_id]
        for job in engine.running.values():
            if job.kind == "notebook" and job.id not in self.sessions:
                self._session(job)
        settings = self.settings()
        now = self.live.clock()
        candidates = [s for s in self.sessions.values() if s.job_id not in self._culling]
        actions = decide(candidates, settings, now)
        self._schedule(candidates, settings, now)
        for action in actions:
            session = self.sessions[action.job_id]
            if isinstance(action, Warn):
                self._warn(session, action, settings, now)
            elif isinstance(action, ShutdownKernels):
                self._shutdown_kernels(session, action, settings, now)
            else:
                self._cull(session, action, settings, now)
        return actions

    def _schedule(self, sessions, settings: dict, now: float) -> None:
        """Tick again when the next warning or cull is due, not up to a poll interval later."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        due = next_moment(sessions, settings, now)
        if due is None or self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside the service's event loop (a unit test)
            return
        self._timer = loop.call_later(max(0.0, due - now) + 0.01, self._on_timer)

    def close(self) -> None:
        """No more ticks of its own (the service is stopping)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._closed = True

    def _on_timer(self) -> None:
        self._timer = None
        try:
            self.tick()
        except Exception:
            log.exception("the reaper failed")

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

    def _warn(self, session: Session, action: Warn, settings: dict, now: float) -> None:
        session.warned, session.warn_deadline = now, action.deadline
        message = (
            f"This server's GPUs have been idle since "
            f"{time.strftime('%H:%M:%S UTC', time.gmtime(action.idle_since))}. It will be "
            f"stopped {stop_phrase(action.deadline, now)} unless its GPUs are used; save your "
            "work."
        )
        data = self._evidence(session, action, settings, now)
        self._tell(session, "reaper-warning", message, data, kind="idle", deadline=action.deadline)

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
        self._tell(
            session,
            "reaper-kernels",
            message,
            data,
            kind="shutdown-kernels",
            kernel_ids=kernels,
            deadline=action.deadline,
        )

    def _tell(self, session: Session, event_kind: str, message: str, data: dict, **notice):
        """Audit ``event_kind`` with its evidence, log it, and post the notice to the server:
        one message for all three."""
        job = self.live.engine.jobs[session.job_id]
        log.info("reaper: %s of %s (%s): %s", event_kind, job.id, job.user, message)
        event = self.live._event(event_kind, job, "reaper", message)
        event["data"] = data
        self.live.store.add_event(event)
        hub = self.live.hub
        if hub is not None:
            notice = {**notice, "job_id": session.job_id, "message": message}
            self.live._spawn(hub.post_notice(session.user, session.server_name, notice))

    def _cull(self, session: Session, action: Cull, settings: dict, now: float) -> None:
        job = self.live.engine.jobs[session.job_id]
        if action.reason == "idle":
            why = f"GPUs idle for {describe_duration(now - action.idle_since)} (timeout "
            why += f"{describe_duration(action.timeout)})"
        else:
            why = f"ran past the maximum lifetime of {describe_duration(action.timeout)}"
        message = f"culled by the reaper: {why}"
        log.info("reaper: reaper-cull of %s (%s): %s", job.id, job.user, message)
        event = self.live._event("reaper-cull", job, "reaper", message)
        event["data"] = self._evidence(session, action, settings, now)
        self.live.store.add_event(event)
        if self.metrics is not None:
            self.metrics.culls.inc()
        if self.reclaimed is not None and action.reason == "idle":
            self.reclaimed.inc(session.gpus * max(0.0, now - action.idle_since) / 3600)
        self._culling[job.id] = message
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
            self._culling.pop(job.id, None)


# -- REST ------------------------------------------------------------------------------------
from .handlers import APIHandler, api  # noqa: E402 (handlers imports nothing of this module)


class ReaperHandler(APIHandler):
    """``GET api/reaper``: the settings in force, the policy file's defaults, the run-time
    overrides and (admins: every, users: their own) sessions. ``PUT``: change settings (admin),
    a partial object; ``null`` for a timeout turns it off."""

    @property
    def reaper(self) -> Reaper:
        return self.live.reaper

    @api
    def get(self):
        reaper = self.reaper
        settings = reaper.settings()
        sessions = [
            reaper.view(s, settings)
            for s in reaper.sessions.values()
            if self.admin or s.user == self.identity.name
        ]
        self.send(
            {
                "settings": settings,
                "defaults": reaper.defaults,
                "overrides": reaper.overrides(),
                "sessions": sessions,
            }
        )

    @api
    def put(self):
        self.require_admin()
        changes = self.body()
        check_reaper_changes(changes)
        self.reaper.update(changes, self.identity.name)
        self.get_sync()

    def get_sync(self):
        reaper = self.reaper
        self.send({"settings": reaper.settings(), "overrides": reaper.overrides()})


class UsageSamplesHandler(APIHandler):
    """``POST api/usage-samples``: a notebook server's GPU monitor reports (its user's token)."""

    @api
    def post(self):
        report = self.body()
        check_usage_report(report)
        session = self.live.reaper.report(self.identity, report)
        settings = self.live.reaper.settings()
        self.send(
            {
                "job_id": session.job_id,
                "idle_since": session.idle_since,
                "warned": session.warned,
                "timeout": timeout_for(session, settings),
                # why this report is not acted on (None: it is): its monitor logs it
                "ignored": untrusted_reason(report, self.live.reaper.trusted_backends),
            }
        )
