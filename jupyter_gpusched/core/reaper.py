"""The idle reaper's policy, as plain data and functions (no I/O, the time passed in): what it
knows of a session, and :func:`decide`, which says what to do with each session now, under the
settings :mod:`.reaper_settings` checks. Nothing here needs the service: a replay can feed
:func:`decide` sessions, settings and a time.

Two rules hold whatever the settings and whenever they change:

* **warned first**: a server is stopped for idleness only after a warning that went out at
  least ``warning_lead`` before, in the same idle stretch, and not before the deadline that
  warning named. A server already idle past its timeout when the timeout is lowered, the lead
  shortened, an exemption lifted or the service restarted gets the warning now and its whole
  ``warning_lead``;
* **one timeout per server** (:func:`timeout_for`): the admin's ``profile_timeouts`` for its
  profile, else its profile's own ``idle_timeout`` (the hub's ``GPUSchedSpawner.profiles``, passed
  to the service as ``GPUSchedService.profile_idle_timeouts``: what the spawn form shows), else
  its tier's ``timeout_tier_N``.

**The idle threshold** is ``idle_threshold`` here, the one the culls and kernel shutdowns use,
applied to the service's own GPU samples (an admin changes it at run time). The monitor inside
the user's server has its own ``GPUMonitor.busy_threshold`` (the same 5 % by default) for another
purpose: marking the server and its kernels active for JupyterHub and the kernel culler. The
reaper never reads it (it would let a user decide their own idleness), and the monitor does not
import this module (it would load the engine into every notebook server).

**A notebook server's lifetime** (:func:`lifetime_end`), which of three settings applies:

* its profile's ``max_lifetime`` (``GPUSchedSpawner.profiles``) is its job's walltime; the hub's
  spawner stops the server once it has run that long (``spawner.py``, ``poll``);
* the reaper's ``max_lifetime`` is a cap on every server its exemptions do not cover, counted
  from its allocation: :func:`decide` culls it then (``max-lifetime``), whatever its profile says;
  so the server ends at the sooner of the two;
* the policy file's ``walltime.notebook`` is not a lifetime: it is only what the engine plans
  with (backfill, maintenance) for a notebook job without a walltime
  (:meth:`.settings.PolicySettings.default_walltime`), and nothing stops a server then.

:class:`jupyter_gpusched.service.reaper.Reaper` feeds it the service's own measurements (the GPU
samples of ``service/gpu_sampling.py``; the hub's activity for servers without GPUs:
``service/reaper_measure.py``) and carries out its decisions. The monitors' reports inside the
users' servers only say which kernels hold GPU memory.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

from .durations import describe_duration

SAMPLES_KEPT = 60  # per session, the evidence of a cull


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
    watched_from: float | None = None  # when the service could first measure it (None: started)
    first_measured: float | None = None  # its first trusted measurement (the service's own)
    last_measured: float | None = None  # its latest one
    last_busy: float | None = None  # the last measurement that showed use
    warned: float | None = None  # when the warning of this idle stretch went out
    warn_deadline: float | None = None  # the stop time that warning named
    kernels_shut: float | None = None  # when its idle kernels were shut down, this stretch
    samples: deque = field(default_factory=lambda: deque(maxlen=SAMPLES_KEPT))  # measurements
    measured_by: str | None = None  # the source and backend of the latest measurement
    unmonitored_reason: str | None = None  # why it has no trusted measurement now (None: it has)
    unmonitored_reported: float | None = None  # when admins were told, this unmonitored stretch
    unmonitored_told: float | None = None  # when its owner's notice went out (warn), this stretch
    # what its monitor's reports add: which kernels hold GPU memory (shutdown_kernels_first)
    kernels: dict = field(default_factory=dict)
    last_report: float | None = None  # the monitor's latest report (attribution only)
    backend: str | None = None  # the backend the latest report named (None: none, or no report)
    ignored_reports: int = 0  # reports not acted on (see untrusted_reason)
    ignored_reason: str | None = None  # why the latest of them was not

    @property
    def idle_since(self) -> float:
        """The start of the current idle stretch: the last measurement that showed use, else the
        first measurement (the service's own, from the allocation on: the server's start-up
        counts), else the allocation."""
        if self.last_busy is not None:
            return self.last_busy
        return self.first_measured if self.first_measured is not None else self.started

    def unmonitored_since(self, settings: dict) -> float:
        """When it is (or will be) unmonitored if no measurement comes: ``unmonitored_after``
        past its last measurement, else past the moment the service could first measure it."""
        base = self.last_measured
        if base is None:
            base = self.watched_from if self.watched_from is not None else self.started
        return base + settings["unmonitored_after"]

    def measured(self, when: float, busy: bool, busy_at: float | None = None) -> None:
        """A trusted measurement of the server at ``when``, the one way a measurement changes
        what :func:`decide` sees (the live reaper's ``service/reaper_measure.py`` and the
        what-if's ``sim/reaper_whatif.py`` both call it). ``busy``: it showed use, at ``busy_at``
        (default ``when``; the hub's last activity is older than the tick that reads it). Use
        ends the idle stretch; use since the warning went out cancels it. Use from before the
        warning that is only learned now (the hub reports activity late) moves the stretch's
        start, and the warning stands: the stop stays at least a timeout after that use and no
        sooner than the warning said, without a second warning for the same quiet. Any
        measurement ends an unmonitored stretch."""
        self.last_measured = when
        if self.first_measured is None:
            self.first_measured = when
        if busy:
            self.last_busy = when if busy_at is None else busy_at
            if self.warned is None or self.last_busy >= self.warned:
                self.warned = self.warn_deadline = self.kernels_shut = None
        self.unmonitored_reported = self.unmonitored_reason = self.unmonitored_told = None


@dataclass(frozen=True)
class Warn:
    job_id: str
    deadline: float
    timeout: float
    idle_since: float
    reason: str = "idle"  # or "unmonitored" (unmonitored: cull, its unmeasured time as idle)


@dataclass(frozen=True)
class Unmonitored:
    """This session has had no trusted measurement: tell the admins (``report``, once per
    unmonitored stretch) and, under ``unmonitored: warn``, its owner (``notify``, until the
    notice reached the server: it may not be up yet)."""

    job_id: str
    since: float
    reason: str
    notify: bool
    report: bool = True


@dataclass(frozen=True)
class ShutdownKernels:
    """Shut down these GPU-idle kernels that hold GPU memory; the server stays until
    ``deadline`` (if it stays GPU-idle)."""

    job_id: str
    kernel_ids: tuple[str, ...]
    deadline: float
    timeout: float
    idle_since: float


@dataclass(frozen=True)
class Cull:
    job_id: str
    reason: str  # "idle", "unmonitored" (idle as far as known, unmeasured since) or "max-lifetime"
    timeout: float
    idle_since: float


#: The backends whose samples the reaper acts on; "simulated" only where the service itself runs
#: the simulated cluster (service/app.py's gpu_backend), as the demo and the tests do.
REAL_BACKENDS = frozenset({"nvml", "dcgm"})


def trusted_backends(service_backend: str) -> frozenset[str]:
    """The report backends a service whose own GPU backend is ``service_backend`` acts on."""
    return REAL_BACKENDS | ({"simulated"} if service_backend == "simulated" else set())


def untrusted_reason(report: dict, trusted: frozenset[str]) -> str | None:
    """Why the reaper must not act on this monitor report (None: it may). A report without
    telemetry, without a backend (a guess: which GPUs measured it?) or from the simulated GPUs
    on a service that does not simulate them counts as no report: unknown is not idle."""
    backend = report.get("backend")
    if backend in trusted:
        return None
    if backend is None:
        error = report.get("telemetry_error")
        if isinstance(error, str) and error:
            return f"its monitor has no GPU telemetry: {error[:300]}"
        return "the report does not say which GPU backend measured it"
    if backend == "simulated":
        return (
            "its samples come from the simulated GPU backend, and this service does not run "
            "the simulated cluster (GPUSchedService.gpu_backend)"
        )
    return f"unknown GPU backend {str(backend)[:40]!r}"


def timeout_for(session: Session, settings: dict) -> float | None:
    """The idle timeout of this server: the admin's ``profile_timeouts`` for its profile, else
    the profile's own ``idle_timeout``, else its tier's (None: never culled for idleness)."""
    profile = session.profile
    if profile is not None:
        if profile in settings["profile_timeouts"]:
            return settings["profile_timeouts"][profile]
        if profile in settings.get("profile_idle_timeouts", {}):
            return settings["profile_idle_timeouts"][profile]
    return settings.get(f"timeout_tier_{session.tier}")


def timeout_in_force(session: Session, settings: dict) -> float | None:
    """:func:`timeout_for`, or None where the reaper is off or exempts the server."""
    timeout = timeout_for(session, settings)
    if timeout is None or not settings["enabled"] or exempt(session, settings):
        return None
    return timeout


def promised_timeout(user: str, groups, profile: str, tier: int, settings: dict) -> float | None:
    """The idle timeout a new server of ``profile`` (at ``tier``) of ``user`` would have now
    (None: never stopped for idleness): what the spawn form promises, the admin's changes
    included."""
    session = Session("", user, 0, tier, 0.0, groups=frozenset(groups), profile=profile)
    return timeout_in_force(session, settings)


def lifetime_end(session: Session, settings: dict) -> float | None:
    """When the reaper culls ``session`` for its age: ``max_lifetime`` after its allocation
    (None: no cap). Its profile's own ``max_lifetime`` is the hub's to enforce (module doc)."""
    lifetime = settings["max_lifetime"]
    return None if lifetime is None else session.started + lifetime


def stop_due(session: Session, timeout: float, settings: dict) -> float:
    """The earliest moment the idle ``session`` may be stopped: its timeout, and never before a
    warning's ``warning_lead`` has passed or the deadline that warning named."""
    due = session.idle_since + timeout
    if session.warned is not None:
        due = max(due, session.warned + settings["warning_lead"], session.warn_deadline or 0.0)
    return due


def stop_at(session: Session, settings: dict, now: float) -> float | None:
    """When this server will be stopped if its GPUs stay idle (None: never, as things stand):
    what the warning says, and the Lab's status shows."""
    timeout = timeout_in_force(session, settings)
    if timeout is None:
        return None
    due = stop_due(session, timeout, settings)
    if session.warned is None:  # the warning is still to come: a whole lead from it
        due = max(due, now + settings["warning_lead"])
    return due


def stop_phrase(deadline: float, now: float) -> str:
    """``in 45 s (at 14:05:30 UTC)``: when a warned server will be stopped, in the notice, the
    audit and the log alike."""
    clock = time.strftime("%H:%M:%S UTC", time.gmtime(deadline))
    return f"in {describe_duration(deadline - now)} (at {clock})"


def exempt(session: Session, settings: dict) -> bool:
    return (
        session.user in settings["exempt_users"]
        or bool(session.groups & set(settings["exempt_groups"]))
        or (session.profile is not None and session.profile in settings["exempt_profiles"])
    )


def unmonitored(session: Session, settings: dict, now: float) -> bool:
    """No trusted measurement for longer than ``unmonitored_after``."""
    return now > session.unmonitored_since(settings)


def decide(sessions, settings: dict, now: float) -> list:
    """What to do with ``sessions`` at ``now``: a list of :class:`Unmonitored`, :class:`Warn`,
    :class:`ShutdownKernels` and :class:`Cull`. Only measurements count: a session whose latest
    one is older than ``stale_after`` is left alone, unless it is unmonitored and the setting
    ``unmonitored`` is ``cull``."""
    actions: list = []
    if not settings["enabled"]:
        return actions
    for s in sessions:
        if exempt(s, settings):
            continue
        end = lifetime_end(s, settings)
        if end is not None and now >= end:
            actions.append(Cull(s.job_id, "max-lifetime", settings["max_lifetime"], s.idle_since))
            continue
        reason = "idle"
        if unmonitored(s, settings, now):
            report = s.unmonitored_reported is None  # once per unmonitored stretch
            notify = settings["unmonitored"] == "warn" and s.unmonitored_told is None
            if report or notify:
                why = s.unmonitored_reason or "no trusted GPU measurement"
                since = s.unmonitored_since(settings)
                actions.append(Unmonitored(s.job_id, since, why, notify, report))
            if settings["unmonitored"] != "cull":
                continue  # unknown is not idle
            reason = "unmonitored"  # its unmeasured time counts as idle
        elif s.last_measured is None or now - s.last_measured > settings["stale_after"]:
            continue  # unknown is not idle: no measurement this recent
        elif s.last_busy is not None and s.last_busy >= s.last_measured:
            continue  # its latest measurement shows use (a late next one is not idleness)
        timeout = timeout_for(s, settings)
        if timeout is None:
            continue
        lead = settings["warning_lead"]
        if now - s.idle_since < timeout - lead:
            continue
        if s.warned is None:  # warned first, always: a whole lead, even past the timeout
            deadline = max(s.idle_since + timeout, now + lead)
            actions.append(Warn(s.job_id, deadline, timeout, s.idle_since, reason))
            continue
        if now < stop_due(s, timeout, settings):
            continue
        if settings["shutdown_kernels_first"]:
            if s.kernels_shut is None:
                kernels = idle_kernels_holding_memory(s, settings["idle_threshold"])
                if kernels:
                    actions.append(
                        ShutdownKernels(s.job_id, kernels, now + lead, timeout, s.idle_since)
                    )
                    continue
            elif now < s.kernels_shut + lead:
                continue  # its kernels went first; the server gets warning_lead more
        actions.append(Cull(s.job_id, reason, timeout, s.idle_since))
    return actions


def next_moment(sessions, settings: dict, now: float) -> float | None:
    """The earliest time after ``now`` at which :func:`decide` may act on ``sessions`` if no
    report changes them (a warning, a kernel shutdown, a cull, a lifetime's end), so that the
    reaper acts then rather than at its next periodic tick."""
    if not settings["enabled"]:
        return None
    lead = settings["warning_lead"]
    moments = []
    for s in sessions:
        end = lifetime_end(s, settings)
        if end is not None:
            moments.append(end)
        timeout = timeout_for(s, settings)
        if timeout is not None:
            if s.warned is None:  # when it is warned, then when it may be stopped
                moments += [s.idle_since + timeout - lead, s.idle_since + timeout]
            else:
                moments.append(stop_due(s, timeout, settings))
        if s.kernels_shut is not None:
            moments.append(s.kernels_shut + lead)
    later = [m for m in moments if m > now]
    return min(later) if later else None


def as_number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def as_dict(value) -> dict:
    return value if isinstance(value, dict) else {}


#: GPU memory (GB) below which a kernel is taken to hold none (a CUDA context alone holds more).
MEMORY_HELD_GB = 0.01


def idle_kernels_holding_memory(session: Session, threshold: float) -> tuple[str, ...]:
    """The kernels whose monitor's latest report shows GPU memory held at a utilization below
    ``threshold``: what ``shutdown_kernels_first`` shuts down (the reports' one use)."""
    kernels = session.kernels
    return tuple(
        sorted(
            kernel_id
            for kernel_id, use in kernels.items()
            if (use.get("memory_gb") or 0.0) >= MEMORY_HELD_GB
            and (use.get("utilization") or 0.0) < threshold
        )
    )
