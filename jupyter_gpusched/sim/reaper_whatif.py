"""The idle-timeout what-if: the idle reaper replayed over the notebook servers of an exported
trace and their recorded GPU utilization (``jupyter gpusched reaper what-if``), to say what other
settings (a shorter timeout, another lead or threshold) would have done before an admin sets
them.

Each server (a trace row of kind ``notebook`` with its recorded start, and GPUs) is walked
through time from its recorded start to its recorded end. The walk stops at each start and end of
its utilization runs (:mod:`.utilization`) and at each moment :func:`~..core.reaper.next_moment`
names; there the session's measurement is set from the run covering that time (inside a run:
measured then, busy when the run reached ``idle_threshold``; between runs: nothing measured, as
for the live reaper when no sample came) through :meth:`~..core.reaper.Session.measured`, the
live reaper's own rule, and :func:`~..core.reaper.decide` says what to do: a warning is noted on
the session as the live reaper notes it, a cull ends the server there. So exemptions,
``max_lifetime``, profile timeouts, the warning's lead and ``unmonitored`` are the live reaper's
rules, not a copy of them.

What it cannot replay: ``shutdown_kernels_first`` (the trace has no kernels; replayed as off) and
servers without GPUs (judged by the hub's activity, which the samples do not hold). A server's
end is its recorded end: a longer timeout cannot show how much longer a server the live reaper
culled would have run. Pure: no files, no clock (the CLI reads the files).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from ..core.durations import describe_duration
from ..core.reaper import Cull, Session, Unmonitored, Warn, decide, lifetime_end, next_moment
from ..core.utilization_bands import BAND_EDGES

#: the settings that are durations (shown as such in the table)
DURATIONS = (
    "warning_lead",
    "timeout_tier_1",
    "timeout_tier_2",
    "timeout_tier_3",
    "max_lifetime",
    "stale_after",
    "unmonitored_after",
)


@dataclass(frozen=True)
class ServerOutcome:
    """What the reaper would have done to one notebook server under one set of settings."""

    job_id: str
    tier: int
    profile: str | None
    gpus: float  # GPUs x gpu_fraction
    start: float  # its recorded start
    end: float  # its recorded end (still running: its last sample's end)
    warned_at: float | None  # its first warning (None: never warned)
    warnings: int  # warnings, all idle stretches together
    culled_at: float | None  # None: not culled before its recorded end
    reason: str | None  # the cull's: idle, unmonitored or max-lifetime
    used_after_cull: bool  # a busy run after the cull, before its recorded end
    live_culled: bool  # the live reaper culled it (recorded outcome "culled")

    @property
    def gpu_hours_reclaimed(self) -> float:
        """The GPU-hours between the cull and the recorded end."""
        if self.culled_at is None:
            return 0.0
        return self.gpus * (self.end - self.culled_at) / 3600.0


@dataclass
class Tally:
    """The figures of a group of servers (a tier and profile, or all)."""

    servers: int = 0
    warned: int = 0  # servers warned at least once
    culled: int = 0
    gpu_hours_reclaimed: float = 0.0
    culls_followed_by_use: int = 0  # culls of a server busy again before its recorded end
    live_culled: int = 0  # servers the live reaper really culled

    def add(self, outcome: ServerOutcome) -> None:
        self.servers += 1
        self.warned += outcome.warned_at is not None
        self.culled += outcome.culled_at is not None
        self.gpu_hours_reclaimed += outcome.gpu_hours_reclaimed
        self.culls_followed_by_use += outcome.used_after_cull
        self.live_culled += outcome.live_culled


@dataclass
class WhatIf:
    """The reaper replayed under one set of settings: each server's outcome, the figures per
    (tier, profile) and in all, and what was left out."""

    servers: list[ServerOutcome]
    by_class: dict[tuple[int, str], Tally]  # (tier, profile slug or "") -> figures
    total: Tally
    left_out: dict[str, int] = field(default_factory=dict)  # why -> servers (or runs)
    notes: list[str] = field(default_factory=list)


def notebook_servers(trace) -> tuple[list, dict[str, int]]:
    """The trace's notebook servers the what-if replays (recorded start, GPUs), by id, and how
    many it leaves out, by reason."""
    servers, left_out = [], {}
    for job in trace:
        if job.kind != "notebook":
            continue
        if job.recorded is None:
            why = "notebook servers without a recorded start"
        elif job.gpus == 0:
            why = "servers without GPUs (judged by hub activity, not in the samples)"
        else:
            servers.append(job)
            continue
        left_out[why] = left_out.get(why, 0) + 1
    return sorted(servers, key=lambda j: j.id), left_out


def server_end(job, runs) -> float:
    """The recorded end of the server ``job``; still running when exported: its last sample's."""
    if job.recorded.end_time is not None:
        return job.recorded.end_time
    return max([job.recorded.start_time, *(r.end for r in runs)])


