"""Notebook servers' GPU utilization over time, as the service measured it: what ``export-trace``
exports and the idle-timeout what-if (``jupyter gpusched reaper what-if``) replays.

The reaper keeps only a server's last samples in memory (the evidence of a cull). Here each of
the service's own samples of a server with GPUs (service/gpu_sampling.py, taken every
``gpu_sample_interval``: never the user's monitor) extends the server's current *run*: the
samples in a row whose utilization stays in one band (core/utilization_bands.py) with no gap
longer than the reaper's ``stale_after``. A run is one row of ``utilization_runs`` (its first and
last sample's times, its highest utilization), so an idle afternoon is one row, not 1,440. A
sample's utilization is its busiest GPU's: the reaper calls a server busy when any of its GPUs
is at or above ``idle_threshold``.

Writes: a new run is inserted at once; a growing run's row is brought up to date at most every
``flush_every`` seconds and when it ends (another band, a gap, the server gone), so the open run
of a server is at most that far behind in the table (and after a crash). Rows whose run ended
more than ``utilization_retention_days`` ago are dropped, once an hour.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from ..core.utilization_bands import band
from .models import utilization_table

PURGE_EVERY = 3600.0  # seconds between two retention purges


@dataclass
class _OpenRun:
    """The run a server's samples are extending, and what its row in the table says."""

    row_id: int
    band: int
    start: float
    end: float
    utilization: float
    written_end: float
    written_utilization: float


def sample_utilization(sample: dict) -> float | None:
    """A reaper sample's utilization: its busiest GPU's (None: no GPU reading in it)."""
    values = [
        d["utilization"] for d in sample.get("devices") or () if d.get("utilization") is not None
    ]
    return max(values) if values else None


class UtilizationRecorder:
    """Records runs of notebook servers' GPU samples in the ``utilization_runs`` table of
    ``engine`` (the store's SQLAlchemy engine)."""

    def __init__(self, engine: sa.Engine, retention_days: float, flush_every: float = 60.0):
        self.engine = engine
        self.retention = retention_days * 86400.0
        self.flush_every = flush_every
        self.open: dict[str, _OpenRun] = {}  # job id -> its run being extended
        self._purged = -float("inf")

    def add(self, job_id: str, when: float, utilization: float, stale_after: float) -> None:
        """One sample of ``job_id``'s server, taken at ``when`` (epoch seconds)."""
        run = self.open.get(job_id)
        level = band(utilization)
        if run is not None and run.band == level and 0 <= when - run.end <= stale_after:
            run.end = when
            run.utilization = max(run.utilization, utilization)
            if when - run.written_end >= self.flush_every:
                self._write(run)
            return
        if run is not None:
            self._write(run)
        with self.engine.begin() as conn:
            row_id = conn.execute(
                utilization_table.insert().values(
                    job_id=job_id, start=when, end=when, utilization=utilization
                )
            ).inserted_primary_key[0]
        self.open[job_id] = _OpenRun(row_id, level, when, when, utilization, when, utilization)

    def close(self, job_id: str) -> None:
        """``job_id``'s server is gone (or no longer sampled): its run ends with its last
        sample."""
        run = self.open.pop(job_id, None)
        if run is not None:
            self._write(run)

    def flush(self) -> None:
        """Every open run's row up to date (the service is stopping)."""
        for run in self.open.values():
            self._write(run)

    def tick(self, now: float) -> None:
        """Drop the runs that ended before the retention, at most once an hour."""
        if now - self._purged < PURGE_EVERY:
            return
        self._purged = now
        with self.engine.begin() as conn:
            conn.execute(
                utilization_table.delete().where(utilization_table.c.end < now - self.retention)
            )

    def _write(self, run: _OpenRun) -> None:
        if run.end == run.written_end and run.utilization == run.written_utilization:
            return
        t = utilization_table
        with self.engine.begin() as conn:
            conn.execute(
                t.update()
                .where(t.c.id == run.row_id)
                .values(end=run.end, utilization=run.utilization)
            )
        run.written_end, run.written_utilization = run.end, run.utilization


def utilization_runs(engine: sa.Engine, job_ids: list[str]) -> list[dict]:
    """The recorded runs of these jobs' servers, by job and start."""
    t = utilization_table
    rows: list[dict] = []
    with engine.connect() as conn:
        for chunk in range(0, len(job_ids), 500):  # SQLite's bound on a statement's variables
            ids = job_ids[chunk : chunk + 500]
            query = sa.select(t.c.job_id, t.c.start, t.c.end, t.c.utilization).where(
                t.c.job_id.in_(ids)
            )
            rows += [dict(row) for row in conn.execute(query).mappings()]
    rows.sort(key=lambda r: (r["job_id"], r["start"]))
    return rows
