"""Learned run-time estimates (core/runtime_estimates.py): the model, and the engine planning
with it on small hand-made clusters."""

import copy

import pytest
from helpers import cluster, job, started

from jupyter_gpusched.core import PolicySettings, Scheduler
from jupyter_gpusched.core.errors import ConfigError
from jupyter_gpusched.core.estimate import earliest_finish, snapshot
from jupyter_gpusched.core.plan import expected_starts
from jupyter_gpusched.core.runtime_estimates import RuntimeEstimates, expected_ends, quantile

ALWAYS = PolicySettings().replace(estimate="always")
MISSING = PolicySettings().replace(estimate="missing")


def observe(model, runs, **fields):
    for n, run_time in enumerate(runs):
        model.observe(job(f"past{n}", fields.pop("gpus", 1), **fields), run_time)


# -- the model ---------------------------------------------------------------------------------
def test_the_estimate_is_the_quantile_of_recent_runs_times_the_margin():
    model = RuntimeEstimates(quantile=0.9, margin=1.2, history=20, min_samples=3)
    for n, run_time in enumerate([100.0, 200.0, 300.0, 400.0, 500.0]):
        model.observe(job(f"p{n}", 1, user="ann"), run_time)
    # p90 of 100..500, linear between ranks: 460; x 1.2
    assert quantile([100.0, 200.0, 300.0, 400.0, 500.0], 0.9) == pytest.approx(460.0)
    assert model.estimate(job("new", 1, user="ann")) == pytest.approx(552.0)


def test_no_estimate_before_min_samples_runs():
    model = RuntimeEstimates(min_samples=3)
    model.observe(job("p0", 1, user="ann"), 100.0)
    model.observe(job("p1", 1, user="ann"), 100.0)
    assert model.estimate(job("new", 1, user="ann")) is None
    model.observe(job("p2", 1, user="ann"), 100.0)
    assert model.estimate(job("new", 1, user="ann")) == pytest.approx(120.0)


def test_keys_from_most_to_least_specific():
    model = RuntimeEstimates(quantile=1.0, margin=1.0, min_samples=2)
    for n in range(2):  # ann's named runs, ann's other runs, and her queue's
        model.observe(job(f"a{n}", 2, user="ann", queue="q", run_name="train.py"), 1000.0)
        model.observe(job(f"b{n}", 2, user="ann", queue="q", run_name="eval.py"), 50.0)
        model.observe(job(f"c{n}", 2, user="bob", queue="q"), 7000.0)
    named = job("x", 2, user="ann", queue="q", run_name="train.py")
    assert model.estimate(named) == 1000.0  # (user, kind, GPUs, name)
    unnamed = job("y", 2, user="ann", queue="q", run_name="other.py")
    assert model.estimate(unnamed) == 1000.0  # (user, kind, GPUs): max of 1000 and 50
    stranger = job("z", 2, user="cat", queue="q")
    assert model.estimate(stranger) == 7000.0  # (queue, kind, GPUs)
    assert model.estimate(job("w", 2, user="cat", queue="other")) is None
    assert model.estimate(job("v", 4, user="ann", queue="q")) is None  # other GPU count
    assert model.estimate(job("u", 2, user="ann", queue="q", kind="notebook")) is None


def test_memory_is_bounded_and_the_least_recently_observed_key_goes_first():
    model = RuntimeEstimates(history=5, min_samples=1, max_keys=6)
    for n in range(12):
        model.observe(job(f"a{n}", 1, user="ann", queue="q"), float(n))
    assert model.runs(("user", "ann", "batch", 1)) == (7.0, 8.0, 9.0, 10.0, 11.0)
    for user in ("bob", "cat", "dan"):  # 2 keys each (user, queue): 2 + 6 keys -> 6 kept
        model.observe(job(user, 1, user=user, queue=f"q-{user}"), 5.0)
    assert len(model) == 6
    assert model.runs(("user", "ann", "batch", 1)) == ()  # observed least recently: gone
    assert model.runs(("user", "dan", "batch", 1)) == (5.0,)


def test_a_copy_does_not_share_what_the_original_observes_later():
    model = RuntimeEstimates(min_samples=1, quantile=1.0, margin=1.0)
    model.observe(job("a", 1, user="ann"), 100.0)
    twin = copy.deepcopy(model)
    model.observe(job("b", 1, user="ann"), 900.0)
    assert twin.estimate(job("x", 1, user="ann")) == 100.0
    assert model.estimate(job("x", 1, user="ann")) == 900.0


