"""Jobs: what a user asked for, and where the engine has got with it."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property, partial

from .jobspec import JOB_ATTRIBUTES, KINDS, TIERS, JobSpec
from .reasons import Reason  # defined with its catalogue; imported from here too

__all__ = ["KINDS", "TIERS", "Job", "JobState", "Reason"]


class JobState(str, Enum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"  # a notebook pre-empted for good; batch victims go back to PENDING
    REJECTED = "rejected"  # can never run on this cluster under these quotas

    @property
    def finished(self) -> bool:
        return self in _FINISHED


_FINISHED = {
    JobState.COMPLETED,
    JobState.FAILED,
    JobState.CANCELLED,
    JobState.PREEMPTED,
    JobState.REJECTED,
}


@dataclass(eq=False)
class Job:
    """A request for GPUs. The first block is the request; the rest is engine bookkeeping.

    ``gpus`` is the total; ``gpus_per_node`` fixes the gang shape (without it a multi-GPU job
    uses the fewest nodes that fit); ``gpu_models`` lists acceptable models (None = any);
    ``gpu_fraction`` below 1 asks for a share of one GPU (fractions on a GPU sum to at most 1,
    and a whole-GPU job never lands on a shared GPU); ``labels`` must all match node labels;
    ``cpus`` and ``memory_gb`` are per job, spread over its nodes; ``walltime`` is the user's
    estimate in seconds (None = the policy default); ``deadline`` is when it must have
    finished (None = no deadline; :mod:`.deadlines`). The request block is the one of
    :class:`~.jobspec.JobSpec` (``tests/test_jobspec.py`` checks that they agree).
    """

    id: str
    gpus: int
    submit_time: float
    tier: int = 2
    queue: str = ""
    user: str = ""
    kind: str = "batch"
    gpus_per_node: int | None = None
    gpu_models: frozenset[str] | None = None
    labels: dict[str, str] = field(default_factory=dict)
    cpus: float | None = None
    memory_gb: float | None = None
    walltime: float | None = None
    deadline: float | None = None  # it must have finished by then (the engine's clock)
    gpu_fraction: float = 1.0  # below 1: a share of one GPU (then gpus is 1)
    priority: int = 0  # an admin's override: higher goes first within the job's tier
    held: bool = False  # held by an admin: pending, but not considered until released
    array_id: str | None = None  # a job of an array (core/arrays.py): the array
    array_index: int | None = None  # its index in the array
    array_max_running: int | None = None  # the array's %max_running (None: no cap)

    state: JobState = JobState.PENDING
    reason: Reason | None = None
    pending_since: float | None = None  # submitted, or requeued after its last run
    start_time: float | None = None  # start of the current (or last) run
    first_start: float | None = None
    end_time: float | None = None
    runs: int = 0
    preemptions: int = 0
    preempted_by: str | None = None  # while a pre-emption signal is pending
    preemptors: tuple[str, ...] = ()  # the jobs that ever pre-empted it: it never takes theirs
    one_leaf_since: float | None = None  # first seen placeable only across leaf switches
    leaf_reserved_until: float | None = None  # its reservation inside one leaf starts then
    retry_at: float | None = None  # the launcher refused its placement: retried from then
    refusals: int = 0  # refused launches in a row
    first_reason: Reason | None = None
    reject_reason: str | None = None
    reject_field: str | None = None  # the request field the rejection is about
    deadline_missed: bool = False  # it was still unfinished at its deadline (core/deadlines.py)
    # what matches it with similar earlier runs (its name, notebook or command; None: unknown),
    # and the run time the engine plans it with, frozen at submission: its walltime, the
    # default, or a learned estimate (``estimated_from`` says which runs taught it: "user", its
    # user's; "queue", its queue's, anyone's; None: no estimate; core/runtime_estimates.py)
    run_name: str | None = None
    planned_run_time: float | None = None
    estimated_from: str | None = None
    # GPUs this job counts for against quotas and in usage: a fraction counts as itself (set
    # once: a pass reads it for every job it looks at, and a request never changes)
    amount: float = field(init=False, repr=False, compare=False, default=0.0)

    def __post_init__(self) -> None:
        self.amount = self.gpus * self.gpu_fraction

    @classmethod
    def from_spec(cls, spec: JobSpec, id: str, submit_time: float) -> Job:
        """The engine's job for what ``spec`` asks (its queue, tier and user filled in)."""
        return cls(
            id=id, submit_time=submit_time, **{name: getattr(spec, name) for name in JOB_ATTRIBUTES}
        )

    @cached_property
    def request_shape(self) -> tuple:
        """What decides where the job can go, apart from its size (:mod:`.shapes`)."""
        labels = tuple(sorted(self.labels.items()))
        return (
            self.gpu_fraction,
            self.gpus_per_node,
            self.gpu_models,
            labels,
            self.cpus,
            self.memory_gb,
        )

    @property
    def fractional(self) -> bool:
        return self.gpu_fraction < 1.0

    @property
    def estimated(self) -> bool:
        """Its planned run time is a learned estimate (not a walltime or the default)."""
        return self.estimated_from is not None


def set_reason(tally: dict[str, float], job: Job, reason: Reason | None) -> None:
    """Give pending ``job`` the ``reason`` it waits (None: none), keeping ``tally`` (the GPUs
    the pending jobs ask for, by reason family) and the first reason it ever waited for."""
    if reason is job.reason:
        return  # (a pass gives most jobs the reason they had: reasons are shared, immutable)
    if job.reason is not None:
        tally[job.reason.family] -= job.amount
    job.reason = reason
    if reason is not None:
        tally[reason.family] += job.amount
        if job.first_reason is None and job.runs == 0:
            job.first_reason = reason


def set_reason_by_class(
    tally: dict[str, float],
    by_class: dict[tuple, dict[str, float]],
    job: Job,
    reason: Reason | None,
) -> None:
    """:func:`set_reason`, also keeping ``by_class``: the same tally for each job class
    ``(tier, queue, kind)``. Only a replay that reports per job class asks for it
    (``Scheduler(tally_by_class=True)``); the plain :func:`set_reason` stays as cheap as it is."""
    if reason is job.reason:
        return
    key = (job.tier, job.queue, job.kind)
    counts = by_class.get(key)
    if counts is None:
        counts = by_class[key] = dict.fromkeys(tally, 0)
    if job.reason is not None:
        counts[job.reason.family] -= job.amount
    if reason is not None:
        counts[reason.family] += job.amount
    set_reason(tally, job, reason)


def reason_setter(tally: dict[str, float], by_class: dict[tuple, dict[str, float]] | None = None):
    """The scheduler's step giving a job its reason: :func:`set_reason` keeping ``tally``, or
    with ``by_class`` :func:`set_reason_by_class` keeping both (chosen once, not per call)."""
    if by_class is None:
        return partial(set_reason, tally)
    return partial(set_reason_by_class, tally, by_class)
