"""IPython magics: ``%load_ext jupyter_gpusched``, then

``%%gpujob --gpus 2 --tier 2 [--queue Q] [--gpu-model M] [--walltime 2h] [--deadline 6h]``
``[--name N] [--array 0-9%2] [--wait] [--estimate] [--help]``
    (``--gpus 0 --cpus 4 [--memory-gb 16]``: a CPU-only job; ``--array``: a job array, each
    element with ``$GPUSCHED_ARRAY_INDEX``, returned as a ``JobArray``)
    ``--deadline``: when it must have finished, a duration from now (``6h``) or a time with
    its zone (``2026-12-24T18:00Z``); one the scheduler cannot meet is a ``UsageError`` that
    gives the earliest finish (give a walltime: without one it plans with the default).
    Runs the cell's code as a batch job. The cell text is written to
    ``.gpusched/cell-<time>-<id>.py`` under the kernel's working directory (your home, with a
    warning, when the job could not enter that) and run there by ``$GPUSCHED_PYTHON`` (the
    interpreter the scheduler's launcher chose for your account, this environment's packages
    with it), the working directory first on ``sys.path``.
    Captured: the cell's text and the working directory (and so the files in it). Not captured:
    the kernel's variables, imports and earlier cells, IPython syntax (``%magics``, ``!shell``),
    and the kernel's environment variables (the job gets the scheduler's minimal environment).
    A bad option (``--gpus -1``, ``--gpus 0`` without CPUs or memory, an unknown one, a tier the
    service refuses, a deadline it cannot meet) is a one-line
    ``UsageError`` naming it; any other service error raises
    :class:`~jupyter_gpusched.notebook.client.GPUSchedError`.
    Prints the job id and returns the :class:`~jupyter_gpusched.notebook.client.Job`; ``--wait``
    prints the job's output as it comes and returns once it ended. ``--estimate`` submits
    nothing (and writes no file): it prints when such a job would start ("starts now",
    "about 25 min (at 14:05 UTC)", "waits: <reason>") and returns the
    :class:`~jupyter_gpusched.notebook.estimate.Estimate`.

``%gpusched status``
    My jobs (pending and running) with their place in the queue, reason and ETA.
``%gpusched jobs`` (all of mine, recent first), ``%gpusched cancel ID``,
``%gpusched logs ID``, ``%gpusched cluster``.
"""

from __future__ import annotations

import sys
from collections import Counter

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .client import Client, GPUSchedError, Job, JobArray
from .job import ACTIVE, gpus_words, how_it_ended
from .payloads import cell_payload
from .typed_options import duration_with_unit

#: The request fields the options of %%gpujob set: a 400 naming one is a usage error.
OPTIONS = {
    "gpus": "--gpus",
    "tier": "--tier",
    "queue": "--queue",
    "gpu_model": "--gpu-model",
    "walltime": "--walltime",
    "deadline": "--deadline",
    "name": "--name",
    "cpus": "--cpus",
    "memory_gb": "--memory-gb",
    "array": "--array",
}


