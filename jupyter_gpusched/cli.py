"""``jupyter-gpusched`` (also ``jupyter gpusched``): the command line.

Exit codes: 0 success, 1 unexpected failure, 2 bad input (a usage error or a file that says
what to fix, with its line and field).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import __version__
from .core import ConfigError, PolicySettings, get_policy
from .files import load_cluster, load_policy, load_queues


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="jupyter-gpusched", description="GPU scheduling for JupyterHub."
    )
    parser.add_argument("--version", action="version", version=__version__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    replay = commands.add_parser(
        "replay",
        help="replay a job trace through one or more policies and compare them",
        description="Replay TRACE through each --policy in simulated time and write "
        "jobs.csv and metrics.json to --out, with a comparison table on stdout.",
    )
    replay.add_argument("trace", help="trace CSV (job_id, submit_time, duration, gpus, ...)")
    replay.add_argument("--cluster", required=True, help="cluster YAML file")
    replay.add_argument("--queues", help="queue (quota) YAML file; default: one root queue")
    replay.add_argument("--config", help="policy YAML file; default: the documented defaults")
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
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except ConfigError as exc:
        print(f"jupyter-gpusched {args.command}: error: {exc}", file=sys.stderr)
        return 2


def run_replay(args) -> int:
    from .sim.metrics import comparison_table, metrics, write_jobs_csv
    from .sim.replay import replay
    from .sim.trace import read_trace

    try:
        policies = [get_policy(name) for name in args.policies or ["gpusched", "fifo"]]
    except ValueError as exc:
        raise ConfigError(str(exc), field="--policy") from None
    cluster = load_cluster(args.cluster)
    queues = load_queues(args.queues, cluster) if args.queues else None
    settings = load_policy(args.config) if args.config else PolicySettings()
    trace = read_trace(args.trace)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results, figures = [], {}
    for policy in policies:
        progress = None if args.quiet else _progress(policy.name)
        result = replay(trace, cluster, queues, settings, policy, progress)
        results.append(result)
        figures[policy.name] = metrics(result)
    write_jobs_csv(results, out / "jobs.csv")
    (out / "metrics.json").write_text(json.dumps({"policies": figures}, indent=2) + "\n")
    print(comparison_table(figures))
    if not args.quiet:
        print(f"\nwrote {out / 'jobs.csv'} and {out / 'metrics.json'}", file=sys.stderr)
    return 0


def _progress(name: str):
    def report(done: int, total: int) -> None:
        end = "\n" if done >= total else ""
        print(f"\r{name}: {done:,}/{total:,} jobs finished", end=end, file=sys.stderr, flush=True)

    return report


if __name__ == "__main__":
    sys.exit(main())