def test_policy_file_keys_and_bad_values():
    settings = PolicySettings.from_dict(
        {"walltime": {"estimate": "always", "estimate_quantile": 0.8, "estimate_history": 10}}
    )
    assert (settings.estimate, settings.estimate_quantile, settings.estimate_history) == (
        "always",
        0.8,
        10,
    )
    assert PolicySettings().estimate == "never"  # opt-in: see docs/engine.md's figures
    for bad, where in (
        ({"estimate": "sometimes"}, "walltime.estimate"),
        ({"estimate_quantile": 1.5}, "walltime.estimate_quantile"),
        ({"estimate_margin": 0.5}, "walltime.estimate_margin"),
        ({"estimate_history": 2.5}, "walltime.estimate_history"),
        ({"estimate_min_samples": 0}, "walltime.estimate_min_samples"),
        ({"estimate_min_samples": 30}, "walltime.estimate_min_samples"),
        ({"estimator": "x"}, "walltime.estimator"),
    ):
        with pytest.raises(ConfigError) as error:
            PolicySettings.from_dict({"walltime": bad}, "policy.yaml")
        assert where in str(error.value) and "policy.yaml" in str(error.value), bad


# -- the engine --------------------------------------------------------------------------------
def run_three(scheduler, user="ann", gpus=8, run_time=100.0, **fields):
    """Three jobs of ``user`` that each run ``run_time`` seconds on the idle cluster."""
    now = 0.0
    for n in range(3):
        scheduler.submit(job(f"h{n}", gpus, t=now, user=user, **fields), now)
        assert started(scheduler.schedule(now)) == {f"h{n}": started(()) or _any()}
        now += run_time
        scheduler.job_ended(f"h{n}", now)
        scheduler.schedule(now)
    return now


class _any:  # equal to any placement
    def __eq__(self, other):
        return True


def test_a_waiting_job_is_planned_with_its_estimate_and_the_reservation_with_limits():
    """The estimate plans jobs that wait (backfill's "ends before the reservation"); the
    reservation's start is planned from the running jobs' limits (here the 24 h default), so a
    job estimated to end before it starts in front of it: planning the running job's end with
    its estimate (120 s) instead would have kept the GPUs idle for 2 min."""
    for settings, backfills in ((MISSING, True), (PolicySettings(), False)):
        scheduler = Scheduler(cluster(("n1", 8, "leaf")), settings=settings)
        now = run_three(scheduler, gpus=4)  # ann's 4-GPU jobs run 100 s: estimate 120 s
        scheduler.submit(job("running", 4, t=now, user="cat"), now)  # no walltime
        assert "running" in started(scheduler.schedule(now))
        scheduler.submit(job("big", 8, t=now + 1, user="bob"), now + 1)  # waits for the node
        scheduler.schedule(now + 1)
        assert scheduler.reservation.job_id == "big"
        assert scheduler.reservation.start == pytest.approx(now + 86_400.0)  # cat's limit
        scheduler.submit(job("small", 4, t=now + 2, user="ann"), now + 2)
        decisions = started(scheduler.schedule(now + 2))
        assert ("small" in decisions) is backfills, settings.estimate
        if backfills:  # planned 120 s: it ends before the reservation's start
            assert scheduler.jobs["small"].planned_run_time == pytest.approx(120.0)
            assert scheduler.jobs["small"].estimated
            # cat's job is estimated too (her queue's 4-GPU batch jobs): the plan expects
            # bob's job once both have ended, not at the reservation's 24 h
            assert expected_starts(scheduler, now + 2)["big"] == pytest.approx(now + 122.0)
        else:
            assert scheduler.jobs["small"].reason.detail == "reservation"


def test_a_walltime_caps_the_estimate_and_missing_mode_keeps_the_walltime():
    c = cluster(("n1", 8, "leaf"))
    scheduler = Scheduler(c, settings=ALWAYS)
    now = run_three(scheduler, run_time=1000.0)  # estimate 1200 s
    scheduler.submit(job("short-limit", 8, t=now, user="ann", walltime=500.0), now)
    scheduler.submit(job("long-limit", 8, t=now, user="ann", walltime=9000.0), now)
    assert scheduler.jobs["short-limit"].planned_run_time == 500.0  # the limit stands
    assert not scheduler.jobs["short-limit"].estimated
    assert scheduler.jobs["long-limit"].planned_run_time == pytest.approx(1200.0)
    assert scheduler.jobs["long-limit"].walltime == 9000.0  # still the limit
    missing = Scheduler(c, settings=MISSING)
    now = run_three(missing, run_time=1000.0)
    missing.submit(job("given", 8, t=now, user="ann", walltime=9000.0), now)
    assert missing.jobs["given"].planned_run_time == 9000.0


def test_a_jobs_own_run_never_feeds_its_own_estimate():
    c = cluster(("n1", 8, "leaf"))
    scheduler = Scheduler(c, settings=MISSING)
    now = run_three(scheduler, run_time=100.0)
    scheduler.submit(job("x", 8, t=now, user="ann"), now)
    scheduler.schedule(now)
    planned = scheduler.jobs["x"].planned_run_time
    scheduler.job_ended("x", now + 50_000)  # it ran far longer than planned
    scheduler.schedule(now + 50_000)
    assert scheduler.jobs["x"].planned_run_time == planned == pytest.approx(120.0)
    # only later jobs see it: the next estimate includes the long run
    scheduler.submit(job("y", 8, t=now + 50_000, user="ann"), now + 50_000)
    assert scheduler.jobs["y"].planned_run_time > 10_000  # p90 of 100, 100, 100, 50000


