"""What the idle reaper measures of each session, from the service's side only.

* A session with GPUs: the trusted readings of its devices (:class:`.gpu_sampling.GPUSampler`).
  It is busy when any of its GPUs is at or above ``idle_threshold``. It is idle only when every
  GPU of it has been measured: a GPU without a reading may be the busy one.
* A session without GPUs (a CPU-only profile): the hub's ``last_activity`` of its server
  (``live.hub_activity``, ``service/hub_activity.py``), as jupyterhub-idle-culler judges: activity
  newer than the session's last busy time makes it busy at that time.

The monitor inside the user's server is not a measurement: its reports only say which kernels
hold GPU memory (:func:`take_report`). A session without a trusted measurement is left alone
until it is *unmonitored* (:func:`~..core.reaper.unmonitored`); ``unmonitored_reason`` says why.
"""

from __future__ import annotations

from ..core.reaper import Session, as_dict, as_number

NO_SOURCES = (
    "the service samples no GPUs (GPUSchedService.local_gpu_nodes, node_agents, gpu_metrics_url)"
)


def take_readings(
    session: Session, readings, allocated: int, threshold: float, measured_by: str | None
) -> bool:
    """Take the trusted ``readings`` of the session's ``allocated`` GPUs if they are newer than
    its last measurement and not older than the session (a reading of its GPU from before it
    was allocated tells of the job that held it then: a server started on a GPU idle since an
    earlier job left was once counted idle since then, and stopped a minute after it started);
    True when they made one."""
    known = [r for r in readings if r.utilization is not None and r.time >= session.started]
    if not known:
        return False
    when = max(r.time for r in known)
    if session.last_measured is not None and when <= session.last_measured:
        return False  # the same readings, seen at an earlier tick
    busy = any(r.utilization >= threshold for r in known)
    if not busy and len(known) < allocated:
        return False  # idle as far as measured, but an unmeasured GPU may be in use
    devices = [
        {
            "node": r.node,
            "index": r.index,
            "utilization": r.utilization,
            "memory_gb": r.memory_used_gb,
            "backend": r.backend,
        }
        for r in sorted(known, key=lambda r: (r.node, r.index))
    ]
    memory = [r.memory_used_gb for r in known if r.memory_used_gb is not None]
    sample = {
        "time": when,
        "measured_by": measured_by,
        "utilization": sum(r.utilization for r in known) / len(known),
        "memory_gb": sum(memory) if memory else None,
        "devices": devices,
    }
    session.measured_by = measured_by
    session.measured(when, busy)
    session.samples.append(sample)
    return True


def take_activity(session: Session, latest: float | None, now: float) -> bool:
    """Take the hub's last activity of a server without GPUs (``latest``, epoch; None:
    unknown): a measurement as of ``now``; activity newer than the last busy time (or the
    start) makes it busy then. True when it was a measurement."""
    if latest is None:
        return False
    before = session.last_busy if session.last_busy is not None else session.started
    busy = latest > before
    changed = busy or session.last_measured is None
    session.measured(now, busy, busy_at=latest)
    session.measured_by = "hub (last_activity)"
    if changed:  # the evidence: each new activity, not every tick
        sample = {"time": now, "measured_by": session.measured_by, "activity": latest}
        session.samples.append(sample)
    return True


def measure(live, sampler, session: Session, threshold: float, now: float) -> None:
    """Bring ``session``'s measurements up to date (each reaper tick), and say why it has none
    where it has none."""
    if session.gpus == 0:
        activity = live.hub_activity
        latest = activity.latest(session.job_id) if activity is not None else None
        if not take_activity(session, latest, now):
            session.unmonitored_reason = (
                "the hub has not said when this server was last active"
                if activity is not None
                else "the service reads no hub activity (it runs without a hub)"
            )
        return
    if sampler is None:
        session.unmonitored_reason = NO_SOURCES
        return
    job_id = session.job_id
    readings, allocated = sampler.readings_for(job_id), sampler.allocated(job_id)
    if not take_readings(session, readings, allocated, threshold, sampler.measured_by(job_id)):
        session.unmonitored_reason = sampler.why_unmeasured(job_id) or (
            "its GPUs' readings are no newer than its last measurement"
        )


def take_report(session: Session, report: dict, now: float) -> None:
    """A trusted monitor report's one use: which of the server's kernels hold GPU memory, at
    what utilization (``shutdown_kernels_first`` and what the user sees). Never a measurement:
    a report claiming use keeps no server, and a missing one exempts none."""
    session.last_report = now
    session.kernels = {
        str(k)[:100]: {
            "utilization": as_number(v.get("utilization")),
            "memory_gb": as_number(v.get("memory_gb")),
        }
        for k, v in list(as_dict(report.get("kernels")).items())[:100]
        if isinstance(v, dict)
    }
