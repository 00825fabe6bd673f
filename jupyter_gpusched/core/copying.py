"""Deep copies of the engine's bulkiest parts at a fraction of ``copy.deepcopy``'s cost, for
:func:`.estimate.snapshot` (a copy of the scheduler per ``POST api/estimate``).

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
