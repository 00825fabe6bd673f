"""``jupyter-gpusched`` (also ``jupyter gpusched``): the command line.

For operators: ``serve``, ``replay``, ``pack`` (here), ``export-trace`` (:mod:`.export`),
``reaper`` (:mod:`.reaper`), ``node-agent``. For users, in Slurm's habits: ``submit``,
``estimate``, ``cancel``, ``log`` (:mod:`.jobs`), ``queue``, ``jobs`` (:mod:`.listings`),
``nodes``, ``queues``, ``usage`` (:mod:`.cluster`), talking to the service through the notebook
client (:mod:`.service`).

Exit codes: 0 success, 1 unexpected failure (the service unreachable or failing: a 5xx), 2 bad
input (a usage error, a file that says what to fix, with its line and field, or a request the
service refused: a 4xx, with its message).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from .. import __version__

# the commands of users in a terminal: parsed without the engine's package (numpy and all),
# whose import is most of a command's start-up (a command per submission adds up)
USER_COMMANDS = ("submit", "estimate", "cancel", "log", "queue", "jobs", "nodes", "queues", "usage")
EXIT_STATUS = (
    "Exit status: 0 ok; 1 failure (the service unreachable, or a 5xx); 2 bad input (a usage "
    "error, a bad file, or a request the service refused with a 4xx)."
)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "serve":  # a traitlets Application: --GPUSchedService.x=... options
        from ..service.app import main as serve

        return serve(argv[1:])
    if argv and argv[0] in USER_COMMANDS:
        parser = argparse.ArgumentParser(prog="jupyter-gpusched", epilog=EXIT_STATUS)
        add_user_commands(parser.add_subparsers(dest="command", required=True))
        args = parser.parse_args(argv)
        return args.run(args)
    from ..core import ConfigError
    from ..sim.loaders import FORMATS

    parser = argparse.ArgumentParser(
        prog="jupyter-gpusched", description="GPU scheduling for JupyterHub.", epilog=EXIT_STATUS
    )
    parser.add_argument("--version", action="version", version=__version__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser(
        "serve",
        help="run the scheduler service (a JupyterHub service; see `serve --help-all`)",
        add_help=False,
    )
    replay = commands.add_parser(
        "replay",
        help="replay a job trace through one or more policies and compare them",
        description="Replay TRACE through each --policy in simulated time and write "
        "jobs.csv and metrics.json to --out, with a comparison table on stdout.",
    )
    replay.add_argument("trace", help="trace file, in the --format given")
    replay.add_argument(
        "--format",
        default="csv",
        choices=FORMATS,
        help="trace format: csv (job_id, submit_time, duration, gpus, ...; the default), "
        "philly (the Philly job log), alibaba2023 (the Alibaba 2023 pod list)",
    )
    replay.add_argument(
        "--cluster",
        required=True,
        metavar="CLUSTER",
        help="cluster YAML file, an Alibaba node-list .csv, or philly[:GPUS] (8-GPU nodes, "
        "16 per leaf switch, 8 leaves per spine; default 2816 GPUs)",
    )
    replay.add_argument(
        "--queues",
        metavar="QUEUES",
        help="queue (quota) YAML file, or philly[:GPUS]: one queue per virtual cluster of the "
        "trace, guaranteed its share of the Philly VC nodes scaled to GPUS (default 2816); "
        "default: one root queue",
    )
    replay.add_argument(
        "--tier-mix",
        metavar="T1,T2,T3",
        help="philly format only: percentages of jobs in tiers 1, 2, 3 (e.g. 10,60,30), "
        "assigned by a hash of the job id; default: all tier 2",
    )
    replay.add_argument(
        "--skip-bad-rows",
        action="store_true",
        help="skip malformed trace (and node-list) rows and count them, instead of stopping",
    )
    replay.add_argument(
        "--walltime-factor",
        type=float,
        metavar="F",
        help="walltime estimate for jobs whose trace gives none: F x their real run time "
        "(default 2 for the philly and alibaba2023 formats, whose traces carry no estimates; "
        "otherwise the policy file's default walltime); the same for every policy",
    )
    replay.add_argument(
        "--deadlines",
        type=float,
        metavar="PERCENT",
        help="give PERCENT of the jobs whose trace gives no deadline one of 1.5-4x their "
        "walltime after their submission (chosen by a hash of the job id: the same jobs under "
        "every policy); metrics.json then has the deadline figures",
    )
    replay.add_argument(
        "--config",
        action="append",
        dest="configs",
        metavar="POLICY_FILE",
        help="policy YAML file (default: the documented defaults); repeat to compare: each "
        "--policy then runs under each, named POLICY@STEM, and the first table is each run's "
        "difference per job class from the first file's run",
    )
    replay.add_argument(
        "--policy",
        action="append",
        dest="policies",
        metavar="NAME",
        help="policy to replay (repeat to compare; default: gpusched and fifo)",
    )
    replay.add_argument("--out", required=True, help="output folder (created)")
    replay.add_argument("--quiet", action="store_true", help="no progress on stderr")
    replay.add_argument("--no-report", action="store_true", help="skip report.html")
    replay.set_defaults(run=run_replay)
    pack = commands.add_parser(
        "pack",
        help="the FGD packing experiment: place tasks until demand reaches the cluster's GPUs",
        description="Tasks arrive in trace order (sampled again, seeded, when the list runs "
        "out) and never leave, until the GPU demand that arrived reaches 100%% of the "
        "cluster's GPUs. Writes DIR/pack.json and DIR/pack.png.",
    )
    pack.add_argument("tasks", help="Alibaba 2023 pod list CSV (num_gpu, gpu_milli, ...)")
    pack.add_argument("--cluster", required=True, help="Alibaba node-list CSV or cluster YAML")
    pack.add_argument(
        "--policy",
        action="append",
        dest="policies",
        metavar="NAME",
        help="gpusched, bestfit or firstfit (repeat; default: all three)",
    )
    pack.add_argument("--seed", type=int, default=0, help="seed for resampling tasks")
    pack.add_argument("--skip-bad-rows", action="store_true", help="skip malformed node-list rows")
    pack.add_argument("--out", required=True, help="output folder (created)")
    pack.set_defaults(run=run_pack)
    from .check import add_parser as add_check
    from .export import add_parser as add_export
    from .reaper import add_parser as add_reaper

    add_check(commands)
    add_export(commands)
    add_reaper(commands)
    add_user_commands(commands)
    from ..backends.gpu.node_agent import add_parser as add_node_agent

    add_node_agent(commands)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except ConfigError as exc:
        print(f"jupyter-gpusched {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # its reader went away (`... --json | head`): stop without a word
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (no error at exit)
        return 1


def add_user_commands(commands) -> None:
    """The parsers of :data:`USER_COMMANDS`."""
    from . import cluster, jobs, listings

    for group in (jobs, listings, cluster):
        group.add_parsers(commands)


def run_replay(args) -> int:
    from ..core import ConfigError, PolicySettings, get_policy
    from ..files import load_policy
    from ..sim import classes, recorded
    from ..sim.cluster_loaders import load_cluster_spec, load_queue_spec
    from ..sim.loaders import WALLTIME_FACTORS, load_trace, parse_tier_mix
    from ..sim.metrics import comparison_table, metrics, write_jobs_csv
    from ..sim.replay import replay
    from ..sim.trace import with_deadlines, with_walltimes

    try:
        policies = [get_policy(name) for name in args.policies or ["gpusched", "fifo"]]
    except ValueError as exc:
        raise ConfigError(str(exc), field="--policy") from None
    tier_mix = parse_tier_mix(args.tier_mix) if args.tier_mix is not None else None
    started = time.perf_counter()
    loaded = load_trace(args.trace, args.format, tier_mix, args.skip_bad_rows)
    factor = args.walltime_factor
    if factor is None:
        factor = WALLTIME_FACTORS.get(args.format)
    elif factor <= 0:
        raise ConfigError("must be greater than 0", field="--walltime-factor")
    if not loaded.jobs:
        raise ConfigError(
            "the trace has no jobs (only its header?): nothing to replay",
            source=str(args.trace),
        )
    trace = with_walltimes(loaded.jobs, factor)
    if args.deadlines is not None:
        if not 0 <= args.deadlines <= 100:
            raise ConfigError("must be a percentage from 0 to 100", field="--deadlines")
        trace = with_deadlines(trace, args.deadlines)
    if not args.quiet:
        took = time.perf_counter() - started
        print(f"read {len(trace):,} jobs from {args.trace} in {took:.2f} s", file=sys.stderr)
    _report_skipped(args.trace, loaded)
    # the cluster and queues come after the trace: --queues philly needs the trace's VC list
    cluster_loaded = load_cluster_spec(args.cluster, args.skip_bad_rows)
    _report_skipped(args.cluster, cluster_loaded)
    cluster = cluster_loaded.cluster
    queues = load_queue_spec(args.queues, cluster, trace, args.trace) if args.queues else None
    configs = [(name, load_policy(path)) for name, path in _config_names(args.configs or [])]
    configs = configs or [("", PolicySettings())]
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file of that name, a directory it may not write to ...
        raise ConfigError(
            f"cannot make the directory {str(out)!r}: {exc.strerror}", field="--out"
        ) from None
    # the recorded outcome (an exported trace) is the first column and, with one config, the
    # baseline of the table per job class; with several, the first config's run is
    has_recorded = recorded.has_recorded(trace)
    figures = {}
    if has_recorded:
        figures[recorded.NAME] = recorded.recorded_metrics(trace, cluster.total_gpus)
    results, pairs = [], []
    for policy in policies:
        first = None
        for config, settings in configs:
            name = f"{policy.name}@{config}" if len(configs) > 1 else policy.name
            progress = None if args.quiet else _progress(name)
            by_class = len(configs) > 1 or has_recorded
            result = replay(trace, cluster, queues, settings, policy, progress, by_class)
            result.policy = name
            results.append(result)
            figures[name] = metrics(result)
            if first is not None or (len(configs) == 1 and has_recorded):
                pairs.append((result, first))
            first = first or result
    compared = classes.compare(pairs, trace)
    first_rows = recorded.recorded_rows(trace) if has_recorded else ()
    write_jobs_csv(results, out / "jobs.csv", first_rows)
    document = {"policies": figures}
    if compared:
        document["classes"] = {run: c["classes"] for run, c in compared.items()}
        document["class_baselines"] = {run: c["baseline"] for run, c in compared.items()}
    (out / "metrics.json").write_text(json.dumps(document, indent=2) + "\n")
    for run, c in compared.items():
        print(classes.class_table(run, c["baseline"], c["classes"]), end="\n\n")
    print(comparison_table(figures))
    written = [out / "jobs.csv", out / "metrics.json"]
    if not args.no_report:
        from ..sim.report import write_report

        write_report(
            results,
            figures,
            out / "report.html",
            title=Path(args.trace).name,
            recorded=recorded.recorded_waits(trace) if has_recorded else None,
            classes=compared,
        )
        written.append(out / "report.html")
    if not args.quiet:
        print(f"\nwrote {', '.join(map(str, written))}", file=sys.stderr)
    return 0


def _config_names(paths: list[str]) -> list[tuple[str, str]]:
    """``(name, path)`` of each policy file: its stem, or where two stems are equal as much of
    the path as tells them apart (``a/policy``, ``b/policy``)."""
    from pathlib import PurePath

    parts = [PurePath(p).with_suffix("").parts for p in paths]
    for depth in range(1, max((len(p) for p in parts), default=1) + 1):
        names = ["/".join(p[-depth:]) for p in parts]
        if len(set(names)) == len(names):
            break
    else:  # the same file twice: number the repeats
        names = [f"{n}#{i + 1}" if names.count(n) > 1 else n for i, n in enumerate(names)]
    return list(zip(names, paths, strict=True))


def run_pack(args) -> int:
    from ..core import ConfigError
    from ..sim.cluster_loaders import load_cluster_spec
    from ..sim.pack import PACK_POLICIES, pack, plot_pack, read_tasks

    names = args.policies or list(PACK_POLICIES)
    unknown = [n for n in names if n not in PACK_POLICIES]
    if unknown:
        known = ", ".join(PACK_POLICIES)
        raise ConfigError(
            f"unknown packing policy {unknown[0]!r}; known: {known}", field="--policy"
        )
    tasks = read_tasks(args.tasks)
    cluster_loaded = load_cluster_spec(args.cluster, args.skip_bad_rows)
    _report_skipped(args.cluster, cluster_loaded)
    cluster = cluster_loaded.cluster
    results = [pack(tasks, cluster, name, args.seed) for name in names]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    document = {
        "tasks": str(args.tasks),
        "cluster_gpus": cluster.total_gpus,
        "seed": args.seed,
        "policies": {
            r.policy: {k: v for k, v in vars(r).items() if k != "policy"} for r in results
        },
    }
    (out / "pack.json").write_text(json.dumps(document, indent=2) + "\n")
    plot_pack(results, out / "pack.png")
    for r in results:
        print(
            f"{r.policy:>9}: unallocated GPU fraction {r.unallocated_gpu_fraction:.4f}, "
            f"allocation rate at 100% {r.allocation_rate['100']:.4f}, {r.wall_s:.2f} s"
        )
    return 0


def _report_skipped(source: str, loaded) -> None:
    """Say on stderr how many rows a loader left out, and why (even with --quiet: it changes
    what is replayed)."""
    for reason, count in sorted(loaded.skipped.items()):
        print(f"{source}: skipped {reason}: {count:,}", file=sys.stderr)
    if loaded.first_error is not None:
        print(f"{source}: first bad row: {loaded.first_error}", file=sys.stderr)


def _progress(name: str):
    def report(done: int, total: int) -> None:
        end = "\n" if done >= total else ""
        print(f"\r{name}: {done:,}/{total:,} jobs finished", end=end, file=sys.stderr, flush=True)

    return report


if __name__ == "__main__":
    sys.exit(main())
