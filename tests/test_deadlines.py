"""core/deadlines.py on small hand-made clusters: urgency (order and reclaim), misses (kept,
cancelled), Slurm's ``--deadline`` for the ``slurm`` baseline, and the earliest finish a
submission is checked with."""

from __future__ import annotations

import pickle

import pytest
from helpers import cluster, job, preempted, queues, started

from jupyter_gpusched.core import PolicySettings, Scheduler
from jupyter_gpusched.core.decisions import DeadlineMissed, Stop
from jupyter_gpusched.core.errors import ConfigError
from jupyter_gpusched.core.estimate import earliest_finish
from jupyter_gpusched.core.jobs import JobState


def two_nodes(policy="gpusched", **settings) -> Scheduler:
    """16 GPUs, all held by ``long`` until 3600 (its walltime)."""
    sched = Scheduler(
        cluster(("n[1-2]", 8, "leaf-1")),
        settings=PolicySettings().replace(**settings),
        policy=policy,
    )
    sched.submit(job("long", 16, walltime=3600), 0)
    sched.schedule(0)
    return sched


def order(sched: Scheduler, now: float) -> list[str]:
    return [j.id for j in sched.pending_jobs(now)]


def test_a_deadline_job_waits_its_turn_until_urgent_then_goes_first():
    sched = two_nodes()
    sched.submit(job("b", 16, t=1, walltime=600), 1)
    # latest start 3900 - 600 = 3300... deadline 4500, run time 600: latest start 3900,
    # urgent from 3900 - 1.0 x 600 = 3300
    sched.submit(job("c", 16, t=2, walltime=600, deadline=4500), 2)
    sched.schedule(2)
    assert order(sched, 2) == ["b", "c"]  # not urgent yet: fair share and age decide
    assert sched.next_wakeup() <= 3300
    sched.schedule(3299)
    assert order(sched, 3299) == ["b", "c"]
    sched.schedule(3300)
    assert order(sched, 3300) == ["c", "b"]
    sched.job_ended("long", 3600)
    assert list(started(sched.schedule(3600))) == ["c"]
    assert sched.jobs["c"].first_reason.family == "capacity"


def test_urgent_jobs_go_least_slack_first_and_tiers_stay_strict():
    sched = two_nodes()
    # both urgent at once (slack below their run time): latest starts 400 and 300
    sched.submit(job("loose", 16, t=1, walltime=600, deadline=1000), 1)
    sched.submit(job("tight", 16, t=2, walltime=1200, deadline=1500), 2)
    sched.submit(job("t1", 8, t=3, tier=1, walltime=600), 3)
    sched.submit(job("t3", 16, t=4, tier=3, walltime=60, deadline=1000), 4)
    sched.schedule(4)
    assert order(sched, 4) == ["t1", "tight", "loose", "t3"]


def test_an_admins_priority_still_ranks_above_urgency():
    sched = two_nodes()
    sched.submit(job("urgent", 16, t=1, walltime=600, deadline=1000), 1)
    sched.submit(job("pushed", 16, t=2, walltime=600), 2)
    sched.schedule(2)
    sched.set_priority("pushed", 10, 3)
    sched.schedule(3)
    assert order(sched, 3) == ["pushed", "urgent"]


def reclaim_case(deadline=None, guaranteed=4):
    """8 GPUs; team b (tier 2) runs two 4-GPU jobs, borrowing 4 of team a's guarantee."""
    c = cluster(("n1", 8, "leaf-1"))
    tree = queues({"a": {"guaranteed": guaranteed}, "b": {"guaranteed": 8 - guaranteed}}, c)
    sched = Scheduler(c, tree)
    sched.submit(job("b1", 4, queue="b", walltime=86400), 0)
    sched.submit(job("b2", 4, queue="b", walltime=86400), 0)
    sched.schedule(0)
    sched.submit(job("a3", 4, t=1000, queue="a", tier=3, walltime=600, deadline=deadline), 1000)
    return sched


def test_an_urgent_tier3_job_reclaims_its_queues_guarantee():
    # deadline 5000, run time 600: urgent from 3800
    sched = reclaim_case(deadline=5000)
    assert not preempted(sched.schedule(1000))  # not urgent: tier 3 never pre-empts
    assert sched.jobs["a3"].state == JobState.PENDING
    decisions = sched.schedule(3800)
    victims = preempted(decisions)
    assert len(victims) == 1 and victims[0].by == "a3"
    assert victims[0].job_id in ("b1", "b2")  # one: b stays at its guarantee (4)


