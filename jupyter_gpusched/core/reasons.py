"""The one catalogue of why a job waits: every :class:`Reason` the engine (or the service, for
a rejected job) gives is built from an entry here.

An entry has a ``family`` (``capacity`` | ``placement`` | ``policy``, or ``rejected``), a
``detail``, a message template with named arguments (``str.format`` syntax; the arguments in
``gpus`` are written in words, "8 GPUs"), the arguments that name a user (``users``: the API
shows "its owner" there to anyone but the job's owner and admins) and a line for the docs, "the
job waits because ...". A detail may have several entries (``user-limit`` counts GPUs or jobs);
they share the detail's docs row.

Build a reason with the entry, ``QUEUE_LIMIT.reason(queue=..., limit=..., used=..., asks=...)``; the
Reason keeps its arguments (``args``) so a message can be rendered again without its users'
names (:meth:`Reason.render`). The constructor refuses a family and detail that no entry has.

``make docs`` rewrites the reason table of docs/engine.md from this catalogue (:func:`with_table`,
between its two marker comments); a test fails when they differ.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, replace
from functools import lru_cache

from .wording import gpus_text

HIDDEN_USER = "its owner"  # what a user argument reads as for those who may not see the name


@dataclass(frozen=True)
class Reason:
    """Why a job is pending: one ``family`` (capacity | placement | policy), a finer ``detail``
    (e.g. ``queue-limit``, ``reservation``) and a message a user understands, rendered from
    ``args`` (name, value pairs) by its catalogue entry."""

    family: str
    detail: str
    message: str
    eta: float | None = None  # estimated start (engine time), where the reservation gives one
    args: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        if (self.family, self.detail) not in _DETAILS:
            raise ValueError(
                f"no reason {self.family!r} / {self.detail!r} in the catalogue (core/reasons.py)"
            )

    def with_eta(self, eta: float | None) -> Reason:
        return replace(self, eta=eta)

    def render(self, hide_users: bool = False) -> str:
        """The message; with ``hide_users``, "its owner" where it names a user."""
        if not hide_users:
            return self.message
        return entry_of(self).render(dict(self.args), hide_users=True)


@dataclass(frozen=True, eq=False)  # compared (and hashed: see _build) by identity
class Entry:
    family: str
    detail: str
    template: str
    because: str  # for the docs: "the job waits because ..."
    users: tuple[str, ...] = ()  # arguments that name a user
    gpus: tuple[str, ...] = ()  # arguments written as a GPU count in words

    def render(self, args: dict, hide_users: bool = False) -> str:
        if self.gpus or (hide_users and self.users):
            args = dict(args)
            for name in self.gpus:
                args[name] = gpus_text(args[name])
            if hide_users:
                for name in self.users:
                    args[name] = HIDDEN_USER
        return self.template.format_map(args)

    def reason(self, eta: float | None = None, **args) -> Reason:
        return _build(self, eta, tuple(args.items()), tuple(map(type, args.values())))


# A pass gives the same jobs the same reasons again and again: reasons are immutable, so one
# instance serves (this keeps the catalogue as fast as the f-strings it replaced). The types
# are part of the key: 8 and 8.0 are equal but do not read the same.
@lru_cache(maxsize=4096)
def _build(entry: Entry, eta: float | None, args: tuple, _types: tuple) -> Reason:
    return Reason(entry.family, entry.detail, entry.render(dict(args)), eta, args)


# -- policy: a quota, a limit, a reservation, maintenance or an admin keeps it waiting ----------
QUEUE_LIMIT = Entry(
    "policy",
    "queue-limit",
    "queue {queue} is at its limit of {limit} ({used:g} in use, the job asks for {asks:g})",
    "its queue or an ancestor would go over its GPU `limit`",
    gpus=("limit",),
)
QUEUE_ABOVE_LIMIT = Entry(
    "policy",
    "queue-limit",
    "queue {queue}, above {leaf}, is at its limit of {limit} ({used:g} in use, the job asks for "
    "{asks:g})",
    "its queue or an ancestor would go over its GPU `limit`",
    gpus=("limit",),
)
QUEUE_CPU_LIMIT = Entry(
    "policy",
    "queue-cpu-limit",
    "queue {queue} is at its limit of {limit:g} CPUs ({used:g} in use, the job asks for {asks:g})",
    "its queue or an ancestor would go over its `cpus` limit",
)
QUEUE_MEMORY_LIMIT = Entry(
    "policy",
    "queue-memory-limit",
    "queue {queue} is at its limit of {limit:g} GB of memory ({used:g} in use, the job asks "
    "for {asks:g})",
    "its queue or an ancestor would go over its `memory_gb` limit",
)
QUEUE_ABOVE_CPU_LIMIT = Entry(
    "policy",
    "queue-cpu-limit",
    "queue {queue}, above {leaf}, is at its limit of {limit:g} CPUs ({used:g} in use, the job "
    "asks for {asks:g})",
    "its queue or an ancestor would go over its `cpus` limit",
)
QUEUE_ABOVE_MEMORY_LIMIT = Entry(
    "policy",
    "queue-memory-limit",
    "queue {queue}, above {leaf}, is at its limit of {limit:g} GB of memory ({used:g} in use, "
    "the job asks for {asks:g})",
    "its queue or an ancestor would go over its `memory_gb` limit",
)
TIER1_GUARANTEE = Entry(
    "policy",
    "tier1-guarantee",
    "tier-1 jobs of {queue} already use {used:g} of its {guaranteed:g} guaranteed GPUs",
    "a tier-1 job would go over its queue's guarantee",
)
USER_LIMIT_GPUS = Entry(
    "policy",
    "user-limit",
    "{user} already runs {gpus}; the limit per user is {limit:g}",
    "its user runs the most GPUs or jobs `user_limits` allow",
    users=("user",),
    gpus=("gpus",),
)
USER_LIMIT_JOBS = Entry(
    "policy",
    "user-limit",
    "{user} already runs {count} jobs; the limit per user is {limit}",
    "its user runs the most GPUs or jobs `user_limits` allow",
    users=("user",),
)
ARRAY_LIMIT = Entry(
    "policy",
    "array-limit",
    "array {array} is at its limit of {limit} running",
    "its job array already runs as many elements as its `%max_running` allows",
)
RESERVATION = Entry(
    "policy",
    "reservation",
    "the free GPUs it could use are reserved for job {job}, which has priority; it would not "
    "end before that job starts",
    "the free GPUs (or, CPU-only, the CPUs) it could use are reserved",
)
RESERVATION_CPUS = Entry(
    "policy",
    "reservation",
    "the nodes with {cpus:g} CPUs and {memory_gb:g} GB of memory free for it are reserved for "
    "job {job}, which needs them when it starts",
    "the free GPUs (or, CPU-only, the CPUs) it could use are reserved",
)
MAINTENANCE = Entry(
    "policy",
    "maintenance",
    "the GPUs free for it are on nodes going into maintenance before its walltime of "
    "{walltime_h:g} h would end",
    "the free GPUs are on nodes going into maintenance before it would end",
)
HELD = Entry(
    "policy",
    "held",
    "held by an admin; it waits until released",
    "an admin holds it",
)

# -- capacity: not enough is free -----------------------------------------------------------
GPUS_BUSY = Entry(
    "capacity",
    "gpus-busy",
    "needs {gpus}; {free:g} free",
    "fewer free GPUs of its models than it asks for",
    gpus=("gpus",),
)
FREED_SINCE_BACKFILL = Entry(
    "capacity",
    "awaiting-backfill",
    "needs {gpus}; {free:g} free since the last backfill pass; the next one, within "
    "{within_s} s, checks whether it can start before job {job}",
    "GPUs it could use were freed after the last backfill pass; the next one (at most "
    "`backfill.interval` later) checks whether it can use them before the first job in line "
    "(core/reason_now.py)",
    gpus=("gpus",),
)
CPUS_BUSY = Entry(
    "capacity",
    "cpus-busy",
    "needs {cpus:g} CPUs and {memory_gb:g} GB of memory on one node; no node has them free",
    "(CPU-only) no node has its CPUs and memory free",
)
PREEMPTING = Entry(
    "capacity",
    "preempting",
    "pre-empting {victims}; starts once they have checkpointed",
    "it pre-empts lower-tier jobs and starts once they have gone",
)
PREEMPTION_DROPPED = Entry(
    "capacity",
    "preemption-dropped",
    "its pre-emption was called off; it waits again",
    "its pre-emption was called off (a node went away, an admin held it...)",
)
PREEMPTED = Entry(
    "capacity",
    "preempted",
    "requeued after pre-emption",
    "requeued after a pre-emption",
)
NODE_DOWN = Entry(
    "capacity",
    "node-down",
    "requeued: {node} went down",
    "requeued after a node failure",
)

# -- placement: enough is free, but not in a shape it can use --------------------------------
FRAGMENTED = Entry(
    "placement",
    "fragmented",
    "{free} free, but no single node has {gpus} free",
    "enough GPUs are free, but no single node has as many as it asks for",
    gpus=("free",),
)
GANG_SHAPE = Entry(
    "placement",
    "gang-shape",
    "{free} free, but not {nodes} nodes with {per_node} each",
    "enough GPUs are free, but not on as many nodes with `gpus_per_node` each",
    gpus=("free",),
)
CONSTRAINTS = Entry(
    "placement",
    "constraints",
    "{free} free, but none in a shape that meets its constraints",
    "enough GPUs are free, but none of its models, labels or shape",
    gpus=("free",),
)
ONE_LEAF = Entry(
    "placement",
    "one-leaf",
    "{free} free, but not under one leaf switch; it waits for one for {patience_min:g} min, "
    "then may span leaves",
    "enough GPUs are free, but not under one leaf switch (for `leaf_patience`)",
    gpus=("free",),
)
LAUNCH_REFUSED = Entry(
    "placement",
    "launch-refused",
    "the launcher refused its placement ({message}); retried at {when} UTC (refusal "
    "{refusals} in a row)",
    "the launcher refused its placement; it is retried after a back-off",
)

# -- rejected: it can never run (the service's records; the engine rejects, not waits) --------
CANNOT_RUN = Entry(
    "rejected",
    "cannot-run",
    "{message}",
    "(rejected) it can never run on this cluster under these quotas",
)

CATALOGUE: tuple[Entry, ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, Entry)
)
_DETAILS = {(entry.family, entry.detail) for entry in CATALOGUE}


def entry_of(reason: Reason) -> Entry:
    """The catalogue entry ``reason`` was built from (its detail and argument names)."""
    names = {name for name, _ in reason.args}
    for entry in CATALOGUE:
        same = entry.detail == reason.detail and entry.family == reason.family
        if same and names == _arguments(entry.template):
            return entry
    raise LookupError(f"no catalogue entry for {reason!r}")


def _arguments(template: str) -> set[str]:
    return {field for _, field, _, _ in string.Formatter().parse(template) if field}


# -- the docs table --------------------------------------------------------------------------
TABLE_BEGIN = "<!-- reasons table: generated from core/reasons.py by make docs -->"
TABLE_END = "<!-- end of reasons table -->"


def markdown_table() -> str:
    """The reason table of docs/engine.md: one row per family and detail, in catalogue order."""
    rows: dict[tuple[str, str], list[str]] = {}
    for entry in CATALOGUE:
        because = rows.setdefault((entry.family, entry.detail), [])
        if entry.because not in because:
            because.append(entry.because)
    lines = ["| family | detail | the job waits because |", "|---|---|---|"]
    for (family, detail), because in rows.items():
        lines.append(f"| `{family}` | `{detail}` | {'; '.join(because)} |")
    return "\n".join(lines) + "\n"


def with_table(text: str) -> str:
    """``text`` (docs/engine.md) with the table between its markers rewritten."""
    head, begin, rest = text.partition(TABLE_BEGIN)
    _, end, tail = rest.partition(TABLE_END)
    if not begin or not end:
        raise ValueError(f"the markers {TABLE_BEGIN!r} and {TABLE_END!r} are missing")
    return f"{head}{TABLE_BEGIN}\n{markdown_table()}{TABLE_END}{tail}"
