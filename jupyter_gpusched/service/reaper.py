"""The idle reaper: notebook servers whose GPUs stay idle are warned, then stopped.

It decides from measurements the user cannot switch off or forge: the service's own GPU samples
of each server's allocated devices (``service/gpu_sampling.py``: the service's host, node agents,
Prometheus; :mod:`.reaper_measure`), and for a server without GPUs the hub's activity of it. A
session is *GPU-idle* when every GPU of the server is below ``idle_threshold``, whatever the CPU or
the browser does. The GPU monitor inside the server (``serverext/monitor.py``, ``POST
api/usage-samples``) only says which kernels hold GPU memory: its reports neither keep a server
nor exempt one. Each ``poll()`` of the service calls :meth:`Reaper.tick`, which asks
:func:`decide` (one plain function, in the style of jupyterhub-idle-culler) what to do and
carries it out (:class:`.reaper_actions.ReaperActions`: the notices, events and culls):

* :class:`Unmonitored`: a server with no trusted measurement for ``unmonitored_after`` is
  reported to admins (audit event ``reaper-unmonitored`` once per stretch, gauge
  ``gpusched_unmonitored_servers``, ``api/reaper``) and handled by the setting ``unmonitored``:
  ``warn`` (a notice ``kind: "unmonitored"`` to its owner; it keeps running), ``cull`` (its
  unmeasured time counts as idle: warned, then culled) or ``keep``;

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

The policy itself is in core: :func:`decide` in :mod:`jupyter_gpusched.core.reaper`, the
settings' defaults and checks in :mod:`jupyter_gpusched.core.reaper_settings`.

Only trusted measurements count: readings by ``nvml`` or ``dcgm``, or ``simulated`` where the
service itself runs the simulated cluster (``GPUSchedService.gpu_backend = "simulated"``, as the
demo and the tests do). A monitor report from another backend is counted (``ignored_reports`` in
``api/reaper``), answered with the reason (``ignored``) and its kernels are not used.

Settings (``GET/PUT api/reaper``, ``jupyter-gpusched reaper show|set``): defaults from the policy
file's ``reaper:`` section, run-time overrides stored in the database (setting ``reaper``), audited
(event ``reaper-settings``), read at every tick: no restart.
"""

from __future__ import annotations

import asyncio
import copy
import logging

from prometheus_client import Counter, Gauge

from ..core.jobs import JobState
from ..core.reaper import (  # noqa: F401 (the policy's names are importable from here too)
    Cull,
    Session,
    ShutdownKernels,
    Unmonitored,
    Warn,
    decide,
    exempt,
    idle_kernels_holding_memory,
    next_moment,
    promised_timeout,
    stop_at,
    stop_phrase,
    timeout_for,
    trusted_backends,
    unmonitored,
    untrusted_reason,
)
from ..core.reaper_settings import DEFAULTS  # noqa: F401 (importable from here too)
from .profile_claims import applied_profile, check_claimed_profile
from .profile_claims import profile_shapes as profile_shapes_of
from .reaper_actions import ReaperActions
from .reaper_measure import measure, take_report
from .reaper_requests import validate, with_profile_idle_timeouts
from .records import utilization_series
from .requests import RequestError, quote
from .utilization_record import sample_utilization

log = logging.getLogger("jupyter_gpusched.service")


