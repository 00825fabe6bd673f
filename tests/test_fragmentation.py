"""FGD placement: the fragmentation measure, the workload it is weighed by, and the choices it
makes on hand-made nodes where the right one is known."""

import math
import random

import pytest
from helpers import cluster, job, names, started, trace_job

from jupyter_gpusched.core import ConfigError, PolicySettings, Scheduler
from jupyter_gpusched.core.fragmentation import Fragmentation
from jupyter_gpusched.core.fragmentation_scores import fragmentation, usable_by
from jupyter_gpusched.core.state import Part, Placement
from jupyter_gpusched.core.workload import TaskType, Workload, task_type
from jupyter_gpusched.sim.pack import pack

WHOLE = TaskType(1, 1.0, None, (), 0.0, 0.0)
HALF = TaskType(1, 0.5, None, (), 0.0, 0.0)


# -- the measure --------------------------------------------------------------------------------
def test_free_shares_too_small_for_a_type_are_its_fragment():
    rooms = (0.2, 0.5, 1.0)
    # whole GPUs: the two partly used GPUs (0.7); halves: only the 0.2 share
    types = [(WHOLE, 0.5), (HALF, 0.5)]
    assert fragmentation("A100", {}, rooms, 8.0, 64.0, types) == pytest.approx(
        0.5 * 0.7 + 0.5 * 0.2
    )


@pytest.mark.parametrize(
    "kind",
    [
        TaskType(1, 0.5, None, (), 16.0, 0.0),  # more CPUs than the node has free
        TaskType(1, 0.5, None, (), 0.0, 128.0),  # more memory
        TaskType(1, 0.5, ("H100",), (), 0.0, 0.0),  # another GPU model
        TaskType(1, 0.5, None, (("zone", "b"),), 0.0, 0.0),  # a label the node lacks
        TaskType(2, 1.0, None, (), 0.0, 0.0),  # two whole GPUs; one is free
    ],
)
def test_a_type_that_cannot_run_there_sees_all_free_share_as_fragment(kind):
    rooms = (0.2, 0.5, 1.0)
    assert fragmentation("A100", {}, rooms, 8.0, 64.0, [(kind, 1.0)]) == pytest.approx(1.7)


def test_usable_share_for_gangs_of_whole_gpus():
    two = TaskType(2, 1.0, None, (), 4.0, 0.0)
    assert usable_by(two, (0.5, 1.0, 1.0), 8.0, 0.0) == 2.0
    assert usable_by(two, (0.5, 1.0, 1.0), 2.0, 0.0) == 0.0  # CPUs


def test_usable_share_counts_the_tasks_the_cpus_and_memory_hold():
    """Eight free GPUs with CPUs for one more task are one usable GPU, not eight (the paper
    counts all eight once a single task fits)."""
    hungry = TaskType(1, 1.0, None, (), 12.0, 0.0)
    assert usable_by(hungry, (1.0,) * 8, 20.0, 0.0) == 1.0
    assert usable_by(hungry, (1.0,) * 8, 96.0, 0.0) == 8.0
    # shares: two 0.47s fit on each GPU (0.06 left over on each), CPUs for three
    share = TaskType(1, 0.47, None, (), 10.0, 4.0)
    assert usable_by(share, (1.0, 1.0), 35.0, 64.0) == pytest.approx(3 * 0.47)
    assert usable_by(share, (1.0, 1.0), 99.0, 64.0) == pytest.approx(4 * 0.47)
    assert usable_by(share, (1.0, 1.0), 99.0, 8.0) == pytest.approx(2 * 0.47)  # memory
    assert usable_by(share, (1.0, 1.0), math.inf, math.inf) == pytest.approx(4 * 0.47)


def _random_measure(rng):
    """A measure over nodes of 1 to 8 GPUs (one kind) and a random workload, with types that
    ask no CPUs or no memory and tiny shares among them."""
    c = cluster(*[(f"n{g}", g, "leaf", {"cpus": 64, "memory_gb": 256}) for g in (1, 2, 4, 7, 8)])
    workload = Workload(8)
    shapes = (
        [
            TaskType(rng.choice([1, 1, 2, 4]), 1.0, None, (), rng.choice([0.0, 2.0, 6.0]), 16.0)
            for _ in range(6)
        ]
        + [
            TaskType(1, rng.choice([0.001, 0.1, 0.25, 0.7]), None, (), rng.choice([0.0, 4.0]), 8.0)
            for _ in range(6)
        ]
        + [TaskType(1, 0.001, None, (), 0.0, 0.0), TaskType(1, 0.1, None, (), 0.0, 0.0)]
    )
    weights = [rng.random() for _ in shapes]
    workload.types = tuple((k, w / sum(weights)) for k, w in zip(shapes, weights, strict=True))
    workload.version += 1
    measure = Fragmentation(c, workload).measure
    measure.refresh()
    return measure, workload


