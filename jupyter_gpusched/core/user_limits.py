"""Per-user caps from the queue file's ``user_limits:`` section: the GPUs and jobs one user may
run at once and the jobs they may keep pending (``default`` applies to users without an entry).

Apart from :mod:`.quotas` because they cap a person across all queues, not a queue's subtree;
the :class:`~.quotas.QueueTree` keeps them, :mod:`.admission` and :mod:`.submission` apply them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import ConfigError, line_of


@dataclass(frozen=True)
class UserLimit:
    """Caps on one user's jobs (None: no cap): GPUs and jobs running, jobs pending."""

    gpus: float | None = None
    running_jobs: int | None = None
    pending_jobs: int | None = None


_USER_LIMIT_FIELDS = ("gpus", "running_jobs", "pending_jobs")


def parse_user_limits(entries, source: str, container) -> dict[str, UserLimit]:
    if entries is None:
        return {}
    if not isinstance(entries, dict):
        raise ConfigError(
            "must map user names (or 'default') to limits",
            source=source,
            field="user_limits",
            line=line_of(container, "user_limits"),
        )
    out = {}
    for user, spec in entries.items():

        def fail(message, key, spec=spec, user=user):
            line = line_of(spec, key) if isinstance(spec, dict) else line_of(entries, user)
            raise ConfigError(
                message, source=source, entry=f"user_limits {user}", field=key, line=line
            )

        if not isinstance(spec, dict):
            fail("must be a mapping with gpus, running_jobs, pending_jobs", "user_limits")
        values = {}
        for key, value in spec.items():
            if key not in _USER_LIMIT_FIELDS:
                fail(f"unknown field {key!r}; known: {', '.join(_USER_LIMIT_FIELDS)}", key)
            if value is None:
                continue
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                fail(f"'{key}' must be a finite number >= 0, got {value!r}", key)
            if key != "gpus" and value != int(value):
                fail(f"'{key}' must be a whole number of jobs, got {value!r}", key)
            values[key] = float(value) if key == "gpus" else int(value)
        out[str(user)] = UserLimit(**values)
    return out