class Reaper:
    def __init__(
        self,
        live,
        defaults: dict | None = None,
        metrics=None,
        gpu_backend: str = "auto",
        profile_idle_timeouts: dict | None = None,
        sampler=None,
        profile_shapes: dict | None = None,
        recorder=None,
    ):
        self.live = live
        self.sampler = sampler  # the service's GPU samples (service/gpu_sampling.py)
        # records each server's samples over time (service/utilization_record.py); None: not kept
        self.recorder = recorder
        # the policy file's reaper: section, and the hub profiles' own idle timeouts
        self.defaults = with_profile_idle_timeouts(validate(defaults or {}), profile_idle_timeouts)
        self.trusted_backends = trusted_backends(gpu_backend)  # whose samples count
        self.profile_shapes = profile_shapes_of(profile_shapes or {})  # the hub's profiles
        self.sessions: dict[str, Session] = {}
        self._overrides: dict | None = None  # (the store's, read once: overrides())
        self._settings: dict | None = None  # (the settings they make: settings())
        self.since = live.clock()  # servers running before this (a restart): no history
        self.reclaimed = self.unmonitored_gauge = None
        if metrics is not None:
            self.unmonitored_gauge = Gauge(
                "gpusched_unmonitored_servers",
                "Notebook servers with no trusted measurement for longer than unmonitored_after",
                registry=metrics.registry,
            )
            self.reclaimed = Counter(
                "gpusched_reaper_reclaimed_gpu_hours",
                "GPU-hours of idleness ended by the reaper's culls (GPUs x idle time)",
                registry=metrics.registry,
            )
        self.metrics = metrics
        # what is done once core decided: notices, audit events, culls (service/reaper_actions.py)
        self.actions = ReaperActions(live, metrics, self.reclaimed)
        self._timer: asyncio.TimerHandle | None = None  # the next tick due before the poll's
        self._closed = False

    # -- settings ----------------------------------------------------------------------------
    def overrides(self) -> dict:
        """The admin's changes, as stored (read once: only :meth:`update` changes them)."""
        if self._overrides is None:
            self._overrides = dict(self.live.store.get_setting("reaper", {}) or {})
        return copy.deepcopy(self._overrides)

    def settings(self) -> dict:
        """The settings in force (worked out once per change: each tick, each monitor report
        and each ``api/me`` reads them)."""
        if self._settings is None:
            try:
                self._settings = validate(self.overrides(), self.defaults)
            except RequestError:  # a stored value no longer valid: the defaults
                log.exception("stored reaper settings are invalid; using the policy file's")
                self._settings = dict(self.defaults)
        return copy.deepcopy(self._settings)

    def promised_timeouts(self, user: str, groups) -> dict[str, float | None]:
        """By hub profile: the idle timeout a new server of ``user``'s would have now (None:
        never stopped for idleness), for the spawn form (``api/me``)."""
        settings = self.settings()
        return {
            slug: promised_timeout(user, groups, slug, tier, settings)
            for slug, (_gpus, tier) in self.profile_shapes.items()
        }

    def update(self, changes: dict, actor: str) -> dict:
        validate(changes, self.settings())  # 400 naming the field
        overrides = {**self.overrides(), **changes}
        effective = validate(overrides, self.defaults)
        event = self.live._event("reaper-settings", None, actor, f"reaper settings by {actor}")
        event["data"] = {"changes": changes, "settings": effective}
        self.live.store.set_setting("reaper", overrides, by=actor, event=event)
        self._overrides, self._settings = overrides, effective
        return copy.deepcopy(effective)

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
        backend = report.get("backend")
        session.backend = backend if isinstance(backend, str) else None
        why = untrusted_reason(report, self.trusted_backends)
        if why is not None:  # its kernel attribution is not used either
            if session.ignored_reports == 0 or why != session.ignored_reason:
                log.warning("reaper: not acting on the reports of %s: %s", job.id, why)
            session.ignored_reports += 1
            session.ignored_reason = why
            return session
        take_report(session, report, now)
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
                # its spawner's word, checked against the hub's profiles at submission (the
                # server's own GPUSCHED_PROFILE is the user's to change)
                profile=applied_profile(extra.profile if extra else None, self.profile_shapes),
            )
            if extra is not None and extra.profile and session.profile is None:
                log.warning(
                    "reaper: %s names profile %r, which is none of the hub's profiles the "
                    "service was told (GPUSchedService.profile_shapes: call "
                    "pass_idle_timeouts_to_service after the profiles): its tier's timeout "
                    "applies",
                    job.id,
                    extra.profile[:80],
                )
            if session.started < self.since:  # its idle time before a restart is unknown:
                session.last_busy = self.live.clock()  # count from now, warning first
                session.watched_from = self.since  # and its unmeasured time
            if self.live.hub is not None:  # its groups, for exemptions before its first report
                self.live._spawn(self._read_groups(session))
        return session

    async def _read_groups(self, session: Session) -> None:
        groups = await self.live.hub.user_groups(session.user)
        if groups is not None and session.last_report is None:  # a report's groups win
            session.groups = groups

    def view(self, session: Session, settings: dict) -> dict:
        timeout = timeout_for(session, settings)
        now = self.live.clock()
        lost = unmonitored(session, settings, now)
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
            "stop_at": stop_at(session, settings, now),
            "measured_by": session.measured_by,
            "last_measured": session.last_measured,
            "last_sample": session.samples[-1] if session.samples else None,
            # the recent measurements (the web page's sparkline): [time, percent or None]
            "utilization_history": utilization_series(session.samples, session.gpus),
            "unmonitored_since": session.unmonitored_since(settings) if lost else None,
            "unmonitored_reason": session.unmonitored_reason if lost else None,
            "kernels": session.kernels,
            "backend": session.backend,
            "ignored_reports": session.ignored_reports,
            "ignored_reason": session.ignored_reason,
        }

    def check_profile(self, request, default_tier: int) -> None:
        """400 naming ``profile`` when a notebook job claims a hub profile it is not."""
        tier = request.tier or default_tier
        check_claimed_profile(request.profile, request.gpus, tier, self.profile_shapes)

    def stop_reason(self, job_id: str) -> str | None:
        """Why the reaper is stopping this server, while it is (the spawner's release that
        follows is recorded with it)."""
        return self.actions.culling.get(job_id)

    def latest_sample(self, job_id: str) -> tuple[dict, float] | None:
        """The service's last measurement of a notebook server and the server's GPUs, or None
        (none since it, or the service, started)."""
        session = self.sessions.get(job_id)
        if session is None or not session.samples:
            return None
        return session.samples[-1], session.gpus

    def measured(self) -> dict[int, tuple[float, float]]:
        """By tier: (GPUs of notebook servers with a fresh measurement, their mean measured
        utilization in percent, weighted by GPUs): the cluster utilization metric."""
        now, stale = self.live.clock(), self.settings()["stale_after"]
        sums: dict[int, list[float]] = {}
        for session in self.sessions.values():
            if not session.samples or session.last_measured is None or session.gpus == 0:
                continue
            if now - session.last_measured > stale:
                continue
            utilization = session.samples[-1].get("utilization")
            if utilization is None:
                continue
            tier = sums.setdefault(session.tier, [0.0, 0.0])
            tier[0] += session.gpus
            tier[1] += session.gpus * utilization
        return {t: (gpus, used / gpus if gpus else 0.0) for t, (gpus, used) in sums.items()}

    # -- each poll ---------------------------------------------------------------------------
    def tick(self) -> list:
        if self.sampler is not None:
            self.sampler.tick()  # a new read, when one is due (its readings come next ticks)
        engine = self.live.engine
        for job_id in list(self.sessions):
            job = engine.jobs.get(job_id)
            if job is None or job.state != JobState.RUNNING:
                del self.sessions[job_id]
                self.actions.undelivered.pop(job_id, None)
                if self.recorder is not None:
                    self.recorder.close(job_id)
        for job in engine.running.values():
            if job.kind == "notebook" and job.id not in self.sessions:
                self._session(job)
        settings = self.settings()
        now = self.live.clock()
        for session in self.sessions.values():
            before = session.last_measured
            measure(self.live, self.sampler, session, settings["idle_threshold"], now)
            if session.last_measured != before:
                self._record(session, settings)
        if self.recorder is not None:
            self.recorder.tick(now)
        candidates = [s for s in self.sessions.values() if s.job_id not in self.actions.culling]
        actions = decide(candidates, settings, now)
        self._schedule(candidates, settings, now)
        if self.unmonitored_gauge is not None:
            lost = sum(unmonitored(s, settings, now) for s in self.sessions.values())
            self.unmonitored_gauge.set(lost)
        for session in candidates:
            self.actions.resend(session)
        for action in actions:
            self.actions.carry_out(self.sessions[action.job_id], action, settings, now)
        return actions

    def _record(self, session: Session, settings: dict) -> None:
        """Keep the new measurement of a server with GPUs over time (its utilization runs)."""
        if self.recorder is None or not session.gpus or not session.samples:
            return
        sample = session.samples[-1]
        utilization = sample_utilization(sample)
        if utilization is not None:
            self.recorder.add(session.job_id, sample["time"], utilization, settings["stale_after"])

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
        if self.recorder is not None:
            self.recorder.flush()

    def _on_timer(self) -> None:
        self._timer = None
        try:
            self.tick()
        except Exception:
            log.exception("the reaper failed")
