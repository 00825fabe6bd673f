"""The reaper's settings at the REST edge: the checks of ``core/reaper_settings.py``, their
ConfigError as the 400 :class:`~.requests.RequestError` naming the same field and saying the same
thing (the message alone: a request names no file)."""

from __future__ import annotations

from contextlib import contextmanager

from ..core import reaper_settings as rules
from ..core.errors import ConfigError
from .requests import RequestError


@contextmanager
def as_request_error():
    """A ConfigError of the reaper's rules, raised inside, as a 400 RequestError."""
    try:
        yield
    except ConfigError as exc:
        raise RequestError(exc.message, exc.field) from None


def validate(changes, base: dict | None = None) -> dict:
    """:func:`..core.reaper_settings.validate`, a bad setting a 400 naming its field."""
    with as_request_error():
        return rules.validate(changes, base)


def with_profile_idle_timeouts(settings: dict, profiles: dict) -> dict:
    """:func:`..core.reaper_settings.with_profile_idle_timeouts`, a bad one a 400."""
    with as_request_error():
        return rules.with_profile_idle_timeouts(settings, profiles)
