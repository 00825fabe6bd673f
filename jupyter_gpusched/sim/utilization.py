"""The utilization samples beside an exported trace: ``NAME-utilization.csv`` next to
``NAME.csv`` (:func:`utilization_path`), what ``export-trace`` writes and the idle-timeout what-if
(:mod:`.reaper_whatif`) replays.

One row per *run of measurements*: consecutive service-side GPU samples of one notebook server
whose utilization stayed in one band (:mod:`jupyter_gpusched.core.utilization_bands`), with no
gap longer than the reaper's ``stale_after`` between two of them. Columns: ``job_id`` (the
server's job, a row of the trace), ``start`` and ``end`` (the run's first and last sample,
seconds from the trace's time 0), ``utilization`` (the run's highest sample, percent: a sample's
utilization is its busiest GPU's). Between two runs of a server farther apart than
``stale_after`` the server was not measured.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from ..core.utilization_bands import BAND_EDGES, band  # noqa: F401 (the bands' one home)
from .trace import TraceError, csv_rows

COLUMNS = ("job_id", "start", "end", "utilization")


@dataclass(frozen=True)
class UtilizationRun:
    """One run of a notebook server's samples: from ``start`` to ``end`` (its first and last
    sample), at most ``utilization`` percent."""

    job_id: str
    start: float
    end: float
    utilization: float


def utilization_path(trace_path) -> Path:
    """Where the samples of the trace ``trace_path`` lie: ``DIR/NAME.csv`` ->
    ``DIR/NAME-utilization.csv``."""
    path = Path(trace_path)
    return path.with_name(f"{path.stem}-utilization.csv")


def write_utilization(path, runs) -> None:
    """Write ``runs`` (UtilizationRun, in any order) as a samples file, per job by start time;
    :func:`read_utilization` reads back the same runs."""
    ordered = sorted(runs, key=lambda r: (r.job_id, r.start, r.end))
    with Path(path).open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for run in ordered:
            writer.writerow([run.job_id, repr(run.start), repr(run.end), repr(run.utilization)])


def read_utilization(path) -> dict[str, list[UtilizationRun]]:
    """The runs of a samples file by job id, each job's sorted by start. A bad file or row is a
    :class:`~.trace.TraceError` naming the file, the line and the field."""
    runs: dict[str, list[UtilizationRun]] = {}
    for line, row in csv_rows(path, "samples", COLUMNS, COLUMNS):
        run = parse_run(row, str(path), line)
        runs.setdefault(run.job_id, []).append(run)
    for job_runs in runs.values():
        job_runs.sort(key=lambda r: (r.start, r.end))
    return runs


def parse_run(row: dict, source: str, line: int) -> UtilizationRun:
    """One row of a samples file (``line``: its line, for the errors)."""

    def fail(field, message):
        raise TraceError(message, source=source, line=line, field=field)

    def number(name) -> float:
        value = row.get(name)
        text = value.strip() if isinstance(value, str) else ""
        if not text:
            fail(name, "is required")
        try:
            parsed = float(text)
        except ValueError:
            fail(name, f"{text!r} is not a number")
        if not math.isfinite(parsed):
            fail(name, f"{text} must be a finite number")
        return parsed

    value = row.get("job_id")
    job_id = value.strip() if isinstance(value, str) else ""
    if not job_id:
        fail("job_id", "is required")
    start, end, utilization = number("start"), number("end"), number("utilization")
    if end < start:
        fail("end", f"{end:g} is before the run's start ({start:g})")
    if not 0 <= utilization <= 100:
        fail("utilization", f"{utilization:g} must be a percentage from 0 to 100")
    return UtilizationRun(job_id, start, end, utilization)
