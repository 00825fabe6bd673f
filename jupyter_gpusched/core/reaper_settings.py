"""The idle reaper's settings: their defaults (:data:`DEFAULTS`, what the policy file's
``reaper:`` section and ``PUT api/reaper`` change) and their checks, plain functions with no I/O.
A bad setting is a :class:`~.errors.ConfigError` naming the field (``service/reaper_requests.py``
answers it as the REST API's 400); :mod:`.reaper` decides with the settings they return.
"""

from __future__ import annotations

import math

from .durations import parse_duration
from .errors import ConfigError

DEFAULTS: dict = {
    "enabled": True,
    "idle_threshold": 5.0,  # percent: the one that decides idleness (core/reaper.py says why)
    "warning_lead": 600.0,  # seconds before the timeout
    "timeout_tier_1": None,  # None (or 0): never culled for idleness
    "timeout_tier_2": 2700.0,
    "timeout_tier_3": 1800.0,
    "profile_timeouts": {},  # profile slug -> seconds or None; wins over the two below
    # profile slug -> the profile's own idle_timeout (the hub's profiles; not set through PUT)
    "profile_idle_timeouts": {},
    "exempt_users": [],
    "exempt_groups": [],
    "exempt_profiles": [],
    "max_lifetime": None,  # a cap on every notebook server's run (reaper.lifetime_end); None: none
    "stale_after": 120.0,  # a session without a measurement this recent is not decided on
    # a session without a trusted measurement for this long (since its start or its last one)
    # is unmonitored: reported to admins, then "warn" (its owner is told, it keeps running),
    # "cull" (its unmeasured time counts as idle: warned, then culled) or "keep" (reported only)
    "unmonitored": "warn",
    "unmonitored_after": 300.0,
    # at the timeout, first shut down only the GPU-idle kernels that hold GPU memory; the
    # server is stopped if it stays GPU-idle for warning_lead more
    "shutdown_kernels_first": False,
    # GPU processes no allocation accounts for (service/rogue.py): "report", "kill" or "off"
    "rogue_processes": "report",
}
ROGUE_MODES = ("report", "kill", "off")
UNMONITORED_MODES = ("warn", "cull", "keep")
DURATIONS = ("warning_lead", "timeout_tier_1", "timeout_tier_2", "timeout_tier_3")
OPTIONAL = ("timeout_tier_1", "timeout_tier_2", "timeout_tier_3", "max_lifetime")
LISTS = ("exempt_users", "exempt_groups", "exempt_profiles")
FROM_THE_HUB = ("profile_idle_timeouts",)  # settings the hub's configuration gives, read-only


def _duration(value, name: str, optional: bool) -> float | None:
    if value is None or (optional and value in ("off", "none", "null", "")):
        if optional:
            return None
        raise ConfigError(f"'{name}' must be a duration (seconds, or 30m, 1h)", field=name)
    try:
        seconds = parse_duration(value)
    except (ValueError, TypeError, OverflowError):
        raise ConfigError(
            f"'{name}' must be a duration (seconds, or 30m, 1h)"
            + (", or off (null in JSON) to turn it off" if optional else ""),
            field=name,
        ) from None
    if not math.isfinite(seconds):
        raise ConfigError(f"'{name}' must be a finite duration", field=name)
    if optional and seconds == 0:
        return None
    return seconds


def validate(changes, base: dict | None = None) -> dict:
    """``base`` (default :data:`DEFAULTS`) with ``changes`` applied, checked; a ConfigError names
    the first bad field."""
    if not isinstance(changes, dict):
        raise ConfigError("the reaper settings must be a JSON object")
    result = {k: (dict(v) if isinstance(v, dict) else v) for k, v in (base or DEFAULTS).items()}
    for name, value in changes.items():
        if name not in DEFAULTS:
            known = ", ".join(k for k in DEFAULTS if k not in FROM_THE_HUB)
            raise ConfigError(f"unknown reaper setting {name!r}; known: {known}", field=name)
        if name in FROM_THE_HUB:
            raise ConfigError(
                f"'{name}' are the idle_timeout of the hub's profiles (GPUSchedSpawner.profiles); "
                "set profile_timeouts to override one",
                field=name,
            )
        if name in ("enabled", "shutdown_kernels_first"):
            if not isinstance(value, bool):
                raise ConfigError(f"'{name}' must be true or false", field=name)
        elif name in ("rogue_processes", "unmonitored"):
            modes = ROGUE_MODES if name == "rogue_processes" else UNMONITORED_MODES
            if value not in modes:
                raise ConfigError(f"'{name}' must be one of {', '.join(modes)}", field=name)
        elif name == "idle_threshold":
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0 <= value <= 100
            ):
                raise ConfigError("'idle_threshold' must be a percentage from 0 to 100", field=name)
            value = float(value)
        elif name in DURATIONS or name in ("max_lifetime", "stale_after", "unmonitored_after"):
            value = _duration(value, name, name in OPTIONAL)
        elif name in LISTS:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"'{name}' must be a list of names", field=name)
            value = sorted(set(value))
        elif name == "profile_timeouts":
            if not isinstance(value, dict):
                raise ConfigError(
                    "'profile_timeouts' must map profile slugs to durations", field=name
                )
            value = {
                str(slug): _duration(seconds, f"profile_timeouts.{slug}", True)
                for slug, seconds in value.items()
            }
        result[name] = value
    return result


def with_profile_idle_timeouts(settings: dict, profiles: dict) -> dict:
    """``settings`` with the hub profiles' own idle timeouts (slug -> seconds; None or 0: the
    profile has none and its tier's applies)."""
    timeouts = {}
    for slug, seconds in (profiles or {}).items():
        value = _duration(seconds, f"profile_idle_timeouts.{slug}", True)
        if value is not None:
            timeouts[str(slug)] = value
    return {**settings, "profile_idle_timeouts": timeouts}
