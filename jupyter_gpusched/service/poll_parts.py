"""The parts :meth:`.live.LiveScheduler.poll` runs besides noticing exited processes: Slurm's
node states first (:func:`sync_nodes`), then the periodic ones (:func:`tick_parts`: the idle
reaper, the hub's activity, the rogue-process check, the history's recorder, the expected
starts).

Each part is given to the live scheduler once built (``LiveScheduler.attach``, app.py); any of
them may be absent (None: not configured, or a test's service without it). One part failing is
logged and stops neither the others nor the scheduling pass after them.
"""

from __future__ import annotations

import logging

log = logging.getLogger("jupyter_gpusched.service")


def sync_nodes(live) -> None:
    """Slurm's node states into the engine, before a poll reads exits: a node's failure
    requeues, not fails, its jobs."""
    if live.node_sync is None:
        return
    try:
        live.node_sync.sync()
    except Exception:
        log.exception("reading Slurm's node states failed")


def tick_parts(live) -> None:
    """Each periodic part's ``tick()``, in this order; each decides itself whether it is due."""
    _tick(live.reaper, "the reaper")
    if live.hub_activity is not None:
        live.hub_activity.tick()  # (reads in a task of its own, which logs its failures)
    _tick(live.rogue_watch, "checking for rogue GPU processes")
    _tick(live.history, "recording the history")  # the cluster over time (history.py)
    _tick(live.expected_starts, "planning expected starts")  # (expected_starts.py)


def _tick(part, what: str) -> None:
    if part is None:
        return
    try:
        part.tick()
    except Exception:
        log.exception("%s failed", what)
