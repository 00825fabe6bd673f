"""The OpenAPI 3.1 description of the REST API (served, without a token, at ``api/openapi.json``).

Complete and exact, so that tools can test against it (``tests/test_schemathesis.py`` runs
Schemathesis on it against a live service behind a real hub):

* ``components.securitySchemes``: the hub API token (``Authorization: token <t>``, or
  ``Bearer <t>``) and, for reading in a browser, the hub's OAuth cookie; every operation but this
  document itself requires one of them;
* every status an operation can answer, each with its body: JSON (``Error`` for every 4xx),
  ``text/plain`` for a job's log, Prometheus' text format for ``/metrics``;
* request schemas as strict as the server, built from the bounds the server enforces
  (:mod:`.requests`), so that the two cannot drift: lengths, ranges, enums, patterns, exactly
  one of ``command`` and ``notebook``. What JSON Schema cannot say is in the descriptions, and
  is answered with a 400 naming the field: ``gpus_per_node`` must divide ``gpus``; a job must fit
  this cluster (GPUs, shape, labels, CPUs, memory), name one of its queues and GPU models, and a
  ``cwd`` its user may enter, and a ``deadline`` after now that the engine can meet (a 400
  giving the earliest finish); a queue document must keep the queues and their guarantees must
  add up.

``tests/test_service_api.py`` checks that every route the service serves is described here and
nothing more. The request schemas are in :mod:`.openapi_requests`, the response schemas in
:mod:`.openapi_responses`, how an operation is described (security, statuses, errors) in
:mod:`.openapi_operations`; the arrays' and the history's parts in their own modules.
"""

from __future__ import annotations

import copy

from .openapi_arrays import ARRAY_ID, ARRAY_SCHEMAS, SUBMIT_REQUEST, SUBMITTED
from .openapi_export import EXPORT_SCHEMAS, export_paths
from .openapi_history import HISTORY_SCHEMAS, history_paths
from .openapi_operations import SECURITY_SCHEMES, TIME, operation
from .openapi_requests import (
    JOB_ID,
    JOB_REQUEST,  # one job's body (POST api/estimate; POST api/jobs takes SUBMIT_REQUEST)
    MAINTENANCE_REQUEST,
    NODE_NAME,
    PRIORITY_REQUEST,
    QUEUE_SETTINGS,
    QUOTAS_REQUEST,
    REAPER_REQUEST,
    USAGE_SAMPLE_REQUEST,
    whole,
)
from .openapi_responses import JOB_STATES, SCHEMAS, ref
from .requests import MAX_EVENTS_LIMIT, MAX_LIST_LIMIT, MAX_LOG_BYTES
from .server_stops import MAX_REASON

_JOB = [("id", "path", {"type": "string", "pattern": JOB_ID})]
_NODE = [("name", "path", {"type": "string", "pattern": NODE_NAME, "maxLength": 255})]
_FROM_JOB = {"id": "$response.body#/id"}
# What a tool can do next with the job it just submitted. Not DELETE: it cancels the job, which
# stays readable (cancelled), where a tool takes a 200 after a DELETE for a use after free.
JOB_LINKS = {
    name: {"operationId": op, "parameters": _FROM_JOB}
    for name, op in (
        ("GetJob", "getJob"),
        ("GetJobLog", "getJobLog"),
        ("HoldJob", "holdJob"),
        ("ReleaseJob", "releaseJob"),
        ("SetJobPriority", "setJobPriority"),
    )
}

