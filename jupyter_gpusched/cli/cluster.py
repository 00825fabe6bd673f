"""The user commands about the cluster and its shares: ``nodes`` (``sinfo``), ``queues`` (every
queue's guarantee, limit, use and waiting GPUs, like ``sshare``) and ``usage`` (my GPU-hours and
my queues)."""

from __future__ import annotations

from .service import OK, UsageError, add_command, print_json, table


def add_parsers(commands) -> None:
    add_command(
        commands,
        "nodes",
        "the nodes: GPUs, free, state, like sinfo",
        "Each node: its GPU model, GPUs, how many are free, its state (up, drain, down) and "
        "leaf switch.",
        run_nodes,
    )
    add_command(
        commands,
        "queues",
        "every queue: guarantee, limit, GPUs in use, borrowed and waiting, like sshare",
        "Every queue of the tree, each under its parent (root is the cluster): its guarantee "
        "and limit, the GPUs in use there (held for jobs whose pre-emption victims are leaving "
        "too), those it borrows above its guarantee (reclaim may take them back), those its "
        "waiting jobs ask for (held ones apart) and its fair-share weight.",
        run_queues,
    )
    usage = add_command(
        commands,
        "usage",
        "my GPU-hours (last 30 days) and my queues",
        "My GPU-hours over the last --days days, and each queue I may use: its GPUs in use, "
        "guarantee and limit (* marks my default queue).",
        run_usage,
    )
    usage.add_argument("--days", type=float, default=30, help="how far back (default 30)")


def run_nodes(args, client) -> int:
    cluster = client.cluster()
    if args.json:
        print_json(cluster)
        return OK
    rows = [
        [n["name"], n["gpu_model"], n["gpus"], f"{n['free']:g}", n["state"], n.get("leaf")]
        for n in cluster["nodes"]
    ]
    print(table(["NODE", "MODEL", "GPUS", "FREE", "STATE", "LEAF"], rows))
    print(f"\n{cluster['allocated_gpus']:g} of {cluster['total_gpus']:g} GPUs allocated")
    return OK


def run_queues(args, client) -> int:
    quotas = client.quotas()
    if args.json:
        print_json(quotas["queues"])
        return OK
    rows = []
    for q in quotas["queues"]:  # (parents first: sorted by path, root's is "root")
        depth = 0 if q["path"] == "root" else q["path"].count("/") + 1
        in_use, borrowed = q["in_use"], q["borrowed"]
        rows.append(
            [
                "  " * depth + q["path"].rsplit("/", 1)[-1],
                f"{q['guaranteed']:g}",
                "-" if q["limit"] is None else f"{q['limit']:g}",
                f"{in_use:g}",
                f"{borrowed:g}" if borrowed else "",
                f"{q['pending']:g}" if q["pending"] else "",
                f"{q['weight']:g}",
            ]
        )
    headers = ["QUEUE", "GUARANTEED", "LIMIT", "IN USE", "BORROWED", "WAITING", "WEIGHT"]
    print(table(headers, rows))
    return OK


def run_usage(args, client) -> int:
    if args.days <= 0:
        raise UsageError("--days must be more than 0")
    me = client.me()
    usage = client.usage("user")  # the last 30 days, up to the service's now
    if args.days != 30:
        usage = client.usage("user", since=usage["until"] - args.days * 86400)
    if args.json:
        print_json({"me": me, "usage": usage})
        return OK
    mine = [row for row in usage["usage"] if row["key"] == me["name"]]
    hours = sum(row["gpu_hours"] for row in mine)
    print(f"{me['name']}: {hours:.1f} GPU-hours in the last {args.days:g} days\n")
    rows = [
        [
            q["path"] + (" *" if q["default"] else ""),
            f"{q['in_use']:g}",
            f"{q['guaranteed']:g}",
            "-" if q["limit"] is None else f"{q['limit']:g}",
        ]
        for q in me["queues"]
    ]
    print(table(["QUEUE", "IN USE", "GUARANTEED", "LIMIT"], rows))
    return OK
