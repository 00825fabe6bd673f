"""Start-up after a stop or a crash: rebuild the engine from the database.

Order matters: the admin's settings first (quota edits, drained nodes, maintenance windows), then
the jobs that were running (re-attached to their processes where those still live), then the
pending queue in submit order. What cannot be put back is finished with a message saying why;
nothing is dropped silently. What becomes of a job that was running is core/recovery.py's rule:
this module reads the store and the launcher, asks it, and writes the answer back.
"""

from __future__ import annotations

import logging

from ..backends.interface import Exit
from ..core.errors import ConfigError
from ..core.jobs import Job, JobState
from ..core.quotas import QueueTree
from ..core.recovery import (
    End,
    Requeue,
    after_restart,
    ended_state,
    interrupted_stop,
    waiting_since,
)
from ..core.runtime_estimates import run_name
from .records import job_from_row, placement_from_rows

log = logging.getLogger("jupyter_gpusched.service")


def recover(live) -> dict:
    """Rebuild ``live``'s engine from its store. Returns what happened, by kind, for the log."""
    engine, store, now = live.engine, live.store, live.clock()
    counts = {"running": 0, "pending": 0, "ended-while-down": 0, "requeued": 0, "failed": 0}
    quotas = store.get_setting("quotas")
    if quotas:
        try:
            tree = QueueTree.from_dict(quotas, engine.cluster.total_gpus, "stored quotas")
            engine.update_quotas(tree, now)
            live.quota_document = quotas
        except ConfigError as exc:  # the queue file changed shape since the edit
            log.warning("stored quota edits no longer apply (%s); using the queue file", exc)
    for name, node_state in (store.get_setting("nodes") or {}).items():
        try:
            engine.set_node_state(name, node_state, now)
        except ConfigError:
            log.warning("stored state of node %s ignored: no such node any more", name)
    for name, start in (store.get_setting("maintenance") or {}).items():
        try:
            engine.set_maintenance(name, start, now)
        except ConfigError:
            log.warning("maintenance window of node %s ignored: no such node any more", name)

    # fair share: each queue's decayed usage, from the allocations of the last ten half-lives
    half_life = engine.half_life
    runs = store.runs_since(now - 10 * half_life)
    engine.tree.seed_usage(
        ((q, g, s, now if e is None else e) for q, g, s, e in runs), now, half_life
    )
    fit_run_times(engine, store)
    rows = store.unfinished_jobs()
    running = sorted((r for r in rows if r["state"] == "running"), key=lambda r: r["start_time"])
    for row in running:
        job, extra = job_from_row(row)
        live.extras[job.id] = extra
        batch, launched = job.kind == "batch", extra.handle is not None
        stopping = interrupted_stop(_latest_event(store, job.id))  # a pre-emption or a cancel
        alive = batch and launched and live.launcher.alive(extra.handle)
        verdict = after_restart(job, launched=launched, stopping=stopping, alive=alive, now=now)
        if isinstance(verdict, Requeue):
            fields = {"state": "pending", **verdict.changes, "handle": None}
            event = live._event("requeued", job, None, verdict.message)
            store.apply([(job.id, fields)], [], [(job.id, job.runs, now)], [event])
            rows.append({**row, **fields})  # queued with the pending ones below
            counts["requeued"] += 1
            continue
        if isinstance(verdict, End):
            if verdict.kill:
                live.launcher.signal(extra.handle, "SIGKILL")
            if verdict.cancelled:
                result = Exit(None, "killed", "cancelled")
            else:
                result = live.launcher.poll(extra.handle) or Exit(
                    None, "lost", "its processes vanished while the service was down"
                )
            _ended_while_down(live, job, extra, result, now, ended_state(verdict, result.outcome))
            counts["ended-while-down"] += 1
            continue
        try:
            placement = placement_from_rows(store.open_allocations(job.id), engine.cluster)
            engine.restore(job, placement, now)
        except (ConfigError, ValueError) as exc:
            if batch:  # its GPUs are no longer held: it must not keep running
                try:
                    live.launcher.signal(extra.handle, "SIGKILL")
                except Exception:
                    log.exception("could not stop job %s", job.id)
            else:
                log.warning(
                    "notebook server of %s (%s) runs outside the scheduler", job.user, job.id
                )
            _fail(live, job, extra, f"could not be put back after a restart: {exc}", now)
            counts["failed"] += 1
            continue
        counts["running"] += 1

    pending = sorted((r for r in rows if r["state"] == "pending"), key=lambda r: r["number"])
    for row in pending:
        job, extra = job_from_row(row)
        live.extras[job.id] = extra
        try:
            engine.submit(job, now)
        except ConfigError as exc:
            _fail(live, job, extra, f"could not be queued after a restart: {exc}", now)
            counts["failed"] += 1
            continue
        if job.state == JobState.REJECTED:
            store.update_job(job.id, live._fields(job))
            live.extras.pop(job.id)
            engine.forget(job.id)
            counts["failed"] += 1
            continue
        job.pending_since = waiting_since(row.get("end_time"), row["submit_time"])
        live.submissions.count_pending(job, +1)
        counts["pending"] += 1
    return counts


HISTORY_RUNS = 10_000  # completed jobs the run-time estimates are fitted on at start-up


def fit_run_times(engine, store, limit: int = HISTORY_RUNS) -> int:
    """Fit the engine's run-time estimates (core/runtime_estimates.py) on the last ``limit``
    completed jobs, oldest first, before any job is queued. Returns the runs observed."""
    runs = store.completed_runs(limit)
    for row in runs:
        job = Job(
            id="", gpus=row["gpus"], submit_time=0.0, queue=row["queue"] or "",
            user=row["user"] or "", kind=row["kind"],
            run_name=run_name(row["name"], row["notebook"], row["command"]),
        )  # fmt: skip
        engine.runtime_estimates.observe(job, row["end_time"] - row["start_time"])
    return len(runs)


def _latest_event(store, job_id: str) -> str | None:
    latest = store.events(job_id=job_id, limit=1)
    return latest[0]["kind"] if latest else None


def _ended_while_down(live, job, extra, result: Exit, now: float, state: JobState) -> None:
    outcome = state.value  # the event: completed, failed or cancelled
    job.state, job.end_time = state, now
    extra.exit_code, extra.handle = result.code, None
    extra.message = f"{result.message} (noticed after a restart)"
    event = live._event(outcome, job, None, extra.message)
    live.store.apply([(job.id, live._fields(job))], [], [(job.id, job.runs, now)], [event])
    live.extras.pop(job.id, None)


def _fail(live, job, extra, message: str, now: float) -> None:
    job.state, job.end_time = JobState.FAILED, now
    extra.message, extra.handle = message, None
    event = live._event("failed", job, None, message)
    live.store.apply([(job.id, live._fields(job))], [], [(job.id, job.runs, now)], [event])
    live.extras.pop(job.id, None)
