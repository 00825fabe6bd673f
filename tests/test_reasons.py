"""Every pending job says why (capacity, placement or policy); impossible jobs are rejected."""

from pathlib import Path

import pytest
from helpers import cluster, job, queues, run_replay, started

from jupyter_gpusched.core import JobState, Reason, Scheduler, reasons
from jupyter_gpusched.sim.cluster_loaders import load_cluster_spec, load_queue_spec
from jupyter_gpusched.sim.loaders import load_trace


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


def test_a_parent_queues_limit_names_the_jobs_own_queue_too():
    """The demo's case: alice's 1-GPU job in research/vision waits on research's limit, and her
    queues (api/me, the spawn form, the Lab) list research/vision, not research."""
    c = cluster(("n[1-2]", 8, "leaf"))
    tree = queues(
        {"research": {"guaranteed": 4, "limit": 8, "children": {"vision": {}, "nlp": {}}}}, c
    )
    scheduler = Scheduler(c, tree)
    scheduler.submit(job("nlp-run", 8, queue="research/nlp"), 0)
    scheduler.submit(job("vision", 1, queue="research/vision", t=1), 1)
    scheduler.schedule(1)
    assert scheduler.jobs["vision"].reason.message == (
        "queue research, above research/vision, is at its limit of 8 GPUs (8 in use, the job "
        "asks for 1)"
    )


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


# -- the catalogue (core/reasons.py) ---------------------------------------------------------
#: Each entry with sample arguments and the message the engine gave before the catalogue (the
#: f-strings it replaced): a template that renders anything else changes what users read. (The
#: GPU limit's has since said what the job asks, as the CPU and memory limits' do: "4 of 4 GPUs
#: ... (2 in use)" read as a contradiction.)
MESSAGES = [
    (
        reasons.QUEUE_LIMIT,
        {"queue": "vision", "limit": 12, "used": 10.5, "asks": 2},
        "queue vision is at its limit of 12 GPUs (10.5 in use, the job asks for 2)",
    ),
    (  # an ancestor's: named with the job's own queue, which alone the user sees listed
        reasons.QUEUE_ABOVE_LIMIT,
        {"queue": "research", "leaf": "research/vision", "limit": 8, "used": 8, "asks": 1},
        "queue research, above research/vision, is at its limit of 8 GPUs (8 in use, the job "
        "asks for 1)",
    ),
    (
        reasons.QUEUE_LIMIT,
        {"queue": "a", "limit": 1, "used": 0, "asks": 2},
        "queue a is at its limit of 1 GPU (0 in use, the job asks for 2)",
    ),
    (
        reasons.QUEUE_CPU_LIMIT,
        {"queue": "lab/a", "limit": 8.0, "used": 6.0, "asks": 4.0},
        "queue lab/a is at its limit of 8 CPUs (6 in use, the job asks for 4)",
    ),
    (
        reasons.QUEUE_MEMORY_LIMIT,
        {"queue": "lab", "limit": 64.0, "used": 60.0, "asks": 8.5},
        "queue lab is at its limit of 64 GB of memory (60 in use, the job asks for 8.5)",
    ),
    (
        reasons.QUEUE_ABOVE_CPU_LIMIT,
        {"queue": "lab", "leaf": "lab/b", "limit": 12.0, "used": 6.0, "asks": 7.0},
        "queue lab, above lab/b, is at its limit of 12 CPUs (6 in use, the job asks for 7)",
    ),
    (
        reasons.QUEUE_ABOVE_MEMORY_LIMIT,
        {"queue": "lab", "leaf": "lab/a", "limit": 64.0, "used": 60.0, "asks": 8.5},
        "queue lab, above lab/a, is at its limit of 64 GB of memory (60 in use, the job asks "
        "for 8.5)",
    ),
    (
        reasons.TIER1_GUARANTEE,
        {"queue": "a", "used": 4.0, "guaranteed": 4.0},
        "tier-1 jobs of a already use 4 of its 4 guaranteed GPUs",
    ),
    (
        reasons.USER_LIMIT_GPUS,
        {"user": "bob", "gpus": 2.0, "limit": 2.0},
        "bob already runs 2 GPUs; the limit per user is 2",
    ),
    (
        reasons.USER_LIMIT_JOBS,
        {"user": "bob", "count": 3, "limit": 3},
        "bob already runs 3 jobs; the limit per user is 3",
    ),
    (
        reasons.RESERVATION,
        {"job": "gang"},
        "the free GPUs it could use are reserved for job gang, which has priority; it would "
        "not end before that job starts",
    ),
    (
        reasons.RESERVATION_CPUS,
        {"cpus": 4.0, "memory_gb": 0, "job": "g"},
        "the nodes with 4 CPUs and 0 GB of memory free for it are reserved for job g, which "
        "needs them when it starts",
    ),
    (
        reasons.MAINTENANCE,
        {"walltime_h": 1.5},
        "the GPUs free for it are on nodes going into maintenance before its walltime of 1.5 h"
        " would end",
    ),
    (
        reasons.HELD,
        {},
        "held by an admin; it waits until released",
    ),
    (
        reasons.ARRAY_LIMIT,
        {"array": "a-000012", "limit": 8},
        "array a-000012 is at its limit of 8 running",
    ),
    (
        reasons.GPUS_BUSY,
        {"gpus": 0.5, "free": 0.0},
        "needs 0.5 GPUs; 0 free",
    ),
    (
        reasons.CPUS_BUSY,
        {"cpus": 2.0, "memory_gb": 16.0},
        "needs 2 CPUs and 16 GB of memory on one node; no node has them free",
    ),
    (
        reasons.FREED_SINCE_BACKFILL,
        {"gpus": 2, "free": 3, "within_s": 12, "job": "j-4"},
        "needs 2 GPUs; 3 free since the last backfill pass; the next one, within 12 s, checks "
        "whether it can start before job j-4",
    ),
    (
        reasons.PREEMPTING,
        {"victims": "a, b"},
        "pre-empting a, b; starts once they have checkpointed",
    ),
    (
        reasons.PREEMPTION_DROPPED,
        {},
        "its pre-emption was called off; it waits again",
    ),
    (
        reasons.PREEMPTED,
        {},
        "requeued after pre-emption",
    ),
    (
        reasons.NODE_DOWN,
        {"node": "n1"},
        "requeued: n1 went down",
    ),
    (
        reasons.FRAGMENTED,
        {"free": 8, "gpus": 8},
        "8 GPUs free, but no single node has 8 free",
    ),
    (
        reasons.GANG_SHAPE,
        {"free": 12, "nodes": 2, "per_node": 8},
        "12 GPUs free, but not 2 nodes with 8 each",
    ),
    (
        reasons.CONSTRAINTS,
        {"free": 1},
        "1 GPU free, but none in a shape that meets its constraints",
    ),
    (
        reasons.ONE_LEAF,
        {"free": 16, "patience_min": 2.5},
        "16 GPUs free, but not under one leaf switch; it waits for one for 2.5 min, then may "
        "span leaves",
    ),
    (
        reasons.LAUNCH_REFUSED,
        {"message": "Invalid node name {x}", "when": "00:01:00", "refusals": 1},
        "the launcher refused its placement (Invalid node name {x}); retried at 00:01:00 UTC "
        "(refusal 1 in a row)",
    ),
    (
        reasons.CANNOT_RUN,
        {"message": "asks for 9 GPUs"},
        "asks for 9 GPUs",
    ),
]


