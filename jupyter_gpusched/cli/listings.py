"""The user commands that list jobs, in Slurm's habits: ``queue`` (``squeue``, ``squeue --me``,
``squeue --start``) and ``jobs`` (``sacct``: mine, finished ones too).

The pending elements of a job array are one row, named the Slurm way: ``a-000012_[5-99%8]``
(its id, the indices still pending, its ``%max_running``); running elements are rows of their
own. Other users' names are hidden as the API hides them (``-``). A ``DEADLINE`` column is
added when a listed job has a deadline: its time, and ``missed`` once it was unfinished then.
"""

from __future__ import annotations

from ..notebook.job import how_it_ended
from .service import OK, add_command, gpus_text, print_json, table, when

QUEUE_HEADERS = ["ID", "USER", "QUEUE", "TIER", "GPUS", "STATE", "POS", "ETA", "REASON"]
JOBS_HEADERS = ["ID", "NAME", "QUEUE", "TIER", "GPUS", "STATE", "SUBMITTED", "ENDED", "EXIT"]


def add_parsers(commands) -> None:
    queue = add_command(
        commands,
        "queue",
        "the queue: pending jobs in order, with reasons and ETAs, like squeue",
        "The pending jobs in priority order (others' anonymised), held and retrying ones, and "
        "your running jobs: id, user, queue, tier, GPUs, state, position, ETA and the reason "
        "each waits.",
        run_queue,
    )
    queue.add_argument("--me", action="store_true", help="only my jobs")
    queue.add_argument(
        "--start",
        action="store_true",
        help="only pending jobs, soonest estimated start first (like squeue --start)",
    )
    jobs = add_command(
        commands,
        "jobs",
        "my jobs, finished ones too, newest first",
        "My jobs, newest first, with how they ended.",
        run_jobs,
    )
    jobs.add_argument("--state", action="append", help="only jobs in this state (repeat)")
    jobs.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")


def run_queue(args, client) -> int:
    queue = client.queue()
    running = [] if args.start else client.request("GET", "api/jobs", params={"state": "running"})
    if args.json:
        print_json({"queue": queue, "running": running["jobs"] if running else []})
        return OK
    pending = [dict(e, state="pending") for e in queue["jobs"]]
    held = [dict(e, state="held") for e in queue["held"]]
    retrying = [dict(e, state="retrying") for e in queue["retrying"]]
    entries = pending + held + retrying
    if not args.start:
        entries += [dict(v, position=None) for v in (running["jobs"] if running else [])]
    if args.me:
        entries = [e for e in entries if e.get("mine")]
    rows = grouped(entries)
    if args.start:
        rows = [r for r in rows if r["state"] == "pending"]
        rows.sort(key=lambda r: (_eta(r) is None, _eta(r) or 0, r["position"] or 0))
    print(table(*with_deadlines(QUEUE_HEADERS, [_queue_row(r) for r in rows], rows)))
    return OK


def grouped(entries: list[dict]) -> list[dict]:
    """``entries`` with the pending (held, retrying) elements of each job array folded into
    one row at the first one's place: its ``id`` ``a-..._[indices%max]``."""
    rows: list[dict] = []
    arrays: dict[tuple, dict] = {}
    for entry in entries:
        array_id = entry.get("array_id")
        if array_id is None or entry["state"] == "running":
            rows.append(entry)
            continue
        key = (array_id, entry["state"])
        row = arrays.get(key)
        if row is None:
            row = arrays[key] = dict(entry, indices=[])
            rows.append(row)
        row["indices"].append(entry["array_index"])
    if arrays:  # imported here: the engine's package is no part of a terminal command's start-up
        from ..core.arrays import array_name
    for row in arrays.values():
        row["id"] = array_name(row["array_id"], row["indices"], row.get("array_max_running"))
    return rows


def _eta(row: dict) -> float | None:
    return (row.get("reason") or {}).get("eta")


def _queue_row(row: dict) -> list:
    reason = (row.get("reason") or {}).get("message")
    position = row.get("position")
    return [
        row["id"],
        row.get("user"),
        row.get("queue"),
        row.get("tier"),
        gpus_text(row),
        row["state"],
        None if position is None else position + 1,
        when(_eta(row)),
        reason,
    ]


def run_jobs(args, client) -> int:
    params = {"limit": args.limit}
    if args.state:
        params["state"] = args.state
    answer = client.request("GET", "api/jobs", params=params)
    if args.json:
        print_json(answer)
        return OK
    rows = []
    views = answer["jobs"]
    for view in views:
        name = view.get("name")
        if view.get("array_id") is not None:  # which element of which array
            name = f"{view['array_id']}_{view['array_index']}" + (f" {name}" if name else "")
        rows.append(
            [
                view["id"],
                name,
                view.get("queue"),
                view.get("tier"),
                gpus_text(view),
                view["state"],
                when(view.get("submit_time")),
                when(view.get("end_time")),
                view.get("exit_code"),
            ]
        )
    print(table(*with_endings(*with_deadlines(JOBS_HEADERS, rows, views), views)))
    return OK


def with_endings(headers: list[str], rows: list[list], views: list[dict]):
    """``headers`` and ``rows``, and a last column, HOW IT ENDED, where a finished job of
    ``views`` (the rows' jobs, in order) has a message beyond its exit code
    (:func:`..notebook.job.how_it_ended`)."""
    cells = [how_it_ended(view) for view in views]
    if not any(cells):
        return headers, rows
    return [*headers, "HOW IT ENDED"], [[*row, cell] for row, cell in zip(rows, cells, strict=True)]


def with_deadlines(headers: list[str], rows: list[list], views: list[dict]):
    """``headers`` and ``rows``, and a DEADLINE column after STATE where a job of ``views``
    (the rows' jobs, in order) has a deadline: when, and "missed" once it was unfinished then."""
    if not any(view.get("deadline") for view in views):
        return headers, rows
    at = headers.index("STATE") + 1
    cells = [deadline_text(view) for view in views]
    return (
        [*headers[:at], "DEADLINE", *headers[at:]],
        [[*row[:at], cell, *row[at:]] for row, cell in zip(rows, cells, strict=True)],
    )


def deadline_text(view: dict) -> str | None:
    """A job's deadline as a column shows it: ``18:00``, ``12-24 18:00``, ``... missed``."""
    deadline = view.get("deadline")
    if deadline is None:
        return None
    return when(deadline) + (" missed" if view.get("deadline_missed") else "")
