"""A gang that fits one leaf switch reserves one leaf, and keeps waiting for it."""

from helpers import cluster, run_replay, trace_job

from jupyter_gpusched.core import PolicySettings


def four_nodes():
    """Two leaves of two 8-GPU nodes; each node its own GPU model, so that jobs can be pinned."""
    return cluster(
        ("a1", 8, "leaf-1", {"gpu_model": "A1"}),
        ("a2", 8, "leaf-1", {"gpu_model": "A2"}),
        ("b1", 8, "leaf-2", {"gpu_model": "B1"}),
        ("b2", 8, "leaf-2", {"gpu_model": "B2"}),
        switches={"spine": ["leaf-1", "leaf-2"]},
    )


def on(model):
    return {"gpu_models": frozenset((model,))}


def busy_nodes(a2_ends: float) -> list:
    """Each node full at time 0: a1 frees at 100, b1 at 200, a2 at ``a2_ends``, b2 much later."""
    return [
        trace_job("a1-busy", 0, 100, 8, walltime=100, **on("A1")),
        trace_job("b1-busy", 0, 200, 8, walltime=200, **on("B1")),
        trace_job("a2-busy", 0, a2_ends, 8, walltime=a2_ends, **on("A2")),
        trace_job("b2-busy", 0, 100_000, 8, walltime=100_000, **on("B2")),
    ]


def test_a_gang_reserves_the_leaf_that_frees_soon_and_leaves_the_other_nodes_to_backfill():
    # 16 GPUs are free across leaves at 200 (a1 + b1), under leaf-1 alone at 300 (a1 + a2): the
    # gang waits for leaf-1, so its reservation is a1 + a2, and the long job may take b1 at 200
    trace = [
        *busy_nodes(a2_ends=300),
        trace_job("gang", 1, 1000, 16, walltime=1000),
        trace_job("long", 2, 50_000, 8, walltime=50_000),
    ]
    _, rows = run_replay(trace, four_nodes())
    assert rows["gang"]["start_time"] == 300 and rows["gang"]["leaves"] == 1
    assert rows["long"]["start_time"] == 200 and rows["long"]["nodes"] == "b1"
    # without topology the reservation is a1 + b1 (where GPUs free first): the long job waits
    _, rows = run_replay(trace, four_nodes(), policy="slurm")
    assert rows["long"]["start_time"] > 200


def test_one_leaf_much_later_than_across_leaves_keeps_the_cross_leaf_reservation():
    # leaf-1 frees at 5000, more than leaf_reservation_slack (600 s) after the GPUs free across
    # leaves at 200: the gang reserves a1 + b1 and spans leaves once its patience is over
    trace = [*busy_nodes(a2_ends=5000), trace_job("gang", 1, 1000, 16, walltime=1000)]
    slack = PolicySettings().replace(leaf_patience=600.0, leaf_reservation_slack=600.0)
    _, rows = run_replay(trace, four_nodes(), settings=slack)
    assert rows["gang"]["start_time"] == 800 and rows["gang"]["leaves"] == 2
    # with the default slack (7 days) it reserves leaf-1 and waits for it past its patience
    patience = PolicySettings().replace(leaf_patience=600.0)
    _, rows = run_replay(trace, four_nodes(), settings=patience)
    assert rows["gang"]["start_time"] == 5000 and rows["gang"]["leaves"] == 1


def test_a_gang_holding_a_reservation_inside_one_leaf_waits_past_its_patience():
    # the gang could span leaves at 1 (a1 + b1): its patience (100 s) runs from then. A tier-1
    # job takes b1 at 10, so the gang reserves leaf-1 (a1 + a2, due at 150). b2 frees early, at
    # 120, past the patience: the gang still waits for its leaf instead of taking a1 + b2
    trace = [
        trace_job("a2-busy", 0, 150, 8, walltime=150, **on("A2")),
        trace_job("b2-busy", 0, 120, 8, walltime=100_000, **on("B2")),
        trace_job("gang", 1, 100, 16, walltime=100),
        trace_job("tier1", 10, 10_000, 8, walltime=10_000, tier=1, **on("B1")),
    ]
    patience = PolicySettings().replace(leaf_patience=100.0)
    _, rows = run_replay(trace, four_nodes(), settings=patience)
    assert rows["tier1"]["start_time"] == 10
    assert rows["gang"]["start_time"] == 150 and rows["gang"]["leaves"] == 1


def test_a_gang_behind_the_reservation_does_not_use_its_patience_up():
    # the head job waits for a1 (busy until 1000); behind it the gang could span leaves at once
    # (a2 + b1). There its patience (100 s) does not run: it waits, and at the head, from 1000,
    # reserves leaf-2 (b2 frees at 1050, within its patience of spanning leaves)
    trace = [
        trace_job("a1-busy", 0, 1000, 8, walltime=1000, **on("A1")),
        trace_job("b2-busy", 0, 1050, 8, walltime=1050, **on("B2")),
        trace_job("head", 1, 10_000, 8, walltime=10_000, **on("A1")),
        trace_job("gang", 2, 100, 16, walltime=100),
    ]
    patience = PolicySettings().replace(leaf_patience=100.0)
    _, rows = run_replay(trace, four_nodes(), settings=patience)
    assert rows["head"]["start_time"] == 1000
    assert rows["gang"]["start_time"] == 1050 and rows["gang"]["nodes"] == "b1|b2"
