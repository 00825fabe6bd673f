"""What is refused at the door, before a job enters the queue: the rules the live service
(``service/live.py``, as an HTTP error) and the replay (``sim/replay.py``, as a rejected job in its
metrics) both apply, so that a replay refuses what the service would.

Checked in this order, the first that applies wins:

1. a GPU model the cluster does not have (``gpu_model``): the job could never run here;
2. the user's ``pending_jobs`` limit (the queue file's ``user_limits``): too many jobs waiting.

The engine's own rejection (:func:`.admission.rejection`, when the job is submitted) checks the
rest of what makes a job impossible; its first rule is :func:`unknown_gpu_model`, checked here
before the pending limit so that a request that can never run is told so whatever the user's
queue holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .cluster import Cluster
from .jobs import Job
from .quotas import QueueTree


@dataclass(frozen=True)
class Refusal:
    """Why a submission is refused: ``message`` for the user, ``field`` the request field that
    says so (None: no one field), ``limit`` True when it is a limit reached (the service answers
    429) rather than a job that can never run (400)."""

    message: str
    field: str | None
    limit: bool = False


def unknown_gpu_model(job: Job, cluster: Cluster) -> tuple[str, str] | None:
    """``(message, "gpu_model")`` when ``job`` asks only for GPU models this cluster lacks."""
    if job.gpu_models is not None and not job.gpu_models & set(cluster.gpu_models):
        known = ", ".join(cluster.gpu_models)
        wanted = "|".join(sorted(job.gpu_models))
        return f"no GPU of model {wanted} in this cluster (it has {known})", "gpu_model"
    return None


def check_submission(
    job: Job, cluster: Cluster, tree: QueueTree, pending: Callable[[str], int], count: int = 1
) -> Refusal | None:
    """Why ``job`` is refused before it is queued, or None. ``pending(user)``: how many of the
    user's jobs wait now (held ones included); asked only when the user has a pending limit.
    ``count``: how many such jobs come in together (a job array's elements: all or none)."""
    model = unknown_gpu_model(job, cluster)
    if model is not None:
        return Refusal(*model)
    limit = tree.user_limit(job.user)
    if limit is not None and limit.pending_jobs is not None:
        waiting = pending(job.user)
        if waiting + count > limit.pending_jobs:
            more = f" and asks for {count} more" if count > 1 else ""
            return Refusal(
                f"{job.user} already has {waiting} pending jobs{more}; the limit is "
                f"{limit.pending_jobs}",
                None,
                limit=True,
            )
    return None
