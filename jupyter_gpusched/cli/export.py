"""``jupyter-gpusched export-trace``: the live service's history as a trace to replay.

It asks the service (``GET api/export``, admins only: the token must hold the scheduler's admin
scope) for the jobs and notebook servers that ran in the period, and writes three files, each
readable by its owner alone (mode 0600: they name users and what they ran):

* ``--out`` (``trace.csv``): the trace format (docs/replay.md), times in seconds from the
  earliest submission, with the recorded columns (first start, end, GPU time, pre-emptions, how
  it ended, a notebook's profile) that ``replay`` shows as its ``recorded`` column;
* ``NAME-utilization.csv`` beside it: the notebook servers' measured GPU utilization, what
  ``reaper what-if`` replays;
* ``NAME-queues.yaml``: the queue document in force (the queue file, or an admin's last edit
  through ``PUT api/quotas``), pseudonymized with the trace, for ``replay --queues``;
* ``NAME-reaper.json``: the idle reaper's settings in force (the policy file's, an admin's
  changes through ``PUT api/reaper``, the hub profiles' idle timeouts), what ``reaper what-if``
  compares a candidate with.

Where the service is and the token: as for ``reaper`` (``--url``, ``$GPUSCHED_SERVICE_URL``,
the demo hub's; ``$GPUSCHED_SERVICE_TOKEN``, ``$JUPYTERHUB_API_TOKEN``, never an option): in an
admin's own notebook server, a terminal needs neither.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.parse
from pathlib import Path

from .connection import DEFAULT_URL, request, service_token, service_url


def add_parser(commands) -> None:
    export = commands.add_parser(
        "export-trace",
        help="write the service's history (jobs, notebook servers, their GPU use) as a trace "
        "to replay (admins)",
        description="Write the jobs and notebook servers that ran in the period as a trace "
        "(--out), their measured GPU utilization (NAME-utilization.csv) and the queue document "
        "in force (NAME-queues.yaml), each readable by you alone. Replay it with `replay "
        "--queues NAME-queues.yaml --cluster <the service's cluster file> --config <its policy "
        "file>`; try idle timeouts with `reaper what-if`.",
    )
    export.add_argument(
        "--since", default="30d", help="how far back: a duration (30d, 12h, 3600) (default 30d)"
    )
    export.add_argument("--queue", help="only this queue and those below it (e.g. research/nlp)")
    export.add_argument("--out", default="trace.csv", help="the trace file (default trace.csv)")
    export.add_argument(
        "--pseudonymize",
        action="store_true",
        help="replace user names (also in queue names and the queue document) with pseudonyms "
        "that stay the same from one export to the next, to share the trace",
    )
    # the token of a scheduler admin: $GPUSCHED_SERVICE_TOKEN, else $JUPYTERHUB_API_TOKEN (an
    # admin's own server has one); never an option, which every user of the machine sees (ps)
    export.add_argument("--url", default=None, help=f"the service's URL (default {DEFAULT_URL})")
    export.set_defaults(run=run)


class ServiceFailed(Exception):
    """The service could not be reached, or failed (a 5xx): exit code 1."""


def fetch_export(url: str | None, since: str, queue=None, pseudonymize=False):
    """``GET api/export`` of the last ``since`` (a duration: 30d, 12h, seconds); a refusal (a
    4xx: not an admin, a bad queue) is a ConfigError with the service's message (exit code 2),
    an unreachable or failing service :class:`ServiceFailed`."""
    from ..core import ConfigError
    from ..core.durations import parse_duration

    try:
        span = parse_duration(since)
    except ValueError as exc:
        raise ConfigError(f"{exc}: a duration such as 30d, 12h or 3600", field="--since") from None
    now = time.time()
    query = {"since": f"{now - span:.3f}", "until": f"{now:.3f}"}
    if queue:
        query["queue"] = queue
    if pseudonymize:
        query["pseudonymize"] = "true"
    address = service_url(url).rstrip("/") + "/api/export?" + urllib.parse.urlencode(query)
    try:
        status, answer = request(address, service_token())
    except OSError as exc:
        raise ServiceFailed(f"cannot reach the service at {address}: {exc}") from None
    if status >= 500:
        raise ServiceFailed(f"the service failed: {status}: {answer.get('error')}")
    if status >= 400:
        field = f" ({answer.get('field')})" if answer.get("field") else ""
        raise ConfigError(f"the service answered {status}: {answer.get('error')}{field}")
    return answer


def run(args) -> int:
    try:
        answer = fetch_export(args.url, args.since, args.queue, args.pseudonymize)
    except ServiceFailed as exc:
        print(f"jupyter-gpusched export-trace: {exc}", file=sys.stderr)
        return 1
    written = write_export(answer, Path(args.out))
    origin = written["origin"]
    print(
        f"wrote {written['jobs']:,} jobs ({written['notebooks']:,} notebook servers) to "
        f"{args.out}, {written['runs']:,} utilization runs to {written['utilization']}, "
        + (f"the queues to {written['queues']}" if written["queues"] else "no queue file")
        + (f", the reaper's settings to {written['reaper']}" if written["reaper"] else "")
        + "; time 0 is "
        + (time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(origin)) if origin else "-"),
        file=sys.stderr,
    )
    for reason, count in sorted((answer.get("left_out") or {}).items()):
        if count:
            print(f"left out: {count:,} jobs {reason}", file=sys.stderr)
    return 0


def reaper_settings_path(trace) -> Path:
    """Where the idle reaper's settings in force at the export lie: ``NAME-reaper.json`` beside
    the trace ``NAME.csv`` (what ``reaper what-if`` takes as the current settings)."""
    trace = Path(trace)
    return trace.with_name(trace.stem + "-reaper.json")


def write_export(answer: dict, out: Path) -> dict:
    """Write ``answer`` (``GET api/export``'s) as the trace ``out``, its utilization file and
    its queue file, each mode 0600; returns what was written (counts, paths, time 0)."""
    import yaml

    from ..sim.trace import Recorded, TraceJob, write_trace
    from ..sim.utilization import UtilizationRun, utilization_path, write_utilization

    jobs = answer["jobs"]
    origin = min((job["submit_time"] for job in jobs), default=0.0)

    def at(moment):
        return None if moment is None else moment - origin

    trace = []
    for job in jobs:
        models = job.get("gpu_model")
        recorded = Recorded(
            start_time=at(job["start_time"]),
            end_time=at(job["end_time"]),
            run_time=job["run_time"],
            preemptions=job["preemptions"],
            outcome=job["outcome"],
            profile=job.get("profile"),
        )
        trace.append(
            TraceJob(
                id=job["job_id"],
                submit_time=at(job["submit_time"]),
                duration=job["duration"],
                gpus=job["gpus"],
                tier=job["tier"],
                queue=job["queue"],
                user=job["user"],
                kind=job["kind"],
                gpus_per_node=job.get("gpus_per_node"),
                gpu_models=frozenset(models) if models else None,
                walltime=job.get("walltime"),
                deadline=at(job.get("deadline")),  # seconds from the trace start, as submit_time
                gpu_fraction=job.get("gpu_fraction") or 1.0,
                cpus=job.get("cpus"),
                memory_gb=job.get("memory_gb"),
                array_id=job.get("array_id"),
                array_index=job.get("array_index"),
                array_max_running=job.get("array_max_running"),
                recorded=recorded,
            )
        )
    runs = [
        UtilizationRun(r["job_id"], at(r["start"]), at(r["end"]), r["utilization"])
        for r in answer.get("utilization") or ()
    ]
    samples = utilization_path(out)
    queues = out.with_name(out.stem + "-queues.yaml")
    reaper = reaper_settings_path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for path in (out, samples, queues, reaper):  # created private, before anything is written
        path.touch(mode=0o600, exist_ok=True)
        path.chmod(0o600)
    write_trace(out, trace)
    write_utilization(samples, runs)
    document = answer.get("queues")
    if document is None:  # the service runs without a queue file: one root queue
        queues.unlink()
        queues = None
    else:
        queues.write_text(
            "# the queue document in force when exported (jupyter gpusched export-trace)\n"
            + yaml.safe_dump(document, sort_keys=False)
        )
    if answer.get("reaper") is None:
        reaper.unlink()
        reaper = None
    else:
        reaper.write_text(json.dumps(answer["reaper"], indent=2, sort_keys=True) + "\n")
    return {
        "reaper": reaper,
        "jobs": len(trace),
        "notebooks": sum(1 for t in trace if t.kind == "notebook"),
        "runs": len(runs),
        "origin": origin if jobs else None,
        "utilization": samples,
        "queues": queues,
    }