def _random_conditions(rng, count):
    out = []
    for _ in range(count):
        gpus = rng.choice([1, 2, 4, 8])
        rooms = tuple(
            sorted(rng.choice([0.0, 0.1, 0.3, 0.47, 0.5, 0.75, 1.0]) for _ in range(gpus))
        )
        cpus, memory = rng.choice([0.0, -1e-10, rng.uniform(0, 64)]), rng.uniform(0, 256)
        if rng.random() < 0.1:
            cpus = memory = math.inf  # a node that does not say
        out.append((rooms, cpus, memory))
    return out


def test_the_engine_scores_nodes_as_the_definition_says():
    """The vectorised sums the engine uses equal sum_m p_m A_n(m) (no model constraints, so the
    weights are the popularities), CPUs and memory free or not, on nodes of any size."""
    rng = random.Random(7)
    measure, workload = _random_measure(rng)
    # a type that asks no CPUs fits any number of times, also where no CPUs are left
    conditions = [((1.0,) * 8, 0.0, 0.0), ((1.0,) * 8, -1e-10, 256.0)]
    for rooms, cpus, memory in conditions + _random_conditions(rng, 300):
        expected = sum(p * usable_by(k, rooms, cpus, memory) for k, p in workload.types)
        assert measure.usable(0, rooms, cpus, memory) == pytest.approx(expected)


def _single_type_measure(_rng):
    c = cluster(*[(f"n{g}", g, "leaf", {"cpus": 64, "memory_gb": 256}) for g in (1, 2, 4, 7, 8)])
    workload = Workload(8)
    workload.types = ((TaskType(1, 0.1, None, (), 4.0, 0.0), 1.0),)
    workload.version += 1
    measure = Fragmentation(c, workload).measure
    measure.refresh()
    return measure, workload


@pytest.mark.parametrize("make", [_random_measure, _single_type_measure])
def test_a_condition_scores_the_same_alone_and_in_any_batch(make):
    """A condition's value never depends on what it is computed with (nodes of other sizes), so
    choices do not depend on which classes happen to be scored together."""
    rng = random.Random(11)
    measure, _ = make(random.Random(3))
    # a 7-GPU node's sum is the sum of 8 numbers when an 8-GPU node is in the batch: summed in
    # another order, 5.000000000000001 became 5.0
    conditions = [((0.1, 0.6, 0.7, 0.9, 0.9, 0.9, 0.9), 64.0, 256.0), ((1.0,) * 8, 64.0, 256.0)]
    conditions += _random_conditions(rng, 200)
    usable, stranded = measure._evaluate(0, conditions)
    for condition, value, strand in zip(conditions, usable, stranded, strict=True):
        assert measure.usable(0, *condition) == value
        assert measure.stranded(0, *condition[:2]) == strand


def test_a_tiny_share_does_not_break_the_scores():
    c = cluster(("n1", 8, "leaf"), ("n2", 8, "leaf"))
    scheduler = Scheduler(c)
    _hold(scheduler, 40, gpu_fraction=0.0004)  # a type of share 0.001 (never 0)
    costs = [
        cost
        for run in scheduler.state.fgd.tiers(scheduler.state, job("x", 1, gpu_fraction=0.5))
        for cost, _, _ in run
    ]
    assert costs and all(math.isfinite(cost) for cost in costs)


# -- the workload -------------------------------------------------------------------------------
def test_before_any_job_a_prior_of_whole_and_half_gpus_stands_in():
    workload = Workload(8)
    assert workload.types
    assert sum(p for _, p in workload.types) == pytest.approx(1.0)
    assert {(k.gpus, k.share) for k, _ in workload.types} == {
        (1, 1.0),
        (2, 1.0),
        (4, 1.0),
        (8, 1.0),
        (1, 0.5),
    }
    assert all(k.cpus == 0 and k.models is None for k, _ in Workload(4).types)
    assert max(k.gpus for k, _ in Workload(4).types) == 4


