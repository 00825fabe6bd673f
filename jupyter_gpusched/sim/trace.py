"""The trace file of DESIGN.md: CSV, one job a row, times in seconds from the trace start.

Columns: ``job_id, submit_time, duration, gpus`` (required), then optional ``tier, queue, user,
kind, gpus_per_node, gpu_model, walltime, deadline, gpu_fraction, cpus, memory_gb``
(``deadline`` in seconds from the trace start, like ``submit_time``): besides the three
of the trace itself, the job spec's fields marked ``trace`` (core/jobspec.py), under their
request names. An empty cell means "not given"; ``gpu_model`` may list alternatives separated
by ``|``. ``gpus`` 0 is a CPU-only
job, which needs ``cpus`` or ``memory_gb`` and no GPU shape (core/resources.py).

A trace exported from the live service (``export-trace``) also has the six **recorded columns**
:data:`RECORDED` after those: what really happened to the job (first start, end, run time,
pre-emptions, outcome, hub profile), read into :class:`Recorded`. They are what the replay's
``recorded`` column (:mod:`.recorded`) is computed from; the replay itself ignores them.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

from ..core import ConfigError, Job
from ..core.durations import parse_duration
from ..core.jobspec import TRACE_FIELDS
from ..core.resources import cpu_only_problem


def trace_columns(fields=TRACE_FIELDS) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The required and the optional columns of a trace of these spec fields: the trace's own
    (job id, submit time, real duration), then the fields, required where they have no
    default."""
    required = tuple(f.wire for f in fields if f.default is dataclasses.MISSING)
    optional = tuple(f.wire for f in fields if f.default is not dataclasses.MISSING)
    return ("job_id", "submit_time", "duration", *required), optional


REQUIRED, OPTIONAL = trace_columns()
# what the live service saw happen (an exported trace; every cell optional), after OPTIONAL
RECORDED = ("start_time", "end_time", "run_time", "preemptions", "outcome", "profile")
OUTCOMES = ("completed", "failed", "cancelled", "preempted", "culled", "running")


class TraceError(ConfigError):
    """A malformed trace row: the message names the file, line and field."""


@dataclass(frozen=True)
class Recorded:
    """What the live service recorded of one job: times in seconds from the trace's time 0.

    ``end_time`` None: still running when exported; ``run_time``: seconds it held GPUs, all
    runs together (None: not given); ``outcome`` one of :data:`OUTCOMES` (None: not given);
    ``profile``: a notebook's hub profile slug."""

    start_time: float
    end_time: float | None = None
    run_time: float | None = None
    preemptions: int = 0
    outcome: str | None = None
    profile: str | None = None


@dataclass(frozen=True)
class TraceJob:
    """One trace row: the request (a Job template) and how long it really runs."""

    id: str
    submit_time: float
    duration: float
    gpus: int
    tier: int = 2
    queue: str = ""
    user: str = ""
    kind: str = "batch"
    gpus_per_node: int | None = None
    gpu_models: frozenset[str] | None = None
    walltime: float | None = None
    deadline: float | None = None  # seconds from the trace start, like submit_time
    gpu_fraction: float = 1.0  # < 1: a share of one GPU (gpus must be 1)
    cpus: float | None = None
    memory_gb: float | None = None
    array_id: str | None = None  # a job of an array (core/arrays.py): its array, index, cap
    array_index: int | None = None
    array_max_running: int | None = None
    recorded: Recorded | None = None  # the recorded columns; None when the row has no start_time

    def to_job(self) -> Job:
        return Job(
            id=self.id,
            submit_time=self.submit_time,
            **{f.name: getattr(self, f.name) for f in TRACE_FIELDS},
        )


def trace_row(job: TraceJob) -> dict[str, str]:
    """``job`` as a row of the trace file (what :func:`parse_row` reads back)."""
    row = {"job_id": job.id, "submit_time": f"{job.submit_time!r}", "duration": f"{job.duration!r}"}
    for spec_field in TRACE_FIELDS:
        value = getattr(job, spec_field.name)
        if isinstance(value, frozenset):
            value = "|".join(sorted(value))
        row[spec_field.wire] = "" if value is None else str(value)
    if job.recorded is not None:
        for name in RECORDED:
            value = getattr(job.recorded, name)
            row[name] = "" if value is None else f"{value!r}" if isinstance(value, float) else value
    return row


