"""At its exit, the service ends everything it runs (``GPUSchedService.cancel_jobs_at_exit``).

Off by default: a production hub's restart keeps notebook servers and batch jobs, and the next
service re-adopts them (service/recovery.py). ``make demo`` turns it on
(``GPUSCHED_DEMO_STOP_ALL=1``, read by hub_config/jupyterhub_config.py), so that Ctrl-C on the
demo leaves nothing of it running.

Why the service does it, and not the hub's ``cleanup_servers`` alone: JupyterHub's shutdown
stops its managed services *first* and only then the notebook servers, whose spawners then
could not release their jobs (the service is gone), and batch jobs are the service's own. So
on SIGINT or SIGTERM, while the hub still answers its API, the service

* cancels every pending job (queued notebook starts included), so that nothing new is placed;
* asks the hub to stop every notebook server and waits for its spawner's release (the server's
  process tree is gone): the job ends ``cancelled`` with the reason (server_stops.py);
* cancels every batch job: its process group gets the polite signal, SIGKILL after
  ``cancel_grace``; the job ends ``cancelled``, its message led by the reason;

then it exits. JupyterHub waits ``interrupt_timeout`` (LocalProcessSpawner's, 30 s) after the
SIGINT to a service before its SIGTERM (and as long again before SIGKILL), so all of this gets
``timeout`` seconds (``exit_stop_timeout``, 20 s by default), and a server's stop at most half of
it before the service kills what is left of it here. One log line per thing stopped; one per
thing left, saying why, when the time is up.
"""

from __future__ import annotations

import asyncio
import logging
import time

from ..core.jobs import Job, JobState

log = logging.getLogger("jupyter_gpusched.service")

ACTOR = "gpusched"  # who cancels, in the jobs' events
POLL = 0.1  # seconds between looks at the jobs being stopped


def describe(live, job: Job) -> str:
    """``alice's notebook server 'second' (j-000003)``, ``bob's batch job j-000004 (sleep 600)``."""
    extra = live.extras.get(job.id)
    if job.kind == "notebook":
        name = extra.server_name if extra is not None and extra.server_name else ""
        what = f"notebook server {name!r}" if name else "notebook server"
        if job.state == JobState.PENDING:
            what = f"queued start of a {what}"
        return f"{job.user}'s {what} ({job.id})"
    command = (extra.name or extra.command or extra.notebook) if extra is not None else None
    detail = f" ({command[:60]})" if command else ""
    pending = "pending " if job.state == JobState.PENDING else ""
    return f"{job.user}'s {pending}batch job {job.id}{detail}"


async def stop_everything(live, reason: str, timeout: float) -> tuple[list[str], list[str]]:
    """Cancel every unfinished job with ``reason`` and wait, at most ``timeout`` seconds, for
    them to end. Returns (what was stopped, what is left and why), one line each, as logged."""
    deadline = time.monotonic() + timeout
    live.server_stop_wait = min(live.server_stop_wait, timeout / 2)
    unfinished = [job for job in live.engine.jobs.values() if not job.state.finished]
    # pending first: the GPUs the running ones free must not start anything
    unfinished.sort(key=lambda job: job.state != JobState.PENDING)
    names = {job.id: describe(live, job) for job in unfinished}
    stopped: list[str] = []
    left: list[str] = []
    if not unfinished:
        log.warning("gpusched exiting: no jobs or notebook servers to stop")
        return stopped, left
    log.warning("gpusched exiting: stopping %d jobs and notebook servers", len(unfinished))
    waiting = []
    for job in unfinished:
        try:
            live.cancel(job.id, ACTOR, reason=reason)
        except Exception as exc:  # one job's failure must not keep the others running
            log.exception("cancelling %s failed", names[job.id])
            left.append(f"left running: {names[job.id]}: its cancel failed ({exc})")
            continue
        waiting.append(job)
    while any(not job.state.finished for job in waiting) and time.monotonic() < deadline:
        await asyncio.sleep(POLL)
    for job in waiting:
        if job.state.finished:
            line = f"stopped {names[job.id]}: {job.state.value}"
            stopped.append(line)
            log.warning("gpusched: %s", line)
        else:
            line = (
                f"left running: {names[job.id]}: still stopping after {timeout:g} s "
                f"(exit_stop_timeout); it is {job.state.value}, and the next start of the "
                "service finds it"
            )
            left.append(line)
            log.warning("gpusched: %s", line)
    return stopped, left
