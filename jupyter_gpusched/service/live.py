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
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, replace

from ..backends.accounts import AccountRefused
from ..backends.local.launcher import Exit, LaunchError, LaunchSpec
from ..core.decisions import Preempt, Start, Stop
from ..core.errors import ConfigError
from ..core.jobs import Job, JobState
from ..core.scheduler import Scheduler
from ..core.submission import check_submission
from ..core.wording import gpus_text
from .records import Extra, allocation_rows, job_id_for, row_for, state_fields
from .requests import JobRequest, RequestError
from .server_stops import ServerStops

log = logging.getLogger("jupyter_gpusched.service")


@dataclass(frozen=True)
class Identity:
    """Who is calling: a hub user (or service), their groups, and whether they administer the
    scheduler."""

    name: str
    admin: bool = False
    groups: frozenset[str] = frozenset()


class LiveScheduler:
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
        self.extras: dict[str, Extra] = {}  # unfinished jobs only
        self._number = store.next_number()
        self._pending_by_user: dict[str, int] = {}
        self._stopping: dict[str, tuple[int, str]] = {}  # job -> (run, why) while signalled
        self._cancel_reasons: dict[str, str] = {}  # running batch job -> its cancel's reason
        self._tasks: set[asyncio.Task] = set()
        self._in_pass = self._again = False  # see run_pass
        self.decisions = 0
        self.quota_document: dict | None = None  # the queue file as loaded, or the last edit
        self.hub = None  # a HubClient when the hub runs this service (see hubclient.py)
        self._unsaved: list[tuple[Job, dict]] = []  # submissions not yet committed
        self._saved: asyncio.Future | None = None  # resolved when they are
        self._batch_of: dict[str, asyncio.Future] = {}  # job -> its batch, until awaited
        self.server_stop_wait = 30.0  # after asking the hub to stop a server (server_stops.py)
        self.server_stops = ServerStops(self)  # notebook servers: ended once they are gone
        self.reaper = None  # the idle reaper (service/reaper.py), ticked by poll()
        self.rogue_watch = None  # checks for rogue GPU processes (service/rogue.py), by poll()
        self.hub_activity = None  # the hub's last_activity of servers (hub_activity.py), by poll()
        self.node_sync = None  # Slurm's node states into the engine (backends/slurm/inventory.py)

    # -- what users and admins do ------------------------------------------------------------
    def submit(self, who: Identity, request: JobRequest) -> Job:
        self._check_account(who, request)
        tree = self.engine.tree
        allowed = tree.queues_for(who.name, who.groups)
        queue_path = request.queue
        if queue_path is None:  # the user's team queue (core/quotas.py: default_for)
            default = tree.default_for(who.name, who.groups)
            if default is None:
                raise RequestError(f"{who.name} belongs to no queue", "queue", status=403)
            queue_path = default.path
        queue = tree.get(queue_path)
        if queue is None:
            known = ", ".join(q.path for q in allowed) or "none"
            raise RequestError(f"no queue {queue_path!r}; yours: {known}", "queue")
        if queue not in allowed and not who.admin:
            raise RequestError(f"{who.name} may not submit to queue {queue.path}", "queue", 403)
        now = self.clock()
        job_id = job_id_for(self._number)
        filled = replace(
            request, queue=queue.path, tier=request.tier or self.default_tier, user=who.name
        )
        job = Job.from_spec(filled, job_id, now)
        refusal = check_submission(job, self.cluster, tree, self._pending_of)
        if refusal is not None:  # core/submission.py: a model the cluster lacks, a pending limit
            raise RequestError(refusal.message, refusal.field, 429 if refusal.limit else 400)
        try:
            self.engine.submit(job, now)
        except ConfigError as exc:
            raise RequestError(exc.message, exc.field) from None
        if job.state == JobState.REJECTED:  # it could never run here: a 400, nothing stored
            # Counted, not audited: a refused request stores nothing (a user sending bad
            # requests in a loop must not grow the database).
            self.engine.forget(job.id)
            if self.metrics is not None:
                self.metrics.refused(job.reject_field)
            raise RequestError(
                f"this job can never run here: {job.reject_reason}",
                job.reject_field,
            )
        self._number += 1
        extra = Extra.from_spec(self._number - 1, request)
        message = f"{gpus_text(job.gpus)}, tier {job.tier}"
        event = self._event("submitted", job, who.name, message)
        self.extras[job.id] = extra
        self._count_pending(job, +1)
        self._unsaved.append((job, event))
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside the service's loop (tests, tools): save now
            self._save_submissions()
        else:
            if self._saved is None:
                self._saved = loop.create_future()
                loop.call_soon(self._save_submissions)
            self._batch_of[job.id] = self._saved
        self.run_pass()
        return job

    def _check_account(self, who: Identity, request: JobRequest) -> None:
        """The account ``who``'s work would run as may be used (a 403 if not: AccountPolicy),
        and a batch job's working directory is one that account may enter (a 400)."""
        try:
            account = self.launcher.job_account(who.name)
        except AccountRefused as exc:
            raise RequestError(exc.message, "user", status=403) from None
        if request.kind == "batch" and request.cwd is not None:
            problem = self.launcher.cwd_problem(account, request.cwd)
            if problem is not None:
                raise RequestError(problem, "cwd")

    async def saved(self, job_id: str) -> None:
        """Wait until the submission of ``job_id`` is committed (raises if it was not).
        Submissions that arrive in the same turn of the event loop are written in one
        transaction (a group commit): the 201 goes out only after it, so a job acknowledged
        is never lost, and the commit cost is shared under load."""
        batch = self._batch_of.pop(job_id, None)
        if batch is not None:
            await asyncio.shield(batch)

    def _save_submissions(self) -> None:
        """Commit the pending submissions (before anything else is written about them)."""
        batch, self._unsaved = self._unsaved, []
        future, self._saved = self._saved, None
        if not batch:
            if future is not None and not future.done():
                future.set_result(None)
            return
        try:
            self.store.add_jobs(
                [row_for(job, self.extras[job.id]) for job, _ in batch],
                [event for _, event in batch],
            )
        except Exception as exc:
            log.exception("the database did not take %d submissions", len(batch))
            for job, _ in batch:  # undo: the callers get an error, not a 201
                if job.state == JobState.PENDING:
                    self.engine.cancel(job.id, self.clock())
                    self._count_pending(job, -1)
                    self._forget(job)
            if future is not None and not future.done():
                future.set_exception(exc)
            return
        if future is not None and not future.done():
            future.set_result(None)

    def cancel(
        self, job_id: str, actor: str, server_gone: bool = False, reason: str | None = None
    ) -> Job:
        """``server_gone`` and ``reason``: a notebook server's spawner releasing its job (see
        server_stops.py); ``reason`` is also the message of a pending job's cancel, and leads
        that of a running batch job's (e.g. "the demo stopped": service/exit_stop.py)."""
        self._save_submissions()
        job = self.engine.jobs[job_id]
        if job.kind == "notebook" and job.state == JobState.RUNNING:
            # a notebook server's GPUs are free only once it is gone (server_stops.py)
            self.server_stops.cancel(job, actor, server_gone, reason)
            return job
        was_pending = job.state == JobState.PENDING
        self.engine.cancel(job_id, self.clock())
        if job.state == JobState.RUNNING:  # recorded, so that a restart finishes the cancel
            if reason:
                self._cancel_reasons[job_id] = reason
            message = reason or f"cancelled by {actor}"
            self.store.add_event(self._event("cancelling", job, actor, message))
        if was_pending:
            self._count_pending(job, -1)
            extra = self.extras.get(job_id)
            if reason and extra is not None:  # the job's message too, not only its event's
                extra.message = reason
            event = self._event("cancelled", job, actor, reason or f"cancelled by {actor}")
            self.store.update_job(job.id, self._fields(job), event)
        self.run_pass()
        if was_pending:  # after the pass: a job that was pre-empting is due to be looked at
            self._forget(job)  # again (core/claims.py _drop_claim), and must still be there
        return job

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
        self._save_submissions()
        now = self.clock()
        job = (self.engine.hold if hold else self.engine.release)(job_id, now)
        kind = "held" if hold else "released"
        self.store.update_job(
            job_id, self._fields(job), self._event(kind, job, actor, f"{kind} by {actor}")
        )
        self.run_pass()
        return job

    def set_priority(self, job_id: str, priority: int, actor: str) -> Job:
        self._save_submissions()
        job = self.engine.set_priority(job_id, priority, self.clock())
        message = f"priority set to {priority} by {actor}"
        self.store.update_job(
            job_id, self._fields(job), self._event("priority", job, actor, message)
        )
        self.run_pass()
        return job

    def set_node(self, name: str, node_state: str, actor: str) -> None:
        """``drain`` (no new work; running jobs finish), ``resume`` (back in service) or
        ``down`` (running jobs stop: batch jobs are requeued)."""
        engine_state = {"drain": "drain", "resume": "up", "down": "down"}[node_state]
        self.engine.set_node_state(name, engine_state, self.clock())
        nodes = dict(self.store.get_setting("nodes", {}))
        if engine_state == "up":
            nodes.pop(name, None)
            windows = dict(self.store.get_setting("maintenance", {}))
            if windows.pop(name, None) is not None:  # a window that began (or is due) ends
                self.engine.set_maintenance(name, None, self.clock())
                self.store.set_setting("maintenance", windows, by=actor)
        else:
            nodes[name] = engine_state
        event = self._event(f"node-{node_state}", None, actor, f"{name}: {node_state} by {actor}")
        event["node"] = name
        self.store.set_setting("nodes", nodes, by=actor, event=event)
        self.run_pass()

    def set_maintenance(self, name: str, start: float | None, actor: str) -> None:
        self.engine.set_maintenance(name, start, self.clock())
        windows = dict(self.store.get_setting("maintenance", {}))
        if start is None:
            windows.pop(name, None)
            message = f"{name}: maintenance window cancelled by {actor}"
        else:
            windows[name] = start
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(start))
            message = f"{name}: drained from {when} (set by {actor})"
        event = self._event("maintenance", None, actor, message)
        event["node"] = name
        self.store.set_setting("maintenance", windows, by=actor, event=event)
        self.run_pass()

    def update_quotas(self, tree, document: dict, actor: str) -> None:
        self.engine.update_quotas(tree, self.clock())
        event = self._event("quota-changed", None, actor, f"quotas edited by {actor}")
        self.store.set_setting("quotas", document, by=actor, event=event)
        self.quota_document = document
        self.run_pass()

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
                self._again = False
                self._run_pass_once()
        finally:
            self._in_pass = False

    def _run_pass_once(self) -> None:
        now = self.clock()
        decisions = self.engine.schedule(now)
        if not decisions:
            return
        self._save_submissions()  # rows about these jobs follow
        self.decisions += len(decisions)
        changes, opened, closed, events, launches, stops = [], [], [], [], [], []
        for decision in decisions:
            job = self.engine.jobs[decision.job_id]
            extra = self.extras[job.id]
            if isinstance(decision, Start):
                self._count_pending(job, -1)
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
                        self._count_pending(job, +1)
                    stops.append((job, run, "SIGKILL", 0.0, extra.handle))
                    extra.handle = None
                else:
                    self._stopping[job.id] = (job.runs, "cancelled")
                    signame = self.engine.settings.preemption_signal
                    stops.append((job, job.runs, signame, self.cancel_grace, extra.handle))
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
        if self.node_sync is not None:  # first: a node's failure requeues, not fails, its jobs
            try:
                self.node_sync.sync()
            except Exception:
                log.exception("reading Slurm's node states failed")
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
        if self.reaper is not None:
            try:
                self.reaper.tick()
            except Exception:
                log.exception("the reaper failed")
        if self.hub_activity is not None:
            self.hub_activity.tick()  # (reads in a task of its own, which logs its failures)
        if self.rogue_watch is not None:
            try:
                self.rogue_watch.tick()
            except Exception:
                log.exception("checking for rogue GPU processes failed")
        self.run_pass()

    def process_exited(self, job_id: str, run: int, result: Exit) -> None:
        """A run's processes are gone: tell the engine, record how it ended, reschedule."""
        job = self.engine.jobs.get(job_id)
        if job is None or job.state != JobState.RUNNING or job.runs != run:
            return  # already accounted for
        self._save_submissions()
        extra = self.extras[job_id]
        stopping = self._stopping.pop(job_id, (None, None))
        why = stopping[1] if stopping[0] == run else None
        reason = self._cancel_reasons.pop(job_id, None)
        if why == "cancelled" and reason:  # why it was cancelled, then how it ended
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
            self._count_pending(job, +1)
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
        first = placement.parts[0]
        gpus = [i for i in range(first.mask.bit_length()) if first.mask >> i & 1]
        nodes = ",".join(self.cluster.nodes[p.node].name for p in placement.parts)
        env = dict(extra.env)
        env.update(
            GPUSCHED_JOB_ID=job.id,
            GPUSCHED_QUEUE=job.queue,
            GPUSCHED_TIER=str(job.tier),
            GPUSCHED_NODES=nodes,
            GPUSCHED_NODE=self.cluster.nodes[first.node].name,  # its GPUs' node (the first)
            GPUSCHED_RUN=str(job.runs),
            GPUSCHED_PREEMPTION_SIGNAL=self.engine.settings.preemption_signal,
        )
        spec = LaunchSpec(
            job_id=job.id,
            user=job.user,
            command=extra.command,
            notebook=extra.notebook,
            gpus=gpus,
            env=env,
            cwd=extra.cwd,
            log_dir=os.path.join(self.log_dir, job.user or "_"),
            nodes=[
                (
                    self.cluster.nodes[p.node].name,
                    [i for i in range(p.mask.bit_length()) if p.mask >> i & 1],
                )
                for p in placement.parts
            ],
        )
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

    def _finish(self, job: Job, event: dict) -> None:
        self.store.update_job(job.id, self._fields(job), event)
        self._forget(job)

    def _forget(self, job: Job) -> None:
        self.extras.pop(job.id, None)
        self._stopping.pop(job.id, None)
        self._cancel_reasons.pop(job.id, None)
        self.server_stops.forget(job.id)
        self.engine.forget(job.id)

    def _count_pending(self, job: Job, sign: int) -> None:
        self._pending_by_user[job.user] = self._pending_by_user.get(job.user, 0) + sign

    def _pending_of(self, user: str) -> int:
        return self._pending_by_user.get(user, 0)

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


def describe(placement, cluster) -> str:
    parts = []
    for part in placement.parts:
        gpus = ",".join(str(i) for i in range(part.mask.bit_length()) if part.mask >> i & 1)
        share = f" ({part.fraction:g} of it)" if part.fraction < 1 else ""
        what = f"GPU {gpus}{share}" if gpus else "no GPU"  # (a CPU-only job)
        parts.append(f"{cluster.nodes[part.node].name} {what}")
    return "; ".join(parts)