def test_failed_cancelled_and_preempted_runs_are_not_learned():
    c = cluster(("n1", 8, "leaf"))
    scheduler = Scheduler(c, settings=MISSING)
    for n, outcome in enumerate(("failed", "failed", "failed")):
        scheduler.submit(job(f"f{n}", 8, t=n, user="ann"), n)
        scheduler.schedule(n)
        scheduler.job_ended(f"f{n}", n + 0.5, outcome)
    scheduler.submit(job("c", 8, t=5, user="ann"), 5)
    scheduler.schedule(5)
    scheduler.cancel("c", 6)
    scheduler.job_ended("c", 6)  # a stopped job's processes exit "completed"
    assert scheduler.runtime_estimates.observed == 0
    scheduler.submit(job("x", 8, t=7, user="ann"), 7)
    assert not scheduler.jobs["x"].estimated


def test_an_overrun_is_expected_to_run_as_long_again_within_its_limit():
    c = cluster(("n1", 8, "leaf"))
    scheduler = Scheduler(c, settings=MISSING)
    now = run_three(scheduler)  # ann's 8-GPU jobs: 120 s planned
    scheduler.submit(job("overrun", 8, t=now, user="ann"), now)
    scheduler.schedule(now)
    scheduler.submit(job("next", 8, t=now, user="bob"), now)
    scheduler.schedule(now)
    assert scheduler.reservation.start == pytest.approx(now + 86_400.0)  # by its limit

    def expected(at):
        ends = expected_ends(scheduler.ledger.ends, scheduler.jobs, at, scheduler.settings)
        return dict((job_id, end) for end, job_id in ends)["overrun"]

    assert expected(now + 60.0) == pytest.approx(now + 120.0)  # at its estimate
    later = now + 500.0  # past its estimate, still running: expected to run 500 s more
    assert expected(later) == pytest.approx(now + 1000.0)
    assert expected_starts(scheduler, later)["next"] == pytest.approx(now + 1000.0)
    assert expected(now + 50_000.0) == pytest.approx(now + 86_400.0)  # within its limit
    much_later = now + 86_400.0 + 10  # past the default walltime (24 h): taken to end now
    assert expected(much_later) == pytest.approx(much_later)
    scheduler.agenda.freed = True
    scheduler.schedule(much_later)
    assert scheduler.reservation.start == pytest.approx(much_later)
    assert "overrun" in scheduler.running  # nothing stops it at its estimate or limit


def test_a_deadlines_earliest_finish_expects_running_jobs_to_end_at_their_estimates():
    """The deadline check is an optimistic bound: the running job is expected at its estimate
    (120 s), not at the 24 h default the reservation plans with."""
    scheduler = Scheduler(cluster(("n1", 8, "leaf")), settings=MISSING)
    now = run_three(scheduler)
    scheduler.submit(job("running", 8, t=now, user="ann"), now)
    scheduler.schedule(now)
    asked = job("due", 8, t=now + 1, user="bob")  # his queue's 8-GPU jobs: 120 s too
    assert earliest_finish(scheduler, asked, now + 1) == pytest.approx(now + 240.0)
    assert "due" not in scheduler.jobs  # (tried on a copy)


def test_the_estimate_api_snapshot_plans_with_the_same_model_and_leaves_it_alone():
    c = cluster(("n1", 8, "leaf"))
    scheduler = Scheduler(c, settings=MISSING)
    now = run_three(scheduler)
    copied = snapshot(scheduler)
    assert copied.runtime_estimates is not scheduler.runtime_estimates
    copied.submit(job("x", 8, t=now, user="ann"), now)
    copied.schedule(now)
    copied.job_ended("x", now + 9999)
    assert copied.jobs["x"].planned_run_time == pytest.approx(120.0)
    assert scheduler.runtime_estimates.observed == 3  # the copy's learning stays in the copy
    assert copied.runtime_estimates.observed == 4


def test_same_inputs_same_decisions_with_estimates():
    def run():
        c = cluster(("n[1-2]", 8, "leaf"))
        scheduler = Scheduler(c, settings=ALWAYS)
        log, running, now = [], {}, 0.0
        for n in range(60):
            now += 37.0
            user = f"u{n % 3}"
            scheduler.submit(job(f"j{n}", (1, 2, 4, 8)[n % 4], t=now, user=user), now)
            for job_id, end in sorted(running.items(), key=lambda item: (item[1], item[0])):
                if end <= now:
                    scheduler.job_ended(job_id, end)
                    del running[job_id]
            for job_id, placement in started(scheduler.schedule(now)).items():
                running[job_id] = now + 50.0 * (1 + int(job_id[1:]) % 5)
                log.append((now, job_id, placement.nodes))
        plans = sorted((j.id, j.planned_run_time, j.estimated) for j in scheduler.jobs.values())
        return log, plans

    first, second = run(), run()
    assert first == second
    assert any(estimated for _, _, estimated in first[1])
