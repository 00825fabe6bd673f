"""Loaders for the replay: real cluster traces read as they are, and the CSV reader they share.

The full mapping of every format is in docs/replay.md ("Real traces"); in short:

- ``csv``: the contract trace of :mod:`.trace`.
- ``philly``: job ``philly-NNNNN`` = data row N (file line N + 1); submit times from the earliest
  timestamp; queue = virtual cluster. Philly has no tiers: all tier 2, or with a tier mix
  (T1,T2,T3 percent) ``bucket = int(sha256(id).hexdigest()[:8], 16) % 100`` gives tier 1 if
  ``bucket < T1``, 2 if ``bucket < T1 + T2``, else 3: the same job always gets the same tier.
- ``alibaba2023``: qos Guaranteed -> tier 1, LS and Burstable -> 2, BE -> 3; run time =
  deletion - scheduled; ``gpu_milli`` < 1000 -> a GPU fraction; one (root) queue. Tasks without
  GPUs and tasks never scheduled (no run time to replay) are skipped and counted.

The cluster and queues to replay a trace on (``--cluster``, ``--queues``) are read by
:mod:`.cluster_loaders`, with the CSV reader here. A malformed row raises :class:`TraceError`
(file, line, field), or with ``skip_bad_rows`` is skipped and counted.
"""

from __future__ import annotations

import csv
import hashlib
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from ..core import Cluster, ConfigError
from .trace import OPTIONAL, RECORDED, REQUIRED, TraceError, TraceJob, parse_row, read_trace

FORMATS = ("csv", "philly", "alibaba2023")
# traces that carry no walltime estimates get this multiple of each job's real run time
WALLTIME_FACTORS = {"philly": 2.0, "alibaba2023": 2.0}
BAD_ROWS = "bad rows"
ZERO_GPU = "zero-GPU tasks"
NEVER_SCHEDULED = "never-scheduled tasks"

PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus", "cluster")

ALIBABA_COLUMNS = (
    "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
    "creation_time", "deletion_time", "scheduled_time",
)  # fmt: skip
ALIBABA_TIERS = {"Guaranteed": 1, "LS": 2, "Burstable": 2, "BE": 3}

_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.\-@]+$")  # what a queue file accepts as a name
_EPOCH = datetime(1970, 1, 1)


@dataclass
class Loaded:
    """What a loader read: the jobs (sorted by submit time) or a cluster, and what it skipped.

    ``skipped`` counts rows left out by reason (``bad rows`` only with ``skip_bad_rows``);
    ``first_error`` is the first bad row's error, to show the user what kind of row was skipped.
    """

    jobs: list[TraceJob] = field(default_factory=list)
    cluster: Cluster | None = None
    skipped: Counter = field(default_factory=Counter)
    first_error: TraceError | None = None


def fail(source: str, line: int, name: str, message: str):
    """Raise the :class:`TraceError` of a bad cell (file, line, field)."""
    raise TraceError(message, source=source, line=line, field=name)


def number(row: dict, name: str, source: str, line: int, whole: bool = False) -> float:
    """The cell ``name`` as a finite number >= 0 (an int when ``whole``); a TraceError if not."""
    text = row[name].strip()
    if not text:
        fail(source, line, name, "is required")
    try:
        value = float(text)
    except ValueError:
        fail(source, line, name, f"{text!r} is not a number")
    if not math.isfinite(value) or value < 0:
        fail(source, line, name, f"{text} must be a finite number >= 0")
    if whole:
        if value != int(value):
            fail(source, line, name, f"{text!r} must be a whole number")
        return int(value)
    return value