def test_the_shapes_submitted_take_over_and_old_ones_fade():
    workload = Workload(8, half_life=10, check_every=1, drift=0.0)
    a = job("a", 1, gpu_fraction=0.3, cpus=4)
    b = job("b", 2, cpus=8, memory_gb=32)
    for _ in range(10):
        workload.observe(a)
    for _ in range(10):
        workload.observe(b)
    p = {kind: share for kind, share in workload.types}
    a_kind, b_kind = task_type(a, 8), task_type(b, 8)
    # a's weight halves every 10 later submissions: the 10 a's weigh half the 10 b's
    assert p[a_kind] / p[b_kind] == pytest.approx(0.5)
    assert p[a_kind] + p[b_kind] > 0.75  # the prior (10 jobs, 20 submissions ago) has faded
    assert b_kind == TaskType(2, 1.0, None, (), 8.0, 32.0)


def test_a_gang_counts_as_one_of_its_nodes():
    gang = job("g", 32, gpus_per_node=8, cpus=64, memory_gb=512)
    assert task_type(gang, 8) == TaskType(8, 1.0, None, (), 16.0, 128.0)
    free_form = job("f", 12, gpu_models=frozenset({"B", "A"}))
    assert task_type(free_form, 8) == TaskType(8, 1.0, ("A", "B"), (), 0.0, 0.0)


def test_the_workload_is_deterministic():
    shapes = [job(f"j{i}", 1 + i % 3, cpus=float(i % 5)) for i in range(300)]
    first, second = Workload(8), Workload(8)
    for j in shapes:
        first.observe(j)
        second.observe(j)
    assert first.types == second.types and first.version == second.version


# -- choices on hand-made nodes -----------------------------------------------------------------
def _hold(scheduler, count, **shape):
    """Teach the engine a workload: jobs submitted on hold are seen but never placed."""
    for i in range(count):
        scheduler.submit(job(f"seen-{len(scheduler.jobs)}-{i}", 1, held=True, **shape), 0)


def test_a_share_goes_where_the_room_left_stays_usable():
    scheduler = Scheduler(cluster(("n1", 2, "leaf")))
    scheduler.restore(job("x", 1, gpu_fraction=0.4, start_time=0.0), _share(0, 0b01, 0.4), 0)
    scheduler.restore(job("y", 1, gpu_fraction=0.3, start_time=0.0), _share(0, 0b10, 0.3), 0)
    _hold(scheduler, 40, gpu_fraction=0.5)
    scheduler.submit(job("z", 1, gpu_fraction=0.2, t=1), 1)
    z = started(scheduler.schedule(1))["z"]
    # best fit would take the 0.6 room (leaving 0.4: no use to the popular halves); FGD takes
    # the 0.7 room and leaves 0.5
    assert z.parts[0].mask == 0b10


def test_a_cpu_hungry_job_goes_where_it_strands_no_gpu():
    c = cluster(("lean", 2, "leaf", {"cpus": 8}), ("fat", 2, "leaf", {"cpus": 64}))
    scheduler = Scheduler(c)
    _hold(scheduler, 40, cpus=4)
    _hold(scheduler, 10, cpus=4, gpu_fraction=0.5)  # a workload that shares GPUs
    scheduler.submit(job("hungry", 1, cpus=8, t=1), 1)
    placement = started(scheduler.schedule(1))["hungry"]
    # on lean it would leave a GPU without CPUs for anyone; on fat nothing is lost but itself
    assert names(scheduler, placement) == ["fat"]


def test_a_job_pays_for_the_gpus_it_leaves_without_cpus_to_feed_them():
    """On either node the job costs the popular types the same usable GPU; on the lean node it
    also leaves a GPU with 4 CPUs, less than the workload asks per GPU on average: it goes to
    the fat node, where nothing is stranded (best fit alone would take the first, lean)."""
    c = cluster(("lean", 2, "leaf", {"cpus": 14}), ("fat", 2, "leaf", {"cpus": 100}))
    scheduler = Scheduler(c)
    for _ in range(20):
        _hold(scheduler, 1, cpus=2)
        _hold(scheduler, 1, cpus=10)
        _hold(scheduler, 1, cpus=2, gpu_fraction=0.5)
    fgd = scheduler.state.fgd
    x = job("x", 1, cpus=10, t=1)
    (fat_cost, _, _), (lean_cost, _, _) = [run[0] for run in fgd.tiers(scheduler.state, x)]
    stranded = fgd.measure.stranded(0, (1.0,), 4.0)  # lean after it: one GPU, 4 CPUs
    assert stranded > 0 and fgd.measure.stranded(0, (1.0,), 90.0) == 0
    assert lean_cost - fat_cost == pytest.approx(stranded)  # the only difference
    scheduler.submit(x, 1)
    assert names(scheduler, started(scheduler.schedule(1))["x"]) == ["fat"]