def write_trace(path, trace: list[TraceJob]) -> None:
    """Write ``trace`` as a trace CSV, every column of the contract format; the recorded
    columns only when some job has them (so an ordinary trace keeps its ordinary header)."""
    recorded = RECORDED if any(job.recorded is not None for job in trace) else ()
    with Path(path).open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=REQUIRED + OPTIONAL + recorded, restval="")
        writer.writeheader()
        writer.writerows(trace_row(job) for job in trace)


def csv_rows(path, what: str, required: tuple, allowed: tuple):
    """The rows of the CSV file ``path`` as ``(line, row)``, its header checked: every column
    of ``required``, none beyond ``allowed``; a :class:`TraceError` names the file (``what``:
    "trace", "samples") and line otherwise."""
    source = str(path)
    try:
        handle = Path(path).open(newline="")  # noqa: SIM115 (the with below closes it)
    except OSError as exc:
        raise TraceError(f"cannot read the {what}: {exc.strerror}", source=source) from None
    with handle:
        reader = csv.DictReader(handle)
        header = [h.strip() for h in reader.fieldnames or []]
        reader.fieldnames = header
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(
                f"missing column(s) {', '.join(missing)}; the header must name "
                f"{'at least ' if allowed != required else ''}{', '.join(required)}",
                source=source,
                line=1,
            )
        unknown = [c for c in header if c not in allowed]
        if unknown:
            raise TraceError(f"unknown column {unknown[0]!r}", source=source, line=1)
        for row in reader:
            yield reader.line_num, row


def read_trace(path) -> list[TraceJob]:
    """Read a trace CSV in the contract format, sorted by submit time (stable)."""
    jobs, seen = [], set()
    for line, row in csv_rows(path, "trace", REQUIRED, REQUIRED + OPTIONAL + RECORDED):
        job = parse_row(row, str(path), line)
        if job.id in seen:
            raise TraceError(
                f"duplicate job_id {job.id!r}", source=str(path), line=line, field="job_id"
            )
        seen.add(job.id)
        jobs.append(job)
    jobs.sort(key=lambda j: j.submit_time)
    return jobs


def parse_row(row: dict, source: str, line: int) -> TraceJob:
    def fail(field, message):
        raise TraceError(message, source=source, line=line, field=field)

    def cell(name):
        value = row.get(name)
        return value.strip() if isinstance(value, str) and value.strip() else None

    def number(name, kind=float, minimum=0.0, default=None):
        text = cell(name)
        if text is None:
            if default is None and name in REQUIRED:
                fail(name, "is required")
            return default
        try:
            value = kind(float(text)) if kind is int else float(text)
        except ValueError:
            fail(name, f"{text!r} is not a number")
        if kind is int and float(text) != int(float(text)):
            fail(name, f"{text!r} must be a whole number")
        if not math.isfinite(value) or value < minimum:
            fail(name, f"{text} must be a finite number >= {minimum:g}")
        return value

    job_id = cell("job_id") or fail("job_id", "is required")
    gpus = number("gpus", int, 0)
    tier = number("tier", int, 1, default=2)
    if tier not in (1, 2, 3):
        fail("tier", f"{tier} must be 1, 2 or 3")
    kind = cell("kind") or "batch"
    if kind not in ("batch", "notebook"):
        fail("kind", f"{kind!r} must be batch or notebook")
    fraction = number("gpu_fraction", float, 0.0, default=1.0)
    if not 0 < fraction <= 1 or (fraction < 1 and gpus != 1):
        fail("gpu_fraction", f"{fraction:g} must be in (0, 1], and below 1 only with gpus = 1")
    walltime = cell("walltime")
    if walltime is not None:
        try:
            walltime = parse_duration(walltime)
        except ValueError as exc:
            fail("walltime", str(exc))
    submit_time = number("submit_time")
    deadline = number("deadline", default=None)
    if deadline is not None and deadline <= submit_time:
        fail("deadline", f"{deadline:g} must be after submit_time ({submit_time:g})")
    per_node = number("gpus_per_node", int, 1, default=None)
    if per_node and gpus % per_node:
        fail("gpus_per_node", f"{per_node} does not divide gpus ({gpus})")
    models = cell("gpu_model")
    array_id = cell("array_id")
    array_index = number("array_index", int, 0, default=None)
    array_max_running = number("array_max_running", int, 1, default=None)
    if array_id is None and (array_index is not None or array_max_running is not None):
        fail("array_id", "is required with array_index and array_max_running")
    trace_job = TraceJob(
        id=job_id,
        submit_time=submit_time,
        duration=number("duration"),
        gpus=gpus,
        tier=tier,
        queue=cell("queue") or "",
        user=cell("user") or "",
        kind=kind,
        gpus_per_node=per_node,
        gpu_models=frozenset(m.strip() for m in models.split("|")) if models else None,
        walltime=walltime,
        deadline=deadline,
        gpu_fraction=fraction,
        cpus=number("cpus", default=None),
        memory_gb=number("memory_gb", default=None),
        array_id=array_id,
        array_index=array_index,
        array_max_running=array_max_running,
        recorded=_recorded(cell, number, fail, submit_time),
    )
    problem = cpu_only_problem(trace_job.to_job())
    if problem is not None:
        fail(problem[1], problem[0])
    return trace_job