def read_rows(path, columns, parse, loaded, skip_bad_rows, allowed=None, quick=None) -> list:
    """``parse(row, line, source)`` for each data row of the CSV at ``path``.

    ``parse`` returns an item to keep, or a string: the reason the row is skipped (counted).
    Short rows are padded with empty cells (so the error names the missing field); a header that
    lacks one of ``columns`` (or, with ``allowed``, names an unknown one) is always an error.
    ``quick(header)``, if given, returns a fast parser of ``(cells, line)`` for plain, well-formed
    rows; whatever it raises sends the row to the careful ``parse``, which names the bad field.
    """
    source = str(path)
    try:
        with Path(path).open(newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            header = [cell.strip() for cell in next(reader, [])]
            missing = [c for c in columns if c not in header]
            unknown = [c for c in header if allowed is not None and c not in allowed]
            if missing or unknown:
                problem = f"unknown column {unknown[0]!r}" if unknown else "missing column(s)"
                raise TraceError(
                    f"{problem}; the header must name {', '.join(columns)}", source=source, line=1
                )
            items, fast = [], quick(header) if quick else None
            for cells in reader:
                if fast:
                    try:
                        items.append(fast(cells, reader.line_num))
                        continue
                    except (ValueError, TypeError, IndexError, KeyError):
                        pass  # the careful parse below says what is wrong, or what to skip
                if cells:  # else a blank line
                    item = _parse_cells(
                        header, cells, reader.line_num, source, parse, loaded, skip_bad_rows
                    )
                    if isinstance(item, str):
                        loaded.skipped[item] += 1
                    elif item is not None:
                        items.append(item)
            return items
    except OSError as exc:
        raise TraceError(f"cannot read the file: {exc.strerror}", source=source) from None
    except UnicodeDecodeError:
        raise TraceError("not a UTF-8 text file", source=source) from None


def _parse_cells(header, cells, line, source, parse, loaded: Loaded, skip_bad_rows: bool):
    """One row through ``parse``; a bad row raises, or with ``skip_bad_rows`` is counted."""
    try:
        if len(cells) > len(header):
            fail(source, line, header[-1], f"{len(cells)} cells, the header names {len(header)}")
        cells += [""] * (len(header) - len(cells))
        return parse(dict(zip(header, cells, strict=True)), line, source)
    except TraceError as exc:
        if not skip_bad_rows:
            raise
        loaded.skipped[BAD_ROWS] += 1
        loaded.first_error = loaded.first_error or exc
        return None


def load_trace(path, fmt: str = "csv", tier_mix=None, skip_bad_rows: bool = False) -> Loaded:
    """Read the trace at ``path`` in format ``fmt`` (one of FORMATS)."""
    if tier_mix is not None and fmt != "philly":
        raise ConfigError(
            "only Philly traces get tiers from a mix; the other formats carry their own",
            field="--tier-mix",
        )
    if fmt == "csv":
        return read_contract_trace(path, skip_bad_rows)
    if fmt == "philly":
        return read_philly(path, tier_mix or (0, 100, 0), skip_bad_rows)
    if fmt == "alibaba2023":
        return read_alibaba(path, skip_bad_rows)
    raise ConfigError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}", field="--format")


def read_contract_trace(path, skip_bad_rows: bool = False) -> Loaded:
    """The contract CSV: :func:`.trace.read_trace`, or row by row when bad rows are skipped."""
    if not skip_bad_rows:
        return Loaded(jobs=read_trace(path))
    loaded, seen = Loaded(), set()

    def parse(row, line, source):
        job = parse_row(row, source, line)
        if job.id in seen:
            fail(source, line, "job_id", f"duplicate job_id {job.id!r}")
        seen.add(job.id)
        return job

    loaded.jobs = read_rows(path, REQUIRED, parse, loaded, True, REQUIRED + OPTIONAL + RECORDED)
    loaded.jobs.sort(key=lambda j: j.submit_time)
    return loaded


def parse_tier_mix(text: str) -> tuple[int, int, int]:
    """``"10,60,30"`` -> (10, 60, 30): whole percentages of tiers 1, 2, 3 that add up to 100."""
    parts = [p.strip() for p in str(text).split(",")]
    if len(parts) != 3 or not all(p.isdigit() for p in parts) or sum(map(int, parts)) != 100:
        raise ConfigError(
            f"{text!r} must be three whole percentages for tiers 1,2,3 that add up to 100 "
            "(e.g. 10,60,30)",
            field="--tier-mix",
        )
    return int(parts[0]), int(parts[1]), int(parts[2])


def tier_for(job_id: str, mix: tuple[int, int, int]) -> int:
    """The tier ``mix`` gives ``job_id``: a hash bucket 0..99 against cumulative percentages."""
    if 100 in mix:  # one tier only: no need to hash
        return mix.index(100) + 1
    bucket = int.from_bytes(hashlib.sha256(job_id.encode()).digest()[:4], "big") % 100
    if bucket < mix[0]:
        return 1
    return 2 if bucket < mix[0] + mix[1] else 3


