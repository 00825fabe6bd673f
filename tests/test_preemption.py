"""Borrowing, reclaim and tier pre-emption, end to end through the replay."""

from helpers import cluster, job, names, preempted, queues, run_replay, started, trace_job

from jupyter_gpusched.core import PolicySettings, Preempt, Scheduler


def test_borrowed_guarantee_is_reclaimed_after_minimum_run_time_and_grace():
    c = cluster(("n[1-4]", 8, "leaf"))  # 32 GPUs
    tree = queues({"a": {"guaranteed": 16}, "b": {"guaranteed": 16}}, c)
    trace = [
        # team A fills the cluster: 16 of its own and 16 borrowed from B's idle guarantee
        *(trace_job(f"a{i}", 0, 5000, 8, queue="a", tier=2) for i in range(4)),
        # B needs 16 GPUs inside its guarantee at t=100
        trace_job("b1", 100, 1000, 16, queue="b", tier=2),
    ]
    result, rows = run_replay(trace, c, tree)
    settings = PolicySettings()
    min_run = settings.tiers[2].minimum_run_time
    grace = settings.tiers[2].grace_period
    # B starts as soon as A's victims have passed their minimum run time and their grace
    assert rows["b1"]["start_time"] == min_run + grace
    victims = [j for j in ("a0", "a1", "a2", "a3") if rows[j]["runs"] == 2]
    assert len(victims) == 2  # just enough: 16 GPUs
    for name in victims:
        assert rows[name]["state"] == "completed"
        assert rows[name]["end_time"] > 5000  # requeued and finished later
    untouched = [j for j in ("a0", "a1", "a2", "a3") if j not in victims]
    assert all(rows[j]["runs"] == 1 and rows[j]["end_time"] == 5000 for j in untouched)
    assert result.preemptions == 2
    assert rows["b1"]["first_reason"] == "capacity"


def test_reclaim_never_takes_a_queue_below_its_guarantee():
    c = cluster(("n[1-4]", 8, "leaf"))
    tree = queues({"a": {"guaranteed": 16}, "b": {"guaranteed": 16}}, c)
    trace = [
        *(trace_job(f"a{i}", 0, 5000, 8, queue="a") for i in range(2)),  # A inside guarantee
        *(trace_job(f"b{i}", 0, 5000, 8, queue="b") for i in range(2)),  # B inside guarantee
        trace_job("b-more", 100, 100, 8, queue="b"),  # B beyond its guarantee: no reclaim
    ]
    result, rows = run_replay(trace, c, tree)
    assert result.preemptions == 0
    assert rows["b-more"]["start_time"] == 5000


def test_tier1_preempts_tier3_after_the_tier3_grace_and_is_never_preempted():
    c = cluster(("n1", 8, "leaf"))
    tree = queues({"prod": {"guaranteed": 8}, "spot": {"guaranteed": 0}}, c)
    grace3 = PolicySettings().tiers[3].grace_period
    trace = [
        trace_job("spot", 0, 10_000, 8, queue="spot", tier=3),
        trace_job("prod", 50, 1000, 8, queue="prod", tier=1),
        trace_job("spot-2", 60, 10_000, 8, queue="spot", tier=3),
        trace_job("prod-2", 70, 10, 4, queue="prod", tier=2),
    ]
    result, rows = run_replay(trace, c, tree)
    assert rows["prod"]["start_time"] == 50 + grace3
    assert rows["prod"]["runs"] == 1 and rows["prod"]["end_time"] == 50 + grace3 + 1000
    assert rows["spot"]["runs"] == 2
    assert result.preemptions == 1


def test_tier2_outside_guarantee_preempts_only_tier3():
    c = cluster(("n1", 8, "leaf"))
    tree = queues({"a": {"guaranteed": 4}, "b": {"guaranteed": 4}}, c)
    trace = [
        trace_job("a-borrow", 0, 5000, 8, queue="a", tier=2),  # A borrows B's 4 GPUs
        trace_job("a-more", 1000, 100, 4, queue="a", tier=2),  # A again: not a reclaim
    ]
    result, rows = run_replay(trace, c, tree)
    assert result.preemptions == 0
    assert rows["a-more"]["start_time"] == 5000


def test_notebook_victims_are_not_requeued():
    c = cluster(("n1", 4, "leaf"))
    tree = queues({"prod": {"guaranteed": 4}, "spot": {"guaranteed": 0}}, c)
    trace = [
        trace_job("nb", 0, 10_000, 4, queue="spot", tier=3, kind="notebook"),
        trace_job("prod", 10, 100, 4, queue="prod", tier=1),
    ]
    _, rows = run_replay(trace, c, tree)
    assert rows["nb"]["state"] == "preempted"
    assert rows["nb"]["runs"] == 1