def _recorded(cell, number, fail, submit_time: float) -> Recorded | None:
    """The recorded cells of a row (``cell``, ``number`` and ``fail`` are :func:`parse_row`'s
    readers), or None when it has no ``start_time``."""
    start = number("start_time", default=None)
    if start is None:
        given = [name for name in RECORDED if cell(name) is not None]
        if given:
            fail("start_time", f"is required with {', '.join(given)}")
        return None
    if start < submit_time:
        fail("start_time", f"{start:g} is before submit_time ({submit_time:g})")
    end = number("end_time", default=None)
    if end is not None and end < start:
        fail("end_time", f"{end:g} is before start_time ({start:g})")
    outcome = cell("outcome")
    if outcome is not None and outcome not in OUTCOMES:
        fail("outcome", f"{outcome!r} must be one of {', '.join(OUTCOMES)}")
    return Recorded(
        start_time=start,
        end_time=end,
        run_time=number("run_time", default=None),
        preemptions=number("preemptions", int, 0, default=0),
        outcome=outcome,
        profile=cell("profile"),
    )


def with_walltimes(trace: list[TraceJob], factor: float | None) -> list[TraceJob]:
    """The walltime model for traces without user estimates: a job that gives none gets
    ``factor`` x its real run time (None: leave it to the policy file's defaults). The same
    model applies to every policy replayed."""
    if factor is None:
        return trace
    return [
        t if t.walltime is not None else dataclasses.replace(t, walltime=t.duration * factor)
        for t in trace
    ]


def with_deadlines(
    trace: list[TraceJob], percent: float, slack: tuple[float, float] = (1.5, 4.0)
) -> list[TraceJob]:
    """A deadline model for traces without deadlines (benchmarks, what-ifs): ``percent`` of the
    jobs (chosen by a hash of the job id, so the same ones under every policy and run) must
    finish within ``s`` x their walltime (their run time where they give none) of their
    submission, ``s`` spread evenly over ``slack`` by the same hash. Jobs that have a deadline
    keep theirs."""
    low, high = slack
    out = []
    for job in trace:
        bucket = int.from_bytes(hashlib.sha256(job.id.encode()).digest()[:4], "big")
        if job.deadline is not None or bucket % 10_000 >= percent * 100:
            out.append(job)
            continue
        factor = low + (high - low) * ((bucket >> 16) % 1000) / 999
        planned = job.walltime if job.walltime is not None else job.duration
        out.append(dataclasses.replace(job, deadline=job.submit_time + factor * planned))
    return out
