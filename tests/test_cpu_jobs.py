"""Jobs without GPUs (``gpus: 0``): placed by CPUs and memory, bounded by the queues' CPU and
memory limits, never pre-empting or pre-empted, and never in a GPU job's way (core/resources.py)."""

import math

import pytest
from helpers import cluster, job, names, preempted, queues, started

from jupyter_gpusched.core import JobState, PolicySettings, QueueTree, Scheduler
from jupyter_gpusched.core.errors import ConfigError
from jupyter_gpusched.core.settings import TierSettings


def test_a_cpu_only_job_goes_to_a_node_with_the_cpus_and_holds_no_gpu():
    c = cluster(("small", 8, "leaf", {"cpus": 8}), ("big", 8, "leaf", {"cpus": 64}))
    scheduler = Scheduler(c)
    scheduler.submit(job("cpu", 0, cpus=16, memory_gb=4, kind="notebook"), 0)
    placement = started(scheduler.schedule(0))["cpu"]
    assert names(scheduler, placement) == ["big"]
    assert placement.gpus == 0 and placement.parts[0].cpus == 16
    assert scheduler.state.free_total == 16  # every GPU still free
    assert scheduler.state.cpu_free[c.node("big").index] == 48


def test_a_cpu_only_job_prefers_the_node_with_the_fewest_free_gpus():
    c = cluster(("n[1-2]", 8, "leaf", {"cpus": 32}))
    scheduler = Scheduler(c)
    scheduler.submit(job("gpu", 6, cpus=4), 0)
    first = names(scheduler, started(scheduler.schedule(0))["gpu"])
    scheduler.submit(job("cpu", 0, cpus=4, t=1), 1)
    assert names(scheduler, started(scheduler.schedule(1))["cpu"]) == first


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({}, "cpus"),
        ({"cpus": 0, "memory_gb": 0}, "cpus"),
        ({"cpus": 2, "gpus_per_node": 1}, "gpus_per_node"),
        ({"cpus": 2, "gpu_models": frozenset({"A100"})}, "gpu_model"),
    ],
)
def test_a_cpu_only_request_must_ask_for_cpus_or_memory_and_no_gpu_shape(fields, field):
    scheduler = Scheduler(cluster(("n1", 8, "leaf")))
    with pytest.raises(ConfigError) as caught:
        scheduler.submit(job("bad", 0, **fields), 0)
    assert caught.value.field == field


def test_a_cpu_only_job_no_node_can_hold_is_rejected():
    scheduler = Scheduler(cluster(("n[1-2]", 8, "leaf", {"cpus": 16})))
    scheduler.submit(job("huge", 0, cpus=24), 0)  # 32 CPUs in all, but 16 on each node
    huge = scheduler.jobs["huge"]
    assert huge.state == JobState.REJECTED
    assert huge.reject_field == "cpus" and "no node has 24 CPUs" in huge.reject_reason


def cpu_limited(c):
    return queues(
        {
            "lab": {
                "cpus": {"limit": 12},
                "children": {"a": {"cpus": {"limit": 8}}, "b": {}},
            },
            "other": {"memory_gb": {"limit": 10}},
        },
        c,
    )


def test_a_cpu_only_job_waits_at_its_queue_cpu_limit_then_starts():
    c = cluster(("n1", 8, "leaf", {"cpus": 64, "memory_gb": 256}))
    scheduler = Scheduler(c, cpu_limited(c))
    scheduler.submit(job("a1", 0, cpus=6, queue="lab/a"), 0)
    scheduler.submit(job("a2", 0, cpus=4, queue="lab/a", t=1), 1)
    assert set(started(scheduler.schedule(1))) == {"a1"}
    reason = scheduler.jobs["a2"].reason
    assert (reason.family, reason.detail) == ("policy", "queue-cpu-limit")
    assert reason.message == "queue lab/a is at its limit of 8 CPUs (6 in use, the job asks for 4)"
    # the parent's limit bounds its children together: b has no limit of its own
    scheduler.submit(job("b1", 1, cpus=7, queue="lab/b", t=2), 2)
    assert started(scheduler.schedule(2)) == {}
    assert scheduler.jobs["b1"].reason.message == (  # named with b1's own queue, as users see it
        "queue lab, above lab/b, is at its limit of 12 CPUs (6 in use, the job asks for 7)"
    )
    scheduler.job_ended("a1", 3)
    assert set(started(scheduler.schedule(3))) == {"a2", "b1"}
    assert scheduler.tree.get("lab").cpus_running == 11


