"""Deep copies of the engine's bulkiest parts at a fraction of ``copy.deepcopy``'s cost, for
:func:`snapshot`: a copy of the scheduler, for ``POST api/estimate`` (:mod:`.estimate`) and
the expected starts (:mod:`.plan`).

A class whose attributes include containers of immutable entries (tuples of numbers and strings,
frozen dataclasses) names them in its ``__deepcopy__``: a new container holding the same
entries is then a whole copy, where a deep copy would visit every tuple. Every attribute not
named is deep-copied as usual, so an attribute added later is copied safely until it is named.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable


def copy_parts(obj, memo: dict, flat: Iterable[str] = (), nested: Iterable[str] = ()):
    """A deep copy of ``obj`` (through ``memo``, so what it shares with the rest of the copied
    graph stays shared), except that its ``flat`` attributes are containers of immutable
    entries, copied as containers, and its ``nested`` ones dicts of such containers."""
    new = object.__new__(type(obj))
    memo[id(obj)] = new
    flat, nested = set(flat), set(nested)
    for name, value in vars(obj).items():
        if name in flat:
            value = copy.copy(value)
        elif name in nested:
            value = {key: copy.copy(inner) for key, inner in value.items()}
        else:
            value = copy.deepcopy(value, memo)
        new.__dict__[name] = value
    return new


def snapshot(sched):
    """A copy of ``sched`` that can be submitted to and scheduled without changing ``sched``.
    Shares the cluster description, the settings and the policy (which no event or pass
    changes); copies the rest. A job is copied shallowly (most of the copy's cost otherwise):
    the engine changes a job only by assigning its attributes, and its one mutable value, the
    ``labels`` it asks for, is only read."""
    memo: dict[int, object] = {id(part): part for part in (sched.cluster, sched.settings)}
    memo[id(sched.policy)] = sched.policy
    for job in sched.jobs.values():
        memo[id(job)] = _shallow(job)
    return copy.deepcopy(sched, memo)


def _shallow(job):
    """``copy.copy(job)`` at a third of its cost (a Job is a plain dataclass)."""
    new = object.__new__(type(job))
    new.__dict__.update(job.__dict__)
    return new
