"""Slurm's words, read: ``scontrol show ... --oneliner`` lines, host lists, GRES strings and
node states, as Python values.

Pure text-to-value functions, no command is run here: the cluster-file reader
(:mod:`.inventory`), the batch launcher (:mod:`.launcher`, :mod:`.ends`) and the hub's Slurm
spawner all read Slurm's answers through them, so each format is understood in one place.
"""

from __future__ import annotations

import re
from collections import Counter

from ...core.hostlist import expand_hostlist

_KEY = re.compile(r"^([A-Za-z][A-Za-z0-9_/:.]*)=(.*)$", re.S)


def parse_oneliner(line: str) -> dict[str, str]:
    """``Key=value Key=value ...`` (one ``scontrol show ... --oneliner`` line) as a dict.
    A value may contain spaces (``OS=Linux 6.1 #1 SMP``, ``Reason=disk full [root@...]``):
    words without ``Key=`` belong to the value before them."""
    fields: dict[str, str] = {}
    key = None
    for word in line.split():
        match = _KEY.match(word)
        if match is not None:
            key = match.group(1)
            fields[key] = match.group(2)
        elif key is not None:
            fields[key] += " " + word
    return fields


def expand_nodes(hostlist: str) -> list[str]:
    """Slurm host list -> names: ``n[1-3],gpu7`` -> n1, n2, n3, gpu7."""
    names: list[str] = []
    depth, item = 0, ""
    for char in hostlist.strip():
        if char == "," and depth == 0:
            if item:
                names.extend(expand_hostlist(item))
            item = ""
            continue
        depth += (char == "[") - (char == "]")
        item += char
    if item:
        names.extend(expand_hostlist(item))
    return names


def parse_gres(gres: str) -> Counter:
    """GPUs per type from a node's ``Gres=``: ``gpu:h100:4(S:0-1),gpu:2,shard:8`` ->
    {"h100": 4, "": 2}."""
    counts: Counter = Counter()
    if not gres or gres == "(null)":
        return counts
    depth, items, item = 0, [], ""
    for char in gres:
        if char == "," and depth == 0:
            items.append(item)
            item = ""
            continue
        depth += (char == "(") - (char == ")")
        item += char
    items.append(item)
    for entry in items:
        entry = re.sub(r"\(.*\)$", "", entry.strip())
        parts = entry.split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        count = parts[-1]
        if not count.isdigit():  # "gpu:h100" (a count of 1 is written out by Slurm, but ...)
            continue
        kind = ":".join(p for p in parts[1:-1] if p not in ("no_consume",))
        counts[kind] += int(count)
    return counts


def engine_state(slurm_state: str) -> str | None:
    """Slurm's ``State=`` -> the engine's ``up``, ``drain`` or ``down``; None when Slurm does not
    know yet (UNKNOWN: slurmctld has just started and the node has not registered).

    * ``down``: the base state is DOWN (set by an admin, or after ``SlurmdTimeout`` without an
      answer) or FUTURE (not in service yet). Running jobs there are lost: the engine requeues
      batch jobs.
    * ``drain``: the flags DRAIN (also DRAINING / DRAINED), FAIL, REBOOT_REQUESTED,
      REBOOT_ISSUED, INVALID_REG, or the base state ERROR / INVAL: no new work; running jobs
      finish.
    * ``up``: everything else: IDLE, MIXED, ALLOCATED, COMPLETING, with flags such as
      NOT_RESPONDING (a passing silence; Slurm itself downs the node after ``SlurmdTimeout``),
      POWERED_DOWN / POWERING_UP (power saving: Slurm powers it up for a job), MAINT, RESERVED,
      PLANNED, CLOUD.
    """
    words = [w.rstrip("*~#!%$@^-") for w in slurm_state.upper().split("+")]
    base, flags = words[0], set(words[1:])
    if base == "UNKNOWN" and not flags & {"DRAIN", "FAIL"}:
        return None
    if base in ("DOWN", "FUTURE"):
        return "down"
    drain_flags = {"DRAIN", "DRAINING", "DRAINED", "FAIL", "FAILING", "INVALID_REG"}
    drain_flags |= {"REBOOT_REQUESTED", "REBOOT_ISSUED"}
    if base in ("ERROR", "INVAL", "DRAINED", "DRAINING") or flags & drain_flags:
        return "drain"
    return "up"


def node_states_of(text: str) -> dict[str, tuple[str | None, str]]:
    """Every node of ``scontrol show node --oneliner``'s output: its state for the engine
    (:func:`engine_state`) and Slurm's reason: ``{"n1": ("drain", "disk full"), ...}``."""
    states = {}
    for line in text.splitlines():
        if not line.startswith("NodeName="):
            continue
        fields = parse_oneliner(line)
        reason = fields.get("Reason", "")
        states[fields["NodeName"]] = (engine_state(fields.get("State", "")), reason)
    return states
