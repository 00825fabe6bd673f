"""A notebook server's GPUs are free only when nothing of it runs any more.

A notebook job (``kind: notebook``) has no process of the service's own: its spawner (in the
hub) runs the server. So the service ends such a job only when it knows the server's processes
are gone, whoever stopped it:

* **its spawner's release** (``DELETE api/jobs/ID?server_gone=true&reason=...``): the spawner
  stopped the server (through the hub: its user, an admin, jupyterhub-idle-culler, the hub) or
  found it exited, and waited for its process tree to be gone. Where the service can see the
  server's processes (:meth:`ServerStops.processes`), it checks that claim itself;
* **a cancel through the service's API** (the widget's Cancel, ``jupyter-gpusched cancel``), a
  **pre-emption** or the **reaper**: the service asks the hub to stop the server and the job
  stays ``running`` with ``stopping`` set, holding its GPUs, until the spawner's release comes.
  After ``server_stop_wait`` seconds without it the service looks itself: processes of the job
  still running here are killed (and waited for); a server it cannot see (on another machine)
  is taken for gone then, as it must be given up on some time. A release that comes while
  processes of the job still run here ends the job as soon as they are gone.

Which processes are the server's: those of the job's account (or the service's own) whose
environment says ``GPUSCHED_JOB_ID=<the job>`` (the spawner sets it; kernels and terminals
inherit it) and, when the service knows its hub (``JUPYTERHUB_API_URL``, which a hub gives its
managed services and its servers alike), names the same hub: job ids are numbered per service,
so two hubs on one host (two demos, a test hub beside the demo) each have a ``j-000001`` of
alice's, and one service must never take (or kill) the other's server for its own.
They are visible only on the nodes of ``GPUSchedService.local_gpu_nodes`` (this
machine's; every node of the simulated demo cluster), and only where the service may read their
environment (root, or the same account); elsewhere the answer is "unknown", never "gone".

Why the job ended, in its message: the service's own reason when it stopped the server (the
reaper's cull, "cancelled by alice through the scheduler API", the pre-emption), else the
spawner's (``reason``: "server stopped through the hub", "the server process exited (1)"),
else "cancelled by <the caller>". JupyterHub does not tell a spawner who asked for a stop, so
the spawner never claims to know.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pwd
import time

import psutil

from ..backends.interface import Exit
from ..core.jobs import Job, JobState

log = logging.getLogger("jupyter_gpusched.service")

JOB_ENV = "GPUSCHED_JOB_ID"
HUB_ENV = "JUPYTERHUB_API_URL"
MAX_REASON = 200  # characters of a release's reason kept in the job's message
KILL_WAIT = 10.0  # seconds to wait for processes the service killed


class ServerStops:
    """The notebook servers' side of :class:`~jupyter_gpusched.service.live.LiveScheduler`."""

    def __init__(self, live, local_nodes=()):
        self.live = live
        self.local_nodes = set(local_nodes)  # nodes whose processes this machine sees
        self.why: dict[str, str] = {}  # job -> why the service is stopping its server
        self.released: set[str] = set()  # jobs whose spawner released them, processes left

    # -- what runs ---------------------------------------------------------------------------
    def processes(self, job: Job) -> list[psutil.Process] | None:
        """The processes of ``job``'s server on this machine; None when it cannot tell (its
        node is not this machine's, or a process of the job's account hides its
        environment)."""
        placement = self.live.engine.state.allocations.get(job.id)
        if placement is None or not self.local_nodes:
            return None
        names = {self.live.cluster.nodes[part.node].name for part in placement.parts}
        if not names <= self.local_nodes:
            return None
        hub = os.environ.get(HUB_ENV, "").rstrip("/")  # this service's hub, if it has one
        uids = {os.geteuid()}
        with contextlib.suppress(KeyError):
            uids.add(pwd.getpwnam(job.user).pw_uid)
        found, unknown = [], False
        for process in psutil.process_iter(["uids"]):
            try:
                if process.info["uids"] is None or process.info["uids"].real not in uids:
                    continue
                if process.pid == os.getpid():
                    continue
                env = process.environ()
                if env.get(JOB_ENV) == job.id and (
                    not hub or env.get(HUB_ENV, "").rstrip("/") == hub
                ):
                    found.append(process)
            except psutil.AccessDenied:
                unknown = True
            except psutil.Error:
                continue
        return None if unknown and not found else found

    # -- DELETE api/jobs/ID on a running notebook server ---------------------------------------
    def cancel(self, job: Job, actor: str, server_gone: bool, reason: str | None) -> None:
        """End the job now if nothing of the server runs; else stop the server first."""
        running = self.processes(job)
        if running == [] or (running is None and server_gone):
            message = self._message(job, actor, reason)
            self.live.process_exited(job.id, job.runs, Exit(0, "completed", message))
            return
        if running and server_gone:
            self.released.add(job.id)  # stop_and_wait ends it as soon as they are gone
            log.warning(
                "job %s: released by its spawner, but %d of its processes still run (%s)",
                job.id,
                len(running),
                ", ".join(str(p.pid) for p in running[:5]),
            )
        live = self.live
        if live.stopping(job.id):
            return  # already being stopped (cancelled, pre-empted): its stop task ends it
        self.why[job.id] = reason or f"cancelled by {actor} through the scheduler API"
        live.engine.cancel(job.id, live.clock())  # a Stop decision: live._stop -> self.stop
        live.store.add_event(live._event("cancelling", job, actor, self.why[job.id]))
        live.run_pass()

    def _message(self, job: Job, actor: str, reason: str | None) -> str:
        reaper = self.live.reaper
        culled = reaper.stop_reason(job.id) if reaper is not None else None
        own = self.why.pop(job.id, None)
        return culled or own or reason or f"cancelled by {actor}"

    # -- the service stops a server ------------------------------------------------------------
    async def stop(self, job: Job, run: int, why: str, grace: float) -> None:
        """A Stop (``cancelled``) or Preempt decision about a notebook server: for a
        pre-emption a notice and the grace period first; then the hub stops the server; the
        job ends when it is gone."""
        live = self.live
        extra = live.extras.get(job.id)
        server = extra.server_name if extra and extra.server_name is not None else ""
        if why == "preempted":
            message = f"server stopped after a pre-emption notice ({grace:g} s)"
            self.why.setdefault(job.id, message)
            if live.hub is not None:
                notice = {
                    "kind": "preemption",
                    "job_id": job.id,
                    "deadline": live.clock() + grace,
                    "message": "This server's GPUs are needed by a higher-priority job. Save "
                    f"your work: the server stops in {grace:g} s.",
                }
                await live.hub.post_notice(job.user, server, notice)
            await asyncio.sleep(grace)
        await self.stop_and_wait(job, run, server)
        if job.state == JobState.RUNNING and job.runs == run:
            message = self.why.pop(job.id, None) or f"server stopped ({why})"
            live.process_exited(job.id, run, Exit(None, "killed", message))

    async def stop_and_wait(self, job: Job, run: int, server: str) -> None:
        """Ask the hub to stop the server; return once its spawner released the job, or,
        after ``server_stop_wait``, once what is left of it here is gone (killed)."""
        live = self.live
        if live.hub is not None and self._current(job, run):  # no hub: no release will come
            answer = await live.hub.stop_server(job.user, server)
            # "not running" and never released: the hub has no such server (a notebook job
            # submitted through the API) or it had just exited: no release will come, so no
            # wait for one; what may be left of it here is looked for below. A released job's
            # leftovers get the whole wait to exit by themselves.
            no_release = answer == "not running" and job.id not in self.released
            wait = 0.0 if no_release else live.server_stop_wait
            deadline = time.monotonic() + wait
            while self._current(job, run) and time.monotonic() < deadline:
                if job.id in self.released and self.processes(job) == []:
                    break  # released, and what was left of the server has exited since
                await asyncio.sleep(0.2)
        if not self._current(job, run):
            return
        left = self.processes(job) or []
        if left:
            log.warning(
                "job %s: no release %g s after the hub was asked to stop the server; killing "
                "what is left of it: %s",
                job.id,
                live.server_stop_wait,
                ", ".join(str(p.pid) for p in left),
            )
            for process in left:
                with contextlib.suppress(psutil.Error):
                    process.kill()
            await asyncio.to_thread(psutil.wait_procs, left, KILL_WAIT)

    def _current(self, job: Job, run: int) -> bool:
        return job.state == JobState.RUNNING and job.runs == run

    def forget(self, job_id: str) -> None:
        self.why.pop(job_id, None)
        self.released.discard(job_id)