def read_philly(path, tier_mix=(0, 100, 0), skip_bad_rows: bool = False) -> Loaded:
    """The Philly job log (see the module docstring for ids, times, queues and tiers)."""
    loaded, queues = Loaded(), set()  # queues: VC ids already checked

    def parse(row, line, source):
        text = row["timestamp"].strip()
        try:  # fromisoformat is fast (strptime on every row would dominate the load time)
            submit = (datetime.fromisoformat(text) - _EPOCH).total_seconds()
        except (ValueError, TypeError):  # TypeError: a time zone was given
            fail(source, line, "timestamp", f"{text!r} is not a time like 2017-10-09 07:01:55")
        duration = number(row, "duration", source, line)
        gpus = number(row, "num_gpus", source, line, whole=True)
        if gpus == 0:
            return ZERO_GPU
        vc = row["cluster"].strip()
        if not _QUEUE_NAME.match(vc):
            fail(source, line, "cluster", f"{vc!r} is not a virtual cluster id (a queue name)")
        queues.add(vc)
        return submit, line - 1, duration, gpus, vc

    def quick(header):  # the same as parse for plain rows, about three times faster
        timestamp, duration, gpus, vc = (header.index(c) for c in PHILLY_COLUMNS)
        width, iso, epoch, inf = len(header), datetime.fromisoformat, _EPOCH, math.inf

        def fast(cells, line):
            run, count, queue = float(cells[duration]), int(cells[gpus]), cells[vc]
            if len(cells) != width or not 0.0 <= run < inf or count < 1 or queue not in queues:
                raise ValueError
            return (iso(cells[timestamp]) - epoch).total_seconds(), line - 1, run, count, queue

        return fast

    rows = read_rows(path, PHILLY_COLUMNS, parse, loaded, skip_bad_rows, quick=quick)
    rows.sort()  # by submit time, then row (rows are unique: the rest is never compared)
    start = rows[0][0] if rows else 0.0
    width = max(5, len(str(max((r[1] for r in rows), default=0))))
    for submit, row, duration, gpus, vc in rows:
        job_id = f"philly-{row:0{width}d}"
        loaded.jobs.append(
            TraceJob(
                id=job_id,
                submit_time=submit - start,
                duration=duration,
                gpus=gpus,
                tier=tier_for(job_id, tier_mix),
                queue=vc,
            )
        )
    return loaded


def read_alibaba(path, skip_bad_rows: bool = False) -> Loaded:
    """The Alibaba 2023 pod list (see the module docstring for the mapping and what is skipped)."""
    loaded, seen = Loaded(), set()

    def parse(row, line, source):
        name = row["name"].strip()
        if not name:
            fail(source, line, "name", "is required")
        if name in seen:
            fail(source, line, "name", f"duplicate task name {name!r}")
        seen.add(name)
        gpus = number(row, "num_gpu", source, line, whole=True)
        if gpus == 0:
            return ZERO_GPU
        milli = number(row, "gpu_milli", source, line, whole=True)
        if not 1 <= milli <= 1000 or (gpus > 1 and milli != 1000):
            fail(source, line, "gpu_milli", f"{milli} must be 1..1000, and 1000 when num_gpu > 1")
        qos = row["qos"].strip()
        if qos not in ALIBABA_TIERS:
            fail(source, line, "qos", f"{qos!r} is not one of {', '.join(ALIBABA_TIERS)}")
        created = number(row, "creation_time", source, line)
        deleted = number(row, "deletion_time", source, line)
        if row["pod_phase"].strip() == "Pending" or not row["scheduled_time"].strip():
            return NEVER_SCHEDULED
        scheduled = number(row, "scheduled_time", source, line)
        if not created <= scheduled <= deleted:
            fail(source, line, "scheduled_time", "must lie between creation and deletion time")
        models = frozenset(m.strip() for m in row["gpu_spec"].split("|") if m.strip())
        return TraceJob(
            id=name,
            submit_time=created,
            duration=deleted - scheduled,
            gpus=gpus,
            tier=ALIBABA_TIERS[qos],
            gpu_models=models or None,
            gpu_fraction=milli / 1000,
            cpus=number(row, "cpu_milli", source, line) / 1000,
            memory_gb=number(row, "memory_mib", source, line) / 1024,
        )

    loaded.jobs = read_rows(path, ALIBABA_COLUMNS, parse, loaded, skip_bad_rows)
    loaded.jobs.sort(key=lambda j: j.submit_time)
    return loaded
