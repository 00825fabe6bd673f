"""What a hub admin (and a restarted service) does to the engine: hold and release jobs,
override a job's priority, schedule maintenance, put back the jobs that were running when the
service stopped, forget finished jobs.

:class:`Admin` is the :class:`~.scheduler.Scheduler`'s collaborator for these (its public
methods of the same names call it). It is given what it reads and changes (the jobs, the queue,
the priority keys, the maintenance windows, the cluster state), the :class:`~.agenda.Agenda` it
notes work on, the :class:`~.claims.Preemptions` whose claims a held job gives up, and the
scheduler's bookkeeping steps it calls. Each operation changes engine state and marks what a
pass must look at again; none starts or stops anything itself (the next
:meth:`Scheduler.schedule` does)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from . import reasons
from .admission import validate
from .errors import ConfigError
from .jobs import Job, JobState, Reason
from .state import Placement

if TYPE_CHECKING:
    from .agenda import Agenda
    from .claims import Preemptions
    from .cluster import Cluster
    from .ordering import PendingQueue
    from .policies import Policy
    from .priority import PriorityKeys
    from .quotas import QueueTree
    from .state import ClusterState

HELD = reasons.HELD.reason()


class Admin:
    def __init__(
        self,
        cluster: Cluster,
        state: ClusterState,
        policy: Policy,
        tree: QueueTree,
        jobs: dict[str, Job],
        pending: PendingQueue,
        priorities: PriorityKeys,
        maintenance: dict[int, float],
        agenda: Agenda,
        preemptions: Preemptions,
        *,
        set_reason: Callable[[Job, Reason | None], None],
        walltime: Callable[[Job], float],
    ):
        self.cluster, self.state, self.policy, self.tree = cluster, state, policy, tree
        self.jobs, self.pending, self.priorities = jobs, pending, priorities
        self.maintenance = maintenance  # node index -> when it is drained
        self.agenda, self.preemptions = agenda, preemptions
        # the scheduler's bookkeeping steps
        self._set_reason, self._walltime = set_reason, walltime

    def hold(self, job_id: str, now: float) -> Job:
        """Keep a pending job out of scheduling until :meth:`release`. Its place in the queue
        (submit time) is kept."""
        job = self._pending_job(job_id, "held")
        if job.held:
            return job
        self.preemptions.drop(job)
        self.pending.remove(job, self._walltime(job))
        job.held = True
        self._set_reason(job, HELD)
        self.agenda.freed = True  # it may have held the reservation
        return job

    def release(self, job_id: str, now: float) -> Job:
        job = self._pending_job(job_id, "released")
        if not job.held:
            return job
        job.held = False
        job.retry_at = None  # a back-off after a refused launch ends too
        self._set_reason(job, None)
        self.pending.add(job, self._walltime(job))
        self.agenda.new.append(job.id)
        return job

    def set_priority(self, job_id: str, priority: int, now: float) -> Job:
        """Override a job's rank within its tier (higher first; 0 is the default)."""
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ConfigError(f"must be a whole number, got {priority!r}", field="priority")
        job = self.jobs.get(job_id)
        if job is None:
            raise KeyError(job_id)
        if job.state != JobState.PENDING or job.held or job.retry_at is not None:
            job.priority = priority  # takes effect if it is requeued or released
            self.priorities.forget(job_id)
            return job
        self.preemptions.drop(job)
        self.pending.remove(job, self._walltime(job))
        job.priority = priority
        self.priorities.forget(job_id)
        self.pending.add(job, self._walltime(job))
        self._set_reason(job, None)
        self.agenda.new.append(job_id)
        self.agenda.freed = True  # the order changed: the reservation may belong to someone else
        return job

    def set_maintenance(self, node_name: str, start: float | None, now: float) -> None:
        """Drain ``node_name`` at ``start`` (None cancels the window). Until then no job whose
        walltime runs past ``start`` is placed there; from then on the node is drained."""
        node = self.cluster.node(node_name)
        if start is None:
            self.maintenance.pop(node.index, None)
        else:
            self.maintenance[node.index] = float(start)
            self.agenda.wake_at(float(start))
        self.agenda.freed = True

    def maintenance_due(self, now: float) -> list[str]:
        """The nodes whose maintenance has begun (their windows end here): the scheduler
        drains them."""
        due = []
        for index, start in sorted(self.maintenance.items()):
            if start <= now:
                del self.maintenance[index]
                due.append(self.cluster.nodes[index].name)
        return due

    def maintenance_excluded(self, job: Job, now: float) -> frozenset:
        """Nodes whose maintenance begins before ``job`` would end if it started now."""
        if not self.maintenance:
            return frozenset()
        end = now + (job.walltime or self._walltime(job))  # a walltime is a limit: kept to
        return frozenset(i for i, start in self.maintenance.items() if end > start)

    def restore(self, job: Job, placement: Placement, now: float) -> Job:
        """Put back a job that was running when the adapter stopped, on the resources it holds
        (its ``start_time``, ``runs`` and ``first_start`` are kept). Raises ValueError if those
        resources are taken or unknown. Call before any submission. The scheduler then starts
        it where it runs, emitting no Start."""
        validate(job)
        if job.id in self.jobs:
            raise ConfigError(f"a job with id {job.id!r} already exists", field="id")
        if job.start_time is None:
            raise ValueError(f"job {job.id} has no start time")
        if self.policy.quotas:
            queue = self.tree.get(job.queue)
            if queue is None:
                raise ValueError(f"job {job.id}: queue {job.queue!r} no longer exists")
            job.queue = queue.path
        conflict = self.state.conflict(placement)
        if conflict is not None:
            raise ValueError(f"job {job.id}: {conflict}")
        self.jobs[job.id] = job
        if self.state.fgd is not None and job.gpus:
            self.state.fgd.workload.observe(job)
        return job

    def _pending_job(self, job_id: str, verb: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise KeyError(job_id)
        if job.state != JobState.PENDING:
            raise ConfigError(f"only a pending job can be {verb}; {job_id} is {job.state.value}")
        return job

    def forget(self, job_id: str) -> None:
        """Drop a finished job from memory (a long-running service keeps finished jobs in its
        database, not in the engine)."""
        job = self.jobs.get(job_id)
        if job is not None and job.state.finished:
            del self.jobs[job_id]
            self.priorities.forget(job_id)

    def position(self, job_id: str) -> int | None:
        """How many pending jobs are ahead of ``job_id`` (None if it is not waiting in line)."""
        job = self.jobs.get(job_id)
        if job is None or job.state != JobState.PENDING or job.held or job.retry_at is not None:
            return None
        return self.pending.ahead_of(self.priorities.key(job_id))
