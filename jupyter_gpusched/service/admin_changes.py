"""What admins change in the live scheduler: holds, priorities, node states, maintenance
windows and quotas.

Each is the same three steps as everything :class:`.live.LiveScheduler` does: tell the engine,
write the row or setting with its audit event, run a pass. The node states, maintenance windows
and quota document are kept as settings so that a restart re-applies them
(``service/recovery.py``). Apart from live.py because none of it is a user's job or the pass;
the LiveScheduler's methods of the same names call these, with
itself as ``live``.
"""

from __future__ import annotations

import time

from ..core.jobs import Job


def hold(live, job_id: str, actor: str, hold: bool = True) -> Job:
    live.submissions.save()
    now = live.clock()
    job = (live.engine.hold if hold else live.engine.release)(job_id, now)
    kind = "held" if hold else "released"
    live.store.update_job(
        job_id, live._fields(job), live._event(kind, job, actor, f"{kind} by {actor}")
    )
    live.run_pass()
    return job


def set_priority(live, job_id: str, priority: int, actor: str) -> Job:
    live.submissions.save()
    job = live.engine.set_priority(job_id, priority, live.clock())
    message = f"priority set to {priority} by {actor}"
    live.store.update_job(job_id, live._fields(job), live._event("priority", job, actor, message))
    live.run_pass()
    return job


def set_node(live, name: str, node_state: str, actor: str) -> None:
    """``drain`` (no new work; running jobs finish), ``resume`` (back in service) or
    ``down`` (running jobs stop: batch jobs are requeued)."""
    engine_state = {"drain": "drain", "resume": "up", "down": "down"}[node_state]
    live.engine.set_node_state(name, engine_state, live.clock())
    nodes = dict(live.store.get_setting("nodes", {}))
    if engine_state == "up":
        nodes.pop(name, None)
        windows = dict(live.store.get_setting("maintenance", {}))
        if windows.pop(name, None) is not None:  # a window that began (or is due) ends
            live.engine.set_maintenance(name, None, live.clock())
            live.store.set_setting("maintenance", windows, by=actor)
    else:
        nodes[name] = engine_state
    event = live._event(f"node-{node_state}", None, actor, f"{name}: {node_state} by {actor}")
    event["node"] = name
    live.store.set_setting("nodes", nodes, by=actor, event=event)
    live.run_pass()


def set_maintenance(live, name: str, start: float | None, actor: str) -> None:
    live.engine.set_maintenance(name, start, live.clock())
    windows = dict(live.store.get_setting("maintenance", {}))
    if start is None:
        windows.pop(name, None)
        message = f"{name}: maintenance window cancelled by {actor}"
    else:
        windows[name] = start
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(start))
        message = f"{name}: drained from {when} (set by {actor})"
    event = live._event("maintenance", None, actor, message)
    event["node"] = name
    live.store.set_setting("maintenance", windows, by=actor, event=event)
    live.run_pass()


def update_quotas(live, tree, document: dict, actor: str) -> None:
    live.engine.update_quotas(tree, live.clock())
    event = live._event("quota-changed", None, actor, f"quotas edited by {actor}")
    live.store.set_setting("quotas", document, by=actor, event=event)
    live.quota_document = document
    live.run_pass()