PATHS = {
    "/api/me": {
        "get": operation(
            "getMe",
            "Who the service takes the caller to be: name, admin, groups; the queues they may "
            "use (GPUs in use, guaranteed, limit) and which is their default",
            ref("Me"),
        )
    },
    "/api/cluster": {
        "get": operation(
            "getCluster", "Nodes, GPUs and who holds them (others anonymised)", ref("Cluster")
        )
    },
    "/api/queue": {
        "get": operation(
            "getQueue",
            "Pending jobs in order: position, tier, GPUs, reason, ETA",
            ref("Queue"),
            params=[("limit", "query", whole(0, MAX_LIST_LIMIT))],
        )
    },
    "/api/jobs": {
        "post": operation(
            "submitJob",
            "Submit a batch job (or a notebook server's allocation), or a job array",
            SUBMITTED,
            body=SUBMIT_REQUEST,
            status=201,
            errors=("429", "503"),
            links=JOB_LINKS,
        ),
        "get": operation(
            "listJobs",
            "Your jobs, newest first (admins: everybody's, or ?user=)",
            ref("JobList"),
            params=[
                (
                    "state",
                    "query",
                    {
                        "type": "array",
                        "items": {"type": "string", "enum": JOB_STATES},
                    },
                ),
                ("user", "query", {"type": "string"}),
                ("limit", "query", whole(0, MAX_LIST_LIMIT)),
                ("offset", "query", whole(0)),
            ],
        ),
    },
    "/api/estimate": {
        "post": operation(
            "estimateJob",
            "When would it start? A job body as for submitJob; nothing is queued",
            ref("Estimate"),
            body=JOB_REQUEST,
            errors=("429",),
        )
    },
    "/api/jobs/{id}": {
        "get": operation(
            "getJob",
            "One of your jobs (running: its allocation; a notebook server: its latest GPU "
            "utilization)",
            ref("Job"),
            params=_JOB,
        ),
        "delete": operation(
            "cancelJob",
            "Cancel one of your jobs (a notebook server: the hub stops it; its GPUs stay held, "
            "with `stopping` set, until its processes are gone)",
            ref("Job"),
            params=[
                *_JOB,
                # the server's spawner, releasing a server it stopped or found exited
                ("server_gone", "query", {"type": "boolean"}),
                (
                    "reason",
                    "query",
                    {
                        "type": "string",
                        "maxLength": MAX_REASON,
                        "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]*$",
                    },
                ),
            ],
            errors=("409",),
        ),
    },
    "/api/arrays/{array_id}": {
        "delete": operation(
            "cancelArray",
            "Cancel every pending or running job of one of your job arrays (404: none is left)",
            ref("JobArray"),
            params=[("array_id", "path", {"type": "string", "pattern": ARRAY_ID})],
        )
    },
    "/api/jobs/{id}/log": {
        "get": operation(
            "getJobLog",
            "The end of a job's output (404 until it has run)",
            {"type": "string"},
            params=[*_JOB, ("bytes", "query", whole(0, MAX_LOG_BYTES))],
            content_type="text/plain",
        )
    },
    "/api/jobs/{id}/hold": {
        "post": operation(
            "holdJob", "Hold a pending job", ref("Job"), params=_JOB, admin=True, errors=("409",)
        )
    },
    "/api/jobs/{id}/release": {
        "post": operation(
            "releaseJob",
            "Release a held job",
            ref("Job"),
            params=_JOB,
            admin=True,
            errors=("409",),
        )
    },
    "/api/jobs/{id}/priority": {
        "put": operation(
            "setJobPriority",
            "Override a job's priority within its tier (higher first)",
            ref("Job"),
            params=_JOB,
            body=PRIORITY_REQUEST,
            admin=True,
            errors=("409",),
        )
    },
    "/api/quotas": {
        "get": operation(
            "getQuotas",
            "Queues: guarantees, limits, weights, what runs; the queue document",
            ref("Quotas"),
        ),
        "put": operation(
            "setQuotas",
            "Replace the quotas with a queue-file document (same queues)",
            ref("Quotas"),
            body=QUOTAS_REQUEST,
            admin=True,
        ),
    },
    "/api/nodes/{name}/drain": {
        "post": operation("drainNode", "Drain a node", ref("NodeState"), params=_NODE, admin=True)
    },
    "/api/nodes/{name}/resume": {
        "post": operation(
            "resumeNode", "Put a node back", ref("NodeState"), params=_NODE, admin=True
        )
    },
    "/api/nodes/{name}/maintenance": {
        "put": operation(
            "setMaintenance",
            "Drain a node at a time; until then only jobs that end before it start there",
            ref("Maintenance"),
            params=_NODE,
            body=MAINTENANCE_REQUEST,
            admin=True,
        ),
        "delete": operation(
            "cancelMaintenance",
            "Cancel a maintenance window",
            ref("Maintenance"),
            params=_NODE,
            admin=True,
        ),
    },
    "/api/events": {
        "get": operation(
            "getEvents",
            "The audit log, newest first (users: their own jobs)",
            ref("Events"),
            params=[
                ("kind", "query", {"type": "string"}),
                ("job_id", "query", {"type": "string"}),
                ("user", "query", {"type": "string"}),
                ("since", "query", TIME),
                ("until", "query", TIME),
                ("before", "query", whole(0)),
                ("limit", "query", whole(1, MAX_EVENTS_LIMIT)),
            ],
        )
    },
    "/api/usage": {
        "get": operation(
            "getUsage",
            "GPU-hours by queue, user or GPU model over a period (with prices: cost); "
            "'since' must be before 'until' (default: now)",
            ref("Usage"),
            params=[
                ("by", "query", {"type": "string", "enum": ["queue", "user", "gpu_model"]}),
                ("since", "query", TIME),
                ("until", "query", TIME),
            ],
        )
    },
    "/api/reaper": {
        "get": operation(
            "getReaper",
            "The idle reaper's settings (in force, defaults, overrides) and sessions",
            ref("Reaper"),
        ),
        "put": operation(
            "setReaper",
            "Change reaper settings (partial; null turns a timeout off)",
            ref("ReaperUpdated"),
            body=REAPER_REQUEST,
            admin=True,
        ),
    },
    "/api/rogue-processes": {
        "get": operation(
            "getRogueProcesses",
            "GPU processes no allocation accounts for, on the nodes this service watches",
            ref("RogueProcesses"),
            admin=True,
        ),
    },
    "/api/usage-samples": {
        "post": operation(
            "postUsageSample",
            "A notebook server's GPU monitor reports which kernels hold GPU memory (the "
            "server's user; 404 for anything but a running notebook server of theirs); the "
            "reaper decides on the service's own GPU samples, never on this",
            ref("UsageSampleTaken"),
            body=USAGE_SAMPLE_REQUEST,
            errors=("404",),
        )
    },
    "/api/openapi.json": {
        "get": operation(
            "getOpenAPI", "This document (no token needed)", {"type": "object"}, public=True
        )
    },
    "/metrics": {
        "get": operation(
            "getMetrics",
            "Prometheus metrics, in its text format (a token unless "
            "GPUSchedService.authenticate_metrics is off)",
            {"type": "string"},
            content_type="text/plain",
        )
    },
}


PATHS.update(history_paths())  # the web page's time series (openapi_history.py)
PATHS.update(export_paths())  # the history as a trace (openapi_export.py)


def openapi_document(prefix: str = "/") -> dict:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "jupyter_gpusched scheduler service",
            "version": "1",
            "description": "GPU scheduling for JupyterHub. Authenticate with a hub API token: "
            "'Authorization: token <token>'. Every 4xx body is {error, field}.",
        },
        "servers": [{"url": prefix.rstrip("/") or "/"}],
        "paths": copy.deepcopy(PATHS),
        "components": {
            "schemas": copy.deepcopy(
                {
                    **SCHEMAS,
                    **HISTORY_SCHEMAS,
                    **EXPORT_SCHEMAS,
                    "QueueSettings": QUEUE_SETTINGS,
                    **ARRAY_SCHEMAS,
                }
            ),
            "securitySchemes": copy.deepcopy(SECURITY_SCHEMES),
        },
    }
