"""What the JupyterLab extension (``labextension/``) reads: the scheduler service, forwarded.

The browser talks only to this server (authenticated like every jupyter-server API: the hub's
OAuth cookie, or a token, with the XSRF check on changes); this server talks to the scheduler
service at ``GPUSCHED_SERVICE_URL`` with ``GPUSCHED_SERVICE_TOKEN`` (both set by
:class:`jupyter_gpusched.hub.spawner.GPUSchedSpawner`: the token of the server's user, for the
service only). So the service sees the server's user, and a user sees what the service shows
them: their own jobs in full, others' anonymised.

Routes under ``<base_url>gpusched/api/``:

* ``GET status``: this server's allocation and the user's waiting jobs, in one answer for the
  status bar: ``{"configured", "time", "job_id", "job", "gpus", "gpu_model", "node",
  "utilization", "devices", "reaper": {"timeout", "idle_since", "reclaim_at", "exempt",
  "warned"} | null, "pending": [my pending jobs with position and reason (with ETA)],
  "page_url"}``; utilization (mean percent over this server's GPUs) comes from the GPU monitor
  (:mod:`.monitor`); ``page_url`` is the scheduler's web page as the browser reaches it (the
  path of ``GPUSCHED_SERVICE_URL``: the hub's proxy serves the service under the same prefix),
  or null.
* ``GET cluster``, ``GET queue``, ``GET jobs`` (query passed on; default: my pending and running
  jobs; the server user's own unless the query names a ``user``, also for an admin),
  ``GET jobs/<id>``, ``GET jobs/<id>/log``, ``DELETE jobs/<id>``, ``GET reaper``
  (the reaper's settings), ``PUT reaper`` (admins: change them; the body passed on),
  ``GET me`` (the user as the service sees them: ``name``, ``admin``, ``groups``),
  ``DELETE arrays/<id>`` (cancel a job array), ``GET history`` (query passed on: the cluster
  over time, as the web page reads it): the service's answers, status and body as
  they are.

Without a service URL (a server not started by the spawner) every route answers 503 with
``{"error": ...}`` (``status``: 200 with ``configured: false``).
"""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import quote, urlsplit

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from ..environment import JobEnvironment
from . import ROUTE_PREFIX
from .monitor import SETTINGS_KEY as MONITOR_KEY
from .service_client import ServiceClient, error_body

_JOB = r"(?P<job_id>[A-Za-z0-9_.:-]+)"
_ARRAY = r"(?P<array_id>[A-Za-z0-9_.:-]+)"


class _Handler(APIHandler):
    @property
    def client(self) -> ServiceClient:
        return self.settings[SETTINGS_KEY]

    async def forward(self, method: str, path: str, body: bytes | None = None) -> None:
        if not self.client.configured:
            self.set_status(503)
            self.finish(error_body("no scheduler service (GPUSCHED_SERVICE_URL is not set)"))
            return
        status, kind, body = await self.client.fetch(method, path, body)
        self.set_status(status)
        self.set_header("Content-Type", kind)
        self.finish(body)


class ClusterHandler(_Handler):
    @web.authenticated
    async def get(self):
        await self.forward("GET", "api/cluster")


class QueueHandler(_Handler):
    @web.authenticated
    async def get(self):
        await self.forward("GET", "api/queue")


class ReaperHandler(_Handler):
    @web.authenticated
    async def get(self):
        await self.forward("GET", "api/reaper")

    @web.authenticated
    async def put(self):
        """Admins change the reaper's settings (the service answers 403 to others)."""
        await self.forward("PUT", "api/reaper", self.request.body or b"{}")


class MeHandler(_Handler):
    @web.authenticated
    async def get(self):
        await self.forward("GET", "api/me")


class JobsHandler(_Handler):
    @web.authenticated
    async def get(self):
        query = self.request.query or "state=pending&state=running"
        if self.get_argument("user", None) is None:
            query += _mine()
        await self.forward("GET", "api/jobs?" + query)


class JobHandler(_Handler):
    @web.authenticated
    async def get(self, job_id):
        await self.forward("GET", f"api/jobs/{quote(job_id)}")

    @web.authenticated
    async def delete(self, job_id):
        await self.forward("DELETE", f"api/jobs/{quote(job_id)}")


class HistoryHandler(_Handler):
    @web.authenticated
    async def get(self):
        query = f"?{self.request.query}" if self.request.query else ""
        await self.forward("GET", f"api/history{query}")


class ArrayHandler(_Handler):
    @web.authenticated
    async def delete(self, array_id):
        await self.forward("DELETE", f"api/arrays/{quote(array_id)}")


