"""A user's request becoming a pending job, committed before it is acknowledged.

:class:`Submissions` is the part of :class:`.live.LiveScheduler` that takes a request in: it
resolves the queue (the user's team queue when none is named), checks the account the job
would run as, asks core (``core/submission.py``) whether it may be queued at all and, for a job
with a deadline, whether it can still finish by then (``deadlines.py``), numbers it,
and commits it together with the other submissions of the same turn of the event loop (a group
commit) before the 201 goes out. Apart from live.py because none of it is the pass: it only
adds pending jobs, then asks the live scheduler for one.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from ..backends.accounts import AccountRefused
from ..core.arrays import ArraySpec
from ..core.errors import ConfigError
from ..core.estimate import Estimate, estimate
from ..core.jobs import Job, JobState
from ..core.runtime_estimates import run_name
from ..core.submission import check_submission
from ..core.wording import gpus_text
from .deadlines import earliest_finish_or_refuse
from .identity import Identity
from .records import Extra, array_id_for, job_id_for, row_for
from .requests import JobRequest, RequestError

log = logging.getLogger("jupyter_gpusched.service")


class Submissions:
    """The requests side of ``live`` (a :class:`.live.LiveScheduler`, which makes it)."""

    def __init__(self, live, first_number: int):
        self.live = live
        self.number = first_number  # the next job's (job_id_for)
        self._unsaved: list[tuple[Job, dict]] = []  # submissions not yet committed
        self._saved: asyncio.Future | None = None  # resolved when they are
        self._batch_of: dict[str, asyncio.Future] = {}  # job -> its batch, until awaited
        self._pending_by_user: dict[str, int] = {}  # what core's pending limits count

    def count_pending(self, job: Job, sign: int) -> None:
        """``job`` became pending (+1: submitted, requeued) or stopped being (-1)."""
        self._pending_by_user[job.user] = self._pending_by_user.get(job.user, 0) + sign

    def pending_of(self, user: str) -> int:
        return self._pending_by_user.get(user, 0)

    def submit(self, who: Identity, request: JobRequest) -> Job:
        filled = self._filled(who, request)
        job = self._enter(filled, who, count=1)
        self._commit_soon([job])
        self.live.run_pass()
        return job

    def submit_array(
        self, who: Identity, request: JobRequest, array: ArraySpec
    ) -> tuple[str, list[Job]]:
        """The array's id and its jobs, one per index of ``array`` (core/arrays.py), all
        queued or none: they are committed together (one transaction), and a refusal of any
        element undoes those before it."""
        filled = self._filled(who, request)
        array_id = array_id_for(self.number)
        first_number, jobs = self.number, []
        count = len(array.indices)
        try:
            for i, index in enumerate(array.indices):
                element = replace(
                    filled,
                    array_id=array_id,
                    array_index=index,
                    array_max_running=array.max_running,
                )
                # one deadline for all: the first element's check is theirs (deadlines.py)
                jobs.append(self._enter(element, who, count=count - i, deadline_check=i == 0))
        except RequestError:
            self._undo(jobs)
            self.number = first_number
            raise
        self._commit_soon(jobs)
        self.live.run_pass()
        return array_id, jobs

    def _filled(self, who: Identity, request: JobRequest) -> JobRequest:
        """``request`` with its queue (checked: one ``who`` may use), tier and user."""
        live = self.live
        self._check_account(who, request)
        tree = live.engine.tree
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
        return replace(
            request, queue=queue.path, tier=request.tier or live.default_tier, user=who.name
        )

    def _enter(
        self, filled: JobRequest, who: Identity, count: int, deadline_check: bool = True
    ) -> Job:
        """The pending job ``filled`` asks for, in the engine and waiting to be committed
        (RequestError when refused: nothing kept). ``count``: the jobs of this request still
        to come, this one included (the pending limit counts them all); ``deadline_check``:
        refuse a deadline it cannot meet (before the engine sees it)."""
        live = self.live
        job = self._checked_job(filled, count)
        if deadline_check:
            earliest_finish_or_refuse(live.engine, job)
        try:
            live.engine.submit(job, job.submit_time)
        except ConfigError as exc:
            raise RequestError(exc.message, exc.field) from None
        if job.state == JobState.REJECTED:  # it could never run here: a 400, nothing stored
            # Counted, not audited: a refused request stores nothing (a user sending bad
            # requests in a loop must not grow the database).
            live.engine.forget(job.id)
            if live.metrics is not None:
                live.metrics.refused(job.reject_field)
            raise _never_runs(job)
        self.number += 1
        extra = Extra.from_spec(self.number - 1, filled)
        message = f"{gpus_text(job.gpus)}, tier {job.tier}"
        if job.array_id is not None:
            message += f", element {job.array_index} of array {job.array_id}"
        event = live._event("submitted", job, who.name, message)
        live.extras[job.id] = extra
        self.count_pending(job, +1)
        self._unsaved.append((job, event))
        return job

    def _checked_job(self, filled: JobRequest, count: int) -> Job:
        """The job ``filled`` asks for, numbered as the next submission; a RequestError for
        what core refuses at submission (core/submission.py: a model the cluster lacks, a
        pending limit, counting ``count`` jobs of this request)."""
        live = self.live
        job = Job.from_spec(filled, job_id_for(self.number), live.clock())
        job.run_name = run_name(filled.name, filled.notebook, filled.command)
        refusal = check_submission(job, live.cluster, live.engine.tree, self.pending_of, count)
        if refusal is not None:
            raise RequestError(refusal.message, refusal.field, 429 if refusal.limit else 400)
        return job

    def _undo(self, jobs: list[Job]) -> None:
        """Take back jobs :meth:`_enter` queued that are not committed yet."""
        live, gone = self.live, {job.id for job in jobs}
        self._unsaved = [(job, event) for job, event in self._unsaved if job.id not in gone]
        for job in jobs:
            live.engine.cancel(job.id, live.clock())
            self.count_pending(job, -1)
            live._forget(job)

    def _commit_soon(self, jobs: list[Job]) -> None:
        """Commit ``jobs`` with the other submissions of this turn of the event loop."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside the service's loop (tests, tools): save now
            self.save()
            return
        if self._saved is None:
            self._saved = loop.create_future()
            loop.call_soon(self.save)
        for job in jobs:
            self._batch_of[job.id] = self._saved

    def estimate(self, who: Identity, request: JobRequest) -> tuple[Estimate, float | None]:
        """What ``request`` would meet if submitted now (core/estimate.py), and the earliest
        it could finish if it has a deadline (else None), refused as :meth:`submit` would
        refuse it (a deadline it cannot meet too); nothing is queued, numbered or stored."""
        job = self._checked_job(self._filled(who, request), count=1)
        finish = earliest_finish_or_refuse(self.live.engine, job)
        try:
            answer = estimate(self.live.engine, job, job.submit_time)
        except ConfigError as exc:
            raise RequestError(exc.message, exc.field) from None
        if answer.rejected:
            raise _never_runs(job)
        return answer, finish

    def _check_account(self, who: Identity, request: JobRequest) -> None:
        """The account ``who``'s work would run as may be used (a 403 if not: AccountPolicy),
        and a batch job's working directory is one that account may enter, its notebook one it
        may read (a 400)."""
        launcher = self.live.launcher
        try:
            account = launcher.job_account(who.name)
        except AccountRefused as exc:
            raise RequestError(exc.message, "user", status=403) from None
        if request.kind == "batch" and request.cwd is not None:
            problem = launcher.cwd_problem(account, request.cwd)
            if problem is not None:
                raise RequestError(problem, "cwd")
        if request.kind == "batch" and request.notebook is not None:
            problem = launcher.notebook_problem(account, request.cwd, request.notebook)
            if problem is not None:
                raise RequestError(problem, "notebook")

    async def saved(self, job_id: str) -> None:
        """Wait until the submission of ``job_id`` is committed (raises if it was not).
        Submissions that arrive in the same turn of the event loop are written in one
        transaction (a group commit): the 201 goes out only after it, so a job acknowledged
        is never lost, and the commit cost is shared under load."""
        batch = self._batch_of.pop(job_id, None)
        if batch is not None:
            await asyncio.shield(batch)

    async def saved_all(self, jobs: list[Job]) -> None:
        """:meth:`saved` for each of ``jobs`` (an array's, committed together)."""
        for job in jobs:
            await self.saved(job.id)

    def save(self) -> set[str]:
        """Commit the pending submissions (before anything else is written about them); the
        ids of those the database did not take (none, normally), taken back from the engine:
        the callers get an error, not a 201, and the pass being carried out (live.py), which
        may have started some, must carry out nothing about them."""
        live = self.live
        batch, self._unsaved = self._unsaved, []
        future, self._saved = self._saved, None
        if not batch:
            if future is not None and not future.done():
                future.set_result(None)
            return set()
        try:
            live.store.add_jobs(
                [row_for(job, live.extras[job.id]) for job, _ in batch],
                [event for _, event in batch],
            )
        except Exception as exc:
            log.exception("the database did not take %d submissions", len(batch))
            now = live.clock()
            for job, _ in batch:
                if job.state == JobState.PENDING:
                    live.engine.cancel(job.id, now)
                elif job.state == JobState.RUNNING:  # started by that pass: nothing launched
                    live.engine.job_ended(job.id, now, "failed", "the database refused it")
                self.count_pending(job, -1)
                live._forget(job)
            if future is not None and not future.done():
                future.set_exception(exc)
            return {job.id for job, _ in batch}
        if future is not None and not future.done():
            future.set_result(None)
        return set()


def _never_runs(job: Job) -> RequestError:
    """The 400 for a job the engine rejected: it can never run here."""
    return RequestError(f"this job can never run here: {job.reject_reason}", job.reject_field)