def test_tier2_jobs_of_the_same_queue_never_preempt_each_other():
    c = cluster(("n1", 8, "leaf"))
    trace = [
        trace_job("first", 0, 5000, 8, tier=2),
        trace_job("second", 1000, 100, 8, tier=2),
    ]
    result, rows = run_replay(trace, c)  # no queue file: one root queue
    assert result.preemptions == 0
    assert rows["second"]["start_time"] == 5000


def test_holdings_name_running_jobs_and_the_claims_their_victims_freed():
    """Scheduler.holdings: what an adapter shows per node, a claim marked reserved."""
    c = cluster(("n1", 8, "leaf"))
    scheduler = Scheduler(c)
    for name in ("v1", "v2"):
        scheduler.submit(job(name, 4, tier=3), 0)
    scheduler.schedule(0)
    assert [(h.job_id, h.reserved, h.part.gpus) for h in scheduler.holdings(0)] == [
        ("v1", False, 4),
        ("v2", False, 4),
    ]
    scheduler.submit(job("big", 8, tier=1, t=3600), 3600)
    preempts = [d for d in scheduler.schedule(3600) if isinstance(d, Preempt)]
    assert sorted(d.job_id for d in preempts) == ["v1", "v2"]
    scheduler.job_ended("v1", 3700, "preempted")
    held = [(h.job_id, h.reserved, h.part.gpus) for h in scheduler.holdings(0)]
    assert held == [("big", True, 4), ("v2", False, 4)]


def test_a_preemption_that_completes_is_not_reported_as_called_off():
    # the claim's end on its last victim's exit once went through the calling-off path, which
    # gave the starting job "its pre-emption was called off" for a moment
    c = cluster(("n1", 8, "leaf"))
    scheduler = Scheduler(c)
    scheduler.submit(job("v", 8, tier=3), 0)
    scheduler.schedule(0)
    given = []
    set_reason = scheduler.preemptions._set_reason
    scheduler.preemptions._set_reason = lambda j, r: (given.append((j.id, r)), set_reason(j, r))
    scheduler.submit(job("big", 8, tier=1, t=60), 60)
    assert [d.job_id for d in scheduler.schedule(60) if isinstance(d, Preempt)] == ["v"]
    scheduler.job_ended("v", 120, "preempted")
    assert "big" in scheduler.running
    assert [r.detail for j, r in given if j == "big"] == ["preempting"]
    # called off (an admin holds it while its victim leaves): then it says so
    scheduler.submit(job("v2", 8, tier=3, t=200), 200)
    scheduler.job_ended("big", 200)
    scheduler.schedule(200)
    scheduler.submit(job("big2", 8, tier=1, t=300), 300)
    scheduler.schedule(300)
    scheduler.hold("big2", 310)
    assert [r.detail for j, r in given if j == "big2"] == ["preempting", "preemption-dropped"]


def test_a_job_whose_victims_are_leaving_starts_at_once_on_gpus_freed_elsewhere():
    # it does not wait out its victims' grace while GPUs it fits on are free (a user would see
    # "pre-empting spot" beside 8 free GPUs); the victims, already signalled, still leave
    c = cluster(("n1", 8, "leaf"), ("n2", 8, "leaf"))
    settings = PolicySettings.from_dict({"tiers": {3: {"grace_period": "10m"}}})
    scheduler = Scheduler(c, settings=settings)
    scheduler.submit(job("spot", 8, tier=3, walltime=86_400), 0)
    scheduler.submit(job("train", 8, tier=2, walltime=86_400), 0)
    assert set(started(scheduler.schedule(0))) == {"spot", "train"}
    scheduler.submit(job("prod", 8, tier=1, t=10), 10)
    assert [d.job_id for d in preempted(scheduler.schedule(10))] == ["spot"]
    assert scheduler.jobs["prod"].reason.detail == "preempting"
    train_node = next(iter(scheduler.state.allocations["train"].nodes))
    scheduler.job_ended("train", 100)
    assert names(scheduler, started(scheduler.schedule(100))["prod"]) == [c.nodes[train_node].name]
    assert not scheduler._claims and scheduler.jobs["spot"].preempted_by is None
    scheduler.job_ended("spot", 610, "preempted")  # its grace over: it leaves, requeued
    assert scheduler.jobs["spot"].state.value == "pending"
    assert "spot" in started(scheduler.schedule(610))
