"""The service's history: a row of the cluster every ``history_interval`` seconds, kept
``history_retention_days``, read by ``GET api/history`` (the web page's charts over time).

What a row holds is core's (:func:`jupyter_gpusched.core.history.snapshot`); this module
records it at the service's poll (:meth:`History.tick`, from ``LiveScheduler.poll``), keeps the
table bounded (each insert drops the rows older than the retention, in the same transaction)
and answers a period as a caller may see it (:func:`visible`).

Who sees what: everyone sees the cluster totals (GPUs by tier, pending GPUs by reason family,
measured utilization), which ``api/cluster`` and ``api/queue`` show of the present anyway.
Per-queue use over time is an admin's: a user gets the queues they may submit to (``api/me``
shows those queues' current use), not how busy other teams have been.
"""

from __future__ import annotations

from traitlets import Float, HasTraits

from ..core.history import snapshot, thin, waited_gpu_hours

MAX_HISTORY_ROWS = 2000  # rows in one answer (more are thinned evenly: a chart needs no more)
MAX_HISTORY_SPAN = 31 * 86400.0  # seconds one request may cover


class HistorySettings(HasTraits):
    """Traits of ``GPUSchedService`` (``c.GPUSchedService.history_interval``), as
    notebook_settings.py's are: one name each, apart from app.py."""

    history_interval = Float(
        60.0,
        min=0.1,
        help="Seconds between two rows of the service's history (GPUs in use by tier and "
        "queue, pending GPUs by reason family, measured utilization): what the web page draws "
        "over time (GET api/history). Recorded at the service's poll, so at most one row a "
        "poll_interval. Shorter: finer charts, a larger table (a row is a few hundred bytes; "
        "60 s over 8 days is about 11,500 rows).",
    ).tag(config=True)
    history_retention_days = Float(
        8.0,
        min=0.01,
        help="Days the history is kept; older rows are dropped as new ones are recorded. The "
        "page's longest chart covers 24 hours; admins read further back through api/history.",
    ).tag(config=True)
    utilization_retention_days = Float(
        31.0,
        min=0.01,
        help="Days each notebook server's measured GPU utilization over time is kept (runs of "
        "samples within one band: service/utilization_record.py), for `jupyter gpusched "
        "export-trace` and the idle-timeout what-if (`reaper what-if`). An idle server is a "
        "row per stretch; a busy one about a row per change of band. 0 is refused: use a "
        "short period instead.",
    ).tag(config=True)


class History:
    """Records the live scheduler's :func:`snapshot` every ``interval`` seconds."""

    def __init__(self, live, interval: float, retention_days: float):
        self.live = live
        self.interval = interval
        self.retention = retention_days * 86400.0
        self.last: float | None = None  # when the last row was recorded

    def tick(self) -> None:
        """At each poll: a row when one is due."""
        now = self.live.clock()
        if self.last is not None and now - self.last < self.interval:
            return
        self.record(now)

    def record(self, now: float) -> dict:
        reaper = self.live.reaper
        measured = reaper.measured() if reaper is not None else {}
        row = snapshot(self.live.engine, measured, now)
        self.live.store.add_history(row, keep_after=now - self.retention)
        self.last = now
        return row


def visible(live, rows: list[dict], identity, since: float, until: float) -> dict:
    """The answer of ``GET api/history`` for ``identity``: ``rows`` thinned to at most
    :data:`MAX_HISTORY_ROWS`, per-queue figures cut to the caller's queues unless an admin (see
    the module docstring), and the GPU-hours waited by reason family over the period."""
    if not identity.admin:
        tree = live.engine.tree
        mine = {q.label() for q in tree.queues_for(identity.name, identity.groups)}
        rows = [{**row, "queues": _only(row["queues"], mine)} for row in rows]
    history = live.history
    return {
        "since": since,
        "until": until,
        "interval": history.interval if history is not None else None,
        "waited_gpu_hours": waited_gpu_hours(rows, until),
        "rows": thin(rows, MAX_HISTORY_ROWS),
    }


def _only(queues: dict, mine: set) -> dict:
    return {path: gpus for path, gpus in queues.items() if path in mine}
