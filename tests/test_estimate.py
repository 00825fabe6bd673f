"""core/estimate.py on small hand-made clusters: the answer is the engine's own (what the job's
record says right after a submission), the scheduler estimated on is unchanged, and the estimate
is a reservation: a job submitted right after it starts no later than its ``eta`` unless
higher-priority work arrives (seeded replay-like scenarios below).

What "no later" needs: every job ends by its walltime (the engine plans with walltimes and never
enforces them: a job that outruns its walltime delays a reservation, in the engine as in Slurm).
"""

from __future__ import annotations

import heapq
import pickle
import random
from collections import deque
from enum import Enum
from functools import partial
from types import BuiltinFunctionType, FunctionType, MethodType

import pytest
from helpers import cluster, job, queues

from jupyter_gpusched.core import PolicySettings, Preempt, Scheduler, Start
from jupyter_gpusched.core.estimate import estimate, snapshot
from jupyter_gpusched.core.jobs import JobState


def busy_cluster() -> Scheduler:
    """Two 8-GPU nodes, both full: one job planned to end at 3600, one at 7200."""
    sched = Scheduler(cluster(("n[1-2]", 8, "leaf-1")))
    sched.submit(job("a", 8, walltime=3600), 0)
    sched.submit(job("b", 8, walltime=7200), 0)
    sched.schedule(0)
    return sched


def test_a_job_that_fits_starts_now():
    sched = Scheduler(cluster(("n[1-2]", 8, "leaf-1")))
    answer = estimate(sched, job("x", 4, t=5), 5)
    assert (answer.start_now, answer.eta, answer.reason, answer.position) == (
        True,
        None,
        None,
        None,
    )
    assert sched.jobs == {}


def test_a_blocked_job_gets_the_reservation_its_submission_would_get():
    sched = busy_cluster()
    answer = estimate(sched, job("x", 4, t=10, walltime=600), 10)
    assert not answer.start_now and answer.position == 1
    assert answer.reason.family == "capacity" and answer.eta == 3600
    sched.submit(job("x", 4, t=10, walltime=600), 10)
    sched.schedule(10)
    assert sched.jobs["x"].reason == answer.reason  # the same object the record would carry


def test_a_job_that_will_reclaim_borrowed_gpus_expects_the_reclaim_not_the_reservation():
    """The demo's case: carol's queue (ops) is idle below its guarantee while bob's queue
    borrows the whole full cluster with jobs of 1 h that started a moment ago. Her 1-GPU job's
    reservation is at the first end (1 h), but the engine reclaims a GPU once a victim's
    minimum run time (10 min) is over and its grace (5 min) has passed: she starts at 15 min,
    and the estimate says so. The job's record keeps its reservation's start."""
    two = cluster(("n[1-2]", 4, "leaf-1"))
    tree = queues(
        {"nlp": {"guaranteed": 4, "users": ["bob"]}, "ops": {"guaranteed": 4, "users": ["carol"]}},
        two,
    )
    sched = Scheduler(two, tree)
    for n in (1, 2):
        sched.submit(job(f"b{n}", 4, queue="nlp", tier=2, user="bob", walltime=3600), 0)
    sched.schedule(0)
    assert len(sched.running) == 2
    asked = job("c", 1, t=60, queue="ops", tier=2, user="carol", kind="notebook")
    answer = estimate(sched, asked, 60)
    assert answer.reason.family == "capacity"
    assert answer.eta == answer.reason.eta == 600 + 300  # the first victim's minimum run time,
    # then its grace, not the reservation's start (3600, when the first of bob's jobs ends)
    # ... which is when the engine starts it if nothing else happens
    sched.submit(job("c", 1, t=60, queue="ops", tier=2, user="carol", kind="notebook"), 60)
    sched.schedule(60)
    decisions = sched.schedule(600)
    [victim] = [d.job_id for d in decisions if isinstance(d, Preempt)]
    sched.job_ended(victim, 900, "preempted")
    assert "c" in [d.job_id for d in sched.schedule(900) if isinstance(d, Start)]