def test_an_urgent_tier3_job_never_pre_empts_beyond_its_guarantee():
    sched = reclaim_case(deadline=5000, guaranteed=0)  # a guarantees nothing: nothing to reclaim
    sched.schedule(1000)
    assert not preempted(sched.schedule(3800))
    assert not preempted(sched.schedule(4400))
    assert sched.jobs["a3"].state == JobState.PENDING


def test_a_tier3_job_without_a_deadline_never_pre_empts():
    sched = reclaim_case(deadline=None)
    for now in (1000, 3800, 50000):
        assert not preempted(sched.schedule(now))


def test_a_miss_is_reported_once_and_the_job_kept_by_default():
    sched = two_nodes()
    sched.submit(job("late", 16, t=1, walltime=600, deadline=2000), 1)
    sched.schedule(1)
    decisions = sched.schedule(2000)
    assert [d for d in decisions if isinstance(d, DeadlineMissed)] == [
        DeadlineMissed("late", 2000, "kept")
    ]
    assert sched.jobs["late"].deadline_missed
    assert sched.jobs["late"].state == JobState.PENDING
    assert sched.jobs["late"].reason is not None  # still its one reason (invariant 6)
    sched.job_ended("long", 3600)
    decisions = sched.schedule(3600)
    assert list(started(decisions)) == ["late"]
    assert not [d for d in decisions if isinstance(d, DeadlineMissed)]


def test_on_miss_cancel_cancels_a_pending_job_and_stops_a_running_one():
    sched = two_nodes(deadline_on_miss="cancel")
    sched.submit(job("waits", 16, t=1, walltime=600, deadline=2000), 1)
    sched.schedule(1)
    decisions = sched.schedule(2000)
    assert DeadlineMissed("waits", 2000, "cancelled") in decisions
    assert sched.jobs["waits"].state == JobState.CANCELLED
    # a running job: stopped at its deadline
    sched.submit(job("runs", 8, t=2001, walltime=600, deadline=3000), 2001)
    sched.job_ended("long", 2001)
    assert "runs" in started(sched.schedule(2001))
    decisions = sched.schedule(3000)
    assert DeadlineMissed("runs", 3000, "cancelled") in decisions
    assert Stop("runs", "deadline missed") in decisions
    sched.job_ended("runs", 3001)
    assert sched.jobs["runs"].state == JobState.CANCELLED


def test_the_slurm_baseline_cancels_a_pending_job_at_its_latest_start_only():
    sched = two_nodes(policy="slurm")
    sched.submit(job("b", 16, t=1, walltime=600), 1)
    sched.submit(job("c", 16, t=2, walltime=600, deadline=4500), 2)
    sched.schedule(2)
    sched.schedule(3300)
    assert order(sched, 3300) == ["b", "c"]  # no urgency under Slurm
    decisions = sched.schedule(3900)  # its latest start: it can no longer end in time
    assert DeadlineMissed("c", 4500, "cancelled") in decisions
    assert sched.jobs["c"].state == JobState.CANCELLED
    # one whose latest start has passed at submission goes at once
    sched.submit(job("hopeless", 8, t=3901, walltime=600, deadline=4000), 3901)
    assert DeadlineMissed("hopeless", 4000, "cancelled") in sched.schedule(3901)
    # a running job is left to finish
    sched = two_nodes(policy="slurm")
    sched.submit(job("r", 8, t=3300, walltime=600, deadline=4000), 3300)
    sched.job_ended("long", 3300)
    assert "r" in started(sched.schedule(3300))
    decisions = sched.schedule(4000)
    assert DeadlineMissed("r", 4000, "kept") in decisions
    assert not [d for d in decisions if isinstance(d, Stop)]


def test_fifo_ignores_deadlines_but_reports_misses():
    sched = two_nodes(policy="fifo")
    sched.submit(job("b", 16, t=1, walltime=600), 1)
    sched.submit(job("c", 16, t=2, walltime=600, deadline=4500), 2)
    sched.schedule(4000)
    assert order(sched, 4000) == ["b", "c"]
    assert DeadlineMissed("c", 4500, "kept") in sched.schedule(4500)


def test_earliest_finish_is_the_engines_answer_and_changes_nothing():
    sched = two_nodes()
    sched.submit(job("b", 16, t=1, walltime=600), 1)
    sched.schedule(1)
    before = pickle.dumps(sched)
    # behind b's reservation at 3600 (all 16 GPUs): the optimistic bound is a reservation of
    # its own (were it first in line, as an urgent job may become), not after b's run
    assert earliest_finish(sched, job("y", 16, t=5, walltime=600), 5) == 3600 + 600
    assert earliest_finish(sched, job("z", 64, t=5, walltime=600), 5) is None  # never fits
    assert pickle.dumps(sched) == before


