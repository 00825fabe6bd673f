"""The packing experiment (FGD): tasks arrive until demand reaches the cluster's GPUs."""

from pathlib import Path

import pytest
from helpers import cluster, trace_job

from jupyter_gpusched.sim.cluster_loaders import load_cluster_spec
from jupyter_gpusched.sim.pack import STEPS, pack, read_tasks


def tasks():
    # fractional and whole-GPU tasks, alternating: first fit strands room on shared GPUs
    out = []
    for i in range(40):
        if i % 2:
            out.append(trace_job(f"f{i}", 0, 0, 1, gpu_fraction=0.6))
        else:
            out.append(trace_job(f"w{i}", 0, 0, 1, gpu_fraction=0.4))
    return out


def test_pack_reports_every_5_percent_and_the_unallocated_fraction():
    c = cluster(("n[1-4]", 4, "leaf"))
    for policy in ("gpusched", "bestfit", "firstfit"):
        result = pack(tasks(), c, policy)
        assert list(result.allocation_rate) == [str(s) for s in STEPS]
        assert all(0 < r <= 1 for r in result.allocation_rate.values())
        assert 0 <= result.unallocated_gpu_fraction <= 1
        assert result.tasks_arrived >= 1


def test_pairs_that_fill_a_gpu_exactly_leave_nothing_unallocated_with_best_fit():
    c = cluster(("n[1-4]", 4, "leaf"))
    result = pack(tasks(), c, "gpusched")
    assert result.allocation_rate["100"] == pytest.approx(1.0)
    assert result.unallocated_gpu_fraction == pytest.approx(0.0, abs=1e-6)


def test_whole_gpu_tasks_that_do_not_fit_are_counted_as_failed():
    c = cluster(("n1", 2, "leaf"))
    small = trace_job("small", 0, 0, 1, gpu_fraction=0.5)
    result = pack([small, trace_job("big", 0, 0, 2)], c, "firstfit")
    assert result.tasks_failed == 1  # the shared GPU is not free for a whole-GPU task
    assert result.allocation_rate["100"] == pytest.approx(0.5 / 2.5)


def test_pack_is_deterministic_with_a_seed():
    c = cluster(("n[1-3]", 2, "leaf"))
    few = [trace_job("a", 0, 0, 1, gpu_fraction=0.7), trace_job("b", 0, 0, 1)]
    first, second = pack(few, c, "bestfit", seed=3), pack(few, c, "bestfit", seed=3)
    assert first.allocation_rate == second.allocation_rate
    assert first.tasks_arrived == second.tasks_arrived


def test_unknown_pack_policy_is_refused():
    with pytest.raises(ValueError, match="unknown packing policy"):
        pack(tasks(), cluster(("n1", 1, "leaf")), "magic")


ALIBABA = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces" / "alibaba2023"


def test_on_the_alibaba_trace_fgd_leaves_at_most_0_6_of_best_fits_unallocated_gpus():
    """The issue's packing figure, on the real pod and node lists (shared/traces)."""
    pods, nodes = ALIBABA / "openb_pod_list_default.csv", ALIBABA / "openb_node_list_gpu_node.csv"
    if not pods.exists() or not nodes.exists():
        pytest.skip(f"real traces not found under {ALIBABA} (see ../shared/traces/README.md)")
    pod_list, node_list = read_tasks(pods), load_cluster_spec(str(nodes)).cluster
    fgd, best = pack(pod_list, node_list, "gpusched"), pack(pod_list, node_list, "bestfit")
    assert fgd.unallocated_gpu_fraction <= 0.6 * best.unallocated_gpu_fraction
    assert fgd.tasks_failed < best.tasks_failed