@magics_class
class GPUSchedMagics(Magics):
    """``%%gpujob`` and ``%gpusched``; ``client``: a Client (default: from the environment,
    made at first use)."""

    def __init__(self, shell=None, client: Client | None = None):
        super().__init__(shell)
        self._client = client

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client()
        return self._client

    @magic_arguments()
    @argument("--gpus", type=int, default=1, help="how many GPUs (default 1)")
    @argument("--tier", type=int, default=None, help="1, 2 (default) or 3")
    @argument("--queue", default=None, help="queue path, e.g. research/vision")
    @argument("--gpu-model", dest="gpu_model", default=None, help="e.g. H100 or 'A100|H100'")
    @argument(
        "--walltime",
        default=None,
        type=duration_with_unit,
        help="how long it runs, which the scheduler plans with (not a limit): 90s, 30m, 2h, 1d",
    )
    @argument(
        "--deadline",
        default=None,
        help="when it must have finished: 6h (from now) or 2026-12-24T18:00Z (a time with zone)",
    )
    @argument("--cpus", type=float, default=None, help="CPUs for the job (needed with --gpus 0)")
    @argument("--memory-gb", dest="memory_gb", type=float, default=None, help="memory in GB")
    @argument("--name", default=None, help="a label (default: gpujob)")
    @argument(
        "--array",
        default=None,
        help="a job array, Slurm's syntax: 0-99%%8 (each element gets $GPUSCHED_ARRAY_INDEX)",
    )
    @argument("-h", "--help", action="store_true", help="print this help; submit nothing")
    @argument(
        "--wait",
        action="store_true",
        help="print the output as it comes, until the end (an array: each element's end)",
    )
    @argument("--estimate", action="store_true", help="print when it would start; submit nothing")
    @line_cell_magic
    def gpujob(self, line, cell=None):
        """Run the cell as a batch job on the GPU scheduler: %%gpujob and its options on the
        cell's first line, the code to run below it (more: docs/notebook.md)."""
        # (%gpujob, the line magic, only for --help: IPython refuses a cell magic without a
        # body, pointing to the line magic. This docstring is the help's text: no markup here)
        args = parse_argstring(self.gpujob, line)
        if args.help:  # (IPython names it %gpujob: its usage line says %%gpujob)
            text = self.gpujob.parser.format_help().removeprefix("::\n\n")  # (IPython's rst)
            print(text.replace("  %gpujob [", "  %%gpujob [", 1))  # its usage line
            return None
        if cell is None:
            raise UsageError(
                "%gpujob runs a cell: write %%gpujob (two %) and its options on the cell's first "
                "line, and the code to run below it (%gpujob --help: the options)"
            )
        fields = {"gpus": args.gpus, "name": args.name or "gpujob"}
        options = ("tier", "queue", "gpu_model", "walltime", "deadline", "cpus", "memory_gb")
        for key in (*options, "array"):
            if getattr(args, key) is not None:
                fields[key] = getattr(args, key)
        written = []

        def payload(where):
            command, result, path = cell_payload(cell, where)
            written[:] = [path]
            return command, result, path

        try:
            if args.estimate:  # nothing written, nothing submitted
                estimate = self.client._estimate(fields)
                print(f"%%gpujob: {estimate.line()}")
                return estimate
            job = self.client._submit(fields, payload=payload)
        except GPUSchedError as exc:
            option = OPTIONS.get(exc.field or "")
            if exc.status == 400 and option:  # a bad option: one line, no traceback
                raise UsageError(f"%%gpujob {option}: {exc.message}") from None
            raise
        if isinstance(job, JobArray):
            counts = Counter(element.state for element in job)  # (in order of first seen)
            states = ", ".join(f"{n} {state}" for state, n in counts.items())
            print(
                f"Submitted array {job.id}: {len(job)} jobs ({states}); the cell is in {written[0]}"
            )
            if args.wait:  # each element's end, in index order (their logs: %gpusched logs ID)
                for element in job:
                    element.wait()
                    print(f"{element.id}: {element.state}")
            return job
        position = job.data.get("position")
        where = f" · queued #{position + 1}" if position is not None else ""
        print(f"Submitted {job.id} ({job.state}{where}); the cell is in {written[0]}")
        if args.wait:
            job.logs(follow=True)
            print(f"{job.id}: {job.state}")
        return job

    @line_magic
    def gpusched(self, line):
        """``%gpusched status|jobs|cluster|cancel ID|logs ID``."""
        words = line.split()
        command = words[0] if words else "status"
        try:
            if command in ("status", "jobs", "cluster") and len(words) > 1:
                print("usage: %gpusched status | jobs | cluster | cancel ID | logs ID")
            elif command == "status":
                print(status_text(self.client))
            elif command == "jobs":
                print(jobs_text(self.client.jobs(limit=20)))
            elif command == "cluster":
                print(cluster_text(self.client.cluster()))
            elif command in ("cancel", "logs") and len(words) == 2:
                if command == "cancel":
                    job = self.client.job(words[1])
                    job.cancel()  # a running job: "running (stopping: cancelled by ...)"
                    print(f"{words[1]}: {job.summary()['state']}")
                else:
                    text = self.client.log(words[1], 1 << 20)
                    print(text or f"{words[1]}: no output yet", end="" if text else "\n")
            else:
                print("usage: %gpusched status | jobs | cluster | cancel ID | logs ID")
        except GPUSchedError as exc:
            print(f"gpusched: {exc}", file=sys.stderr)


# -- text views --------------------------------------------------------------------------------
def jobs_text(jobs: list[Job]) -> str:
    if not jobs:
        return "no jobs"
    lines = []
    for job in jobs:
        s = job.summary()
        extra = " ".join(
            f"{label}{s[key]}"
            for key, label in (("position", "queued "), ("reason", "· "), ("eta", "· ETA "))
            if s.get(key)
        )
        if s.get("where"):
            extra = f"on {s['where']}"
        if s.get("deadline"):
            extra = f"{extra} · deadline {s['deadline']}".lstrip(" ·")
        ended = how_it_ended(job.data)
        if ended:  # (a culled server is 'completed': its message says by whom)
            extra = f"{extra} · {ended}".lstrip(" ·")
        lines.append(
            f"{job.id}  {s['state']:<9} {gpus_words(job.data):>10}  tier {s['tier']}  "
            f"{s['queue']:<12} {s['name'][:20]:<20} {extra}".rstrip()
        )
    return "\n".join(lines)


def status_text(client: Client) -> str:
    mine = client.jobs(state=list(ACTIVE))
    queue = client.queue()
    positions = [f"#{e['position'] + 1}" for e in queue["jobs"] if e.get("mine")]
    head = f"queue: {queue['pending']} pending, {queue['running']} running"
    if positions:
        head += "; yours at " + ", ".join(positions)
    body = jobs_text(mine) if mine else "no pending or running jobs"
    return head + "\n" + body


def cluster_text(cluster: dict) -> str:
    lines = [f"{cluster['allocated_gpus']:g} of {cluster['total_gpus']} GPUs allocated"]
    for node, used, tiers in node_usage(cluster):
        by_tier = " ".join(f"t{t}:{n:g}" for t, n in sorted(tiers.items()))
        bar = "█" * round(used) + "·" * max(0, node["gpus"] - round(used))
        lines.append(
            f"{node['name']:<10} {node['gpu_model']:<6} {bar} {used:g}/{node['gpus']} "
            f"{node['state']} {by_tier}".rstrip()
        )
    return "\n".join(lines)


def node_usage(cluster: dict):
    """(node, GPUs in use, {tier: GPUs}) per node of a ``GET api/cluster`` answer."""
    for node in cluster["nodes"]:
        tiers: dict[int, float] = {}
        used = 0.0
        for gpu in node["gpu_list"]:
            share = 0.0
            for holder in gpu["jobs"]:
                tiers[holder["tier"]] = tiers.get(holder["tier"], 0) + holder["fraction"]
                share += holder["fraction"]
            used += min(1.0, share)
        yield node, used, tiers
