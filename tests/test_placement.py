"""Gang, topology-aware placement."""

from helpers import cluster, job, leaves, names, started

from jupyter_gpusched.core import PolicySettings, Scheduler


def two_leaves():
    return cluster(
        ("a[1-2]", 8, "leaf-1"), ("b[1-2]", 8, "leaf-2"), switches={"spine": ["leaf-1", "leaf-2"]}
    )


def test_16_gpu_gang_lands_inside_one_leaf():
    scheduler = Scheduler(two_leaves())
    # a small job on leaf-1 first: the gang must still pick one whole leaf, not straddle
    scheduler.submit(job("small", 1), 0)
    scheduler.submit(job("gang", 16), 0)
    placements = started(scheduler.schedule(0))
    assert len(leaves(scheduler, placements["gang"])) == 1
    assert placements["gang"].gpus == 16
    assert leaves(scheduler, placements["gang"]) != leaves(scheduler, placements["small"])


def test_gang_with_shape_uses_one_leaf_when_the_other_is_partly_busy():
    scheduler = Scheduler(two_leaves())
    scheduler.submit(job("filler", 4), 0)
    scheduler.schedule(0)
    scheduler.submit(job("gang", 16, gpus_per_node=8), 1)
    placement = started(scheduler.schedule(1))["gang"]
    assert len(placement.parts) == 2 and all(p.gpus == 8 for p in placement.parts)
    assert len(leaves(scheduler, placement)) == 1


def test_4_gpu_job_stays_inside_one_nvlink_domain():
    c = cluster(("dgx1", 8, "leaf", {"nvlink": [[0, 1, 2, 3], [4, 5, 6, 7]]}))
    scheduler = Scheduler(c)
    scheduler.submit(job("one", 1), 0)  # takes GPU 0: domain 0 now has 3 free
    assert started(scheduler.schedule(0))["one"].parts[0].mask == 0b00000001
    scheduler.submit(job("four", 4, t=1), 1)
    placements = started(scheduler.schedule(1))
    assert placements["four"].parts[0].mask == 0b11110000


def test_small_jobs_fill_a_partly_used_node_before_an_empty_one():
    scheduler = Scheduler(cluster(("n[1-2]", 8, "leaf")))
    scheduler.submit(job("a", 2), 0)
    scheduler.schedule(0)
    scheduler.submit(job("b", 2), 1)
    placement = started(scheduler.schedule(1))["b"]
    assert names(scheduler, placement) == ["n1"]


def test_gpu_model_and_labels_are_respected():
    c = cluster(
        ("a1", 4, "leaf", {"gpu_model": "A100"}),
        ("l1", 4, "leaf", {"gpu_model": "L40S", "labels": {"zone": "b"}}),
    )
    scheduler = Scheduler(c)
    scheduler.submit(job("l40s", 2, gpu_models=frozenset({"L40S"})), 0)
    scheduler.submit(job("zone-b", 1, labels={"zone": "b"}), 0)
    placements = started(scheduler.schedule(0))
    assert names(scheduler, placements["l40s"]) == ["l1"]
    assert names(scheduler, placements["zone-b"]) == ["l1"]


def test_cpus_and_memory_limit_placement():
    c = cluster(("n[1-2]", 8, "leaf", {"cpus": 16, "memory_gb": 64}))
    scheduler = Scheduler(c)
    scheduler.submit(job("a", 1, cpus=12), 0)
    scheduler.submit(job("b", 1, cpus=12), 0)
    placements = started(scheduler.schedule(0))
    assert names(scheduler, placements["a"]) != names(scheduler, placements["b"])


def test_multi_node_job_without_shape_uses_fewest_nodes():
    scheduler = Scheduler(cluster(("n[1-4]", 8, "leaf")))
    scheduler.submit(job("twelve", 12), 0)
    placement = started(scheduler.schedule(0))["twelve"]
    assert sorted(p.gpus for p in placement.parts) == [4, 8]


def test_fifo_is_topology_blind_first_fit():
    scheduler = Scheduler(two_leaves(), policy="fifo")
    scheduler.submit(job("a", 4), 0)
    scheduler.submit(job("b", 4), 0)
    placements = started(scheduler.schedule(0))
    assert names(scheduler, placements["a"]) == ["a1"]
    assert names(scheduler, placements["b"]) == ["a1"]


def test_a_gang_waits_for_one_leaf_within_its_patience_then_may_span():
    from helpers import run_replay, trace_job

    c = cluster(
        ("a[1-2]", 8, "leaf-1"),
        ("b[1-2]", 8, "leaf-2", {"gpu_model": "B"}),
        switches={"spine": ["leaf-1", "leaf-2"]},
    )
    trace = [
        trace_job("a-half", 0, 1000, 8, walltime=1000),  # leaf-1 half busy
        trace_job("b-half", 0, 5000, 8, walltime=5000, gpu_models=frozenset("B")),
        trace_job("gang", 10, 100, 16, walltime=100),  # 16 free, but 8 under each leaf
    ]
    _, rows = run_replay(trace, c)
    assert rows["gang"]["start_time"] == 1000  # leaf-1 frees at 1000, inside the 30 min
    assert rows["gang"]["leaves"] == 1
    assert rows["gang"]["first_reason_detail"] == "one-leaf"
    # (and does not reserve leaf-1, which frees more than a minute after it could span)
    impatient = PolicySettings().replace(leaf_patience=60.0, leaf_reservation_slack=60.0)
    _, rows = run_replay(trace, c, settings=impatient)
    assert rows["gang"]["start_time"] == 70 and rows["gang"]["leaves"] == 2
    # the slurm baseline does not wait for one leaf (--switches unset, Slurm's default)
    _, rows = run_replay(trace, c, policy="slurm")
    assert rows["gang"]["start_time"] == 10 and rows["gang"]["leaves"] == 2


def test_leaf_patience_runs_from_when_the_gang_could_span_leaves():
    """Waiting for GPUs at all does not use a gang's patience up: it waits for one leaf from
    the first moment it could have been placed across leaves."""
    from helpers import run_replay, trace_job

    c = cluster(
        ("a[1-2]", 8, "leaf-1", {"gpu_model": "A"}),
        ("b[1-2]", 8, "leaf-2", {"gpu_model": "B"}),
        switches={"spine": ["leaf-1", "leaf-2"]},
    )
    a, b = frozenset("A"), frozenset("B")
    trace = [
        trace_job("a1-busy", 0, 2000, 8, walltime=2000, gpu_models=a),
        trace_job("a2-busy", 0, 2500, 8, walltime=2500, gpu_models=a),
        trace_job("b1-busy", 0, 9000, 8, walltime=9000, gpu_models=b),
        trace_job("gang", 10, 100, 16, walltime=100),  # 8 free (b2) until 2000
    ]
    patience = PolicySettings().replace(leaf_patience=600.0)
    _, rows = run_replay(trace, c, settings=patience)
    # at 2000, a1 + b2 could hold it across leaves: it waits (600 s at most) for leaf-1,
    # which frees at 2500; it had waited far longer than 600 s for GPUs before that
    assert rows["gang"]["start_time"] == 2500 and rows["gang"]["leaves"] == 1
