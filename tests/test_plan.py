"""Expected starts for every pending job (core/plan.py): the engine played forward on a copy,
running jobs ending at their walltimes; the live scheduler unchanged."""

import copy
import random

import pytest
from helpers import cluster, job, queues
from test_estimate import Run

from jupyter_gpusched.core import PolicySettings, Scheduler, Start
from jupyter_gpusched.core.jobs import JobState
from jupyter_gpusched.core.plan import expected_starts, played_end


def full_cluster_with_one_hole(settings=None) -> Scheduler:
    """n1 full until 1000; n2: 6 GPUs until 1000 and 2 until 100. Pending: ``big`` (16 GPUs,
    1st in priority order: it reserves both nodes from 1000), ``long`` (2 GPUs, 700 s planned),
    ``short`` (2 GPUs, 100 s planned)."""
    scheduler = Scheduler(cluster(("n[1-2]", 8, "leaf")), settings=settings)
    for job_id, gpus, walltime in (("r1", 8, 1000), ("r2", 6, 1000), ("r3", 2, 100)):
        scheduler.submit(job(job_id, gpus, walltime=walltime), 0)
    scheduler.schedule(0)
    for n, (job_id, gpus, walltime) in enumerate(
        (("big", 16, 100), ("long", 2, 700), ("short", 2, 100)), start=1
    ):
        scheduler.submit(job(job_id, gpus, t=n, walltime=walltime), n)
        scheduler.schedule(n)
    return scheduler


def test_every_pending_job_gets_the_start_the_engine_would_give_it():
    scheduler = full_cluster_with_one_hole()
    # only the reservation's holder has a time of its own
    assert scheduler.jobs["big"].reason.eta == 1000
    assert scheduler.jobs["long"].reason.eta is None is scheduler.jobs["short"].reason.eta
    # r3 frees 2 GPUs at 100: short (shortest first) runs 100-200, then long 200-900, both
    # before big's reservation at 1000
    assert expected_starts(scheduler, 10) == {"short": 100, "long": 200, "big": 1000}


def test_the_play_follows_the_policy_in_force():
    settings = PolicySettings.from_dict({"backfill": {"order": "priority"}})
    scheduler = full_cluster_with_one_hole(settings)
    # in priority order long takes the hole at 100 (to 800); short waits for it
    assert expected_starts(scheduler, 10) == {"long": 100, "short": 800, "big": 1000}


def test_the_live_scheduler_is_not_changed():
    scheduler = full_cluster_with_one_hole()
    before = copy.deepcopy(
        ({j.id: (j.state, j.reason, j.runs) for j in scheduler.jobs.values()}, scheduler.passes)
    )
    free = list(scheduler.state.free)
    expected_starts(scheduler, 10)
    after = ({j.id: (j.state, j.reason, j.runs) for j in scheduler.jobs.values()}, scheduler.passes)
    assert after == before and list(scheduler.state.free) == free
    assert scheduler.reservation.job_id == "big" and len(scheduler.running) == 3


def test_a_held_job_gets_no_expected_start_and_the_play_stops_at_its_horizon():
    scheduler = full_cluster_with_one_hole()
    scheduler.hold("long", 10)
    assert expected_starts(scheduler, 10) == {"short": 100, "big": 1000}
    # seen from 10 with a horizon of 500 s: r1 and r2 end (at 1000) beyond it
    assert expected_starts(scheduler, 10, horizon=500) == {"short": 100}


def test_a_job_waits_for_a_pre_emption_victims_minimum_run_time_and_grace():
    settings = PolicySettings.from_dict(
        {"tiers": {3: {"minimum_run_time": "10m", "grace_period": "1m"}}}
    )
    scheduler = Scheduler(cluster(("n1", 8, "leaf")), settings=settings)
    scheduler.submit(job("opportunistic", 8, tier=3, walltime=86_400), 0)
    scheduler.schedule(0)
    scheduler.submit(job("urgent", 8, t=5, tier=1, walltime=3600), 5)
    scheduler.schedule(5)
    assert scheduler.jobs["urgent"].state.name == "PENDING"
    # the victim may be pre-empted once it has run 10 min; it goes 1 min after the signal
    assert expected_starts(scheduler, 5) == {"urgent": 600 + 60}


def test_a_job_nothing_running_can_make_room_for_has_no_expected_start():
    scheduler = Scheduler(cluster(("n1", 8, "leaf")))
    scheduler.submit(job("r", 4, walltime=100), 0)
    scheduler.submit(job("fits-later", 8, t=1, walltime=100), 1)
    scheduler.schedule(1)
    scheduler.set_node_state("n1", "drain", 2)  # nothing new starts there: nowhere to go
    assert expected_starts(scheduler, 2) == {}