class JobLogHandler(_Handler):
    @web.authenticated
    async def get(self, job_id):
        query = f"?{self.request.query}" if self.request.query else ""
        await self.forward("GET", f"api/jobs/{quote(job_id)}/log{query}")


class StatusHandler(_Handler):
    @web.authenticated
    async def get(self):
        monitor = self.settings.get(MONITOR_KEY)
        self.finish(json.dumps(await build_status(self.client, monitor)))


async def build_status(client: ServiceClient, monitor=None) -> dict:
    env = JobEnvironment.read()
    job_id, gpus = env.job_id or None, env.gpus
    snapshot = monitor.snapshot() if monitor is not None else None
    devices = (snapshot or {}).get("devices") or []
    utils = [d["utilization"] for d in devices if d.get("utilization") is not None]
    measured = ((snapshot or {}).get("server") or {}).get("utilization")
    if utils:
        utilization = sum(utils) / len(utils)
    elif measured is not None and gpus:
        utilization = measured / max(gpus, 1)
    else:  # nothing measured (no sample yet, or no GPU telemetry): unknown, not 0%
        utilization = None
    out = {
        "configured": client.configured,
        "time": time.time(),
        "job_id": job_id,
        "job": None,
        "gpus": gpus,
        "gpu_model": None,
        "node": env.node or None,
        "profile": env.profile,
        "utilization": utilization,
        "devices": devices,
        # why there is no utilization: the monitor has no GPU telemetry (docs/gpu.md)
        "telemetry_error": (snapshot or {}).get("telemetry_error"),
        "reaper": None,
        "pending": [],
        "page_url": urlsplit(env.service_url).path or None,
    }
    if not client.configured:
        return out

    async def nothing():
        return None

    job, mine, reaper, cluster = await asyncio.gather(
        client.json(f"api/jobs/{quote(job_id)}") if job_id else nothing(),
        client.json("api/jobs?state=pending" + _mine()),
        client.json("api/reaper"),
        client.json("api/cluster"),
    )
    out["job"] = job
    if job and job.get("allocation"):
        out["node"] = job["allocation"][0]["node"]
    if cluster and out["node"]:
        for node in cluster.get("nodes", []):
            if node["name"] == out["node"]:
                out["gpu_model"] = node.get("gpu_model")
    if out["gpu_model"] is None and job and job.get("gpu_models"):
        out["gpu_model"] = job["gpu_models"][0]
    if out["gpus"] is None and job:
        out["gpus"] = job.get("gpus")
    for session in (reaper or {}).get("sessions", []):
        if job_id and session.get("job_id") == job_id:
            timeout, idle_since = session.get("timeout"), session.get("idle_since")
            reclaim = session.get("stop_at")  # the service's: never before a warning's lead
            if "stop_at" not in session and timeout is not None and idle_since is not None:
                reclaim = None if session.get("exempt") else idle_since + timeout  # older ones
            out["reaper"] = {
                "timeout": timeout,
                "idle_since": idle_since,
                "reclaim_at": reclaim,
                "exempt": session.get("exempt"),
                "warned": session.get("warned"),
                "warning_lead": ((reaper or {}).get("settings") or {}).get("warning_lead"),
            }
    out["pending"] = [
        {k: j.get(k) for k in ("id", "name", "kind", "gpus", "tier", "queue", "position", "reason")}
        for j in (mine or {}).get("jobs", [])
        if j.get("state") == "pending"
    ]
    out["pending"].sort(key=lambda j: (j["position"] is None, j["position"] or 0))
    return out


SETTINGS_KEY = "gpusched_service_client"


def _mine() -> str:
    """``&user=<this server's user>``: "my jobs" are the server user's own, also for a scheduler
    admin, whom ``api/jobs`` otherwise answers with everybody's (JupyterHub names the user in
    ``JUPYTERHUB_USER``; for others the service shows only their own anyway)."""
    user = JobEnvironment.read().hub_user
    return f"&user={quote(user)}" if user else ""


def setup_proxy(web_app) -> None:
    web_app.settings.setdefault(SETTINGS_KEY, ServiceClient())
    base = url_path_join(web_app.settings.get("base_url", "/"), ROUTE_PREFIX)
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "status"), StatusHandler),
            (url_path_join(base, "cluster"), ClusterHandler),
            (url_path_join(base, "queue"), QueueHandler),
            (url_path_join(base, "reaper"), ReaperHandler),
            (url_path_join(base, "me"), MeHandler),
            (url_path_join(base, "history"), HistoryHandler),
            (url_path_join(base, "jobs"), JobsHandler),
            (url_path_join(base, "jobs", _JOB), JobHandler),
            (url_path_join(base, "jobs", _JOB, "log"), JobLogHandler),
            (url_path_join(base, "arrays", _ARRAY), ArrayHandler),
        ],
    )
