"""Scheduling policies: the switches that tell the engine which steps of a pass to run.

``gpusched`` is the full design (its single-node jobs placed by fragmentation gradient descent,
:mod:`.fragmentation`). The others are the baselines a platform lead compares it with, replayed
through the same engine and harness:

- ``fifo``: the default scheduler of the seeds: arrival order, first fit, topology-blind, no
  quotas, no pre-emption and no reservation (so a big job can starve).
- ``priority``: strict tier order (arrival within a tier), first fit, tier pre-emption (tier 3
  gives way to tiers 1 and 2), no quotas, no reservation.
- ``slurm``: what an HPC user would pick instead, configured the way Slurm sites commonly do:
  multifactor priority (``PriorityType=priority/multifactor`` with QOS = tier, fair share and
  age factors: see :data:`SLURM_WEIGHTS`), queue limits (``GrpTRES``) but no guarantees to
  reclaim, EASY backfill on walltime estimates (``sched/backfill``), best fit over the switch
  tree (``topology/tree``: the fewest switches free now; a job does not wait for fewer, as
  with ``--switches`` unset), and ``PreemptType=preempt/qos`` pre-emption of tier 3
  (``PreemptMode=REQUEUE``). It uses the policy file's grace periods, minimum run times,
  fair-share half-life and backfill settings like every other policy, but deep passes every
  ``backfill.interval`` whatever the jobs' run times (Slurm's ``bf_interval`` is fixed), and
  backfills in priority order whatever ``backfill.order`` says.

A new policy is one more entry in :data:`POLICIES`.
"""

from __future__ import annotations

from dataclasses import dataclass

# Slurm's multifactor weights, normalised: priority = qos * Q + fairshare * F + age * A, with
# Q = 1 for tier 1, 0.5 for tier 2, 0 for tier 3; F the Fair Tree factor; A = age / max_age.
# The QOS weight is the largest, as sites usually set it, but a tier-2 job of a team far below
# its fair share can overtake a tier-1 job of a team far above it: tiers are not strict here.
SLURM_WEIGHTS = {"qos": 1.0, "fairshare": 1.0, "age": 0.5}


@dataclass(frozen=True)
class Policy:
    name: str
    # "priority": tier, then fair share + age; "multifactor": Slurm's weighted sum;
    # "tier": tier, then arrival; "arrival": submit time only
    order: str = "priority"
    quotas: bool = True  # queue limits and rejection by queue
    guarantees: bool = True  # tier 1 runs inside its guarantee; borrowed GPUs are reclaimed
    preemption: bool = True  # tier 3 gives way to blocked tier-1 and tier-2 jobs
    backfill: bool = True  # the top blocked job reserves; others start only if they don't delay it
    # deep passes come sooner than backfill.interval while completed jobs are short
    # (core/cadence.py); Slurm's bf_interval is fixed
    cadence_from_run_times: bool = True
    # behind the reservation, a deep pass starts the shortest jobs first (with
    # backfill.order: shortest; core/shortest_first.py); Slurm backfills in priority order
    shortest_first: bool = True
    topology: bool = True  # tightest-domain, best-fit placement (else first fit)
    leaf_patience: bool = True  # a gang waits for one leaf switch (placement.leaf_patience)
    # single-node jobs go where the expected fragmentation grows least (FGD, core.fragmentation)
    fragmentation: bool = False
    # jobs with a deadline (core/deadlines.py): "urgency" (urgent jobs go first in their tier,
    # may reclaim their guarantee; deadlines.on_miss applies), "slurm" (Slurm's --deadline: a
    # pending job is cancelled once it can no longer end in time), "ignore" (misses reported)
    deadlines: str = "ignore"


POLICIES = {
    "gpusched": Policy("gpusched", fragmentation=True, deadlines="urgency"),
    "fifo": Policy(
        "fifo",
        order="arrival",
        quotas=False,
        guarantees=False,
        preemption=False,
        backfill=False,
        topology=False,
    ),
    "priority": Policy(
        "priority",
        order="tier",
        quotas=False,
        guarantees=False,
        preemption=True,
        backfill=False,
        topology=False,
    ),
    "slurm": Policy(
        "slurm",
        order="multifactor",
        quotas=True,
        guarantees=False,
        preemption=True,
        backfill=True,
        topology=True,
        leaf_patience=False,  # Slurm's --switches is unset by default: gangs do not wait
        cadence_from_run_times=False,
        shortest_first=False,
        deadlines="slurm",
    ),
}


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        known = ", ".join(sorted(POLICIES))
        raise ValueError(f"unknown policy {name!r}; known policies: {known}") from None
