"""The engine, live: requests and process exits in, launches, signals and rows out.

:class:`LiveScheduler` is the one place where the service changes scheduling state. Every
change follows the same steps:

1. tell the engine (``submit``, ``cancel``, ``job_ended``, ...);
2. run a pass (:meth:`LiveScheduler.run_pass`) and turn its decisions into rows, written in one
   transaction *before* anything is launched or signalled;
3. carry the decisions out through the launcher (start a process, signal, kill).

So after a crash at any point the database says at least as much as happened: a job marked
running whose launch never happened has no launcher handle and is requeued on restart
(:meth:`recover`); one whose process is still alive is put back on its GPUs; one whose process
ended while the service was down is finished from the launcher's exit record.

Its parts, each in a module of its own: a request becoming a pending job (submissions.py), what
admins change (admin_changes.py), what a batch job is launched with (launch_specs.py), the
parts a poll ticks (poll_parts.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from ..backends.interface import Exit, LaunchError
from ..core.decisions import DeadlineMissed, Preempt, Start, Stop
from ..core.jobs import Job, JobState
from ..core.scheduler import Scheduler
from . import admin_changes
from .deadlines import carry_out_miss
from .identity import Identity
from .launch_specs import describe, launch_spec
from .poll_parts import sync_nodes, tick_parts
from .records import Extra, allocation_rows, row_for, state_fields
from .requests import JobRequest
from .server_stops import ServerStops
from .submissions import Submissions

log = logging.getLogger("jupyter_gpusched.service")


class LiveScheduler:
    """The engine, the store and the launcher, and the parts around them.

    Built from its constructor's arguments, then :meth:`attach` gives it the parts that need
    the live scheduler itself (each reads its jobs, clock or store), which :meth:`poll` ticks.
    """

    def __init__(
        self,
        engine: Scheduler,
        store,
        launcher,
        *,
        log_dir: str,
        default_tier: int = 2,
        cancel_grace: float = 10.0,
        clock=time.time,
        metrics=None,
        hub=None,
        server_stop_wait: float = 30.0,
        quota_document: dict | None = None,
        local_nodes=(),
    ):
        self.engine = engine
        self.cluster = engine.cluster
        self.store = store
        self.launcher = launcher
        self.log_dir = log_dir
        self.default_tier = default_tier
        self.cancel_grace = cancel_grace
        self.clock = clock
        self.metrics = metrics
        self.hub = hub  # a HubClient when the hub runs this service (see hubclient.py)
        self.server_stop_wait = server_stop_wait  # after asking the hub to stop a server
        self.quota_document = quota_document  # the queue file as loaded, or the last edit
        self.extras: dict[str, Extra] = {}  # unfinished jobs only
        self.submissions = Submissions(self, store.next_number())  # requests in (group commit)
        self._stopping: dict[str, tuple[int, str]] = {}  # job -> (run, why) while signalled
        # running batch job -> why it was asked to stop (its cancel's reason, its pre-emption),
        # which leads the message of how it ended
        self._stop_reasons: dict[str, str] = {}
        self._tasks: set[asyncio.Task] = set()
        self._in_pass = self._again = False  # see run_pass
        self._forget_later: dict[str, Job] = {}  # finished in a pass: forgotten after the next
        self.decisions = 0
        # notebook servers: ended once they are gone from local_nodes (server_stops.py)
        self.server_stops = ServerStops(self, local_nodes)
        self.reaper = None  # the idle reaper (service/reaper.py)
        self.rogue_watch = None  # checks for rogue GPU processes (service/rogue.py)
        self.hub_activity = None  # the hub's last_activity of servers (hub_activity.py)
        self.node_sync = None  # Slurm's node states into the engine (backends/slurm/inventory.py)
        self.history = None
        self.expected_starts = None  # every pending job's expected start (expected_starts.py)

    def attach(
        self,
        *,
        reaper=None,
        hub_activity=None,
        node_sync=None,
        rogue_watch=None,
        history=None,
        expected_starts=None,
    ):
        """The second step of building (app.py, once): the parts that are given the live
        scheduler when they are made, so cannot be its constructor's arguments; poll() ticks
        them (poll_parts.py)."""
        self.reaper = reaper
        self.hub_activity = hub_activity
        self.node_sync = node_sync
        self.rogue_watch = rogue_watch
        self.history = history
        self.expected_starts = expected_starts

    # -- what users and admins do ------------------------------------------------------------
    def submit(self, who: Identity, request: JobRequest) -> Job:
        """A pending job from ``request`` (a RequestError when refused): submissions.py."""
        return self.submissions.submit(who, request)

    def estimate(self, who: Identity, request: JobRequest):
        """What ``request`` would meet if submitted now, and its earliest finish if it has a
        deadline (else None); nothing queued (submissions.py)."""
        return self.submissions.estimate(who, request)

    async def saved(self, job_id: str) -> None:
        """Wait until the submission of ``job_id`` is committed (submissions.py)."""
        await self.submissions.saved(job_id)

    def cancel(
        self, job_id: str, actor: str, server_gone: bool = False, reason: str | None = None
    ) -> Job:
        """``server_gone`` and ``reason``: a notebook server's spawner releasing its job (see
        server_stops.py); ``reason`` is also the message of a pending job's cancel, and leads
        that of a running batch job's (e.g. "the demo stopped": service/exit_stop.py)."""
        self.submissions.save()
        job = self.engine.jobs[job_id]
        if job.kind == "notebook" and job.state == JobState.RUNNING:
            # a notebook server's GPUs are free only once it is gone (server_stops.py)
            self.server_stops.cancel(job, actor, server_gone, reason)
            return job
        was_pending = job.state == JobState.PENDING
        self.engine.cancel(job_id, self.clock())
        if job.state == JobState.RUNNING:  # recorded, so that a restart finishes the cancel
            message = reason or f"cancelled by {actor}"
            self._stop_reasons[job_id] = message
            self.store.add_event(self._event("cancelling", job, actor, message))
        if was_pending:
            self.store.update_job(job.id, *self.pending_cancelled(job, actor, reason))
        self.run_pass()
        if was_pending:  # after the pass: a job that was pre-empting is due to be looked at
            self._forget(job)  # again (core/claims.py _drop_claim), and must still be there
        return job

    def pending_cancelled(self, job: Job, actor: str, reason: str | None = None):
        """The bookkeeping of a pending job the engine has just cancelled: its message (as a
        running job's stop gives one) and the pending count; its row's fields and the event
        to store."""
        self.submissions.count_pending(job, -1)
        message = reason or f"cancelled by {actor}"
        extra = self.extras.get(job.id)
        if extra is not None:
            extra.message = message
        return self._fields(job), self._event("cancelled", job, actor, message)

    def close(self) -> None:
        """Stop the timers of its own (the reaper's); the poll loop is the caller's."""
        if self.reaper is not None:
            self.reaper.close()

    def stopping(self, job_id: str) -> str | None:
        """Why a running job has been signalled to stop (``cancelled``, ``preempted``), while
        its processes are still going; else None."""
        job = self.engine.jobs.get(job_id)
        run, why = self._stopping.get(job_id, (None, None))
        running = job is not None and job.state == JobState.RUNNING and run == job.runs
        return why if running else None

    def hold(self, job_id: str, actor: str, hold: bool = True) -> Job:
        return admin_changes.hold(self, job_id, actor, hold)

    def set_priority(self, job_id: str, priority: int, actor: str) -> Job:
        return admin_changes.set_priority(self, job_id, priority, actor)

    def set_node(self, name: str, node_state: str, actor: str) -> None:
        """``drain``, ``resume`` or ``down`` (admin_changes.py)."""
        admin_changes.set_node(self, name, node_state, actor)

    def set_maintenance(self, name: str, start: float | None, actor: str) -> None:
        admin_changes.set_maintenance(self, name, start, actor)

    def update_quotas(self, tree, document: dict, actor: str) -> None:
        admin_changes.update_quotas(self, tree, document, actor)

    def node_state(self, name: str) -> str:
        return self.engine.state.node_state[self.cluster.node(name).index]

    # -- the pass ----------------------------------------------------------------------------
    def run_pass(self) -> None:
        """Run the engine and carry out what it decided (rows first, then processes).

        Re-entrant calls (a launch that fails ends its job, which asks for a pass) only ask
        for one more pass after this one, so that a long run of failing launches is a loop,
        not a recursion."""
        if self._in_pass:
            self._again = True
            return
        self._in_pass = True
        try:
            self._again = True
            while self._again:
                self._again, done = False, list(self._forget_later.values())
                self._run_pass_once()
                for job in done:  # (as cancel(): after a pass that may still look at it)
                    self._forget(self._forget_later.pop(job.id))
        finally:
            self._in_pass = False

    def _run_pass_once(self) -> None:
        now = self.clock()
        decisions = self.engine.schedule(now)
        if not decisions:
            return
        lost = self.submissions.save()  # rows about these jobs follow
        if lost:  # submissions the database refused: taken back, GPUs they got free again
            decisions = [decision for decision in decisions if decision.job_id not in lost]
            self._again = True
        self.decisions += len(decisions)
        changes, opened, closed, events, launches, stops = [], [], [], [], [], []
        for decision in decisions:
            job = self.engine.jobs[decision.job_id]
            extra = self.extras[job.id]
            if isinstance(decision, Start):
                self.submissions.count_pending(job, -1)
                extra.handle = extra.exit_code = extra.message = None
                opened += allocation_rows(job, decision.placement, self.cluster, now)
                where = describe(decision.placement, self.cluster)
                events.append(self._event("started", job, None, f"started on {where}"))
                if self.metrics:
                    self.metrics.started(job, now)
                if job.kind == "batch":
                    launches.append((job, decision.placement))
            elif isinstance(decision, Preempt):
                message = (
                    f"pre-empted for {decision.by}: {decision.signal}, then killed after "
                    f"{decision.grace:g} s"
                )
                events.append(self._event("preempted", job, None, message))
                self._stopping[job.id] = (job.runs, "preempted")
                self._stop_reasons[job.id] = f"pre-empted for {decision.by}"
                stops.append((job, job.runs, decision.signal, decision.grace, extra.handle))
                if self.metrics:
                    self.metrics.preempted(job)
            elif isinstance(decision, Stop):
                if decision.ended:  # the engine already ended it (its node went down)
                    # a batch job is requeued, and may have started again in this same pass
                    requeued = job.state in (JobState.PENDING, JobState.RUNNING)
                    run = job.runs - 1 if job.state == JobState.RUNNING else job.runs
                    closed.append((job.id, run, now))
                    extra.message = decision.reason
                    kind = "requeued" if requeued else job.state.value
                    events.append(self._event(kind, job, None, decision.reason))
                    if requeued:
                        self.submissions.count_pending(job, +1)
                    stops.append((job, run, "SIGKILL", 0.0, extra.handle))
                    extra.handle = None
                else:
                    self._stopping[job.id] = (job.runs, "cancelled")
                    signame = self.engine.settings.preemption_signal
                    stops.append((job, job.runs, signame, self.cancel_grace, extra.handle))
            elif isinstance(decision, DeadlineMissed):  # (deadlines.py)
                events.append(carry_out_miss(self, job, decision))
            if self.metrics:
                self.metrics.decided(type(decision).__name__.lower())
            changes.append((job.id, self._fields(job)))
        self.store.apply(changes, opened, closed, events)
        for job in {job.id: job for job, *_ in stops if job.state.finished}.values():
            self._forget(job)
        for job, placement in launches:
            self._launch(job, placement, now)
        for job, run, signame, grace, handle in stops:
            self._spawn(self._stop(job.id, run, handle, signame, grace))

    def poll(self) -> None:
        """Notice processes that exited; then run a pass (for timers inside the engine)."""
        sync_nodes(self)  # first: a node's failure requeues, not fails, its jobs
        for job_id in list(self.engine.running):
            extra = self.extras.get(job_id)
            if extra is None or extra.handle is None:
                continue
            try:
                result = self.launcher.poll(extra.handle)
            except Exception:
                log.exception("polling job %s failed", job_id)
                continue
            if result is not None:
                self.process_exited(job_id, self.engine.jobs[job_id].runs, result)
        tick_parts(self)  # the reaper, the hub's activity, rogue processes, the history
        self.run_pass()

    def process_exited(self, job_id: str, run: int, result: Exit) -> None:
        """A run's processes are gone: tell the engine, record how it ended, reschedule."""
        job = self.engine.jobs.get(job_id)
        if job is None or job.state != JobState.RUNNING or job.runs != run:
            return  # already accounted for
        self.submissions.save()
        extra = self.extras[job_id]
        stopping = self._stopping.pop(job_id, (None, None))
        why = stopping[1] if stopping[0] == run else None
        reason = self._stop_reasons.pop(job_id, None)
        if why is not None and reason:  # why it was stopped, then how it ended
            message = f"{reason} ({result.message})" if result.message else reason
            result = Exit(result.code, result.outcome, message)
        if why == "preempted":
            outcome = "preempted"
        elif result.outcome in ("completed", "refused"):
            outcome = result.outcome  # refused: back to pending, retried after a back-off
        else:
            outcome = "failed"
        now = self.clock()
        self.engine.job_ended(job_id, now, outcome, result.message)
        extra.exit_code, extra.message, extra.handle = result.code, result.message, None
        if job.state == JobState.PENDING:
            kind = "requeued"
            self.submissions.count_pending(job, +1)
        else:
            kind = job.state.value
        event = self._event(kind, job, None, result.message)
        self.store.apply([(job_id, self._fields(job))], [], [(job_id, run, now)], [event])
        if job.state.finished:
            self._forget(job)
        self.run_pass()

    # -- launching and stopping --------------------------------------------------------------
    def _launch(self, job: Job, placement, now: float) -> None:
        extra = self.extras[job.id]
        signame = self.engine.settings.preemption_signal
        spec = launch_spec(job, placement, extra, self.cluster, signame, self.log_dir)
        try:
            extra.handle = self.launcher.start(spec)
        except Exception as exc:  # any backend failure ends this job, not the whole pass
            if not isinstance(exc, (LaunchError, OSError)):
                log.exception("launching job %s failed", job.id)
            log.warning("job %s could not be launched: %s", job.id, exc)
            if isinstance(exc, LaunchError) and exc.requeue:  # refused the placement
                result = Exit(None, "refused", str(exc))
            else:
                result = Exit(None, "failed", f"launch failed: {exc}")
            self.process_exited(job.id, job.runs, result)
            return
        try:
            self.store.update_job(job.id, {"handle": extra.handle})
        except Exception:  # it runs; the database will learn its handle at the next write
            log.exception("could not store the handle of job %s", job.id)

    async def _stop(self, job_id: str, run: int, handle, signame: str, grace: float) -> None:
        job = self.engine.jobs.get(job_id)
        if handle is None and job is not None and job.kind == "notebook":
            why = self._stopping.get(job_id, (None, "cancelled"))[1]
            await self.server_stops.stop(job, run, why, grace)
            return
        if handle is None:  # never launched
            await asyncio.sleep(grace)
            result = Exit(None, "killed", f"stopped ({signame}, grace {grace:g} s)")
        else:
            result = await self.launcher.stop(handle, signame, grace)
        self.process_exited(job_id, run, result)

    def _spawn(self, coroutine) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain_tasks(self) -> None:
        """Wait for signals and kills in flight (used at shutdown and in tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # -- helpers -----------------------------------------------------------------------------
    def _fields(self, job: Job) -> dict:
        return state_fields(job, self.extras.get(job.id) or Extra(0))

    def _forget(self, job: Job) -> None:
        self.extras.pop(job.id, None)
        self._stopping.pop(job.id, None)
        self._stop_reasons.pop(job.id, None)
        self.server_stops.forget(job.id)
        self.engine.forget(job.id)

    def _event(self, kind: str, job: Job | None, actor: str | None, message: str) -> dict:
        return {
            "time": self.clock(),
            "kind": kind,
            "job_id": job.id if job else None,
            "user": job.user if job else None,
            "actor": actor,
            "node": None,
            "message": message,
            "data": None,
        }

    def log_path(self, row: dict) -> str:
        """Where the launcher writes a job's output (see :class:`.launcher.LaunchSpec`)."""
        return os.path.join(self.log_dir, row["user"] or "_", f"{row['id']}.log")

    def row(self, job_id: str) -> dict | None:
        """The job as the database would have it, from memory when it is unfinished."""
        job = self.engine.jobs.get(job_id)
        extra = self.extras.get(job_id)
        if job is None or extra is None:
            return self.store.get_job(job_id)
        return row_for(job, extra)
