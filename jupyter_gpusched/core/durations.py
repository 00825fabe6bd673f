"""Durations in files and requests: ``90``, ``"90s"``, ``"5m"``, ``"2h"``, ``"7d"``, ``"1h30m"``."""

from __future__ import annotations

import re

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")


def parse_duration(value) -> float:
    """Seconds as a float; raises ValueError saying which forms are accepted."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"duration {value!r} is negative")
        return float(value)
    text = str(value).strip().lower()
    try:
        seconds = float(text)
    except ValueError:
        pass
    else:
        if seconds < 0:
            raise ValueError(f"duration {value!r} is negative")
        return seconds
    position, total = 0, 0.0
    for match in _PART.finditer(text):
        if text[position : match.start()].strip():
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        position = match.end()
    if position == 0 or text[position:].strip():
        raise ValueError(
            f"{value!r} is not a duration: use seconds or a number with s, m, h, d or w "
            "(e.g. 300, 5m, 1h30m, 7d)"
        )
    return total


def describe_duration(seconds: float) -> str:
    """A duration as people read it: ``45 s``, ``2 min 6 s``, ``45 min``, ``1 h``, ``1.5 h``,
    ``2 d``. Exact to the second under 10 min, where the seconds matter (a warning's lead);
    whole minutes up to 6 h, unless a round number of hours."""
    seconds = max(0.0, float(seconds))
    if seconds >= 86400 and seconds % 86400 == 0:
        return f"{seconds / 86400:g} d"
    if (seconds % 3600 == 0 and seconds > 0) or seconds > 6 * 3600:
        return f"{round(seconds / 3600, 1):g} h"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, rest = divmod(whole, 60)
    if seconds >= 600 or rest == 0:
        return f"{round(seconds / 60)} min"
    return f"{minutes} min {rest} s"
