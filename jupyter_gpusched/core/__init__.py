"""The scheduling engine: pure Python, no I/O, no wall clock, deterministic.

Start at :class:`~jupyter_gpusched.core.scheduler.Scheduler`; the steps of a pass live in
:mod:`.admission`, :mod:`.placement`, :mod:`.preemption` and :mod:`.reservation`.
"""

from .cluster import Cluster, Node
from .decisions import Preempt, Start, Stop
from .errors import ConfigError
from .jobs import Job, JobState, Reason
from .policies import POLICIES, Policy, get_policy
from .quotas import Queue, QueueTree
from .scheduler import Scheduler
from .settings import PolicySettings

__all__ = [
    "POLICIES",
    "Cluster",
    "ConfigError",
    "Job",
    "JobState",
    "Node",
    "Policy",
    "PolicySettings",
    "Preempt",
    "Queue",
    "QueueTree",
    "Reason",
    "Scheduler",
    "Start",
    "Stop",
    "get_policy",
]
