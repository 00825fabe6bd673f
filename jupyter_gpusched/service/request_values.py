"""Reading one value of a request body: a whole number, a number, a text, a choice, an object
of strings, a duration, GPU models; each within its bound, or a :class:`RequestError` (a 400)
that names the field and quotes at most :data:`QUOTE` characters of what it got. The job
request's parser (service/requests.py) reads its fields with these.
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from datetime import datetime

from ..core.durations import parse_duration
from ..core.jobspec import FIELDS, MAX_GPU_MODEL, MAX_GPU_MODELS, MAX_WALLTIME

QUOTE = 80  # error messages quote at most this many characters of bad input
MAX_DURATION_TEXT = 64  # 'walltime' as text ('1h30m'): characters
_GPU_MODEL_HELP = next(f.spec.help for f in FIELDS if f.wire == "gpu_model")


class RequestError(ValueError):
    """A bad request: ``message`` says what to fix, ``field`` names the field (or None)."""

    def __init__(self, message: str, field: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.field, self.status = message, field, status


def quote(value) -> str:
    """``repr(value)``, cut to :data:`QUOTE` characters: an error never echoes a whole body."""
    if isinstance(value, str) and len(value) > QUOTE:
        value = value[:QUOTE]  # no repr of a megabyte to keep 80 characters of it
    text = repr(value)
    return text if len(text) <= QUOTE else text[: QUOTE - 3] + "..."


MAX_WHOLE = 2**31 - 1  # what an INTEGER column holds on every database


def whole_number(value):
    """``value`` as an int if it is a whole number (JSON Schema's integer: ``2.0`` is one, as
    api/openapi.json says), else unchanged."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def read_whole(data, name, minimum) -> int:
    value = whole_number(data[name])
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_WHOLE:
        raise RequestError(
            f"'{name}' must be a whole number from {minimum} to {MAX_WHOLE}, got {quote(value)}",
            name,
        )
    return value


def read_number(data, name, maximum: float) -> float:
    """A number from 0 to ``maximum``."""
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"'{name}' must be a number, got {quote(value)}", name)
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float, e.g. 10**400
        number = math.inf
    if not 0 <= number <= maximum:
        raise RequestError(
            f"'{name}' must be a number from 0 to {maximum:g}, got {quote(value)}", name
        )
    return number


def read_walltime(value) -> float:
    """Seconds in (0, MAX_WALLTIME], from a number or a duration text."""
    if isinstance(value, str) and len(value) > MAX_DURATION_TEXT:
        raise RequestError(
            f"'walltime' must be at most {MAX_DURATION_TEXT} characters, got {quote(value)}",
            "walltime",
        )
    try:
        seconds = parse_duration(value)
    except (ValueError, TypeError, OverflowError):
        seconds = math.nan
    if not 0 < seconds <= MAX_WALLTIME:  # NaN too
        raise RequestError(
            f"'walltime' must be seconds or a duration (30m, 2h, 1d) longer than 0 and at most "
            f"{MAX_WALLTIME / 86_400:g}d (one year), got {quote(value)}",
            "walltime",
        )
    return seconds


def read_deadline(value, now: float | None = None, latest: float = 2 * 365 * 86_400.0) -> float:
    """The time (epoch seconds) by which a job must have finished, from a time with its zone
    (ISO 8601: ``2026-12-24T18:00:00Z``, ``2026-12-24T19:00+01:00``) or a duration from ``now``
    (the submission: a number of seconds or ``6h``, ``2d``); at most ``latest`` after now."""
    now = time.time() if now is None else now
    expected = (
        "'deadline' must be a time with its zone (2026-12-24T18:00:00Z) or a duration from "
        f"now (seconds, 90m, 6h, 2d), later than now and at most {latest / 86400:g} days ahead"
    )
    if isinstance(value, str) and len(value) > MAX_DURATION_TEXT:
        raise RequestError(f"{expected}; got {quote(value)}", "deadline")
    when = math.nan
    if isinstance(value, str) and re.match(r"\s*\d{4}-\d{2}-\d{2}", value):
        try:
            moment = datetime.fromisoformat(value.strip())
        except ValueError:
            moment = None
        if moment is not None and moment.tzinfo is None:
            raise RequestError(
                f"'deadline' {quote(value)} has no time zone: add Z (UTC) or an offset such "
                "as +01:00",
                "deadline",
            )
        if moment is not None:
            when = moment.timestamp()
    else:
        with contextlib.suppress(ValueError, TypeError, OverflowError):
            when = now + parse_duration(value)
    if not now < when <= now + latest:  # NaN too
        raise RequestError(f"{expected}; got {quote(value)}", "deadline")
    return when


def read_text(data, name, max_length: int) -> str | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise RequestError(f"'{name}' must be a non-empty string, got {quote(value)}", name)
    if len(value) > max_length or "\x00" in value:
        raise RequestError(
            f"'{name}' must be at most {max_length} characters, no NUL; got {len(value)} "
            f"starting {quote(value)}",
            name,
        )
    return value


def read_choice(data, name, choices, default) -> str:
    value = data.get(name, default)
    if not isinstance(value, str) or value not in choices:
        raise RequestError(
            f"'{name}' must be one of {', '.join(choices)}, got {quote(value)}", name
        )
    return value


def read_strings(data, name, max_entries: int, max_key: int, max_value: int) -> dict[str, str]:
    """An object of at most ``max_entries`` strings, keys of at most ``max_key`` and values of
    at most ``max_value`` characters."""
    value = data.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(f"'{name}' must be an object of strings, got {quote(value)}", name)
    if len(value) > max_entries:
        raise RequestError(f"'{name}' has {len(value)} entries; at most {max_entries}", name)
    for key, item in value.items():
        if not isinstance(item, str) or "\x00" in key + item:
            raise RequestError(
                f"'{name}' must be an object of strings (no NUL); {quote(key)} is {quote(item)}",
                name,
            )
        if len(key) > max_key or len(item) > max_value:
            raise RequestError(
                f"'{name}': keys have at most {max_key} and values at most {max_value} "
                f"characters; {quote(key)} has {len(key)} and its value {len(item)}",
                name,
            )
    return dict(value)


def read_models(value) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, str) and len(value) > MAX_GPU_MODELS * (MAX_GPU_MODEL + 1):
        raise RequestError(
            f"'gpu_model' is {len(value)} characters; at most {MAX_GPU_MODELS} models of "
            f"{MAX_GPU_MODEL} characters each",
            "gpu_model",
        )
    names = value.split("|") if isinstance(value, str) else value
    if (
        not isinstance(names, list)
        or not names
        or not all(isinstance(n, str) and n.strip() and "\x00" not in n for n in names)
    ):
        raise RequestError(f"{_GPU_MODEL_HELP}; got {quote(value)}", "gpu_model")
    if len(names) > MAX_GPU_MODELS or any(len(n) > MAX_GPU_MODEL for n in names):
        raise RequestError(
            f"'gpu_model': at most {MAX_GPU_MODELS} models of at most {MAX_GPU_MODEL} "
            f"characters each; got {quote(value)}",
            "gpu_model",
        )
    return frozenset(n.strip() for n in names)