def test_a_job_behind_the_reservation_has_its_reason_and_its_expected_start():
    sched = busy_cluster()
    sched.submit(job("head", 8, t=10, walltime=600), 10)
    sched.schedule(10)
    answer = estimate(sched, job("x", 8, t=20, walltime=600), 20)
    # head takes n1 when a ends (3600) and runs to 4200; then x (b holds n2 until 7200)
    assert (answer.start_now, answer.eta, answer.position) == (False, 4200, 2)
    assert answer.reason == sched.jobs["head"].reason.with_eta(None)  # same words
    assert answer.job.state == JobState.PENDING  # as the pass left it, not as the play did
    # the deadline check's copy plays nothing forward (core/deadlines.py: its own bound)
    plain = estimate(sched, job("x", 8, t=20, walltime=600), 20, expected=False)
    assert (plain.eta, plain.position) == (None, 2)
    assert "x" not in sched.jobs and len(sched.running) == 2


def test_a_short_job_that_backfills_starts_now():
    sched = busy_cluster()
    sched.job_ended("a", 100)  # 8 GPUs free on n1
    sched.submit(job("big", 16, t=100, walltime=600), 100)
    sched.schedule(100)  # big reserves both nodes from 7200
    assert estimate(sched, job("short", 8, t=110, walltime=60), 110).start_now
    answer = estimate(sched, job("long", 8, t=110, walltime=9000), 110)
    assert not answer.start_now and answer.reason.detail == "reservation"


def test_a_job_that_can_never_run_is_rejected_and_not_kept():
    sched = busy_cluster()
    answer = estimate(sched, job("x", 64), 10)
    assert answer.rejected and "64" in answer.job.reject_reason
    assert set(sched.jobs) == {"a", "b"}


def test_a_queue_at_its_limit_is_the_reason():
    c = cluster(("n[1-2]", 8, "leaf-1"))
    tree = queues({"team": {"guaranteed": 8, "limit": 8, "users": ["ann"]}}, c)
    sched = Scheduler(c, tree)
    sched.submit(job("a", 8, user="ann", queue="team"), 0)
    sched.schedule(0)
    answer = estimate(sched, job("x", 1, t=1, user="ann", queue="team"), 1)
    assert answer.reason.family == "policy"
    # expected when a ends, at the policy's default walltime: the queue has room again then
    assert answer.eta == sched.settings.walltime_batch


def test_the_scheduler_estimated_on_is_unchanged():
    """Byte for byte (pickled): jobs, reasons, reservation, fair-share usage, agenda, counters."""
    c = cluster(("n[1-2]", 8, "leaf-1"))
    tree = queues(
        {
            "x": {"guaranteed": 8, "users": ["ann"]},
            "y": {"guaranteed": 8, "users": ["bob"]},
        },
        c,
    )
    sched = Scheduler(c, tree)
    sched.submit(job("a", 8, user="ann", queue="x", walltime=3600), 0)
    sched.submit(job("b", 4, user="bob", queue="y", walltime=7200), 0)
    sched.submit(job("c", 8, t=5, user="bob", queue="y", walltime=600), 5)
    sched.schedule(5)
    before = pickle.dumps(sched)
    for gpus, user, queue in ((2, "ann", "x"), (8, "bob", "y"), (16, "ann", "x")):
        answer = estimate(sched, job("new", gpus, t=900, user=user, queue=queue), 900)
        assert not answer.rejected
    assert pickle.dumps(sched) == before
    with pytest.raises(ValueError):
        estimate(sched, job("a", 1), 900)  # a job it already has


@pytest.mark.parametrize("seed", range(10))
def test_a_snapshot_is_an_equal_copy_that_shares_no_state(seed):
    """The snapshot holds what the scheduler holds; driving it on (every running job ends, new
    jobs, passes) leaves the scheduler's pickled bytes as they were."""
    run, _, _, t, _ = workload(seed, users=1 + seed % 3)
    sched = run.sched
    before = pickle.dumps(sched)
    trial = snapshot(sched)
    assert contents(trial) == contents(sched)
    for job_id in list(trial.running):
        trial.job_ended(job_id, t + 1)
    trial.submit(job("new", 4, t=t + 1), t + 1)
    trial.schedule(t + 1)
    for job_id in list(trial.running)[:2]:
        trial.job_ended(job_id, t + 2, "preempted")
    trial.schedule(t + 2)
    assert pickle.dumps(sched) == before