def test_a_queue_memory_limit_holds_jobs_and_a_job_over_it_is_rejected():
    c = cluster(("n1", 8, "leaf", {"cpus": 64, "memory_gb": 256}))
    scheduler = Scheduler(c, cpu_limited(c))
    scheduler.submit(job("m1", 0, memory_gb=8, queue="other"), 0)
    scheduler.submit(job("m2", 0, memory_gb=4, queue="other"), 0)
    scheduler.submit(job("m3", 0, memory_gb=11, queue="other"), 0)
    assert set(started(scheduler.schedule(0))) == {"m1"}
    assert scheduler.jobs["m2"].reason.detail == "queue-memory-limit"
    m3 = scheduler.jobs["m3"]
    assert m3.state == JobState.REJECTED and m3.reject_field == "memory_gb"
    assert "more than queue other's limit of 10" in m3.reject_reason


def test_queue_cpu_limits_are_checked_in_the_queue_file():
    with pytest.raises(ConfigError) as caught:
        QueueTree.from_dict({"queues": {"lab": {"cpus": 8}}}, 8)
    assert caught.value.field == "cpus" and "{limit: 16}" in caught.value.message
    with pytest.raises(ConfigError) as caught:
        QueueTree.from_dict({"queues": {"lab": {"memory_gb": {"limit": -1}}}}, 8)
    assert caught.value.field == "memory_gb"


def quick_preemption():
    return PolicySettings(tiers={tier: TierSettings(0, 0) for tier in (1, 2, 3)})


def test_a_cpu_only_job_is_never_pre_empted_for_gpus():
    c = cluster(("n1", 8, "leaf", {"cpus": 32}))
    scheduler = Scheduler(c, settings=quick_preemption())
    scheduler.submit(job("gpu3", 8, tier=3), 0)
    scheduler.submit(job("cpu3", 0, cpus=8, tier=3), 0)
    assert set(started(scheduler.schedule(0))) == {"gpu3", "cpu3"}
    scheduler.submit(job("urgent", 8, tier=1, cpus=16, t=10), 10)
    signals = preempted(scheduler.schedule(10))
    assert [d.job_id for d in signals] == ["gpu3"]


def test_a_cpu_only_job_short_of_cpus_pre_empts_nothing():
    c = cluster(("n1", 8, "leaf", {"cpus": 8}))
    scheduler = Scheduler(c, settings=quick_preemption())
    scheduler.submit(job("cpu3", 0, cpus=8, tier=3), 0)
    scheduler.schedule(0)
    scheduler.submit(job("cpu1", 0, cpus=4, tier=1, t=10), 10)
    assert preempted(scheduler.schedule(10)) == []
    reason = scheduler.jobs["cpu1"].reason
    assert (reason.family, reason.detail) == ("capacity", "cpus-busy")


def test_a_blocked_cpu_only_job_does_not_use_up_the_backfill_depth():
    c = cluster(("n1", 8, "leaf", {"cpus": 16}))
    scheduler = Scheduler(c, settings=PolicySettings(backfill_depth=1))
    scheduler.submit(job("gpu", 8, cpus=0), 0)
    scheduler.submit(job("cpu", 0, cpus=16), 0)
    scheduler.schedule(0)
    scheduler.submit(job("cpu-waits", 0, cpus=8, tier=1, t=1), 1)
    scheduler.submit(job("gpu-next", 4, t=1), 1)
    scheduler.schedule(1)
    scheduler.job_ended("gpu", 2)  # a full pass: cpu-waits comes first and is blocked
    assert set(started(scheduler.schedule(2))) == {"gpu-next"}


def test_a_cpu_only_job_leaves_a_reserved_gang_the_cpus_it_needs():
    c = cluster(
        ("n1", 8, "leaf", {"cpus": 16, "labels": {"slot": "a"}}),
        ("n2", 8, "leaf", {"cpus": 16, "labels": {"slot": "b"}}),
    )
    scheduler = Scheduler(c)
    scheduler.submit(job("x", 4, walltime=3600, labels={"slot": "a"}), 0)
    scheduler.submit(job("y", 4, walltime=3600, labels={"slot": "b"}), 0)
    scheduler.schedule(0)
    assert scheduler.state.free == [4, 4]
    scheduler.submit(job("gang", 8, cpus=16, t=1), 1)
    scheduler.schedule(1)
    reservation = scheduler.reservation
    assert reservation is not None and reservation.job_id == "gang"
    (reserved,) = reservation.nodes
    # long CPU-only jobs: the first fits beside the reservation, the second only on its node
    scheduler.submit(job("c1", 0, cpus=12, walltime=86400, t=2), 2)
    scheduler.submit(job("c2", 0, cpus=8, walltime=86400, t=2), 2)
    placements = started(scheduler.schedule(2))
    assert set(placements) == {"c1"} and placements["c1"].nodes != (reserved,)
    reason = scheduler.jobs["c2"].reason
    assert (reason.family, reason.detail) == ("policy", "reservation")
    assert "reserved for job gang" in reason.message
    for running in ("x", "y"):
        scheduler.job_ended(running, 3600)
    assert names(scheduler, started(scheduler.schedule(3600))["gang"]) == [c.nodes[reserved].name]


