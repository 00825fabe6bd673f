"""Who is calling: what auth.py makes of a request's token or cookie, and what the live
scheduler is told a request comes from. Apart from auth.py so that the scheduler side needs
none of the web side to name it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Identity:
    """Who is calling: a hub user (or service), their groups, and whether they administer the
    scheduler."""

    name: str
    admin: bool = False
    groups: frozenset[str] = frozenset()