def replay_server(job, runs, settings: dict) -> ServerOutcome:
    """The reaper, under ``settings``, over the notebook server ``job`` (a TraceJob with
    ``recorded``) and its utilization ``runs`` (sorted by start)."""
    start, end = job.recorded.start_time, server_end(job, runs)
    session = Session(
        job.id, job.user, job.gpus, job.tier, started=start, profile=job.recorded.profile
    )
    threshold = settings["idle_threshold"]
    pending = deque(r for r in runs if r.end >= start and r.start < end)
    covering: list = []  # the runs covering the walk's time
    warned_at, warnings, cull = None, 0, None
    now = start
    while now < end and settings["enabled"]:
        while pending and pending[0].start <= now:
            covering.append(pending.popleft())
        covering = [r for r in covering if r.end >= now]
        busy = None  # between runs: nothing measured
        if covering:
            # where one run ends as the next begins, both are measured now, the ending one
            # first (else a busy run's end would hide an idle run that starts the moment it ends)
            current = [r for r in covering if r.end > now]
            if current and len(current) < len(covering):
                ending = [r for r in covering if r.end == now]
                session.measured(now, any(r.utilization >= threshold for r in ending))
            busy = any(r.utilization >= threshold for r in (current or covering))
            session.measured(now, busy)
        for action in decide([session], settings, now):
            if isinstance(action, Warn):  # as the live reaper notes it (reaper_actions.py)
                session.warned, session.warn_deadline = now, action.deadline
                warnings += 1
                warned_at = now if warned_at is None else warned_at
            elif isinstance(action, Unmonitored):
                session.unmonitored_reported = now
                session.unmonitored_told = now if action.notify else None
            elif isinstance(action, Cull):
                cull = action
        if cull is not None:
            break
        later = _next_stop(session, settings, now, pending, covering, busy)
        if later is None:
            break
        now = later
    culled_at = now if cull is not None else None
    used = culled_at is not None and any(
        r.utilization >= threshold and r.end > culled_at and r.start < end for r in runs
    )
    return ServerOutcome(
        job_id=job.id,
        tier=job.tier,
        profile=job.recorded.profile,
        gpus=job.gpus * job.gpu_fraction,
        start=start,
        end=end,
        warned_at=warned_at,
        warnings=warnings,
        culled_at=culled_at,
        reason=cull.reason if cull is not None else None,
        used_after_cull=used,
        live_culled=job.recorded.outcome == "culled",
    )


def _next_stop(session: Session, settings: dict, now: float, pending, covering, busy):
    """The walk's next stop after ``now`` (None: none): the next run's start, the end of the
    runs covering ``now``, and, unless its latest measurement shows use (then :func:`decide` waits
    for the run's end, or its lifetime's), the moments :func:`next_moment` names and, under
    ``unmonitored: cull``, the first moment it is unmonitored."""
    stops = [r.end for r in covering]
    if pending:
        stops.append(pending[0].start)
    if busy:
        stops.append(lifetime_end(session, settings))
    else:
        stops.append(next_moment([session], settings, now))
        if settings["unmonitored"] == "cull":  # unmonitored strictly after unmonitored_since
            stops.append(math.nextafter(session.unmonitored_since(settings), math.inf))
    later = [s for s in stops if s is not None and s > now]
    return min(later) if later else None


def what_if(trace, runs_by_job: dict, settings: dict) -> WhatIf:
    """The reaper under ``settings`` (checked by :func:`~..core.reaper_settings.validate`)
    replayed over the trace's notebook servers and their utilization runs (job id -> runs sorted
    by start, :func:`.utilization.read_utilization`)."""
    servers, left_out = notebook_servers(trace)
    notes = []
    if settings["shutdown_kernels_first"]:
        settings = {**settings, "shutdown_kernels_first": False}
        notes.append(
            "shutdown_kernels_first is replayed as off: the trace has no kernels (idle servers "
            "are culled at their timeout instead of losing their kernels first)"
        )
    if settings["exempt_groups"]:
        notes.append("exempt_groups cannot apply: the trace does not say who is in which group")
    if settings["idle_threshold"] not in BAND_EDGES:
        edges = ", ".join(f"{e:g}" for e in BAND_EDGES)
        notes.append(
            f"idle_threshold {settings['idle_threshold']:g} % is not a band edge ({edges}): a run "
            "counts as busy when its highest sample reached it, so some idle time may count as "
            "busy"
        )
    known = {job.id for job in servers}
    orphans = sum(len(runs) for job_id, runs in runs_by_job.items() if job_id not in known)
    if orphans:
        left_out["utilization runs of no replayed server"] = orphans
    outcomes = [replay_server(job, runs_by_job.get(job.id, []), settings) for job in servers]
    by_class: dict[tuple[int, str], Tally] = {}
    total = Tally()
    for outcome in outcomes:
        by_class.setdefault((outcome.tier, outcome.profile or ""), Tally()).add(outcome)
        total.add(outcome)
    return WhatIf(outcomes, dict(sorted(by_class.items())), total, left_out, notes)


