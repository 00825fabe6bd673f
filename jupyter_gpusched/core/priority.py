"""The priority key of each pending job (smaller first) under the policy's order, and the
fair-share factors it uses. A key is time-invariant (see :mod:`.ordering`), so it is cached
until the factors are recomputed, at most every ``fair_share.recalc_interval``.

A collaborator of the :class:`~.scheduler.Scheduler`: given the jobs, the queue tree, the
settings and the policy; the Scheduler refreshes it before a pass, forgets a job's key when its
priority changes, and asks for a recomputation when the quotas change.
"""

from __future__ import annotations

import math

from .copying import copy_parts
from .fairshare import fair_share_factors
from .jobs import Job
from .policies import SLURM_WEIGHTS, Policy
from .quotas import QueueTree
from .settings import PolicySettings


class PriorityKeys:
    def __init__(
        self, jobs: dict[str, Job], tree: QueueTree, settings: PolicySettings, policy: Policy
    ):
        self.jobs, self.tree, self.settings, self.policy = jobs, tree, settings, policy
        self.factors: dict[str, float] = {}  # queue path -> fair-share factor
        self.computed_at = -math.inf  # when the factors (and the cached keys) were computed
        self._keys: dict[str, tuple] = {}
        # urgent jobs (core/deadlines.py) -> their latest start: ahead of their tier's others
        self.urgent: dict[str, float] = {}

    def __deepcopy__(self, memo):  # (core/copying.py: factors are numbers, keys tuples)
        return copy_parts(self, memo, flat=("factors", "_keys", "urgent"))

    def refresh(self, now: float, half_life: float) -> bool:
        """Recompute the factors if they are due; True when they were (the keys changed)."""
        if now - self.computed_at < self.settings.fair_share_recalc_interval:
            return False
        self.factors = fair_share_factors(self.tree, now, half_life)
        self.computed_at = now
        self._keys.clear()
        return True

    def recompute_soon(self) -> None:
        """The quotas changed: new factors (and keys) at the next refresh."""
        self.computed_at = -math.inf

    def forget(self, job_id: str) -> None:
        """The job's priority changed, or it is gone."""
        self._keys.pop(job_id, None)

    def make_urgent(self, job_id: str, latest_start: float) -> None:
        """The job's deadline is near (core/deadlines.py): under the ``priority`` order it goes
        ahead of its tier's jobs that are not urgent, least slack (``latest_start``) first. The
        caller refreshes the pending queue's heads."""
        self.urgent[job_id] = latest_start
        self._keys.pop(job_id, None)

    def finished(self, job_id: str) -> None:
        """The job has finished: nothing of it is kept."""
        self._keys.pop(job_id, None)
        self.urgent.pop(job_id, None)

    def key(self, job_id: str) -> tuple:
        key = self._keys.get(job_id)
        if key is None:
            key = self._keys[job_id] = self._compute(self.jobs[job_id])
        return key

    def _compute(self, job: Job) -> tuple:
        order = self.policy.order
        if order == "arrival":
            return (-job.priority, job.submit_time, job.id)
        if order == "tier":
            return (job.tier, -job.priority, job.submit_time, job.id)
        s, t = self.settings, self.computed_at
        fair = self.factors.get(job.queue, 1.0)
        age = 0.0
        if t > -math.inf:  # time-invariant form of age / max_age (see .ordering)
            age = (min(t - job.submit_time, s.max_age) - t) / s.max_age
        if order == "multifactor":
            w = SLURM_WEIGHTS
            score = w["qos"] * (3 - job.tier) / 2 + w["fairshare"] * fair + w["age"] * age
            return (-job.priority, -score, job.submit_time, job.id)
        latest = self.urgent.get(job.id)
        if latest is not None:  # urgent: first in its tier (after an admin's override)
            return (job.tier, -job.priority, 0, latest, 0.0, job.id)
        score = s.fair_share_weight * fair + s.age_weight * age
        return (job.tier, -job.priority, 1, -score, job.submit_time, job.id)
