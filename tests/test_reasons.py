"""Every pending job says why (capacity, placement or policy); impossible jobs are rejected."""

from helpers import cluster, job, queues, started

from jupyter_gpusched.core import JobState, Scheduler


def test_12_gpu_gang_with_8_free_holds_nothing_and_waits_on_capacity():
    c = cluster(("n[1-2]", 8, "leaf"))
    scheduler = Scheduler(c)
    scheduler.submit(job("busy", 8), 0)
    scheduler.schedule(0)
    scheduler.submit(job("gang", 12, t=1), 1)
    assert started(scheduler.schedule(1)) == {}
    gang = scheduler.jobs["gang"]
    assert gang.state == JobState.PENDING
    assert gang.reason.family == "capacity"
    assert "gang" not in scheduler.state.allocations
    assert scheduler.state.free_total == 8  # it holds none of the 8 free GPUs


def test_two_half_busy_nodes_and_an_8_gpu_job_wait_on_placement():
    c = cluster(("n[1-2]", 8, "leaf"))
    scheduler = Scheduler(c)
    scheduler.submit(job("x", 4), 0)
    scheduler.submit(job("y", 4, gpus_per_node=4, labels={}), 0)
    scheduler.schedule(0)
    # best fit put both 4-GPU jobs on n1; fill n2 halfway too
    scheduler.submit(job("z", 4, t=1), 1)
    scheduler.schedule(1)
    scheduler.job_ended("y", 2)
    scheduler.schedule(2)
    assert sorted(scheduler.state.free) == [4, 4]
    scheduler.submit(job("eight", 8, t=3), 3)
    assert started(scheduler.schedule(3)) == {}
    reason = scheduler.jobs["eight"].reason
    assert reason.family == "placement"
    assert "8 free" in reason.message


def test_team_at_its_limit_waits_on_policy_while_gpus_stand_free():
    c = cluster(("n[1-4]", 8, "leaf"))
    tree = queues({"vision": {"guaranteed": 8, "limit": 12}, "nlp": {"guaranteed": 8}}, c)
    scheduler = Scheduler(c, tree)
    scheduler.submit(job("v1", 8, queue="vision"), 0)
    scheduler.submit(job("v2", 4, queue="vision"), 0)
    scheduler.submit(job("v3", 2, queue="vision", t=1), 1)
    scheduler.schedule(1)
    v3 = scheduler.jobs["v3"]
    assert v3.state == JobState.PENDING
    assert v3.reason.family == "policy"
    assert v3.reason.detail == "queue-limit"
    assert "vision is at its limit of 12" in v3.reason.message
    assert scheduler.state.free_total == 20


def test_jobs_that_can_never_run_are_rejected_with_a_reason():
    c = cluster(("n[1-2]", 8, "leaf", {"gpu_model": "A100"}))
    tree = queues({"team": {"guaranteed": 4, "limit": 8}, "other": {"guaranteed": 4}}, c)
    scheduler = Scheduler(c, tree)
    cases = {
        "too-big": job("too-big", 17, queue="other"),
        "over-limit": job("over-limit", 12, queue="team"),
        "unknown-model": job("unknown-model", 1, queue="team", gpu_models=frozenset({"H100"})),
        "tier1-over-guarantee": job("tier1-over-guarantee", 6, queue="team", tier=1),
        "unknown-queue": job("unknown-queue", 1, queue="nope"),
    }
    for j in cases.values():
        scheduler.submit(j, 0)
    scheduler.schedule(0)
    for name, j in cases.items():
        assert j.state == JobState.REJECTED, name
        assert j.reject_reason, name
    assert "limit of 8" in cases["over-limit"].reject_reason
    assert "H100" in cases["unknown-model"].reject_reason
    assert "guarantee" in cases["tier1-over-guarantee"].reject_reason
    assert scheduler.pending_jobs(0) == []


def test_tier1_waits_outside_its_guarantee():
    c = cluster(("n[1-2]", 8, "leaf"))
    tree = queues({"prod": {"guaranteed": 4}, "dev": {"guaranteed": 4}}, c)
    scheduler = Scheduler(c, tree)
    scheduler.submit(job("p1", 4, queue="prod", tier=1), 0)
    scheduler.submit(job("p2", 1, queue="prod", tier=1, t=1), 1)
    scheduler.schedule(1)
    assert scheduler.jobs["p1"].state == JobState.RUNNING
    assert scheduler.jobs["p2"].reason.detail == "tier1-guarantee"


def test_blocked_top_job_has_an_eta_from_its_reservation():
    c = cluster(("n1", 8, "leaf"))
    scheduler = Scheduler(c)
    scheduler.submit(job("a", 6, walltime=100), 0)
    scheduler.schedule(0)
    scheduler.submit(job("b", 4, t=10), 10)
    scheduler.schedule(10)
    assert scheduler.jobs["b"].reason.eta == 100


def test_a_small_job_behind_a_limit_blocked_one_in_its_queue_still_starts():
    c = cluster(("n[1-2]", 8, "leaf"))
    tree = queues({"c": {"guaranteed": 4, "limit": 10}, "d": {"guaranteed": 4}}, c)
    scheduler = Scheduler(c, tree)
    scheduler.submit(job("c-run", 8, queue="c"), 0)
    scheduler.submit(job("d-fill", 8, queue="d"), 0)
    scheduler.schedule(0)
    scheduler.submit(job("h", 4, queue="c", t=1), 1)  # 8 + 4 > 10: the limit
    scheduler.submit(job("small", 2, queue="c", t=2), 2)  # fits the limit, not the free GPUs
    scheduler.schedule(2)
    assert scheduler.jobs["h"].reason.detail == "queue-limit"
    assert scheduler.jobs["small"].reason.family == "capacity"
    scheduler.job_ended("d-fill", 10)
    assert "small" in started(scheduler.schedule(10))
