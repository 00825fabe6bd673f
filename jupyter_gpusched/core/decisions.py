"""The decisions a scheduling pass hands to the adapter (the service, the replay)."""

from __future__ import annotations

from dataclasses import dataclass

from .state import Placement


@dataclass(frozen=True)
class Start:
    job_id: str
    placement: Placement


@dataclass(frozen=True)
class Preempt:
    job_id: str
    by: str  # the job the GPUs go to
    signal: str
    grace: float


@dataclass(frozen=True)
class Stop:
    """Stop the job's processes (signal, grace, kill). ``ended``: the engine has already ended
    the job (its node went down) and expects no ``job_ended`` for this run; otherwise (a
    cancel) the adapter reports ``job_ended`` once the processes are gone."""

    job_id: str
    reason: str
    ended: bool = False


@dataclass(frozen=True)
class DeadlineMissed:
    """``job_id`` was still unfinished at its ``deadline`` (or, under the ``slurm`` policy, could
    no longer finish by then). ``action``: ``kept`` (it goes on: the policy's
    ``deadlines.on_miss: keep``) or ``cancelled`` (the engine has cancelled it if it was pending,
    and a :class:`Stop` follows if it was running)."""

    job_id: str
    deadline: float
    action: str
