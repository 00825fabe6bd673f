"""Start-up after a stop or a crash: rebuild the engine from the database.

Order matters: the admin's settings first (quota edits, drained nodes, maintenance windows), then
the jobs that were running (re-attached to their processes where those still live), then the
pending queue in submit order. What cannot be put back is finished with a message saying why;
nothing is dropped silently.
"""

from __future__ import annotations

import logging

from ..backends.local.launcher import Exit
from ..core.errors import ConfigError
from ..core.jobs import JobState
from ..core.quotas import QueueTree
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
    rows = store.unfinished_jobs()
    running = sorted((r for r in rows if r["state"] == "running"), key=lambda r: r["start_time"])
    for row in running:
        job, extra = job_from_row(row)
        live.extras[job.id] = extra
        if job.kind == "batch" and extra.handle is None:
            # marked running, but the service stopped before the launch: it never ran
            fields = {"state": "pending", "runs": job.runs - 1, "start_time": None}
            message = "requeued: the service stopped before launching it"
            event = live._event("requeued", job, None, message)
            store.apply([(job.id, fields)], [], [(job.id, job.runs, now)], [event])
            rows.append({**row, **fields})  # queued with the pending ones below
            counts["requeued"] += 1
            continue
        stopping = _stopping(store, job.id)  # a pre-emption or cancel the crash interrupted
        if job.kind == "batch" and stopping == "cancelling":
            if live.launcher.alive(extra.handle):
                live.launcher.signal(extra.handle, "SIGKILL")
            _ended_while_down(live, job, extra, Exit(None, "killed", "cancelled"), now, stopping)
            counts["ended-while-down"] += 1
            continue
        if job.kind == "batch" and not live.launcher.alive(extra.handle):
            result = live.launcher.poll(extra.handle) or Exit(
                None, "lost", "its processes vanished while the service was down"
            )
            if stopping == "preempted":  # it left after its pre-emption signal: requeue it
                fields = {"state": "pending", "preemptions": job.preemptions + 1}
                fields.update(handle=None, end_time=now)
                event = live._event("requeued", job, None, "requeued after pre-emption")
                store.apply([(job.id, fields)], [], [(job.id, job.runs, now)], [event])
                rows.append({**row, **fields})
                counts["requeued"] += 1
                continue
            _ended_while_down(live, job, extra, result, now)
            counts["ended-while-down"] += 1
            continue
        try:
            placement = placement_from_rows(store.open_allocations(job.id), engine.cluster)
            engine.restore(job, placement, now)
        except (ConfigError, ValueError) as exc:
            if job.kind == "batch":  # its GPUs are no longer held: it must not keep running
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
        job.pending_since = row.get("end_time") or row["submit_time"]
        live._count_pending(job, +1)
        counts["pending"] += 1
    return counts


def _stopping(store, job_id: str) -> str | None:
    """``preempted`` or ``cancelling`` when that is the latest event of a running job: the
    service was stopping it when it went down."""
    latest = store.events(job_id=job_id, limit=1)
    kind = latest[0]["kind"] if latest else None
    return kind if kind in ("preempted", "cancelling") else None


def _ended_while_down(live, job, extra, result: Exit, now: float, stopping=None) -> None:
    if stopping == "cancelling":
        outcome, state = "cancelled", JobState.CANCELLED
    elif result.outcome == "completed":
        outcome, state = "completed", JobState.COMPLETED
    else:
        outcome, state = "failed", JobState.FAILED
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