def random_run(seed: int):
    """A random small cluster and workload (fair-share queues, tiers 1-3, gangs, both backfill
    cadences) in which each job runs exactly its walltime, run to an instant after the last
    arrival: (the run, the jobs pending then, their expected starts then)."""
    rng = random.Random(seed)
    c = cluster(("n[1-3]", 8, "leaf-1"), ("n[4-5]", 4, "leaf-2"))
    users = [f"u{i}" for i in range(1 + seed % 3)]
    tree = None
    if len(users) > 1:
        spec = {u: {"guaranteed": c.total_gpus / len(users), "users": [u]} for u in users}
        tree = queues(spec, c)
    settings = PolicySettings(backfill_interval=rng.choice([0.0, 30.0]))
    run = Run(Scheduler(c, tree, settings))
    for i in range(rng.randint(20, 80)):
        walltime = round(rng.uniform(60, 3 * 3600))
        user = rng.choice(users)
        submitted = job(
            f"j{i}",
            rng.choice([1, 1, 2, 4, 8, 8, 16]),
            t=round(rng.uniform(0, 3600)),
            walltime=walltime,
            user=user,
            queue=user if tree else None,
            tier=rng.choice([1, 2, 2, 3]),
        )
        run.add(submitted, walltime)
    run.run_until(3600)
    pending = {j.id for j in run.sched.jobs.values() if j.state == JobState.PENDING}
    return run, pending, expected_starts(run.sched, 3600)


@pytest.mark.parametrize("seed", range(40))
def test_when_every_job_runs_its_walltime_and_none_arrives_the_play_is_what_happens(seed):
    """Every pending job's expected start is the start it then gets, to the second."""
    run, pending, expected = random_run(seed)
    assert expected == next_starts(run, pending)


def next_starts(run, pending: set) -> dict:
    """Runs ``run`` to its end: when each job of ``pending`` next started (a pre-empted job
    waiting to run again started before)."""
    starts: dict[str, float] = {}
    schedule = run.sched.schedule

    def noting_starts(now):
        decisions = schedule(now)
        for decision in decisions:
            if isinstance(decision, Start) and decision.job_id in pending:
                starts.setdefault(decision.job_id, now)
        return decisions

    run.sched.schedule = noting_starts
    run.run_until(float("inf"))
    return starts


def test_the_random_runs_leave_many_jobs_waiting_with_pre_emptions_among_them():
    """The seeds above are not trivial: jobs wait, and some runs pre-empt after the instant."""
    waiting, preempted = 0, 0
    for seed in range(40):
        run, pending, _ = random_run(seed)
        next_starts(run, pending)
        waiting += len(pending)
        preempted += sum(run.sched.jobs[j].preemptions for j in run.sched.jobs) > 0
    assert waiting > 400 and preempted >= 5, (waiting, preempted)


def test_a_notebook_past_its_planned_run_time_is_played_as_running_as_long_again():
    """A notebook server has no walltime: the engine plans it with the policy's default (12 h)
    and, once past that, takes it to end now (its reservation holds the GPUs it still has). The
    play does not: a job waiting for its GPUs would be expected "in 1 min" for hours. At 13 h
    it is played to end at 26 h, as long again as it has run."""
    scheduler = Scheduler(cluster(("n[1-2]", 4, "leaf")))
    scheduler.submit(job("notebook", 4, kind="notebook", user="carol"), 0)
    scheduler.submit(job("train", 4, walltime=20 * 3600.0, user="dave"), 0)
    scheduler.schedule(0)
    now = 13 * 3600.0
    scheduler.submit(job("wide", 8, t=now, walltime=3600.0, user="bob"), now)
    scheduler.schedule(now)
    assert scheduler.jobs["wide"].reason.eta == 20 * 3600.0  # the reservation's: "train" ends
    assert expected_starts(scheduler, now) == {"wide": 26 * 3600.0}
    # a walltime is a limit: a job past it is taken to end now in the play too
    scheduler.jobs["notebook"].walltime = 12 * 3600.0
    assert expected_starts(scheduler, now) == {"wide": 20 * 3600.0}
    # one at its planned end, not past it, ends then
    notebook = job("nb", 4, kind="notebook")
    notebook.start_time, notebook.planned_run_time = 0.0, 12 * 3600.0
    assert played_end(notebook, 12 * 3600.0, 12 * 3600.0) == 12 * 3600.0
    assert played_end(notebook, 12 * 3600.0, 13 * 3600.0) == 26 * 3600.0
