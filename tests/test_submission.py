"""What is refused at submission (core/submission.py), as the service and the replay both see it:
a GPU model the cluster lacks, then the user's pending_jobs limit."""

from __future__ import annotations

from helpers import cluster, job, run_replay, trace_job

from jupyter_gpusched.core import QueueTree
from jupyter_gpusched.core.submission import check_submission
from jupyter_gpusched.sim.metrics import metrics


def limited(c, pending_jobs: int) -> QueueTree:
    document = {
        "queues": {"team": {"guaranteed": 0, "users": ["alice", "bob"]}},
        "user_limits": {"alice": {"pending_jobs": pending_jobs}},
    }
    return QueueTree.from_dict(document, c.total_gpus)


def test_the_pending_limit_counts_the_users_waiting_jobs():
    c = cluster(("n1", 4, "leaf", {"gpu_model": "A100"}))
    tree = limited(c, 2)
    alice = job("a", 1, user="alice")
    assert check_submission(alice, c, tree, {"alice": 1}.get) is None
    refusal = check_submission(alice, c, tree, {"alice": 2}.get)
    assert (refusal.message, refusal.field, refusal.limit) == (
        "alice already has 2 pending jobs; the limit is 2",
        None,
        True,
    )
    # bob has no limit: his count is not even asked for
    assert check_submission(job("b", 1, user="bob"), c, tree, {}.__getitem__) is None


def test_a_gpu_model_the_cluster_lacks_is_refused_before_the_limit():
    c = cluster(("n1", 4, "leaf", {"gpu_model": "A100"}))
    refusal = check_submission(
        job("a", 1, user="alice", gpu_models=frozenset({"H100", "B200"})), c, limited(c, 0), {}.get
    )
    assert (refusal.message, refusal.field, refusal.limit) == (
        "no GPU of model B200|H100 in this cluster (it has A100)",
        "gpu_model",
        False,
    )


def test_the_replay_rejects_what_the_service_refuses():
    """alice may have 2 jobs waiting: of her 4 submitted at once on a 1-GPU cluster (none starts
    before the instant's pass), the last 2 are refused; after the first ends, a later one is
    taken again. Bob, without a limit, is never refused."""
    c = cluster(("n1", 1, "leaf"))
    trace = [trace_job(f"a{i}", 0.0, 100.0, 1, user="alice", queue="team") for i in range(4)]
    trace += [trace_job("a-late", 150.0, 10.0, 1, user="alice", queue="team")]
    trace += [trace_job(f"b{i}", 0.0, 10.0, 1, user="bob", queue="team") for i in range(3)]
    result, rows = run_replay(trace, c, limited(c, 2))
    assert {i for i, row in rows.items() if row["state"] == "rejected"} == {"a2", "a3"}
    assert result.refused["a2"].reject_reason == "alice already has 2 pending jobs; the limit is 2"
    figures = metrics(result)
    assert (figures["jobs"], figures["rejected"], figures["completed"]) == (8, 2, 6)