def contents(obj, seen=None):
    """``obj``'s values as nested lists, sets sorted (a copied set may iterate in another
    order, so a copy need not pickle to the same bytes); callables by their name."""
    seen = set() if seen is None else seen
    if isinstance(obj, (str, int, float, bool, type(None), Enum)):
        return obj
    # (before any hasattr: asking a partial for its __dict__ gives it one, which it pickles)
    if isinstance(obj, (partial, MethodType, FunctionType, BuiltinFunctionType)):
        return getattr(obj, "__name__", type(obj).__name__)
    if id(obj) in seen:
        return "<seen>"
    seen.add(id(obj))
    if isinstance(obj, dict):
        return sorted((repr(k), contents(v, seen)) for k, v in obj.items())
    if isinstance(obj, (set, frozenset)):
        return sorted(repr(item) for item in obj)
    if isinstance(obj, (list, tuple, deque)):
        return [contents(item, seen) for item in obj]
    if not hasattr(obj, "__dict__"):  # (a value of a type without attributes of its own)
        return (type(obj).__name__, repr(obj))
    return (type(obj).__name__, contents(vars(obj), seen))


# -- the estimate is a reservation: replay-like scenarios ----------------------------------------
class Run:
    """Jobs submitted at their times, ending after their durations, a pass after each instant's
    events (as sim/replay.py and the live service do); pre-empted jobs leave at the grace."""

    def __init__(self, sched: Scheduler):
        self.sched = sched
        self.heap: list[tuple] = []
        self.durations: dict[str, float] = {}
        self.seq = 0
        self.now = 0.0
        self.holders: list[str | None] = []  # the reservation's job after each pass, in turn

    def push(self, when: float, kind: str, item) -> None:
        heapq.heappush(self.heap, (when, self.seq, kind, item))
        self.seq += 1

    def add(self, new_job, duration: float) -> None:
        self.durations[new_job.id] = duration
        self.push(new_job.submit_time, "submit", new_job)

    def run_until(self, stop: float) -> None:
        sched = self.sched
        while self.heap and self.heap[0][0] <= stop:
            self.now = moment = self.heap[0][0]
            while self.heap and self.heap[0][0] == moment:
                _, _, kind, item = heapq.heappop(self.heap)
                if kind == "submit":
                    sched.submit(item, moment)
                elif kind in ("end", "kill"):
                    run_id, runs = item
                    if run_id in sched.running and sched.jobs[run_id].runs == runs:
                        sched.job_ended(
                            run_id, moment, "completed" if kind == "end" else "preempted"
                        )
            for decision in sched.schedule(moment):
                started = sched.jobs[decision.job_id]
                if isinstance(decision, Start):
                    item = (started.id, started.runs)
                    self.push(moment + self.durations[started.id], "end", item)
                elif isinstance(decision, Preempt):
                    self.push(moment + decision.grace, "kill", (started.id, started.runs))
            holder = sched.reservation.job_id if sched.reservation is not None else None
            if not self.holders or self.holders[-1] != holder:
                self.holders.append(holder)
            wake = sched.next_wakeup()
            if wake is not None and wake > moment:
                self.push(wake, "wake", None)


def workload(seed: int, users: int):
    """A random small cluster and workload run to a random instant ``t``: (the run, the users,
    the queue tree or None, ``t``, the random generator). Every job ends by its walltime; jobs
    keep arriving after ``t``, all of the same tier."""
    rng = random.Random(seed)
    c = cluster(("n[1-3]", 8, "leaf-1"), ("n[4-5]", 4, "leaf-2"))
    names = [f"u{i}" for i in range(users)]
    tree = None
    if users > 1:
        spec = {name: {"guaranteed": c.total_gpus / users, "users": [name]} for name in names}
        tree = queues(spec, c)
    settings = PolicySettings(backfill_interval=rng.choice([0.0, 30.0]))
    run = Run(Scheduler(c, tree, settings))
    horizon = 4 * 3600.0
    for i in range(rng.randint(20, 80)):
        walltime = rng.uniform(60, 3 * 3600)
        user = rng.choice(names)
        background = job(
            f"j{i}",
            rng.choice([1, 1, 2, 4, 8, 8, 16]),
            t=round(rng.uniform(0, horizon)),
            walltime=walltime,
            user=user,
            queue=user if tree else None,
        )
        run.add(background, rng.uniform(0.1, 1.0) * walltime)
    t = round(rng.uniform(600, horizon * 0.75))
    run.run_until(t)
    return run, names, tree, t, rng


