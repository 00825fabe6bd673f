"""Within one pass, a shape that did not fit is not tried again for a larger job.

A GPU job's *shape* is what decides where it can go, apart from its size: whether it fits one
node, its share of a GPU, GPUs per node, models, labels, CPUs and memory, whether it must keep
off some nodes (the reserved ones, or nodes going into maintenance before it would end), and
whether it waits for one leaf switch. Starts only take GPUs, so a job of a shape that did not
fit does not fit later in the same pass, nor does a larger one: it gets the reason the smaller
one got. The pass forgets the shapes when the reserved nodes change.
"""

from __future__ import annotations

import math

from .jobs import Job, Reason
from .placement import shape_reason


class ShapeCache:
    def __init__(self):
        self.smallest: dict[tuple, float] = {}  # shape -> smallest size that did not fit
        self.reasons: dict[tuple, Reason] = {}
        self.version = 0  # changes whenever what it holds does

    @staticmethod
    def shape(sched, job: Job, exclude: frozenset, patient: bool, maintenance: frozenset) -> tuple:
        return (
            job.gpus <= sched.cluster.max_node_gpus,
            job.request_shape,
            bool(exclude),
            patient,
            maintenance,
        )

    def reason_for(self, sched, job: Job, shape: tuple, exclude: frozenset, free: float):
        """The reason a job of this shape and no larger size got in this pass, or None. One that
        waited on the reservation waits on its shape once the reserved nodes have nothing free."""
        if job.amount < self.smallest.get(shape, math.inf):
            return None
        reason = self.reasons[shape]
        if reason.detail == "reservation" and not any(sched.state.free[n] for n in exclude):
            return shape_reason(sched.cluster, job, free)  # the reserved GPUs were taken since
        return reason

    def remember(self, shape: tuple, size: float, reason: Reason) -> None:
        self.smallest[shape], self.reasons[shape] = size, reason
        self.version += 1

    def clear(self) -> None:
        self.smallest.clear()
        self.reasons.clear()
        self.version += 1