# -- current -> candidate -------------------------------------------------------------------
FIGURES = (  # Tally field, table heading
    ("warned", "warned"),
    ("culled", "culled"),
    ("gpu_hours_reclaimed", "GPU-h reclaimed"),
    ("culls_followed_by_use", "culls then busy"),
)


def changed_settings(current: dict, candidate: dict) -> dict[str, tuple]:
    """The settings in which ``candidate`` differs from ``current``: name -> (current, candidate),
    one ``profile_timeouts.SLUG`` per profile."""
    changed = {}
    for name, value in candidate.items():
        if name == "profile_timeouts":
            before = current.get(name, {})
            for slug in sorted(set(before) | set(value)):  # "tier": none set (its tier's)
                pair = (before.get(slug, "tier"), value.get(slug, "tier"))
                if pair[0] != pair[1]:
                    changed[f"{name}.{slug}"] = pair
        elif current.get(name) != value:
            changed[name] = (current.get(name), value)
    return changed


def comparison(trace, runs_by_job: dict, current: dict, candidate: dict) -> dict:
    """The what-if under ``current`` and ``candidate`` settings side by side, as plain data
    (what ``--json`` prints and :func:`comparison_table` shows): per (tier, profile) and in all,
    each figure's current and candidate value, and each server's outcome under both."""
    now, then = what_if(trace, runs_by_job, current), what_if(trace, runs_by_job, candidate)

    def figures(tally: Tally | None) -> dict:
        tally = tally or Tally()
        return {name: _rounded(getattr(tally, name)) for name, _ in FIGURES}

    def group(tally_now: Tally, tally_then: Tally) -> dict:
        return {
            "servers": tally_now.servers,
            "live_culled": tally_now.live_culled,
            "current": figures(tally_now),
            "candidate": figures(tally_then),
        }

    classes = [
        {"tier": tier, "profile": profile or None, **group(tally, then.by_class[(tier, profile)])}
        for (tier, profile), tally in now.by_class.items()
    ]
    servers = [
        {
            "job_id": a.job_id,
            "tier": a.tier,
            "profile": a.profile,
            "current": _server(a),
            "candidate": _server(b),
        }
        for a, b in zip(now.servers, then.servers, strict=True)
    ]
    return {
        "changed": {k: list(v) for k, v in changed_settings(current, candidate).items()},
        "classes": classes,
        "total": group(now.total, then.total),
        "servers": servers,
        "left_out": now.left_out,
        "notes": list(dict.fromkeys(now.notes + then.notes)),
    }


def _server(outcome: ServerOutcome) -> dict:
    return {
        "warned_at": outcome.warned_at,
        "culled_at": outcome.culled_at,
        "reason": outcome.reason,
        "gpu_hours_reclaimed": _rounded(outcome.gpu_hours_reclaimed),
        "used_after_cull": outcome.used_after_cull,
    }


def _rounded(value):
    return round(value, 3) if isinstance(value, float) else value


def comparison_table(result: dict) -> str:
    """:func:`comparison`'s result as text: a row per tier and profile and one for the total,
    each figure ``current -> candidate``, then the changed settings, what was left out and the
    notes."""
    headings = ["tier", "profile", "servers", *(h for _, h in FIGURES), "live culled"]
    rows = [[str(c["tier"]), c["profile"] or "-", *_cells(c)] for c in result["classes"]] + [
        ["total", "", *_cells(result["total"])]
    ]
    widths = [max(len(r[i]) for r in [headings, *rows]) for i in range(len(headings))]
    lines = [
        "  ".join(
            cell.ljust(w) if i < 2 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in [headings, *rows]
    ]
    changed = result["changed"]
    lines.append("")
    if changed:
        described = "; ".join(
            f"{k} {_setting(k, a)} -> {_setting(k, b)}" for k, (a, b) in changed.items()
        )
        lines.append(f"current -> candidate: {described}")
    else:
        lines.append("the candidate is the current settings (no change given)")
    for why, count in result["left_out"].items():
        lines.append(f"left out ({count}): {why}")
    lines += [f"note: {note}" for note in result["notes"]]
    return "\n".join(lines)


def _cells(group: dict) -> list[str]:
    now, then = group["current"], group["candidate"]
    cells = [str(group["servers"])]
    for name, _ in FIGURES:
        a, b = now[name], then[name]
        cells.append(f"{a:.2f} -> {b:.2f}" if isinstance(a, float) else f"{a} -> {b}")
    return [*cells, str(group["live_culled"])]


def _setting(name: str, value) -> str:
    if value is None:
        return "off"
    if value == "tier":
        return "the tier's"
    if name in DURATIONS or name.startswith("profile_timeouts."):
        return describe_duration(value)
    return f"{value:g}" if isinstance(value, float) else str(value)