def test_earliest_finish_of_a_job_that_fits_now():
    sched = Scheduler(cluster(("n1", 8, "leaf-1")))
    assert earliest_finish(sched, job("x", 4, t=5, walltime=900), 5) == 905


def test_the_policy_file_reads_the_deadline_settings():
    settings = PolicySettings.from_dict({"deadlines": {"urgency": 0.5, "on_miss": "cancel"}})
    assert (settings.deadline_urgency, settings.deadline_on_miss) == (0.5, "cancel")
    with pytest.raises(ConfigError, match=r"deadlines\.on_miss"):
        PolicySettings.from_dict({"deadlines": {"on_miss": "kill"}})
    with pytest.raises(ConfigError, match="deadlines"):
        PolicySettings.from_dict({"deadlines": {"urgent": 1}})


def test_decisions_with_deadlines_are_deterministic():
    def run():
        sched = two_nodes()
        out = []
        for i in range(12):
            deadline = None if i % 3 else 500.0 * (i + 4)
            sched.submit(job(f"j{i}", 4 * (1 + i % 4), t=i, walltime=300, deadline=deadline), i)
        now = 0.0
        while now < 20000:
            out.extend(repr(d) for d in sched.schedule(now))
            for jid in list(sched.running):
                if sched.running[jid].start_time + 300 <= now:
                    sched.job_ended(jid, now)
            now += 100
        return out

    assert run() == run()


def test_the_tier2_job_an_urgent_job_reclaimed_from_does_not_pre_empt_it_back():
    # (the property suite found this: as a plain tier-3 victim, the urgent job and the tier-2
    # job it had reclaimed from pre-empted each other in turns)
    sched = reclaim_case(deadline=5000)
    sched.schedule(1000)
    [victim] = preempted(sched.schedule(3800))
    sched.job_ended(victim.job_id, 3800 + victim.grace, "preempted")
    decisions = sched.schedule(3800 + victim.grace)
    assert "a3" in started(decisions)
    assert not preempted(decisions)
    assert sched.jobs[victim.job_id].state == JobState.PENDING  # requeued, tier 2, wants back in
    for now in (5000, 10000, 50000):
        assert not preempted(sched.schedule(now))
    assert sched.jobs["a3"].state == JobState.RUNNING


def test_a_restored_running_job_is_still_watched_for_its_deadline():
    from jupyter_gpusched.core.state import Part, Placement

    sched = Scheduler(cluster(("n1", 8, "leaf-1")))
    running = job("r", 8, walltime=600, deadline=1000)
    running.start_time, running.runs, running.first_start = 100.0, 1, 100.0
    sched.restore(running, Placement((Part(node=0, mask=255),)), 200)
    sched.schedule(200)
    assert DeadlineMissed("r", 1000, "kept") in sched.schedule(1000)


def test_an_urgent_job_requeued_after_its_node_went_down_is_still_urgent():
    sched = two_nodes()
    sched.job_ended("long", 10)
    sched.submit(job("u", 8, t=10, walltime=600, deadline=1200), 10)  # urgent at once
    assert "u" in started(sched.schedule(10))
    sched.submit(job("filler", 16, t=20, walltime=600), 20)
    sched.schedule(20)
    node = sched.cluster.nodes[next(iter(sched.state.allocations["u"].nodes))].name
    sched.set_node_state(node, "down", 30)
    assert sched.jobs["u"].state == JobState.PENDING
    assert "u" in sched.priorities.urgent
    assert order(sched, 30) == ["u", "filler"]


def test_an_urgent_job_requeued_after_its_node_went_down_leaves_the_queue_when_cancelled():
    # it was queued in the list of jobs that are not urgent, then made urgent: cancelling it
    # looked in the urgent list, missed it, and left it queued (the property suite found it)
    sched = two_nodes()
    sched.job_ended("long", 10)
    sched.submit(job("u", 8, t=10, walltime=600, deadline=1200), 10)
    assert "u" in started(sched.schedule(10))
    node = sched.cluster.nodes[next(iter(sched.state.allocations["u"].nodes))].name
    sched.set_node_state(node, "down", 30)
    assert order(sched, 30) == ["u"]
    sched.cancel("u", 40)
    sched.schedule(40)
    assert len(sched.pending) == 0 and list(sched.pending.ordered()) == []
    assert sched.jobs["u"].state == JobState.CANCELLED and sched.jobs["u"].reason is None
