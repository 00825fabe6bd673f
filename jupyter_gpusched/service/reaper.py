"""The idle reaper: notebook servers whose GPUs stay idle are warned, then stopped.

The GPU monitor of each notebook server (``serverext/monitor.py``) reports every few seconds
(``POST api/usage-samples``); the service keeps the last report and the idle stretch of each
notebook job. A session is *GPU-idle* when the utilization of every GPU of the server (and the sum
over its processes) is below ``idle_threshold``, whatever the CPU or the browser does. Each
``poll()`` of the service calls :meth:`Reaper.tick`, which asks :func:`decide` (one plain
function, in the style of jupyterhub-idle-culler) what to do and carries it out:

* :class:`Warn` at ``timeout - warning_lead`` idle: a notice to the server (``kind: "idle"``),
  once per idle stretch; GPU activity ends the stretch (and so cancels the warning);
* :class:`Cull` at ``timeout`` idle, or past ``max_lifetime``: the hub stops the server (its
  spawner then releases the GPUs); audited with the evidence (recent samples, timeout, settings),
  counted in ``gpusched_culls`` and ``gpusched_reaper_reclaimed_gpu_hours`` (GPUs x idle time
  ended by the cull).

Settings (``GET/PUT api/reaper``, ``jupyter-gpusched reaper show|set``): defaults from the policy
file's ``reaper:`` section, run-time overrides stored in the database (setting ``reaper``), audited
(event ``reaper-settings``), read at every tick: no restart.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field

from prometheus_client import Counter

from ..core.durations import parse_duration
from ..core.jobs import JobState
from .launcher import Exit
from .requests import RequestError

log = logging.getLogger("jupyter_gpusched.service")

DEFAULTS: dict = {
    "enabled": True,
    "idle_threshold": 5.0,  # percent
    "warning_lead": 600.0,  # seconds before the timeout
    "timeout_tier_1": None,  # None (or 0): never culled for idleness
    "timeout_tier_2": 2700.0,
    "timeout_tier_3": 1800.0,
    "profile_timeouts": {},  # profile slug -> seconds or None; wins over the tier's
    "exempt_users": [],
    "exempt_groups": [],
    "exempt_profiles": [],
    "max_lifetime": None,  # seconds a notebook server may run at all; None: no limit
    "stale_after": 120.0,  # a session without a report this recent is not decided on
}
DURATIONS = ("warning_lead", "timeout_tier_1", "timeout_tier_2", "timeout_tier_3")
OPTIONAL = ("timeout_tier_1", "timeout_tier_2", "timeout_tier_3", "max_lifetime")
LISTS = ("exempt_users", "exempt_groups", "exempt_profiles")
SAMPLES_KEPT = 60  # per session, the evidence of a cull


def _duration(value, name: str, optional: bool) -> float | None:
    if value is None or (optional and value in ("off", "none", "null", "")):
        if optional:
            return None
        raise RequestError(f"'{name}' must be a duration (seconds, or 30m, 1h)", name)
    try:
        seconds = parse_duration(value)
    except (ValueError, TypeError, OverflowError):
        raise RequestError(
            f"'{name}' must be a duration (seconds, or 30m, 1h){' or null' if optional else ''}",
            name,
        ) from None
    if not math.isfinite(seconds):
        raise RequestError(f"'{name}' must be a finite duration", name)
    if optional and seconds == 0:
        return None
    return seconds


def validate(changes, base: dict | None = None) -> dict:
    """``base`` (default :data:`DEFAULTS`) with ``changes`` applied, checked; RequestError (400)
    names the first bad field."""
    if not isinstance(changes, dict):
        raise RequestError("the reaper settings must be a JSON object", None)
    result = {k: (dict(v) if isinstance(v, dict) else v) for k, v in (base or DEFAULTS).items()}
    for name, value in changes.items():
        if name not in DEFAULTS:
            known = ", ".join(DEFAULTS)
            raise RequestError(f"unknown reaper setting {name!r}; known: {known}", name)
        if name == "enabled":
            if not isinstance(value, bool):
                raise RequestError("'enabled' must be true or false", name)
        elif name == "idle_threshold":
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0 <= value <= 100
            ):
                raise RequestError("'idle_threshold' must be a percentage from 0 to 100", name)
            value = float(value)
        elif name in DURATIONS or name in ("max_lifetime", "stale_after"):
            value = _duration(value, name, name in OPTIONAL)
        elif name in LISTS:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise RequestError(f"'{name}' must be a list of names", name)
            value = sorted(set(value))
        elif name == "profile_timeouts":
            if not isinstance(value, dict):
                raise RequestError("'profile_timeouts' must map profile slugs to durations", name)
            value = {
                str(slug): _duration(seconds, f"profile_timeouts.{slug}", True)
                for slug, seconds in value.items()
            }
        result[name] = value
    return result


@dataclass
class Session:
    """What the service knows about one running notebook server."""

    job_id: str
    user: str
    gpus: float
    tier: int
    started: float
    server_name: str = ""
    groups: frozenset[str] = frozenset()
    profile: str | None = None
    last_report: float | None = None
    last_busy: float | None = None  # the last report that showed GPU use
    warned: float | None = None  # when the warning of this idle stretch went out
    samples: deque = field(default_factory=lambda: deque(maxlen=SAMPLES_KEPT))

    @property
    def idle_since(self) -> float:
        return self.last_busy if self.last_busy is not None else self.started


@dataclass(frozen=True)
class Warn:
    job_id: str
    deadline: float
    timeout: float
    idle_since: float


@dataclass(frozen=True)
class Cull:
    job_id: str
    reason: str  # "idle" or "max-lifetime"
    timeout: float
    idle_since: float


def timeout_for(session: Session, settings: dict) -> float | None:
    if session.profile is not None and session.profile in settings["profile_timeouts"]:
        return settings["profile_timeouts"][session.profile]
    return settings.get(f"timeout_tier_{session.tier}")


def exempt(session: Session, settings: dict) -> bool:
    return (
        session.user in settings["exempt_users"]
        or bool(session.groups & set(settings["exempt_groups"]))
        or (session.profile is not None and session.profile in settings["exempt_profiles"])
    )


def decide(sessions, settings: dict, now: float) -> list:
    """What to do with ``sessions`` at ``now``: a list of :class:`Warn` and :class:`Cull`."""
    actions: list = []
    if not settings["enabled"]:
        return actions
    for s in sessions:
        if exempt(s, settings):
            continue
        lifetime = settings["max_lifetime"]
        if lifetime is not None and now - s.started >= lifetime:
            actions.append(Cull(s.job_id, "max-lifetime", lifetime, s.idle_since))
            continue
        if s.last_report is None or now - s.last_report > settings["stale_after"]:
            continue  # unknown is not idle: a server that does not report is left alone
        if s.last_busy is not None and s.last_busy >= s.last_report:
            continue  # its latest report shows GPU use (a late next report is not idleness)
        timeout = timeout_for(s, settings)
        if timeout is None:
            continue
        idle = now - s.idle_since
        if idle >= timeout:
            actions.append(Cull(s.job_id, "idle", timeout, s.idle_since))
        elif idle >= timeout - settings["warning_lead"] and s.warned is None:
            actions.append(Warn(s.job_id, s.idle_since + timeout, timeout, s.idle_since))
    return actions


def _num(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _devices(report: dict) -> list[dict]:
    devices = report.get("devices")
    return [d for d in devices[:64] if isinstance(d, dict)] if isinstance(devices, list) else []


def busy(report: dict, threshold: float) -> bool:
    """Did this report show GPU use at or above ``threshold`` on any GPU of the server?"""
    if (_num(_dict(report.get("server")).get("utilization")) or 0) >= threshold:
        return True
    return any((_num(d.get("utilization")) or 0) >= threshold for d in _devices(report))


class Reaper:
    def __init__(self, live, defaults: dict | None = None, metrics=None):
        self.live = live
        self.defaults = validate(defaults or {})
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
        self._culling: set[str] = set()

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
        if job is None or job.kind != "notebook" or job.state != JobState.RUNNING:
            raise RequestError(f"no running notebook server {job_id!r}", "job_id", status=404)
        if job.user != who.name and not who.admin:
            raise RequestError(f"{job_id} is not a server of {who.name}", "job_id", status=403)
        now = self.live.clock()
        session = self._session(job)
        if job.user == who.name:
            session.groups = who.groups
        profile = report.get("profile")
        if isinstance(profile, str):
            session.profile = profile
        settings = self.settings()
        server = _dict(report.get("server"))
        sample = {
            "time": now,
            "utilization": _num(server.get("utilization")),
            "memory_gb": _num(server.get("memory_gb")),
            "devices": [
                {"index": d.get("index"), "utilization": _num(d.get("utilization"))}
                for d in _devices(report)
            ],
            "kernels": {
                str(k)[:100]: {
                    "utilization": _num(v.get("utilization")),
                    "memory_gb": _num(v.get("memory_gb")),
                }
                for k, v in list(_dict(report.get("kernels")).items())[:100]
                if isinstance(v, dict)
            },
        }
        session.samples.append(sample)
        session.last_report = now
        if busy(report, settings["idle_threshold"]):
            session.last_busy = now
            session.warned = None  # GPU activity cancels the warning
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
        return session

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
            "last_sample": session.samples[-1] if session.samples else None,
        }

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
        for action in actions:
            session = self.sessions[action.job_id]
            if isinstance(action, Warn):
                self._warn(session, action, settings, now)
            else:
                self._cull(session, action, settings, now)
        return actions

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
        session.warned = now
        minutes = max(0.0, (action.deadline - now) / 60)
        message = (
            f"This server's GPUs have been idle since "
            f"{time.strftime('%H:%M:%S UTC', time.gmtime(action.idle_since))}. It will be "
            f"stopped in {minutes:.0f} min unless its GPUs are used; save your work."
        )
        job = self.live.engine.jobs[session.job_id]
        event = self.live._event("reaper-warning", job, "reaper", message)
        event["data"] = self._evidence(session, action, settings, now)
        self.live.store.add_event(event)
        hub = self.live.hub
        if hub is not None:
            notice = {
                "kind": "idle",
                "job_id": session.job_id,
                "deadline": action.deadline,
                "message": message,
            }
            self.live._spawn(hub.post_notice(session.user, session.server_name, notice))

    def _cull(self, session: Session, action: Cull, settings: dict, now: float) -> None:
        job = self.live.engine.jobs[session.job_id]
        if action.reason == "idle":
            why = f"GPUs idle for {(now - action.idle_since) / 60:.1f} min (timeout "
            why += f"{action.timeout / 60:g} min)"
        else:
            why = f"ran past the maximum lifetime of {action.timeout / 3600:g} h"
        message = f"culled by the reaper: {why}"
        event = self.live._event("reaper-cull", job, "reaper", message)
        event["data"] = self._evidence(session, action, settings, now)
        self.live.store.add_event(event)
        if self.metrics is not None:
            self.metrics.culls.inc()
        if self.reclaimed is not None and action.reason == "idle":
            self.reclaimed.inc(session.gpus * max(0.0, now - action.idle_since) / 3600)
        self._culling.add(job.id)
        self.live._spawn(self._stop(job, job.runs, session.server_name, message))

    async def _stop(self, job, run: int, server_name: str, message: str) -> None:
        """The hub stops the server; its spawner releases the allocation. Without a hub, or if
        the release does not come, the allocation ends here."""
        live = self.live
        try:
            if live.hub is not None:
                await live.hub.stop_server(job.user, server_name)
                waited = 0.0
                while (
                    job.state == JobState.RUNNING
                    and job.runs == run
                    and waited < live.server_stop_wait
                ):
                    await asyncio.sleep(0.2)
                    waited += 0.2
            live.process_exited(job.id, run, Exit(0, "completed", message))
        finally:
            self._culling.discard(job.id)


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
        self.reaper.update(self.body(), self.identity.name)
        self.get_sync()

    def get_sync(self):
        reaper = self.reaper
        self.send({"settings": reaper.settings(), "overrides": reaper.overrides()})


class UsageSamplesHandler(APIHandler):
    """``POST api/usage-samples``: a notebook server's GPU monitor reports (its user's token)."""

    @api
    def post(self):
        session = self.live.reaper.report(self.identity, self.body())
        settings = self.live.reaper.settings()
        self.send(
            {
                "job_id": session.job_id,
                "idle_since": session.idle_since,
                "warned": session.warned,
                "timeout": timeout_for(session, settings),
            }
        )
