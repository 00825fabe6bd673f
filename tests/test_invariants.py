"""Property tests of the six engine invariants (DESIGN.md, "Invariants").

Hypothesis builds a small random cluster, an optional random queue tree, random policy settings
and a random sequence of operations (submissions, time passing, jobs ending, cancellations, nodes
going to drain/down/up). A :class:`Harness` drives the engine the way the replay adapter does
(:mod:`jupyter_gpusched.sim.replay`): after every event it calls ``schedule(now)``, carries out
the decisions (a started job runs until its duration is up; a pre-emption victim keeps running
until ``job_ended(victim, now + grace, "preempted")``; a stopped job ends at once; a wake-up is
honoured at ``next_wakeup()``) and checks the invariants after every ``schedule()`` call.

Invariants checked:
1. no GPU held twice (shares of a shared GPU sum to <= 1 and no whole-GPU job is on it);
   ``free_mask`` is the complement of what is held; CPUs/memory within each node;
2. gang: a running job holds exactly ``job.gpus`` GPUs (or its fraction of one), in its shape;
3. for every queue and its ancestors: running GPUs <= limit, and ``running``, ``claimed`` and
   ``tier1_running`` agree with the jobs (tier-1 jobs inside their queue's guarantee);
4. pre-emption rules (tier 1 never a victim, tier 3 never a pre-emptor, tier 2 only reclaimed by a
   tier-1 job or a job under its guarantee and never below the victim queue's guarantee, minimum
   run time respected, no pre-emption in turns);
5. determinism: the same inputs give the same decisions (also across ``PYTHONHASHSEED`` values);
6. every pending job has exactly one current reason, of family capacity|placement|policy.
At the end, ``test_pinned_*`` replay violations the search found, as fixed scenarios.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jupyter_gpusched.core import (
    Cluster,
    Job,
    JobState,
    PolicySettings,
    Preempt,
    QueueTree,
    Reason,
    Scheduler,
    Start,
    Stop,
)
from jupyter_gpusched.core.settings import TierSettings

FAMILIES = ("capacity", "placement", "policy")
EPS = 1e-6
END, KILL, WAKE = 0, 1, 2  # at one instant: ends, then pre-emption kills (as in the replay)

# No profile is registered here: the suite's profile (if any) decides max_examples.
COMMON = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- strategies --------------------------------------------------------------------------------
@st.composite
def clusters(draw, max_nodes: int = 6) -> dict:
    """A cluster file (parsed): 1-6 nodes under 1-3 leaves under 1-2 spines."""
    n_spines = draw(st.integers(1, 2))
    n_leaves = draw(st.integers(1, 3))
    spine_of = [draw(st.integers(0, n_spines - 1)) for _ in range(n_leaves)]
    switches = {f"s{s}": [f"l{i}" for i in range(n_leaves) if spine_of[i] == s] for s in
                range(n_spines)}  # fmt: skip
    nodes = []
    for i in range(draw(st.integers(1, max_nodes))):
        gpus = draw(st.integers(1, 8))
        node = {
            "name": f"n{i}",
            "gpus": gpus,
            "nvlink": draw(st.sampled_from(["all", "none", "pairs"])),
            "leaf": f"l{draw(st.integers(0, n_leaves - 1))}",
        }
        switches_per_node = draw(st.sampled_from([s for s in (1, 2, 4) if gpus % s == 0]))
        if switches_per_node > 1:
            node["pcie_switches"] = switches_per_node
        if draw(st.integers(0, 4)) == 0:
            node["gpu_model"] = "b"  # the rest: the default model
        if draw(st.booleans()):
            node["cpus"] = draw(st.integers(4, 64))
        if draw(st.booleans()):
            node["memory_gb"] = draw(st.integers(16, 512))
        if draw(st.integers(0, 5)) == 0:
            node["state"] = draw(st.sampled_from(["drain", "down"]))
        nodes.append(node)
    return {"nodes": nodes, "switches": switches}


@st.composite
def queue_trees(draw, total: int, contended: bool = False) -> dict | None:
    """None (one root queue), or 1-3 top-level queues, each a leaf or with 1-3 children;
    guarantees fit inside the parent's (and the cluster); limits are >= the guarantee.
    ``contended``: always 2-3 top-level queues that split the cluster, rarely a limit."""
    if not contended and draw(st.integers(0, 3)) == 0:
        return None

    def queue(guaranteed: int) -> dict:
        spec: dict = {"guaranteed": guaranteed}
        if draw(st.integers(0, 4 if contended else 1)) == 1:
            spec["limit"] = guaranteed + draw(st.sampled_from([total, 0, 1, total // 2, total]))
        if draw(st.integers(0, 3)) == 0:  # CPU and memory limits bound GPU and CPU-only jobs
            spec["cpus"] = {"limit": draw(st.sampled_from([8, 24, 64]))}
        if draw(st.integers(0, 5)) == 0:
            spec["memory_gb"] = {"limit": draw(st.sampled_from([64, 400]))}
        return spec

    def share(available: int, even: int) -> int:
        # guarantees biased towards real shares (small integers alone mostly reject jobs)
        options = [even, 0, 1, available] if contended else [0, 1, 2, available // 2, available]
        return min(available, draw(st.sampled_from(options)))

    top: dict = {}
    remaining = total
    n_top = draw(st.integers(2, 3) if contended else st.integers(1, 3))
    for i in range(n_top):
        g = share(remaining, total // n_top)
        remaining -= g
        spec = queue(g)
        n_children = draw(st.integers(0, 3))
        if n_children:
            children, left = {}, g
            for c in range(n_children):
                cg = share(left, g // n_children)
                left -= cg
                children[f"c{c}"] = queue(cg)
            spec["children"] = children
        top[f"q{i}"] = spec
    return {"queues": top}


def leaves_of(queues: dict | None) -> list[str]:
    if queues is None:
        return [""]
    out = []
    for name, spec in queues["queues"].items():
        if "children" in spec:
            out.extend(f"{name}/{child}" for child in spec["children"])
        else:
            out.append(name)
    return out


policy_settings = st.fixed_dictionaries(
    {
        "grace2": st.sampled_from([0.0, 30.0, 300.0]),
        "minrun2": st.sampled_from([0.0, 100.0, 600.0]),
        "grace3": st.sampled_from([0.0, 60.0]),
        "minrun3": st.sampled_from([0.0, 0.0, 120.0]),
        "backfill_depth": st.sampled_from([200, 200, 1, 2]),
        # deep passes sooner while completed jobs are short (core/cadence.py)
        "interval_fraction": st.sampled_from([0.05, 0.0, 0.5]),
        # behind the reservation: shortest first (core/shortest_first.py) or priority order
        "backfill_order": st.sampled_from(["shortest", "priority"]),
        "recalc": st.sampled_from([300.0, 0.0]),
        # learned run-time estimates (core/runtime_estimates.py): after one completed run of a
        # shape, jobs of that shape are planned with it (a job past its estimate ends "now")
        "estimate": st.sampled_from(["missing", "always", "never"]),
        "estimate_min_samples": st.sampled_from([1, 1, 3]),
    }
)


def build_settings(spec: dict) -> PolicySettings:
    return PolicySettings(
        tiers={
            1: TierSettings(0.0, 0.0),
            2: TierSettings(spec["grace2"], spec["minrun2"]),
            3: TierSettings(spec["grace3"], spec["minrun3"]),
        },
        backfill_depth=spec["backfill_depth"],
        backfill_interval_fraction=spec.get("interval_fraction", 0.0),
        backfill_order=spec.get("backfill_order", "priority"),  # (pinned scenarios predate it)
        fair_share_recalc_interval=spec["recalc"],
        estimate=spec.get("estimate", "never"),  # (the pinned scenarios predate estimates)
        estimate_min_samples=spec.get("estimate_min_samples", 3),
        estimate_margin=1.0,  # estimates often too short: overruns in play
    )


@st.composite
def submit_ops(draw, sizes: list[int], n_leaves: int, models: list, cpus: bool, memory: bool,
               contended: bool = False):  # fmt: skip
    """A job; ``sizes`` are the GPU counts of the nodes (shapes mostly fit the cluster)."""
    total = sum(sizes)
    gpus = min(total, draw(st.sampled_from([1, 1, 2, 3, 4, 8, max(1, total // 2), total, 0])))
    shapes = [
        d
        for d in range(1, gpus + 1)
        if gpus % d == 0 and sum(1 for size in sizes if size >= d) >= gpus // d
    ]
    gpn = draw(st.sampled_from([None, None, *shapes]))
    # a share of one GPU (fractions on a GPU sum to at most 1)
    fraction = draw(st.sampled_from([1.0, 1.0, 1.0, 0.5, 0.25, 0.3, 0.75])) if gpus == 1 else 1.0
    if gpus == 0:  # CPU-only: CPUs or memory, no GPU shape or model (core/resources.py)
        gpn = None
    op = {
        "op": "submit",
        "gpus": gpus,
        "gpus_per_node": gpn,
        "tier": draw(st.sampled_from([2, 3, 3, 1]) if contended else st.integers(1, 3)),
        "queue": draw(st.integers(0, n_leaves - 1)),
        "kind": draw(st.sampled_from(["batch", "batch", "notebook"])),
        "walltime": draw(st.none() | st.sampled_from([100.0, 1000.0, 5000.0, 30000.0])),
        # a deadline, seconds after submission: urgency, reclaim and misses in play
        "deadline": draw(st.none() | st.none() | st.sampled_from([300.0, 2000.0, 8000.0, 4e4])),
        "duration": draw(st.sampled_from([50.0, 400.0, 1000.0, 3000.0, 20000.0, 20000.0])),
        "cpus": draw(st.none() | st.integers(1, 48)) if cpus else None,
        "memory_gb": draw(st.none() | st.integers(1, 300)) if memory else None,
        "models": draw(st.sampled_from([None, None, None, *([m] for m in models)])),
        "gpu_fraction": fraction,
        # a job array (core/arrays.py): (elements, max_running), submitted together
        "array": draw(st.sampled_from([None, None, None, None, (3, 1), (4, 2)])),
    }
    if op["kind"] == "notebook":
        op["array"] = None
    if gpus == 0:
        op["models"] = None
        if not (op["cpus"] or op["memory_gb"]):
            op["cpus"] = draw(st.integers(1, 16))
    return op


@st.composite
def scenarios(draw, max_ops: int = 60, mode: str = "mixed") -> dict:
    """Everything one run needs. ``mode``:
    - ``mixed``: up to 6 nodes, any queue tree, every kind of operation;
    - ``contended``: a small cluster split between queues, busy with tier-2 and tier-3 work, where
      pre-emption happens often;
    - ``reclaim``: as contended, but it starts with one queue filling the cluster with tier-2
      work and then a burst of tier-1/tier-2 jobs from the queues (borrowed capacity is reclaimed,
      possibly by several jobs while the first victims are still in their grace period)."""
    small = mode != "mixed"
    cluster = draw(clusters(3 if small else 6))
    sizes = [n["gpus"] for n in cluster["nodes"]]
    total = sum(sizes)
    queues = draw(queue_trees(total, small))
    n_leaves = len(leaves_of(queues))
    n_nodes = len(cluster["nodes"])
    models = sorted({n.get("gpu_model", "gpu") for n in cluster["nodes"]})
    node_cpus = any("cpus" in n for n in cluster["nodes"])
    node_mem = any("memory_gb" in n for n in cluster["nodes"])
    submit = submit_ops(sizes, n_leaves, models, node_cpus, node_mem, small)
    kinds = {
        "advance": st.fixed_dictionaries(
            {
                "op": st.just("advance"),
                "seconds": st.sampled_from([0.0, 30.0, 200.0, 700.0, 5000.0]),
            }
        ),
        "submit": submit,
        "end": st.fixed_dictionaries(
            {"op": st.just("end"), "pick": st.integers(0, 20), "failed": st.booleans()}
        ),
        "cancel": st.fixed_dictionaries({"op": st.just("cancel"), "pick": st.integers(0, 40)}),
        "node": st.fixed_dictionaries(
            {
                "op": st.just("node"),
                "node": st.integers(0, n_nodes - 1),
                "state": st.sampled_from(["up", "up", "drain", "down"]),
            }
        ),
    }
    # weights by repetition; the first kind is what shrinking aims for: a harmless pause
    mix = ["advance", "submit", "submit", "submit", "submit", "advance", "end", "cancel", "node"]
    if small:
        mix = ["advance", "submit", "submit", "submit", "advance", "end", "cancel", "node"]
    op = st.sampled_from(mix).flatmap(kinds.__getitem__)
    ops = []
    if mode == "reclaim":
        borrower = draw(st.integers(0, n_leaves - 1))
        for _ in range(draw(st.integers(1, 6))):
            ops.append({**draw(submit), "queue": borrower, "tier": draw(st.sampled_from([2, 3]))})
        ops.append({"op": "advance", "seconds": draw(st.sampled_from([0.0, 700.0, 2000.0]))})
        if draw(st.booleans()):
            ops.append(draw(kinds["node"]))
        for _ in range(draw(st.integers(1, 5))):
            ops.append({**draw(submit), "tier": draw(st.sampled_from([2, 1]))})
            ops.append({"op": "advance", "seconds": draw(st.sampled_from([0.0, 30.0]))})
    ops.extend(draw(st.lists(op, min_size=0 if ops else 10, max_size=max_ops)))
    return {
        "cluster": cluster,
        "queues": queues,
        "settings": draw(policy_settings),
        "ops": ops,
    }


# -- the harness -------------------------------------------------------------------------------
def _chain_paths(tree: QueueTree, path: str) -> list[str]:
    return [q.path for q in tree.get(path).chain()]


class Harness:
    """Drives one Scheduler like the replay adapter, checking invariants after each pass."""

    def __init__(self, scenario: dict, policy: str, check: bool = True):
        self.scenario = scenario
        self.cluster = Cluster.from_dict(scenario["cluster"])
        queues = scenario["queues"]
        tree = None if queues is None else QueueTree.from_dict(queues, self.cluster.total_gpus)
        self.settings = build_settings(scenario["settings"])
        self.sched = Scheduler(self.cluster, tree, self.settings, policy)
        self.leaves = leaves_of(queues)
        self.check = check
        self.plans: dict[str, float] = {}  # job id -> its planned run time when first seen
        self.now = 0.0
        self.seq = 0
        self.events: list[tuple] = []  # (time, kind, seq, job_id, run)
        self.woken: float | None = None
        self.runs: dict[str, int] = {}
        self.durations: dict[str, float] = {}
        self.started: dict[str, tuple[float, Start]] = {}  # running jobs: (start time, decision)
        self.signalled: dict[str, str] = {}  # victim -> pre-emptor, until the victim leaves
        self.preempted_pairs: set[tuple[str, str]] = set()  # (pre-emptor, victim), ever
        self.log: list = []  # what determinism compares
        self.ids: list[str] = []

    # -- operations ----------------------------------------------------------------------------
    def run(self) -> list:
        self.settle()
        for op in self.scenario["ops"]:
            self.apply(op)
        self.advance(math.inf)  # let everything finish (or stay blocked)
        return self.log

    def apply(self, op: dict) -> None:
        kind = op["op"]
        if kind == "submit":
            count, cap = op.get("array") or (1, None)
            array_id = f"a{len(self.ids)}" if op.get("array") else None
            for index in range(count):
                self._submit(op, array_id, index if array_id else None, cap)
            self.settle()
        elif kind == "advance":
            self.advance(self.now + op["seconds"])
        elif kind == "end":
            running = sorted(self.sched.running)
            if running:
                job_id = running[op["pick"] % len(running)]
                self.sched.job_ended(job_id, self.now, "failed" if op["failed"] else "completed")
                self.settle()
        elif kind == "cancel":
            if self.ids:
                self.sched.cancel(self.ids[op["pick"] % len(self.ids)], self.now)
                self.settle()
        elif kind == "node":
            name = self.cluster.nodes[op["node"]].name
            self.sched.set_node_state(name, op["state"], self.now)
            self.settle()
        else:  # pragma: no cover - the strategy makes only the kinds above
            raise AssertionError(kind)

    def _submit(self, op: dict, array_id, index, cap) -> None:
        job_id = f"j{len(self.ids)}"
        self.ids.append(job_id)
        self.durations[job_id] = op["duration"]
        job = Job(
            id=job_id,
            gpus=op["gpus"],
            submit_time=self.now,
            tier=op["tier"],
            queue=self.leaves[op["queue"] % len(self.leaves)],
            kind=op["kind"],
            gpus_per_node=op["gpus_per_node"],
            gpu_models=None if op["models"] is None else frozenset(op["models"]),
            cpus=op["cpus"],
            memory_gb=op["memory_gb"],
            walltime=op["walltime"],
            deadline=None if op.get("deadline") is None else self.now + op["deadline"],
            gpu_fraction=op.get("gpu_fraction", 1.0),
            array_id=array_id,
            array_index=index,
            array_max_running=cap,
        )
        self.sched.submit(job, self.now)

    def advance(self, until: float) -> None:
        while self.events and self.events[0][0] <= until:
            self.now = self.events[0][0]
            self.settle()
        if until != math.inf:
            self.now = until
            self.settle()

    def settle(self) -> None:
        """Apply the events due now, schedule, carry out the decisions; until nothing is due."""
        while True:
            while self.events and self.events[0][0] <= self.now:
                _, kind, _, job_id, run = heapq.heappop(self.events)
                if kind == WAKE or run != self.runs.get(job_id) or job_id not in self.sched.running:
                    continue  # that run is already over
                outcome = "completed" if kind == END else "preempted"
                self.sched.job_ended(job_id, self.now, outcome)
            self._sync()
            before = self._queue_snapshot()
            decisions = self.sched.schedule(self.now)
            self.log.append((self.now, tuple(decisions), self._pending_summary()))
            if self.check:
                self.check_decisions(decisions, before)
            for decision in decisions:
                self._carry_out(decision)
            self._sync()
            if self.check:
                self.check_state()
            wake = self.sched.next_wakeup()  # a victim passes its minimum run time then
            if wake is not None and wake > self.now and wake != self.woken:
                heapq.heappush(self.events, (wake, WAKE, self.seq, "", 0))
                self.woken, self.seq = wake, self.seq + 1
            if not (self.events and self.events[0][0] <= self.now):
                return

    def _push(self, when: float, kind: int, job_id: str) -> None:
        heapq.heappush(self.events, (when, kind, self.seq, job_id, self.runs[job_id]))
        self.seq += 1

    def _carry_out(self, decision) -> None:
        if isinstance(decision, Start):
            self.runs[decision.job_id] = self.runs.get(decision.job_id, 0) + 1
            self.started[decision.job_id] = (self.now, decision)
            self._push(self.now + self.durations[decision.job_id], END, decision.job_id)
        elif isinstance(decision, Preempt):
            self.signalled[decision.job_id] = decision.by
            self._push(self.now + decision.grace, KILL, decision.job_id)
        elif isinstance(decision, Stop) and decision.job_id in self.sched.running:
            self._push(self.now, END, decision.job_id)

    def _sync(self) -> None:
        """Forget jobs that have stopped running (ended by us or by the engine)."""
        running = self.sched.running
        self.started = {k: v for k, v in self.started.items() if k in running}
        self.signalled = {k: v for k, v in self.signalled.items() if k in running}

    def _queue_snapshot(self) -> dict[str, float]:
        return {p: q.running + q.claimed for p, q in self.sched.tree.by_path.items()}

    def _pending_summary(self) -> tuple:
        return tuple(
            (j.id, j.state.value, None if j.reason is None else (j.reason.family, j.reason.detail))
            for j in self.sched.jobs.values()
        )

    # -- invariants ----------------------------------------------------------------------------
    def check_decisions(self, decisions: list, before: dict[str, float]) -> None:
        """Invariant 4, on the Preempt decisions of one pass (``before``: each queue's running +
        claimed GPUs just before the pass)."""
        sched = self.sched
        policy = sched.policy
        tiers = self.settings.tiers
        tier2_victims: list[Preempt] = []
        for d in decisions:
            if not isinstance(d, Preempt):
                continue
            assert policy.preemption, f"policy {policy.name} pre-empted: {d}"
            victim, by = sched.jobs[d.job_id], sched.jobs[d.by]
            assert victim.id in sched.running, f"{d}: the victim is not running"
            assert by.state == JobState.PENDING, f"{d}: the pre-emptor is {by.state}"
            assert victim.tier != 1, f"{d}: a tier-1 job was pre-empted"
            if by.tier == 3:  # only an urgent deadline, to reclaim its queue's guarantee
                assert by.id in sched.priorities.urgent, f"{d}: a tier-3 job pre-empted"
                assert victim.tier == 2 or victim.deadline is None, (
                    f"{d}: an urgent tier-3 job pre-empted a tier-3 job with a deadline"
                )
                for path in _chain_paths(sched.tree, by.queue)[:-1]:
                    q = sched.tree.get(path)
                    assert before[path] + _amount(by) <= q.guaranteed + EPS, (
                        f"{d}: an urgent tier-3 job pre-empted outside its queue's guarantee"
                    )
            assert not _fractional(victim) and not _fractional(by), (
                f"{d}: fractional jobs neither pre-empt nor are pre-empted"
            )
            assert victim.gpus and by.gpus, f"{d}: a CPU-only job pre-empted or was pre-empted"
            ran = self.now - self.started.get(victim.id, (victim.start_time,))[0]
            minimum = tiers[victim.tier].minimum_run_time
            assert ran >= minimum - EPS, f"{d}: victim ran {ran}s < minimum run time {minimum}s"
            assert (d.job_id, d.by) not in self.preempted_pairs, (
                f"{d}: {d.job_id} pre-empted {d.by} earlier; they pre-empt each other in turns"
            )
            self.preempted_pairs.add((d.by, d.job_id))
            assert math.isclose(d.grace, tiers[victim.tier].grace_period), d
            if victim.tier == 2:
                # only to return borrowed capacity: never for plain priority
                assert policy.quotas and policy.guarantees, (
                    f"{d}: a tier-2 job pre-empted under policy {policy.name}, which has no "
                    "guarantees to reclaim"
                )
                assert victim.queue != by.queue, f"{d}: tier-2 victim in the pre-emptor's queue"
                if by.tier != 1:
                    # before the pass the pre-emptor's queues used at least ``before``; it was
                    # under its guarantee only if that plus its request fits every guarantee
                    # (the implicit root, the whole cluster, excepted)
                    for path in _chain_paths(sched.tree, by.queue)[:-1]:
                        q = sched.tree.get(path)
                        assert before[path] + _amount(by) <= q.guaranteed + EPS, (
                            f"{d}: tier-2 victim, but the pre-emptor's queue {q.label()} was not "
                            f"under its guarantee ({before[path]:g} used + {_amount(by):g} asked "
                            f"> {q.guaranteed:g})"
                        )
                tier2_victims.append(d)
        self._check_guarantee_floor(tier2_victims)

    def _check_guarantee_floor(self, tier2_victims: list[Preempt]) -> None:
        """Pre-empting tier-2 jobs never takes a queue (that is not also the pre-emptor's) below
        its guarantee: once every signalled tier-2 job has left and every claim has started,
        the queue still runs at least its guarantee."""
        sched, tree = self.sched, self.sched.tree
        leaving = [
            sched.jobs[v]
            for v in set(self.signalled) | {d.job_id for d in tier2_victims}
            if sched.jobs[v].tier == 2
        ]
        for d in tier2_victims:
            victim, by = sched.jobs[d.job_id], sched.jobs[d.by]
            by_chain = set(_chain_paths(tree, by.queue))
            for path in _chain_paths(tree, victim.queue):
                if path in by_chain:
                    continue
                q = tree.get(path)
                gone = sum(_amount(j) for j in leaving if path in _chain_paths(tree, j.queue))
                assert q.running + q.claimed - gone >= q.guaranteed - EPS, (
                    f"{d}: queue {q.label()} drops below its guarantee {q.guaranteed:g} "
                    f"(running {q.running:g} + claimed {q.claimed:g} - leaving tier-2 {gone:g})"
                )

    def check_state(self) -> None:
        sched, state, cluster = self.sched, self.sched.state, self.cluster
        jobs = sched.jobs

        # a job's planned run time (walltime, default or learned estimate) is frozen at its
        # submission: the pending queue and the ledger find it by (planned run time, id)
        for job_id, job in jobs.items():
            if job.state.finished:
                continue
            planned = self.plans.setdefault(job_id, job.planned_run_time)
            assert job.planned_run_time == planned, (job_id, planned, job.planned_run_time)
            if job.walltime and job.planned_run_time is not None:
                assert job.planned_run_time <= job.walltime  # a walltime is the limit

        # -- invariant 1: no GPU held twice (fractions of a shared GPU sum to <= 1, and no
        # whole-GPU holder shares it); free_mask is the complement; CPUs/memory within the node
        n = len(cluster.nodes)
        whole = [0] * n
        shares: list[dict[int, float]] = [{} for _ in range(n)]
        cpus = [0.0] * n
        memory = [0.0] * n
        for holder, placement in state.allocations.items():
            owner = holder.split("\0")[0]
            assert holder in sched.running or jobs[owner].state == JobState.PENDING, (
                f"{holder!r} holds GPUs but is {jobs[owner].state.value}"
            )
            for part in placement.parts:
                i, node = part.node, cluster.nodes[part.node]
                # (a claim may hold CPUs/memory alone: an empty mask)
                assert not part.mask & ~node.all_mask, (holder, part)
                # (a CPU-only job holds no GPU either)
                assert part.mask or holder not in sched.running or not jobs[owner].gpus, part
                fraction = getattr(part, "fraction", 1.0)
                if fraction < 1.0:
                    assert part.mask.bit_count() == 1, f"{holder!r}: a share of {part.mask:b}"
                    shares[i][part.mask] = shares[i].get(part.mask, 0.0) + fraction
                else:
                    overlap = whole[i] & part.mask
                    assert not overlap, (
                        f"GPUs {overlap:b} of {node.name} allocated twice (one holder "
                        f"{holder!r}); allocations: {state.allocations}"
                    )
                    whole[i] |= part.mask
                cpus[i] += part.cpus
                memory[i] += part.memory_gb
        for node in cluster.nodes:
            i = node.index
            shared_bits = 0
            for bit, used in shares[i].items():
                shared_bits |= bit
                assert used <= 1.0 + EPS, f"{node.name}: GPU {bit:b} shared {used:g} > 1"
            assert not whole[i] & shared_bits, (
                f"{node.name}: GPUs {whole[i] & shared_bits:b} held whole and shared"
            )
            if hasattr(state, "shared"):
                assert set(state.shared[i]) == set(shares[i]), (node.name, state.shared[i])
                for bit, used in shares[i].items():
                    assert math.isclose(state.shared[i][bit], used, abs_tol=EPS), node.name
            held = whole[i] | shared_bits
            assert state.free_mask[i] == node.all_mask & ~held, (
                f"{node.name}: free_mask {state.free_mask[i]:b} but held {held:b}"
            )
            assert state.free[i] == state.free_mask[i].bit_count(), node.name
            if node.cpus is not None:
                assert cpus[i] <= node.cpus + EPS, f"{node.name}: {cpus[i]} CPUs > {node.cpus}"
                assert math.isclose(state.cpu_free[i], node.cpus - cpus[i], abs_tol=EPS)
            if node.memory_gb is not None:
                assert memory[i] <= node.memory_gb + EPS, (
                    f"{node.name}: {memory[i]} GB > {node.memory_gb}"
                )
                assert math.isclose(state.mem_free[i], node.memory_gb - memory[i], abs_tol=EPS)
        up = [node.index for node in cluster.nodes if state.node_state[node.index] == "up"]
        assert state.free_total == sum(state.free[i] for i in up), "free_total is stale"

        # the ledger's GPUs per node that pre-emption could free, and the part of them held by
        # victims already signalled (which the victim search passes by), as the jobs say
        ledger = sched.ledger
        room = {key: [0.0] * n for key in ("t3", "t23", "l3", "l23")}
        for job in sched.running.values():
            if job.tier == 1:
                continue
            for part in state.allocations[job.id].parts:
                gpus = part.gpus * part.fraction
                kinds = ("t3", "t23") if job.tier == 3 else ("t23",)
                if job.preempted_by is not None:
                    kinds += ("l3", "l23") if job.tier == 3 else ("l23",)
                for kind in kinds:
                    room[kind][part.node] += gpus
        for kind, kept in (
            ("t3", ledger.tier3_on_node),
            ("t23", ledger.tiers23_on_node),
            ("l3", ledger.leaving3_on_node),
            ("l23", ledger.leaving23_on_node),
        ):
            for i in range(n):
                assert math.isclose(kept[i], room[kind][i], abs_tol=EPS), (kind, i, kept[i])

        # the adapter's view: exactly the jobs it was told to start are running, where told
        running = {j.id for j in jobs.values() if j.state == JobState.RUNNING}
        assert set(sched.running) == running
        assert set(self.started) == running, (
            f"running without a Start: {running - set(self.started)}"
        )
        for job_id, (_, start) in self.started.items():
            assert state.allocations.get(job_id) == start.placement, (
                f"{job_id} holds {state.allocations.get(job_id)}, was started on {start.placement}"
            )

        # -- invariant 2: a gang runs whole, in the shape asked for
        for job_id in running:
            job, placement = jobs[job_id], state.allocations[job_id]
            nodes = [p.node for p in placement.parts]
            assert placement.gpus == job.gpus, f"{job_id} holds {placement.gpus}/{job.gpus} GPUs"
            assert len(set(nodes)) == len(nodes), f"{job_id}: two parts on one node {placement}"
            fractions = {getattr(p, "fraction", 1.0) for p in placement.parts}
            assert fractions == {getattr(job, "gpu_fraction", 1.0)}, (job_id, placement)
            if job.gpus_per_node:
                assert all(p.gpus == job.gpus_per_node for p in placement.parts), (
                    f"{job_id} wants {job.gpus_per_node} per node, got {placement}"
                )
            if job.gpu_models is not None:
                assert all(cluster.nodes[i].gpu_model in job.gpu_models for i in nodes), job_id
            if job.cpus:
                assert math.isclose(sum(p.cpus for p in placement.parts), job.cpus), job_id
            if job.memory_gb:
                assert math.isclose(sum(p.memory_gb for p in placement.parts), job.memory_gb)

        # -- invariant 3: limits along every chain; queue.running is the recomputed sum
        tree, policy = sched.tree, sched.policy
        claims = getattr(sched, "_claims", {})
        for path, queue in tree.by_path.items():
            if policy.quotas:
                members = [j for j in jobs.values() if path in _chain_paths(tree, j.queue)]
            else:
                members = list(jobs.values()) if queue is tree.root else []
            used = sum(_amount(j) for j in members if j.state == JobState.RUNNING)
            assert math.isclose(queue.running, used, abs_tol=EPS), (
                f"queue {queue.label()}: running says {queue.running:g}, jobs hold {used:g}"
            )
            assert used <= queue.limit + EPS, (
                f"queue {queue.label()} runs {used:g} GPUs over its limit {queue.limit:g}"
            )
            for name, limit, counted, promised in (
                ("cpus", "cpu_limit", "cpus_running", "cpus_claimed"),
                ("memory_gb", "memory_limit", "memory_running", "memory_claimed"),
            ):
                asked = sum(getattr(j, name) or 0.0 for j in members if j.state == JobState.RUNNING)
                assert math.isclose(getattr(queue, counted, 0.0), asked, abs_tol=EPS), (
                    f"queue {queue.label()}: {counted} says {getattr(queue, counted, 0.0):g}, "
                    f"jobs ask for {asked:g}"
                )
                held = sum(getattr(j, name) or 0.0 for j in members if j.id in claims)
                assert math.isclose(getattr(queue, promised, 0.0), held, abs_tol=EPS), (
                    f"queue {queue.label()}: {promised} says {getattr(queue, promised, 0.0):g}, "
                    f"claims ask for {held:g}"
                )
                if policy.quotas:  # running and promised to claims, within the limit
                    assert asked + held <= getattr(queue, limit, math.inf) + EPS, (
                        f"queue {queue.label()} runs {asked:g} {name} (+{held:g} claimed) over "
                        "its limit"
                    )
            claimed = sum(_amount(j) for j in members if j.id in claims)
            assert math.isclose(queue.claimed, claimed, abs_tol=EPS), (
                f"queue {queue.label()}: claimed says {queue.claimed:g}, claims hold {claimed:g}"
            )
            # tier-1 jobs run only inside their own queue's guarantee (why they are never victims)
            own = [j for j in members if not policy.quotas or j.queue == path]
            tier1 = sum(
                _amount(j)
                for j in own
                if j.tier == 1 and (j.state == JobState.RUNNING or j.id in claims)
            )
            assert math.isclose(queue.tier1_running, tier1, abs_tol=EPS), (
                f"queue {queue.label()}: tier1_running says {queue.tier1_running:g}, "
                f"tier-1 jobs hold {tier1:g}"
            )
            if policy.quotas and getattr(policy, "guarantees", True):
                assert tier1 <= queue.guaranteed + EPS, (
                    f"queue {queue.label()}: tier-1 jobs hold {tier1:g} GPUs, over its "
                    f"guarantee {queue.guaranteed:g}"
                )

        # -- a job array runs at most its max_running elements at once (core/arrays.py)
        running_by_array: dict[str, int] = {}
        for job in jobs.values():
            if job.state == JobState.RUNNING and job.array_id is not None:
                running_by_array[job.array_id] = running_by_array.get(job.array_id, 0) + 1
                assert running_by_array[job.array_id] <= job.array_max_running, (
                    f"array {job.array_id} runs {running_by_array[job.array_id]} elements, "
                    f"over its max_running {job.array_max_running}"
                )

        # -- invariant 6: every pending job has exactly one current reason
        by_family = dict.fromkeys(FAMILIES, 0.0)
        pending = 0
        for job in jobs.values():
            if job.state == JobState.PENDING:
                pending += 1
                assert isinstance(job.reason, Reason), f"pending {job.id} has no reason"
                assert job.reason.family in FAMILIES, f"{job.id}: {job.reason}"
                by_family[job.reason.family] += _amount(job)
            else:
                assert job.reason is None, f"{job.id} is {job.state.value} but has {job.reason}"
        assert len(sched.pending) == pending, f"{len(sched.pending)} queued, {pending} pending"
        for family in FAMILIES:
            assert math.isclose(
                sched.pending_gpus_by_reason[family], by_family[family], abs_tol=EPS
            ), f"pending GPUs by reason {sched.pending_gpus_by_reason} != {by_family}"


def _amount(job: Job) -> float:
    """GPUs a job counts for in quotas: a fraction of one GPU counts as itself."""
    return job.gpus * getattr(job, "gpu_fraction", 1.0)


def _fractional(job: Job) -> bool:
    return getattr(job, "gpu_fraction", 1.0) < 1.0


# -- the tests ---------------------------------------------------------------------------------
@COMMON
@given(scenario=scenarios())
def test_invariants_gpusched(scenario):
    Harness(scenario, "gpusched").run()


@COMMON
@given(scenario=scenarios(mode="contended"))
def test_invariants_gpusched_contended(scenario):
    Harness(scenario, "gpusched").run()


@COMMON
@given(scenario=scenarios(mode="reclaim"))
def test_invariants_gpusched_reclaim(scenario):
    Harness(scenario, "gpusched").run()


@COMMON
@given(scenario=scenarios())
def test_invariants_fifo(scenario):
    """No quotas, no pre-emption: invariants 1, 2, 3 (root accounting) and 6."""
    Harness(scenario, "fifo").run()


@COMMON
@given(scenario=scenarios(mode="contended"), policy=st.sampled_from(["priority", "slurm"]))
def test_invariants_baseline_policies(scenario, policy):
    """The other policies run through the same engine: tier-3 pre-emption only, limits (slurm)."""
    Harness(scenario, policy).run()


@COMMON
@given(scenario=scenarios(), policy=st.sampled_from(["gpusched", "fifo"]))
def test_same_inputs_same_decisions(scenario, policy):
    first = Harness(scenario, policy, check=False).run()
    second = Harness(json.loads(json.dumps(scenario)), policy, check=False).run()
    assert first == second


_CHILD = (
    "import json, sys; sys.path.insert(0, 'tests'); import test_invariants as t; "
    "s = json.load(sys.stdin); "
    "print(json.dumps([[p, repr(t.Harness(x, p, check=False).run())] for x in s "
    "for p in ('gpusched', 'fifo')]))"
)


@settings(COMMON, max_examples=5)
@given(batch=st.lists(scenarios(max_ops=25), min_size=4, max_size=4))
def test_same_decisions_across_hash_seeds(batch):
    """String hashing changes between processes; decisions must not."""
    root = Path(__file__).resolve().parent.parent
    outputs = []
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        done = subprocess.run(
            [sys.executable, "-c", _CHILD],
            input=json.dumps(batch),
            capture_output=True,
            text=True,
            cwd=root,
            env=env,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        outputs.append(json.loads(done.stdout))
    assert outputs[0] == outputs[1]


# -- pinned cases: violations the search found (each fails while the engine has the bug) --------
def _submit(gpus: int, tier: int, queue: int = 0, **extra) -> dict:
    op = {
        "op": "submit",
        "gpus": gpus,
        "gpus_per_node": None,
        "tier": tier,
        "queue": queue,
        "kind": "batch",
        "walltime": None,
        "duration": 20000.0,
        "cpus": None,
        "memory_gb": None,
        "models": None,
    }
    return {**op, **extra}


def _advance(seconds: float) -> dict:
    return {"op": "advance", "seconds": seconds}


_DEFAULTS = {
    "grace2": 300.0,
    "minrun2": 600.0,
    "grace3": 60.0,
    "minrun3": 0.0,
    "backfill_depth": 200,
    "recalc": 300.0,
}


def test_pinned_claim_keeps_the_memory_it_needs():
    """Invariant 1. A pre-empting job's claim holds the free GPUs it will use but none of the
    memory; another job takes that memory meanwhile, and the claimant then starts on top of it
    (17 GB on a 16 GB node)."""
    scenario = {
        "cluster": {"nodes": [{"name": "n0", "gpus": 3, "memory_gb": 16}]},
        "queues": None,
        "settings": _DEFAULTS,
        "ops": [
            _submit(1, 3),  # j0, a victim
            _submit(1, 3),  # j1
            _advance(1),
            _submit(2, 1, memory_gb=16),  # j2 pre-empts j0; its claim holds one free GPU
            _advance(1),
            {"op": "end", "pick": 1, "failed": False},  # j1 ends: a GPU and no memory freed
            _submit(1, 1, memory_gb=1),  # j3 takes 1 GB of the 16 GB j2 was promised
            _advance(100),  # j0 is killed after its grace; j2 starts
        ],
    }
    Harness(scenario, "gpusched").run()


def test_pinned_victims_free_the_cpus_the_job_needs():
    """Invariant 1. The job that holds all the CPUs is chosen as a victim, then dropped because
    the pre-emptor does not use its GPU; the pre-emptor starts with a CPU that is not free."""
    scenario = {
        "cluster": {"nodes": [{"name": "n0", "gpus": 4, "cpus": 4}]},
        "queues": None,
        "settings": _DEFAULTS,
        "ops": [
            _submit(3, 3),  # j0: GPUs 0-2, no CPUs
            _submit(1, 3, cpus=4),  # j1: GPU 3 and all 4 CPUs
            _submit(2, 1, cpus=1),  # j2 pre-empts j0 only
            _advance(100),
        ],
    }
    Harness(scenario, "gpusched").run()


def test_pinned_reclaim_never_below_the_victim_queues_guarantee():
    """Invariant 4. Queue a (guarantee 2) runs 4 GPUs; b reclaims twice while a's first victim
    is still in its grace period, and the guard counts that victim as staying: a ends with 0."""
    scenario = {
        "cluster": {"nodes": [{"name": "n0", "gpus": 6}]},
        "queues": {"queues": {"a": {"guaranteed": 2}, "b": {"guaranteed": 4}, "c": {}}},
        "settings": _DEFAULTS,
        "ops": [
            _advance(1),
            _submit(2, 2, queue=2),  # c borrows 2 GPUs
            _advance(999),
            _submit(2, 2, queue=0),  # a borrows 2 GPUs beyond its guarantee of 2
            _submit(2, 2, queue=0),
            _advance(700),
            _submit(2, 2, queue=1),  # b (under its guarantee) reclaims: pre-empts one of a's
            _advance(1),
            _submit(2, 2, queue=1),  # ... and again: the other one of a's
        ],
    }
    Harness(scenario, "gpusched").run()