def test_whole_gpu_workloads_keep_best_fit():
    """Without shared GPUs (under 5% of the workload) whole-GPU jobs are placed by best fit,
    which keeps whole nodes free for gangs."""
    c = cluster(("lean", 2, "leaf", {"cpus": 8}), ("fat", 2, "leaf", {"cpus": 64}))
    scheduler = Scheduler(c)
    _hold(scheduler, 40, cpus=4)  # the prior's half-GPU jobs fade to 2 in 50
    assert scheduler.state.fgd.workload.sharing < 0.05
    scheduler.submit(job("hungry", 1, cpus=8, t=1), 1)
    assert names(scheduler, started(scheduler.schedule(1))["hungry"]) == ["lean"]


def test_capacity_only_a_constrained_type_can_use_counts_for_more():
    # many small-CPU "A" nodes and one CPU-rich "T" node; 40% of jobs can only run on T
    c = cluster(
        ("a[1-9]", 2, "leaf", {"gpu_model": "A", "cpus": 12}),
        ("t1", 2, "leaf", {"gpu_model": "T", "cpus": 100}),
    )
    scheduler = Scheduler(c)
    _hold(scheduler, 30, cpus=6)
    _hold(scheduler, 20, cpus=6, gpu_models=frozenset({"T"}))
    scheduler.submit(job("any", 1, cpus=8, t=1), 1)
    placement = started(scheduler.schedule(1))["any"]
    # on an A node it strands that node's other GPU (4 CPUs left); on T it would take a GPU
    # that only T-bound jobs, with nowhere else to go, can use
    assert c.nodes[placement.parts[0].node].gpu_model == "A"


def test_placement_off_in_the_policy_file_is_plain_best_fit():
    settings = PolicySettings.from_dict({"placement": {"fragmentation": False}})
    c = cluster(("lean", 2, "leaf", {"cpus": 8}), ("fat", 2, "leaf", {"cpus": 64}))
    scheduler = Scheduler(c, settings=settings)
    assert scheduler.state.fgd is None
    _hold(scheduler, 40, cpus=4)
    scheduler.submit(job("hungry", 1, cpus=8, t=1), 1)
    assert names(scheduler, started(scheduler.schedule(1))["hungry"]) == ["lean"]


@pytest.mark.parametrize(
    "placement, field",
    [
        ({"fragmentation": "yes"}, "placement.fragmentation"),
        ({"workload_half_life": 0}, "placement.workload_half_life"),
        ({"workload_half_life": "long"}, "placement.workload_half_life"),
    ],
)
def test_bad_fragmentation_settings_are_refused(placement, field):
    with pytest.raises(ConfigError) as caught:
        PolicySettings.from_dict({"placement": placement})
    assert caught.value.field == field


def test_fgd_beats_best_fit_when_cpus_are_scarce_on_some_nodes():
    """Lean nodes have CPUs for four light tasks; every fourth task wants all of a lean node's
    CPUs. Best fit (GPUs only) puts those on lean nodes and strands their other GPUs."""
    c = cluster(("lean[1-4]", 4, "leaf", {"cpus": 16}), ("fat[1-4]", 4, "leaf", {"cpus": 128}))
    tasks = [trace_job(f"t{i}", 0, 0, 1, cpus=16 if i % 4 == 3 else 4) for i in range(40)]
    fgd, best = pack(tasks, c, "gpusched"), pack(tasks, c, "bestfit")
    assert fgd.unallocated_gpu_fraction < best.unallocated_gpu_fraction
    assert fgd.tasks_failed < best.tasks_failed


def _share(node, mask, fraction):
    return Placement((Part(node, mask, 0.0, 0.0, fraction),))
