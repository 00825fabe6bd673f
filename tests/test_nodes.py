"""Node events: drain (no new placements, running jobs finish) and down (running jobs fail;
batch jobs are requeued)."""

from helpers import cluster, job, names, started

from jupyter_gpusched.core import JobState, Scheduler, Stop


def test_a_drained_node_takes_no_new_jobs_but_running_ones_finish():
    scheduler = Scheduler(cluster(("n[1-2]", 4, "leaf")))
    scheduler.submit(job("running", 2), 0)
    first = started(scheduler.schedule(0))["running"]
    drained = names(scheduler, first)[0]
    scheduler.set_node_state(drained, "drain", 1)
    scheduler.submit(job("next", 2, t=2), 2)
    assert names(scheduler, started(scheduler.schedule(2))["next"]) != [drained]
    assert scheduler.jobs["running"].state == JobState.RUNNING
    scheduler.job_ended("running", 3)
    scheduler.submit(job("big", 4, t=4), 4)
    scheduler.schedule(4)
    assert scheduler.jobs["big"].reason.family == "capacity"  # the drained node's GPUs don't count
    scheduler.set_node_state(drained, "up", 5)
    assert names(scheduler, started(scheduler.schedule(5))["big"]) == [drained]


def test_a_drain_moves_the_reservation_off_the_drained_node_at_once():
    """The demo's case: a waiting job reserved the node whose job ends first; an admin drains
    that node. The next schedule() walks the queue again (as after a job's end), so the job's
    reason and expected start say the other node's end, not the drained node's."""
    scheduler = Scheduler(cluster(("n[1-2]", 4, "leaf")))
    scheduler.submit(job("soon", 4, walltime=3600), 0)
    scheduler.submit(job("late", 4, walltime=7200), 0)
    placements = started(scheduler.schedule(0))
    scheduler.submit(job("waiting", 4, t=1, walltime=600), 1)
    scheduler.schedule(1)
    assert scheduler.jobs["waiting"].reason.eta == 3600
    scheduler.set_node_state(names(scheduler, placements["soon"])[0], "drain", 2)
    scheduler.schedule(2)
    assert scheduler.jobs["waiting"].reason.eta == 7200
    assert scheduler.reservation.start == 7200


def test_a_node_going_down_fails_notebooks_and_requeues_batch_jobs():
    scheduler = Scheduler(cluster(("n1", 4, "leaf"), ("n2", 4, "leaf")))
    scheduler.submit(job("batch", 4), 0)
    scheduler.submit(job("notebook", 4, kind="notebook"), 0)
    placements = started(scheduler.schedule(0))
    node_of = {j: names(scheduler, p)[0] for j, p in placements.items()}
    scheduler.set_node_state(node_of["batch"], "down", 10)
    decisions = scheduler.schedule(10)
    assert Stop("batch", f"node {node_of['batch']} is down", ended=True) in decisions
    batch = scheduler.jobs["batch"]
    assert batch.state == JobState.PENDING and batch.runs == 1
    assert batch.reason.family == "capacity"  # re-examined: the other node is busy
    scheduler.set_node_state(node_of["notebook"], "down", 20)
    scheduler.schedule(20)
    assert scheduler.jobs["notebook"].state == JobState.FAILED
    scheduler.set_node_state(node_of["batch"], "up", 30)
    assert "batch" in started(scheduler.schedule(30))
    assert scheduler.jobs["batch"].runs == 2


def test_cancel_pending_and_running_jobs():
    scheduler = Scheduler(cluster(("n1", 4, "leaf")))
    scheduler.submit(job("run", 4), 0)
    scheduler.submit(job("wait", 4, t=1), 1)
    scheduler.schedule(1)
    scheduler.cancel("wait", 2)
    assert scheduler.jobs["wait"].state == JobState.CANCELLED
    scheduler.cancel("run", 3)
    assert Stop("run", "cancelled") in scheduler.schedule(3)
    assert scheduler.jobs["run"].state == JobState.RUNNING  # until its processes are gone
    scheduler.job_ended("run", 4)
    assert scheduler.jobs["run"].state == JobState.CANCELLED
    assert scheduler.state.free_total == 4
