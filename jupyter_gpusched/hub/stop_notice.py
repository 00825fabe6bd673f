"""Why a user's notebook server stopped, said on the hub's own pages.

When the idle reaper stops a server, the user's open Lab only loses its connection; the next
page they see is the hub's (``/hub/home``, or "Server not running" when Lab reloads). So:

* :func:`stop_record` — after GPUSchedSpawner gives an allocation back, it asks the service
  whether the reaper ended it (the ``reaper-cull`` event of the job, which users may read for
  their own jobs) and keeps the answer in its state (``gpusched_last_stop``): across
  ``clear_state`` and hub restarts, until the server starts again;
* :func:`stopped_servers` — for ``c.JupyterHub.template_vars`` (a callable gets the page's
  user): server name -> the sentence, for each of the user's servers that is not running and
  was stopped by the reaper;
* :data:`TEMPLATE_DIR` — for ``c.JupyterHub.template_paths``: ``home.html`` and
  ``not_running.html`` extend JupyterHub's own and show those sentences (and
  ``spawn_pending.html``: its Stop Server on a queued start leads to the home page).
"""

from __future__ import annotations

import os
import time
from urllib.parse import urlencode

from ..core.durations import describe_duration

TEMPLATE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates")
STATE_KEY = "gpusched_last_stop"  # in the spawner's state


def gpus_text(allocation) -> str:
    """``gpu1:0,1`` (one node), ``gpu1:0,1; gpu2:0,1`` (several): as the scheduler's pages
    write a placement ("on gpu1:0,1")."""
    parts = []
    for piece in allocation or []:
        if isinstance(piece, dict) and piece.get("node"):
            gpus = ",".join(str(g) for g in piece.get("gpus") or [])
            parts.append(f"{piece['node']}:{gpus}" if gpus else str(piece["node"]))
    return "; ".join(parts)


async def stop_record(spawner, job_id: str, allocation) -> dict:
    """What the spawner keeps about its server's end: the reaper's cull of ``job_id``, or {}
    (stopped otherwise, or the service did not say). Never raises."""
    query = urlencode({"job_id": job_id, "kind": "reaper-cull", "limit": 1})
    try:
        code, data = await spawner.api("GET", f"api/events?{query}")
    except Exception as exc:  # the service is away: nothing to say, the stop goes on
        who = getattr(spawner, "_log_name", spawner.name)  # ("user's server", not "")
        spawner.log.warning("%s: could not read why job %s ended: %s", who, job_id, exc)
        return {}
    events = data.get("events") if code == 200 and isinstance(data, dict) else None
    if not events:
        return {}
    event, evidence = events[0], events[0].get("data") or {}
    return {
        "job_id": job_id,
        "time": event.get("time"),
        "reason": evidence.get("reason"),
        "idle_seconds": evidence.get("idle_seconds"),
        "timeout": evidence.get("timeout"),
        "gpus": gpus_text(allocation),
        "cpu_only": evidence.get("gpus") == 0,  # judged by its activity, not by GPUs
    }


def sentence(record: dict, server_name: str = "") -> str:
    """``The idle reaper stopped your server at 14:05:03 UTC (2025-01-02): its GPUs (gpu1:0)
    were idle for 2 min 6 s, and the idle timeout is 2 min.``"""
    when = record.get("time")
    moment = ""
    if isinstance(when, (int, float)):
        moment = time.strftime(" at %H:%M:%S UTC (%Y-%m-%d)", time.gmtime(when))
    server = f"your server {server_name!r}" if server_name else "your server"
    gpus = f" ({record['gpus']})" if record.get("gpus") else ""
    timeout = record.get("timeout")
    if record.get("reason") == "max-lifetime" and isinstance(timeout, (int, float)):
        why = f"it ran past the maximum lifetime of {describe_duration(timeout)}"
    else:
        idle = record.get("idle_seconds")
        why = "it had no activity" if record.get("cpu_only") else f"its GPUs{gpus} were idle"
        if isinstance(idle, (int, float)):
            why += f" for {describe_duration(idle)}"
        if isinstance(timeout, (int, float)):
            why += f", and the idle timeout is {describe_duration(timeout)}"
    return f"The idle reaper stopped {server}{moment}: {why}. Start it again when you need it."


def stopped_servers(user) -> dict[str, str]:
    """For ``c.JupyterHub.template_vars``: server name ('' the default) -> why the reaper
    stopped it, for the page's user's servers that are not running."""
    orm_user = getattr(user, "orm_user", None)
    if orm_user is None:  # no user (the login page)
        return {}
    found, spawners = {}, getattr(user, "spawners", None) or {}
    for name, orm_spawner in sorted(orm_user.orm_spawners.items()):
        running = spawners.get(name)  # the hub's object, where it has one (not created here)
        if orm_spawner.server is not None or (running is not None and running.active):
            continue
        record = (orm_spawner.state or {}).get(STATE_KEY)
        if isinstance(record, dict) and record:
            found[name] = sentence(record, name)
    return found