def test_every_catalogue_entry_renders_the_engines_former_message():
    assert {entry for entry, _, _ in MESSAGES} == set(reasons.CATALOGUE)
    for entry, args, message in MESSAGES:
        reason = entry.reason(**args)
        assert (reason.family, reason.detail, reason.message) == (
            entry.family,
            entry.detail,
            message,
        )
        assert dict(reason.args) == args and reasons.entry_of(reason) is entry
        assert reason.with_eta(5.0).eta == 5.0 and reason.with_eta(5.0).message == message


def test_a_reason_outside_the_catalogue_is_refused():
    with pytest.raises(ValueError, match="catalogue"):
        Reason("capacity", "too-busy", "made up")
    with pytest.raises(ValueError, match="catalogue"):
        Reason("policy", "gpus-busy", "a known detail in the wrong family")


def test_hiding_users_replaces_the_user_arguments_only():
    """By argument, not by text: user "a"'s name is hidden, the "a" of "already" is not."""
    reason = reasons.USER_LIMIT_JOBS.reason(user="a", count=1, limit=1)
    assert reason.render() == "a already runs 1 jobs; the limit per user is 1"
    assert (
        reason.render(hide_users=True) == "its owner already runs 1 jobs; the limit per user is 1"
    )
    queue = reasons.QUEUE_LIMIT.reason(queue="a", limit=2, used=2, asks=1)
    assert queue.render(hide_users=True) == queue.message  # a queue is no user


def test_the_reason_table_of_the_docs_is_the_catalogues():
    """docs/engine.md holds the table ``make docs`` writes from the catalogue."""
    docs = (Path(__file__).parent.parent / "docs" / "engine.md").read_text()
    assert reasons.with_table(docs) == docs, "run `make docs`: docs/engine.md is out of date"
    for entry in reasons.CATALOGUE:
        assert f"| `{entry.family}` | `{entry.detail}` |" in docs


def test_the_reasons_of_a_replay_come_from_the_catalogue():
    """Every job of the example trace that waited has a first reason its entry renders again
    from its arguments (nothing built a message outside the catalogue)."""
    root = Path(__file__).parent.parent / "examples"
    c = load_cluster_spec(str(root / "cluster.yaml")).cluster
    trace = load_trace(root / "trace.csv").jobs
    tree = load_queue_spec(str(root / "queues.yaml"), c, trace)
    result, _ = run_replay(trace, c, tree)
    waited = [job.first_reason for job in result.scheduler.jobs.values() if job.first_reason]
    assert len({r.detail for r in waited}) >= 3, waited
    for reason in waited:
        assert reasons.entry_of(reason).render(dict(reason.args)) == reason.message


def test_a_reused_reason_reads_as_its_arguments_do():
    """Entries reuse the Reason built for the same arguments; 8 and 8.0 are equal, yet read
    differently where the template has no number format."""
    assert reasons.FRAGMENTED.reason(free=8, gpus=8) is reasons.FRAGMENTED.reason(free=8, gpus=8)
    whole, real = (
        reasons.FRAGMENTED.reason(free=8, gpus=8),
        reasons.FRAGMENTED.reason(free=8, gpus=8.0),
    )
    assert (whole.message, real.message) == (
        "8 GPUs free, but no single node has 8 free",
        "8 GPUs free, but no single node has 8.0 free",
    )
