"""The user commands about one job or array, in Slurm's habits: ``submit`` (``sbatch``),
``estimate`` (``sbatch --test-only``), ``cancel`` (``scancel``) and ``log``.

``submit`` goes through :meth:`~jupyter_gpusched.notebook.client.Client.submit`, as a notebook's
``client.submit(...)`` does: a notebook file becomes the job's ``notebook`` (executed with
nbclient), anything else the job's shell command; the working directory is this one (or home,
with a warning, where the job's account may not enter it).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from ..notebook.job import MAX_LOG_BYTES, Job
from ..notebook.typed_options import duration_with_unit
from .service import OK, UsageError, add_command, print_json


def add_parsers(commands) -> None:
    submit = add_command(
        commands,
        "submit",
        "submit a batch job: a shell command or a notebook (.ipynb), like sbatch",
        "Submit COMMAND (the words after the options, run by the shell) or NOTEBOOK.ipynb "
        "(executed with nbclient) as a batch job; prints its id (an array: its id and its "
        "number of jobs). Options go before the command.",
        run_submit,
    )
    _job_options(submit)
    submit.add_argument(
        "--array",
        metavar="SPEC",
        help="a job array in Slurm's syntax, e.g. 0-99%%8 (indices 0 to 99, at most 8 running "
        "at once) or 1,3,10-20; each job gets $GPUSCHED_ARRAY_INDEX and $GPUSCHED_ARRAY_ID",
    )
    submit.add_argument(
        "--hold", action="store_true", help="submit it held: it waits until released"
    )
    submit.add_argument("what", nargs=argparse.REMAINDER, metavar="COMMAND | NOTEBOOK")
    estimate = add_command(
        commands,
        "estimate",
        "when would this job start? (nothing is queued), like sbatch --test-only",
        "Ask the service when a job with these options would start, without queuing it: "
        "'starts now', or the reason it would wait, its estimated start and its place in "
        "its queue. COMMAND is optional (it does not change when a job starts).",
        run_estimate,
    )
    _job_options(estimate)
    estimate.add_argument("what", nargs=argparse.REMAINDER, metavar="COMMAND | NOTEBOOK")
    cancel = add_command(
        commands,
        "cancel",
        "cancel jobs or whole job arrays, like scancel",
        "Cancel each ID: a job (j-...) or every pending or running job of an array (a-...).",
        run_cancel,
    )
    cancel.add_argument("ids", nargs="+", metavar="ID")
    log = add_command(
        commands, "log", "a job's output", "Print the end of a job's output.", run_log
    )
    log.add_argument("id", metavar="ID")
    log.add_argument(
        "--follow", "-f", action="store_true", help="print the output as it comes, until the end"
    )


def _job_options(parser) -> None:
    parser.add_argument("--gpus", type=int, default=1, help="how many GPUs (default 1)")
    parser.add_argument("--queue", help="queue path, e.g. research/vision (default: yours)")
    parser.add_argument("--tier", type=int, choices=(1, 2, 3), help="1, 2 (default) or 3")
    parser.add_argument(
        "--walltime",
        type=duration_with_unit,
        help="how long it runs, which the scheduler plans with (not a limit it enforces): 90s, "
        "30m, 2h, 1d",
    )
    parser.add_argument(
        "--deadline",
        help="when it must have finished: a duration from now (6h, 2d) or a time with its zone "
        "(2026-12-24T18:00Z); refused, with the earliest finish, if it cannot be met (give "
        "--walltime too: without it the scheduler plans with its default)",
    )
    parser.add_argument("--name", help="a label for the job")
    parser.add_argument("--gpu-model", help="e.g. H100, or 'A100|H100'")
    parser.add_argument("--cpus", type=float, help="CPUs for the job (needed with --gpus 0)")
    parser.add_argument("--memory-gb", type=float, help="memory for the job in GB")


def _fields(args) -> dict:
    """The request fields the options give (those given only)."""
    fields = {"gpus": args.gpus}
    for key in ("queue", "tier", "walltime", "deadline", "name", "gpu_model", "cpus", "memory_gb"):
        value = getattr(args, key)
        if value is not None:
            fields[key] = value
    return fields


def _what(words: list[str]) -> tuple[str | None, str | None]:
    """(command, notebook) of the words after the options."""
    if words and words[0] == "--":
        words = words[1:]
    if len(words) == 1 and words[0].endswith(".ipynb"):
        path = Path(words[0])
        if not path.is_file():
            raise UsageError(f"no notebook {words[0]}")
        return None, str(path.resolve())
    if not words:
        return None, None
    return (words[0] if len(words) == 1 else shlex.join(words)), None


def run_submit(args, client) -> int:
    command, notebook = _what(args.what)
    if command is None and notebook is None:
        raise UsageError("give the command to run, or a notebook (.ipynb)")
    fields = _fields(args)
    if args.hold:
        fields["held"] = True
    gpus, options = fields.pop("gpus"), fields
    submitted = client.submit(command, notebook=notebook, gpus=gpus, array=args.array, **options)
    if hasattr(submitted, "jobs"):  # a JobArray
        if args.json:
            print_json({"array_id": submitted.id, "jobs": [job.data for job in submitted]})
        else:
            print(f"{submitted.id} ({len(submitted)} jobs)")
        return OK
    if args.json:
        print_json(submitted.data)
    else:
        print(submitted.id)
    return OK


def run_estimate(args, client) -> int:
    command, notebook = _what(args.what)
    body = _fields(args)
    if notebook is not None:
        body["notebook"] = notebook
    else:
        body["command"] = command or "true"  # what it runs does not change when it starts
    answer = client.request("POST", "api/estimate", body)
    if args.json:
        print_json(answer)
        return OK
    print(estimate_text(answer))
    return OK


def estimate_text(answer: dict) -> str:
    """``POST api/estimate``'s answer in a line, in the words the notebook and the page use."""
    # imported here: the words are core's, whose package only this command needs to load
    from ..notebook.estimate import Estimate

    return Estimate(answer).line()


def run_cancel(args, client) -> int:
    for job_or_array in args.ids:  # all checked before any is cancelled
        if not (job_or_array.startswith("j-") or job_or_array.startswith("a-")):
            raise UsageError(f"{job_or_array!r} is neither a job id (j-...) nor an array's (a-...)")
    answers = []
    for job_or_array in args.ids:
        if job_or_array.startswith("a-"):
            answer = client.cancel_array(job_or_array)
            answers.append(answer)
            if not args.json:
                print(f"{job_or_array}: cancelled {len(answer['jobs'])} jobs")
            continue
        view = client.cancel(job_or_array)
        answers.append(view)
        if not args.json:
            stopping = view.get("state") == "running"  # signalled; it ends after its grace
            print(f"{job_or_array}: {'stopping' if stopping else view.get('state')}")
    if args.json:
        print_json(answers)
    return OK


def run_log(args, client) -> int:
    job = Job(client, args.id)
    if args.follow and not args.json:
        job.logs(follow=True, file=sys.stdout)
        return OK
    text = client.log(args.id, MAX_LOG_BYTES)
    if args.json:
        print_json({"id": args.id, "log": text})
    else:
        sys.stdout.write(text)
    return OK
