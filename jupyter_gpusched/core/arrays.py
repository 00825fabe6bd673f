"""Job arrays, as Slurm users know them: one request, ``"array": "0-99%8"``, makes many jobs
that differ only in their index, and ``%8`` caps how many of them run at once.

- :func:`parse_array`: Slurm's ``--array`` syntax (``0-99``, ``1,3,5-7``, ``0-99:10`` with a
  step, and an optional ``%max_running``), bounded by :data:`MAX_ARRAY_ELEMENTS`; a
  :class:`~.errors.ConfigError` naming the field ``array`` for anything else.
- :func:`array_block`: the reason an element waits while its array already runs
  ``max_running`` elements. In core (pure) so that the live service and the replay enforce the
  same cap in the same place of a pass (:func:`.passes.evaluate`).
- :func:`array_text`: an array's pending elements written back the Slurm way, ``5-99%8``, and
  :func:`array_name`, the one row they are listed as, ``a-000012_[5-99%8]`` (the command line's
  ``queue``, ``api/queue``'s ``arrays``, the web page).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import reasons
from .errors import ConfigError
from .jobs import Job, Reason

MAX_ARRAY_ELEMENTS = 10_000  # elements of one array (one request, one transaction)
MAX_ARRAY_INDEX = 1_000_000  # the largest index (Slurm's MaxArraySize is of this order)
MAX_ARRAY_TEXT = 1000  # characters of the 'array' field
ARRAY_PATTERN = r"^[0-9]+(-[0-9]+(:[0-9]+)?)?(,[0-9]+(-[0-9]+(:[0-9]+)?)?)*(%[0-9]+)?$"
_PATTERN = re.compile(ARRAY_PATTERN)
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?")


@dataclass(frozen=True)
class ArraySpec:
    """The indices of an array's elements (sorted, no repeats) and the most that may run at
    once (None: no cap)."""

    indices: tuple[int, ...]
    max_running: int | None = None


def parse_array(text) -> ArraySpec:
    """The array ``text`` asks for (see the module docstring); ConfigError(field="array")."""
    if not isinstance(text, str) or len(text) > MAX_ARRAY_TEXT or not _PATTERN.match(text):
        raise ConfigError(
            "'array' must be Slurm's syntax: indices and ranges separated by commas, each "
            "N or N-M or N-M:STEP, then optionally %MAX_RUNNING, e.g. '0-99%8' or '1,3,10-20'",
            field="array",
        )
    ranges, _, cap = text.partition("%")
    max_running = None
    if cap:
        max_running = int(cap)
        if not 1 <= max_running <= MAX_ARRAY_ELEMENTS:  # (more than runs at once is no cap)
            raise ConfigError(
                f"'array': the %MAX_RUNNING of {text!r} must be from 1 to {MAX_ARRAY_ELEMENTS}",
                field="array",
            )
    indices: set[int] = set()
    for part in ranges.split(","):
        first, last, step = _RANGE.fullmatch(part).groups()
        start = int(first)
        stop = int(last) if last is not None else start
        stride = int(step) if step is not None else 1
        if stop < start or stride < 1:
            raise ConfigError(
                f"'array': the range {part!r} must go upwards, with a step of at least 1",
                field="array",
            )
        if stop > MAX_ARRAY_INDEX:
            raise ConfigError(
                f"'array': indices go up to {MAX_ARRAY_INDEX}; {part!r} goes beyond",
                field="array",
            )
        if len(indices) + (stop - start) // stride + 1 > MAX_ARRAY_ELEMENTS:
            raise ConfigError(f"'array' has more than {MAX_ARRAY_ELEMENTS} elements", field="array")
        indices.update(range(start, stop + 1, stride))
    return ArraySpec(tuple(sorted(indices)), max_running)


def array_block(job: Job, running_by_array: dict[str, int], claimants) -> Reason | None:
    """The reason ``job`` waits because its array already runs its ``max_running`` elements,
    or None. ``running_by_array``: array id -> running elements (the ledger's);
    ``claimants``: jobs waiting for their pre-emption victims to leave (they count as
    running, as for the per-user limits)."""
    cap = job.array_max_running
    if job.array_id is None or cap is None:
        return None
    running = running_by_array.get(job.array_id, 0)
    running += sum(1 for c in claimants if c.array_id == job.array_id and c.id != job.id)
    if running + 1 > cap:
        return reasons.ARRAY_LIMIT.reason(array=job.array_id, limit=cap)
    return None


def array_text(indices, max_running: int | None = None) -> str:
    """Sorted ``indices`` as Slurm writes them, ``0-3,7,9-12``, with ``%max_running``."""
    parts, run = [], []
    for index in sorted(indices):
        if run and index == run[-1] + 1:
            run.append(index)
            continue
        if run:
            parts.append(_run_text(run))
        run = [index]
    if run:
        parts.append(_run_text(run))
    cap = f"%{max_running}" if max_running is not None else ""
    return ",".join(parts) + cap


def array_name(array_id: str, indices, max_running: int | None = None) -> str:
    """The one row an array's elements ``indices`` are listed as: ``a-000012_[5-99%8]``."""
    return f"{array_id}_[{array_text(indices, max_running)}]"


def _run_text(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"