def scenario(seed: int, users: int):
    """An estimate at the workload's ``t`` for one more job (the reservation's start only: a
    job's expected start behind the reservation is no bound, test_plan.py), which is then
    submitted at ``t`` and the run goes on to the end: (the scheduler, the estimate, ``t``, the
    ids of the jobs submitted after ``t``, the job that took the estimated job's reservation or
    None). With one
    user, every later job ranks behind the estimated one."""
    run, names, tree, t, rng = workload(seed, users)
    sched = run.sched
    user = rng.choice(names)
    walltime = rng.uniform(60, 3 * 3600)
    gpus = rng.choice([1, 2, 4, 8, 16])
    asked = job("x", gpus, t=t, walltime=walltime, user=user, queue=user if tree else None)
    answer = estimate(sched, asked, t, expected=False)  # the reservation's own start, or none
    late_arrivals = {item.id for _, _, kind, item in run.heap if kind == "submit"}
    run.add(job("x", gpus, t=t, walltime=walltime, user=user, queue=asked.queue), walltime)
    seen = len(run.holders)
    run.run_until(float("inf"))
    after = run.holders[seen:]
    held_from = after.index("x") if "x" in after else len(after)
    taken_by = next((h for h in after[held_from:] if h != "x"), None)
    return sched, answer, t, late_arrivals, taken_by


@pytest.mark.parametrize("seed", range(150))
def test_one_user_the_job_starts_no_later_than_its_estimate(seed):
    sched, answer, t, _, _ = scenario(seed, users=1)
    x = sched.jobs["x"]
    assert x.state == JobState.COMPLETED
    if answer.start_now:
        assert x.first_start == t
    elif answer.eta is not None:
        assert x.first_start <= answer.eta + 1e-6, (answer, x.first_start)


# Two engine faults these scenarios found (fixed; the seeds that showed them were 45 and 91): a
# pass that examined only the new jobs gave the new job a reservation an older pending job then
# took at the next full pass, because
# - the full pass before it stopped (nothing usable was free) before the blocked head took the
#   reservation back (core/passes.py: that stop waits for the reservation); or
# - the fair-share factors were recomputed at this pass, and the holder ranked below older
#   pending jobs (core/scheduler.py: a new order makes the pass a full one).
@pytest.mark.parametrize("seed", range(150))
def test_fair_share_queues_the_job_starts_no_later_unless_higher_priority_work_came(seed):
    """Three users with fair-share queues: a job that arrived after ``t`` may be ahead of the
    estimated job (its user's queue used less) and take its reservation; where none did, the
    estimate holds."""
    sched, answer, t, late, taken_by = scenario(seed, users=3)
    x = sched.jobs["x"]
    if answer.start_now:
        assert x.first_start == t
        return
    if answer.eta is None or taken_by in late:
        return  # no estimate, or higher-priority work arrived
    assert x.first_start <= answer.eta + 1e-6, (answer, x.first_start)


def test_the_scenarios_reach_each_kind_of_answer():
    """The seeds above are not all trivial: some start now, some wait with an ETA, some
    wait behind the reservation."""
    kinds = set()
    for seed in range(150):
        _, answer, _, _, _ = scenario(seed, users=1)
        kinds.add("now" if answer.start_now else "eta" if answer.eta is not None else "behind")
    assert kinds == {"now", "eta", "behind"}


def test_the_words_for_an_estimate():
    from jupyter_gpusched.core.wording import estimate_text

    now = 1_764_684_300.0  # 2025-12-02 14:05 UTC
    words = [estimate_text(False, now + wait, None, now) for wait in (0, 1500, 3600, 3900, 10000)]
    assert words == [
        "about 1 min (at 14:05 UTC)",
        "about 25 min (at 14:30 UTC)",
        "about 1 h (at 15:05 UTC)",
        "about 1 h 5 min (at 15:10 UTC)",
        "about 2 h 50 min (at 16:51 UTC)",
    ]
    assert (
        estimate_text(False, now + 3 * 86400, None, now) == "about 3 days (at 2025-12-05 14:05 UTC)"
    )
    assert estimate_text(False, now + 1500, None, now, clock=False) == "about 25 min"
    # a start expected while the job waits on something: when, and on what
    assert (
        estimate_text(False, now + 1500, "queue team is at its limit of 8 GPUs", now)
        == "about 25 min (at 14:30 UTC): queue team is at its limit of 8 GPUs"
    )
    assert estimate_text(True, None, None, now) == "starts now"
    assert estimate_text(False, None, "team at its limit", now) == "waits: team at its limit"
    assert estimate_text(False, None, None, now) == "waits"
