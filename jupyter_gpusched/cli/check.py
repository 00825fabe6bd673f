"""``jupyter-gpusched check --cluster C [--queues Q] [--policy P]``: a hub admin's files checked
as the service reads them at start (docs/files.md), without starting anything: a line on what
each holds and exit status 0, or the first error, naming the file, line and field, and 2.
"""

from __future__ import annotations

from collections import Counter


def add_parser(commands) -> None:
    check = commands.add_parser(
        "check",
        help="check a cluster file, and a queue and a policy file, as the service reads them",
        description=__doc__.split("\n\n")[0].replace("``", "'"),
    )
    check.add_argument("--cluster", required=True, help="the cluster file (YAML)")
    check.add_argument("--queues", help="the queue file (YAML), checked against the cluster")
    check.add_argument("--policy", help="the policy file (YAML), its reaper: section too")
    check.set_defaults(run=run)


def run(args) -> int:
    from ..files import load_cluster, load_policy, load_queues

    cluster = load_cluster(args.cluster)
    models = Counter()
    for node in cluster.nodes:
        models[node.gpu_model] += node.gpus
    kinds = ", ".join(f"{count:g} {model}" for model, count in sorted(models.items()))
    print(
        f"{args.cluster}: {len(cluster.nodes)} nodes, {cluster.total_gpus:g} GPUs ({kinds}), "
        f"{len(cluster.leaves)} leaf switch{'' if len(cluster.leaves) == 1 else 'es'}"
    )
    if args.queues:
        tree = load_queues(args.queues, cluster)
        guaranteed = sum(queue.guaranteed for queue in tree.root.children)
        default = tree.default_queue or "none"
        print(
            f"{args.queues}: {len(tree.leaves)} leaf queues, {guaranteed:g} of "
            f"{cluster.total_gpus:g} GPUs guaranteed, default queue {default}"
        )
    if args.policy:
        settings = load_policy(args.policy)
        print(
            f"{args.policy}: backfill every {settings.backfill_interval:g} s at most "
            f"(depth {settings.backfill_depth}, {settings.backfill_order} first), default "
            f"walltime {settings.walltime_batch / 3600:g} h for a batch job, "
            f"{settings.walltime_notebook / 3600:g} h for a notebook server"
        )
    return 0
