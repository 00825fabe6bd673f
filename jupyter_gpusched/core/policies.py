"""Scheduling policies: the switches that tell the engine which steps of a pass to run.

``gpusched`` is the full design (tiers, fair share, quotas, pre-emption, reservation + backfill,
topology). ``fifo`` is the default-scheduler baseline of the seeds: arrival order, first fit,
topology-blind, no quotas, no pre-emption and no reservation (so a big job can starve).
A new policy is one more entry in :data:`POLICIES`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Policy:
    name: str
    order: str = "priority"  # "priority": tier, then fair share + age; "arrival": submit time
    quotas: bool = True  # limits, tier-1 guarantees (admission) and per-queue rejection
    preemption: bool = True  # reclaim of borrowed capacity and pre-emption of tier 3
    backfill: bool = True  # the top blocked job reserves; others start only if they don't delay it
    topology: bool = True  # tightest-domain, best-fit placement (else first fit)


POLICIES = {
    "gpusched": Policy("gpusched"),
    "fifo": Policy(
        "fifo", order="arrival", quotas=False, preemption=False, backfill=False, topology=False
    ),
}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        known = ", ".join(sorted(POLICIES))
        raise ValueError(f"unknown policy {name!r}; known policies: {known}") from None
