"""Expand Slurm-style host lists: ``gpu-a[01-04]`` -> gpu-a01, gpu-a02, gpu-a03, gpu-a04."""

from __future__ import annotations

import re

_BRACKET = re.compile(r"\[([^\[\]]*)\]")


def expand_hostlist(pattern: str) -> list[str]:
    """Expand every ``[a-b,c]`` group of ``pattern``; zero padding follows the lower bound.

    Raises ValueError with a message that says what is wrong with the range.
    """
    if pattern.count("[") != pattern.count("]"):
        raise ValueError(f"unbalanced brackets in host list {pattern!r}")
    match = _BRACKET.search(pattern)
    if match is None:
        if "[" in pattern or "]" in pattern:
            raise ValueError(f"malformed host list {pattern!r}")
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    names = []
    for item in _expand_group(match.group(1), pattern):
        names.extend(expand_hostlist(head + item + tail))
    return names


def _expand_group(group: str, pattern: str) -> list[str]:
    if not group.strip():
        raise ValueError(f"empty range in host list {pattern!r}")
    items: list[str] = []
    for part in group.split(","):
        part = part.strip()
        if "-" in part:
            low, _, high = part.partition("-")
            if not (low.isdigit() and high.isdigit()):
                raise ValueError(f"range {part!r} in {pattern!r} must be two numbers, like 01-16")
            start, stop = int(low), int(high)
            if stop < start:
                raise ValueError(f"range {part!r} in {pattern!r} runs backwards")
            width = len(low) if low.startswith("0") else 0
            items.extend(str(i).zfill(width) for i in range(start, stop + 1))
        elif part.isdigit():
            items.append(part)
        else:
            raise ValueError(f"range item {part!r} in {pattern!r} must be a number or a-b")
    return items
