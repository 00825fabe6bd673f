"""How long a gang that fits one leaf switch waits for one (``placement.leaf_patience``).

A gang that one leaf switch can hold is placed inside one leaf, or waits. It waits:
- while it is behind the reservation: there it cannot take the reserved nodes either way, and
  one that spanned leaves there would give up the locality it will reserve at the head;
- at the head, for ``leaf_patience`` from the first pass there that could have placed it across
  leaves (time spent waiting for GPUs at all does not use its patience up);
- and, past its patience, for as long as its reservation lies inside one leaf: the reservation
  (:func:`.reservation.reserve`) chose that leaf because it frees within
  ``placement.leaf_reservation_slack`` of the time the gang would fit across leaves, and giving
  up while the leaf drains would waste the wait.
After that it may span leaves (one spine first, see :mod:`.placement`).
"""

from __future__ import annotations

from .jobs import Job


def fits_one_leaf(policy, cluster, leaf_gpus: float, job: Job) -> bool:
    """A gang that one leaf switch can hold, under a policy that waits for one."""
    return bool(
        policy.topology
        and policy.leaf_patience
        and len(cluster.leaves) > 1
        and cluster.max_node_gpus < job.gpus <= leaf_gpus
    )


def patient_for_one_leaf(
    policy, cluster, settings, leaf_gpus: float, job: Job, now: float, behind: bool = False
) -> bool:
    """True while ``job`` waits for one leaf rather than span leaves (see the module's rules);
    ``behind``: it comes after the reservation in this pass."""
    return fits_one_leaf(policy, cluster, leaf_gpus, job) and (
        behind
        or job.one_leaf_since is None
        or now < job.one_leaf_since + settings.leaf_patience
        or (job.leaf_reserved_until is not None and now < job.leaf_reserved_until)
    )


def hold_one_leaf(cluster, job: Job, reservation, within) -> None:
    """Note on ``job`` until when its new ``reservation`` holds it to one leaf (``within``: as
    given to :func:`.reservation.reserve`, None when the gang does not wait for one leaf)."""
    if within is not None:
        one_leaf = len({cluster.nodes[n].leaf for n in reservation.nodes}) == 1
        job.leaf_reserved_until = reservation.start if one_leaf else None
