"""Errors raised by the engine when an input (cluster, queue, policy, job) is invalid."""

from __future__ import annotations


class ConfigError(ValueError):
    """An input file or request is invalid.

    The message names where the problem is (``source``: a file name; ``entry``: the node, queue or
    job; ``field``; ``line`` when the YAML loader knows it) and says what to fix.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        entry: str | None = None,
        field: str | None = None,
        line: int | None = None,
    ):
        self.message = message
        self.source = source
        self.entry = entry
        self.field = field
        self.line = line
        super().__init__(str(self))

    def __str__(self) -> str:
        where = []
        if self.source:
            where.append(self.source if self.line is None else f"{self.source}:{self.line}")
        elif self.line is not None:
            where.append(f"line {self.line}")
        if self.entry:
            where.append(self.entry)
        if self.field:
            where.append(f"field '{self.field}'")
        prefix = ", ".join(where)
        return f"{prefix}: {self.message}" if prefix else self.message


def line_of(mapping, key) -> int | None:
    """The YAML line of ``key`` in ``mapping`` when it was read with line numbers, else None."""
    lines = getattr(mapping, "lines", None)
    return lines.get(key) if lines else None