def test_a_trace_row_with_0_gpus_replays_as_a_cpu_only_job(tmp_path):
    from helpers import run_replay

    from jupyter_gpusched.sim.trace import read_trace

    trace = tmp_path / "trace.csv"
    trace.write_text(
        "job_id,submit_time,duration,gpus,cpus,memory_gb\n"
        "gpu,0,100,8,4,\n"
        "cpu,0,50,0,12,8\n"
        "late,10,50,0,,64\n"
    )
    jobs = read_trace(trace)
    assert [(j.id, j.gpus) for j in jobs] == [("gpu", 8), ("cpu", 0), ("late", 0)]
    c = cluster(("n1", 8, "leaf", {"cpus": 16, "memory_gb": 64}))
    _, rows = run_replay(jobs, c)
    assert {r["state"] for r in rows.values()} == {"completed"}
    # the GPU job and the first CPU job fit together; the second waits for the memory
    assert float(rows["cpu"]["start_time"]) == 0 and float(rows["late"]["start_time"]) == 50


def test_an_edited_queue_file_changes_the_cpu_limit_at_run_time():
    c = cluster(("n1", 8, "leaf", {"cpus": 64}))
    scheduler = Scheduler(c, cpu_limited(c))
    scheduler.submit(job("a1", 0, cpus=8, queue="lab/a"), 0)
    scheduler.submit(job("a2", 0, cpus=2, queue="lab/a", t=1), 1)
    assert set(started(scheduler.schedule(1))) == {"a1"}
    edited = queues(
        {
            "lab": {"cpus": {"limit": 12}, "children": {"a": {"cpus": {"limit": 10}}, "b": {}}},
            "other": {},
        },
        c,
    )
    scheduler.update_quotas(edited, 2)
    assert scheduler.tree.get("lab/a").cpu_limit == 10
    assert scheduler.tree.get("other").memory_limit == math.inf
    assert set(started(scheduler.schedule(2))) == {"a2"}


def test_cpus_claimed_by_a_pre_empting_job_count_against_the_queue_cpu_limit():
    c = cluster(("n1", 8, "leaf", {"cpus": 64}))
    tree = queues({"lab": {"guaranteed": 8, "cpus": {"limit": 8}}}, c)
    grace = PolicySettings(
        tiers={1: TierSettings(0, 0), 2: TierSettings(0, 0), 3: TierSettings(30, 0)}
    )
    scheduler = Scheduler(c, tree, grace)
    scheduler.submit(job("victim", 8, tier=3, queue="lab"), 0)
    scheduler.schedule(0)
    scheduler.submit(job("gpus", 8, cpus=6, queue="lab", t=10), 10)
    assert [d.job_id for d in preempted(scheduler.schedule(10))] == ["victim"]
    # while the victim finishes, the pre-empting job's 6 CPUs are promised: 4 more would pass 8
    scheduler.submit(job("cpu", 0, cpus=4, queue="lab", t=11), 11)
    assert started(scheduler.schedule(11)) == {}
    assert scheduler.jobs["cpu"].reason.detail == "queue-cpu-limit"
    scheduler.job_ended("victim", 40, "preempted")
    assert set(started(scheduler.schedule(40))) == {"gpus"}
    assert scheduler.tree.get("lab").cpus_running == 6


def test_a_job_over_its_cpu_limit_does_not_reclaim_gpus_for_its_gpu_limit():
    c = cluster(("n1", 8, "leaf", {"cpus": 64}))
    tree = queues(
        {
            "dept": {
                "guaranteed": 8,
                "limit": 8,
                "children": {"a": {"guaranteed": 6, "cpus": {"limit": 4}}, "b": {"guaranteed": 2}},
            }
        },
        c,
    )
    scheduler = Scheduler(c, tree, quick_preemption())
    scheduler.submit(job("borrowed", 8, queue="dept/b"), 0)  # b borrows all of dept's 8
    scheduler.submit(job("cpus", 0, cpus=4, queue="dept/a"), 0)  # a's 4 CPUs in use
    scheduler.schedule(0)
    scheduler.submit(job("needs", 2, cpus=2, queue="dept/a", t=700), 700)
    assert preempted(scheduler.schedule(700)) == []
    assert scheduler.jobs["needs"].reason.detail == "queue-cpu-limit"
