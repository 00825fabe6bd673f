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
  this cluster (GPUs, shape, labels, CPUs, memory), name one of its queues and GPU models; a
  queue document must keep the queues and their guarantees must add up.

``tests/test_service_api.py`` checks that every route the service serves is described here and
nothing more. The response schemas are in :mod:`.openapi_responses`.
"""

from __future__ import annotations

import copy

from .openapi_responses import JOB_STATES, SCHEMAS, ref
from .requests import (
    JOB_FIELDS,
    MAX_COMMAND,
    MAX_CPUS,
    MAX_DOCUMENT_DEPTH,
    MAX_DOCUMENT_ITEMS,
    MAX_DOCUMENT_TEXT,
    MAX_DURATION_TEXT,
    MAX_ENV_BYTES,
    MAX_ENV_NAME,
    MAX_ENV_VARS,
    MAX_EVENTS_LIMIT,
    MAX_GPU_MODEL,
    MAX_GPU_MODELS,
    MAX_LABEL_KEY,
    MAX_LABEL_VALUE,
    MAX_LABELS,
    MAX_LIST_LIMIT,
    MAX_LOG_BYTES,
    MAX_MEMORY_GB,
    MAX_NAME,
    MAX_PATH,
    MAX_PROFILE,
    MAX_QUEUE,
    MAX_REAPER_LIST,
    MAX_SAMPLE_DEVICES,
    MAX_SAMPLE_KERNELS,
    MAX_SERVER_NAME,
    MAX_WALLTIME,
    MAX_WHOLE,
    MIN_GPU_FRACTION,
)

# -- building blocks ---------------------------------------------------------------------------
NO_NUL = "^[^\\u0000]*$"
NON_BLANK = "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$"  # some non-space character, no NUL
JOB_ID = "^j-[0-9]+$"
NODE_NAME = "^[A-Za-z0-9_.@-]+$"  # what a cluster file's hostlists expand to
QUEUE_NAME = "^[A-Za-z0-9_.@-]+$"  # core/quotas.py _NAME
ENV_NAME = "^[A-Za-z_][A-Za-z0-9_]*$"  # requests.py _ENV_NAME
RESERVED_ENV = "^(CUDA_VISIBLE_DEVICES|GPUSCHED_)"  # set by the scheduler

_UNITS = (("s", 1), ("m", 60), ("h", 3600), ("d", 86400), ("w", 604800))


def duration_pattern(longest: float, parts: int = 3, zero: bool = False) -> str:
    """A pattern of the duration texts ``core/durations.py`` reads (``300``, ``5m``,
    ``1h30m``, ``2 d``) whose every match is at most ``longest`` seconds (each of at most
    ``parts`` parts is below ``longest / parts``; the digits are bounded accordingly) and, unless
    ``zero``, more than 0. Stricter than the server (which also reads ``1e3`` or ``4h4m4s4s``),
    so that whatever a tool generates from it is accepted."""

    def digits(unit: float, share: float) -> int:
        return len(str(int(share / unit))) - 1  # 10**digits <= share / unit

    first = "\\d" if zero else "[1-9]"

    def number(count: int, lead: str) -> str:
        return f"{lead}\\d{{0,{count - 1}}}(\\.\\d{{1,3}})?"

    units = [
        (unit, digits(size, longest / parts))
        for unit, size in _UNITS
        if digits(size, longest / parts) >= 1
    ]

    def part(lead: str) -> str:
        return "(" + "|".join(f"{number(n, lead)}\\s*[{u}{u.upper()}]" for u, n in units) + ")"

    plain = number(digits(1, longest), first)
    parts_text = f"{part(first)}(\\s*{part(chr(92) + 'd')}){{0,{parts - 1}}}"
    return f"^\\s*({plain}|{parts_text})\\s*$"


def text(max_length: int, pattern: str = NON_BLANK, null: bool = True, **more) -> dict:
    schema = {"type": ["string", "null"] if null else "string", "maxLength": max_length}
    return {**schema, "pattern": pattern, **more}


def whole(minimum: int, maximum: int = MAX_WHOLE, null: bool = False) -> dict:
    return {
        "type": ["integer", "null"] if null else "integer",
        "minimum": minimum,
        "maximum": maximum,
    }


def number(maximum: float, minimum: float = 0, null: bool = True) -> dict:
    return {
        "type": ["number", "null"] if null else "number",
        "minimum": minimum,
        "maximum": maximum,
    }


_MODEL = f"[^|\\s\\u0000][^|\\u0000]{{0,{MAX_GPU_MODEL - 1}}}"
WALLTIME_TEXT = duration_pattern(MAX_WALLTIME)

# -- POST api/jobs -------------------------------------------------------------------------------
JOB_REQUEST = {
    "type": "object",
    "additionalProperties": False,
    "required": ["gpus"],
    "properties": {
        "command": text(MAX_COMMAND, minLength=1),
        "notebook": text(MAX_PATH, minLength=1),
        "kind": {"type": "string", "enum": ["batch", "notebook"]},
        "name": text(MAX_NAME, minLength=1),
        "gpus": whole(1),
        "gpu_fraction": {"type": "number", "minimum": MIN_GPU_FRACTION, "maximum": 1},
        "gpus_per_node": whole(1, null=True),
        "tier": {"type": ["integer", "null"], "enum": [1, 2, 3, None]},
        "queue": text(MAX_QUEUE, minLength=1),
        "gpu_model": {
            "anyOf": [
                text(
                    MAX_GPU_MODELS * (MAX_GPU_MODEL + 1),
                    f"^{_MODEL}(\\|{_MODEL}){{0,{MAX_GPU_MODELS - 1}}}$",
                ),
                {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": MAX_GPU_MODELS,
                    "items": text(MAX_GPU_MODEL, null=False),
                },
            ]
        },
        "walltime": {
            "anyOf": [
                {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": MAX_WALLTIME},
                {"type": "string", "maxLength": MAX_DURATION_TEXT, "pattern": WALLTIME_TEXT},
            ]
        },
        "cpus": number(MAX_CPUS),
        "memory_gb": number(MAX_MEMORY_GB),
        "labels": {
            "type": ["object", "null"],
            "maxProperties": MAX_LABELS,
            "propertyNames": {"maxLength": MAX_LABEL_KEY, "pattern": NO_NUL},
            "additionalProperties": text(MAX_LABEL_VALUE, NO_NUL, null=False),
        },
        "env": {
            "type": ["object", "null"],
            "maxProperties": MAX_ENV_VARS,
            "propertyNames": {
                "maxLength": MAX_ENV_NAME,
                "pattern": ENV_NAME,
                "not": {"pattern": RESERVED_ENV},
            },
            "additionalProperties": text(MAX_ENV_BYTES, NO_NUL, null=False),
        },
        "cwd": text(MAX_PATH, "^/[^\\u0000]*$"),
        "held": {"type": "boolean"},
        "server_name": text(MAX_SERVER_NAME, NO_NUL),
    },
    "allOf": [
        {  # a notebook server: an allocation, nothing to run
            "if": {"required": ["kind"], "properties": {"kind": {"const": "notebook"}}},
            "then": {"properties": {"command": {"type": "null"}, "notebook": {"type": "null"}}},
            "else": {  # a batch job: exactly one of command and notebook; no server name
                "properties": {"server_name": {"type": "null"}},
                "oneOf": [
                    {
                        "required": ["command"],
                        "properties": {
                            "command": {"type": "string"},
                            "notebook": {"type": "null"},
                        },
                    },
                    {
                        "required": ["notebook"],
                        "properties": {
                            "notebook": {"type": "string"},
                            "command": {"type": "null"},
                        },
                    },
                ],
            },
        },
        {  # a share of a GPU is a share of one GPU
            "if": {
                "required": ["gpu_fraction"],
                "properties": {"gpu_fraction": {"exclusiveMaximum": 1}},
            },
            "then": {"properties": {"gpus": {"const": 1}}},
        },
    ],
}
for _name, _text in JOB_FIELDS.items():
    JOB_REQUEST["properties"][_name]["description"] = _text

# -- the other bodies ------------------------------------------------------------------------------
PRIORITY_REQUEST = {
    "type": "object",
    "required": ["priority"],
    "properties": {
        "priority": {**whole(-MAX_WHOLE), "description": "higher goes first, within its tier"}
    },
}

MAINTENANCE_REQUEST = {
    "type": "object",
    "required": ["start"],
    "properties": {
        "start": {
            "description": "when the node is drained: epoch seconds, or an ISO 8601 time "
            "(1970 to 9999)",
            "anyOf": [
                {"type": "number", "minimum": 0, "maximum": 253402300799},
                # stricter than the server (which reads any ISO 8601 time): dates that exist
                # in every month, years whose every time zone stays after 1970 and before 9999
                {
                    "type": "string",
                    "pattern": "^(19[7-9][1-9]|19[89]0|[2-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9])"
                    "-(0[1-9]|1[0-2])-(0[1-9]|1[0-9]|2[0-8])"
                    "(T([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9])?(Z|[+-](0[0-9]|1[0-3]):00)?)?$",
                },
            ],
        }
    },
}

_REAPER_SECONDS = 100 * 365 * 86400.0  # the longest duration text the schema describes
_DURATION = {
    "anyOf": [
        {"type": "number", "minimum": 0},
        {"type": "string", "pattern": duration_pattern(_REAPER_SECONDS, zero=True)},
    ]
}
_OPTIONAL_DURATION = {  # null (or 0, "off", "none", ""): no timeout
    "anyOf": [*_DURATION["anyOf"], {"type": "null"}, {"enum": ["off", "none", "null", ""]}]
}
_NAME_LIST = {
    "type": "array",
    "maxItems": MAX_REAPER_LIST,
    "items": {"type": "string", "maxLength": MAX_DOCUMENT_TEXT},
}
REAPER_REQUEST = {
    "type": "object",
    "additionalProperties": False,
    "description": "A partial change: only the settings given change.",
    "properties": {
        "enabled": {"type": "boolean"},
        "idle_threshold": {"type": "number", "minimum": 0, "maximum": 100},
        "warning_lead": _DURATION,
        "timeout_tier_1": _OPTIONAL_DURATION,
        "timeout_tier_2": _OPTIONAL_DURATION,
        "timeout_tier_3": _OPTIONAL_DURATION,
        "profile_timeouts": {
            "type": "object",
            "maxProperties": MAX_REAPER_LIST,
            "propertyNames": {"maxLength": MAX_DOCUMENT_TEXT},
            "additionalProperties": _OPTIONAL_DURATION,
        },
        "exempt_users": _NAME_LIST,
        "exempt_groups": _NAME_LIST,
        "exempt_profiles": _NAME_LIST,
        "max_lifetime": _OPTIONAL_DURATION,
        "stale_after": _DURATION,
        "shutdown_kernels_first": {"type": "boolean"},
        "rogue_processes": {"type": "string", "enum": ["report", "kill", "off"]},
    },
}

_GPUS = {"type": ["number", "null"], "minimum": 0}
QUEUE_SETTINGS = {
    "type": ["object", "null"],
    "additionalProperties": False,
    "properties": {
        "guaranteed": _GPUS,
        "limit": _GPUS,
        "weight": {"type": ["number", "null"], "exclusiveMinimum": 0},
        "users": {"type": "array", "items": {"type": "string"}},
        "groups": {"type": "array", "items": {"type": "string"}},
        "children": {
            "type": "object",
            "propertyNames": {"pattern": QUEUE_NAME, "not": {"const": "root"}},
            "additionalProperties": ref("QueueSettings"),
        },
    },
}
QUOTAS_REQUEST = {
    "type": "object",
    "additionalProperties": False,
    "required": ["queues"],
    "description": "A queue file's document (docs/files.md) with the same queues: guarantees, "
    "limits, weights, members. Each queue's limit is at least its guarantee, and the top-level "
    f"guarantees add up to at most the cluster's GPUs. At most {MAX_DOCUMENT_ITEMS} JSON values, "
    f"nested at most {MAX_DOCUMENT_DEPTH} deep, keys and strings of at most {MAX_DOCUMENT_TEXT} "
    "characters.",
    "properties": {
        "queues": {
            "type": "object",
            "propertyNames": {"pattern": QUEUE_NAME, "not": {"const": "root"}},
            "additionalProperties": ref("QueueSettings"),
        },
        "fair_share_half_life": {"type": "string", "pattern": duration_pattern(10 * 365 * 86400)},
        "default_queue": {"type": ["string", "null"]},
        "user_limits": {"type": ["object", "null"]},
    },
}

USAGE_SAMPLE_REQUEST = {
    "type": "object",
    "required": ["job_id"],
    "description": "One report of a notebook server's GPU monitor (serverext/monitor.py).",
    "properties": {
        "job_id": {"type": "string", "pattern": JOB_ID},
        "profile": {"type": ["string", "null"], "maxLength": MAX_PROFILE},
        "time": {"type": ["number", "null"]},
        "server": {"type": ["object", "null"]},
        "kernels": {"type": ["object", "null"], "maxProperties": MAX_SAMPLE_KERNELS},
        "devices": {
            "type": ["array", "null"],
            "maxItems": MAX_SAMPLE_DEVICES,
            "items": {"type": "object"},
        },
    },
}

# -- operations --------------------------------------------------------------------------------
JSON = "application/json"
SECURITY = [{"token": []}, {"bearer": []}, {"cookie": []}]
SECURITY_SCHEMES = {
    "token": {
        "type": "apiKey",
        "in": "header",
        "name": "Authorization",
        "description": "A JupyterHub API token as 'token <token>' (from /hub/token, or the "
        "hub's REST API); it must hold access:services!service=gpusched. Scheduler admins: "
        "also custom:gpusched:admin.",
    },
    "bearer": {"type": "http", "scheme": "bearer", "description": "The same token as Bearer."},
    "cookie": {
        "type": "apiKey",
        "in": "cookie",
        "name": "jupyterhub-services-gpusched",
        "description": "The hub's OAuth cookie of a browser session (<prefix>login starts "
        "one). Reads only: every change needs a token in the Authorization header.",
    },
}

_WHY = {
    "400": "bad input: the field and what to fix",
    "401": "no valid hub token (or cookie)",
    "403": "not allowed: no access to this service, not an admin of the scheduler, or a "
    "change without a token in the Authorization header",
    "404": "no such job of yours (another user's job is answered like an unknown one), node "
    "or route",
    "405": "this method is not one of the path's (the Allow header lists them)",
    "409": "the job has already ended",
    "413": "the body is larger than GPUSchedService.max_body_bytes",
    "429": "too many pending jobs (the queue file's user_limits pending_jobs)",
    "503": "the job could not be stored; nothing was queued: retry",
}


def _error(status: str) -> dict:
    response = {"description": _WHY[status], "content": {JSON: {"schema": ref("Error")}}}
    if status == "405":
        response["headers"] = {
            "Allow": {"description": "the path's methods", "schema": {"type": "string"}}
        }
    return response


def _op(
    op_id: str,
    summary: str,
    ok,
    *,
    body=None,
    params=(),
    status=200,
    admin=False,
    errors=(),
    public=False,
    content_type=JSON,
    links=None,
):
    """One operation: ``ok`` is the success body's schema; ``errors`` the statuses beyond
    those every operation can answer (401, 403, 405; 400 with parameters or a body)."""
    statuses = set(errors) | {"401", "403", "405"}
    if params or body is not None:
        statuses.add("400")
    if any(where == "path" for _, where, _ in params):
        statuses.add("404")
    if body is not None:
        statuses.add("413")
    if public:
        statuses = {"405"}
    success = {"description": "OK", "content": {content_type: {"schema": ok}}}
    if links:
        success["links"] = links
    operation = {
        "operationId": op_id,
        "summary": summary + (" (admin)" if admin else ""),
        "security": [] if public else SECURITY,
        "parameters": [
            {"name": name, "in": where, "required": where == "path", "schema": schema}
            for name, where, schema in params
        ],
        "responses": {str(status): success, **{s: _error(s) for s in sorted(statuses)}},
    }
    if body is not None:
        operation["requestBody"] = {"required": True, "content": {JSON: {"schema": body}}}
    return operation


_JOB = [("id", "path", {"type": "string", "pattern": JOB_ID})]
_NODE = [("name", "path", {"type": "string", "pattern": NODE_NAME, "maxLength": 255})]
_TIME = {"type": "number", "description": "epoch seconds"}
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
        "get": _op(
            "getMe", "Who the service takes the caller to be: name, admin, groups", ref("Me")
        )
    },
    "/api/cluster": {
        "get": _op(
            "getCluster", "Nodes, GPUs and who holds them (others anonymised)", ref("Cluster")
        )
    },
    "/api/queue": {
        "get": _op(
            "getQueue",
            "Pending jobs in order: position, tier, GPUs, reason, ETA",
            ref("Queue"),
            params=[("limit", "query", whole(0, MAX_LIST_LIMIT))],
        )
    },
    "/api/jobs": {
        "post": _op(
            "submitJob",
            "Submit a batch job (or a notebook server's allocation)",
            ref("Job"),
            body=JOB_REQUEST,
            status=201,
            errors=("429", "503"),
            links=JOB_LINKS,
        ),
        "get": _op(
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
    "/api/jobs/{id}": {
        "get": _op(
            "getJob",
            "One of your jobs (running: its allocation; a notebook server: its latest GPU "
            "utilization)",
            ref("Job"),
            params=_JOB,
        ),
        "delete": _op(
            "cancelJob", "Cancel one of your jobs", ref("Job"), params=_JOB, errors=("409",)
        ),
    },
    "/api/jobs/{id}/log": {
        "get": _op(
            "getJobLog",
            "The end of a job's output (404 until it has run)",
            {"type": "string"},
            params=[*_JOB, ("bytes", "query", whole(0, MAX_LOG_BYTES))],
            content_type="text/plain",
        )
    },
    "/api/jobs/{id}/hold": {
        "post": _op(
            "holdJob", "Hold a pending job", ref("Job"), params=_JOB, admin=True, errors=("409",)
        )
    },
    "/api/jobs/{id}/release": {
        "post": _op(
            "releaseJob",
            "Release a held job",
            ref("Job"),
            params=_JOB,
            admin=True,
            errors=("409",),
        )
    },
    "/api/jobs/{id}/priority": {
        "put": _op(
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
        "get": _op(
            "getQuotas",
            "Queues: guarantees, limits, weights, what runs; the queue document",
            ref("Quotas"),
        ),
        "put": _op(
            "setQuotas",
            "Replace the quotas with a queue-file document (same queues)",
            ref("Quotas"),
            body=QUOTAS_REQUEST,
            admin=True,
        ),
    },
    "/api/nodes/{name}/drain": {
        "post": _op("drainNode", "Drain a node", ref("NodeState"), params=_NODE, admin=True)
    },
    "/api/nodes/{name}/resume": {
        "post": _op("resumeNode", "Put a node back", ref("NodeState"), params=_NODE, admin=True)
    },
    "/api/nodes/{name}/maintenance": {
        "put": _op(
            "setMaintenance",
            "Drain a node at a time; until then only jobs that end before it start there",
            ref("Maintenance"),
            params=_NODE,
            body=MAINTENANCE_REQUEST,
            admin=True,
        ),
        "delete": _op(
            "cancelMaintenance",
            "Cancel a maintenance window",
            ref("Maintenance"),
            params=_NODE,
            admin=True,
        ),
    },
    "/api/events": {
        "get": _op(
            "getEvents",
            "The audit log, newest first (users: their own jobs)",
            ref("Events"),
            params=[
                ("kind", "query", {"type": "string"}),
                ("job_id", "query", {"type": "string"}),
                ("user", "query", {"type": "string"}),
                ("since", "query", _TIME),
                ("until", "query", _TIME),
                ("before", "query", whole(0)),
                ("limit", "query", whole(1, MAX_EVENTS_LIMIT)),
            ],
        )
    },
    "/api/usage": {
        "get": _op(
            "getUsage",
            "GPU-hours by queue, user or GPU model over a period (with prices: cost); "
            "'since' must be before 'until' (default: now)",
            ref("Usage"),
            params=[
                ("by", "query", {"type": "string", "enum": ["queue", "user", "gpu_model"]}),
                ("since", "query", _TIME),
                ("until", "query", _TIME),
            ],
        )
    },
    "/api/reaper": {
        "get": _op(
            "getReaper",
            "The idle reaper's settings (in force, defaults, overrides) and sessions",
            ref("Reaper"),
        ),
        "put": _op(
            "setReaper",
            "Change reaper settings (partial; null turns a timeout off)",
            ref("ReaperUpdated"),
            body=REAPER_REQUEST,
            admin=True,
        ),
    },
    "/api/rogue-processes": {
        "get": _op(
            "getRogueProcesses",
            "GPU processes no allocation accounts for, on the nodes this service watches",
            ref("RogueProcesses"),
            admin=True,
        ),
    },
    "/api/usage-samples": {
        "post": _op(
            "postUsageSample",
            "A notebook server's GPU monitor reports its sample (the server's user; 404 for "
            "anything but a running notebook server of theirs)",
            ref("UsageSampleTaken"),
            body=USAGE_SAMPLE_REQUEST,
            errors=("404",),
        )
    },
    "/api/openapi.json": {
        "get": _op("getOpenAPI", "This document (no token needed)", {"type": "object"}, public=True)
    },
    "/metrics": {
        "get": _op(
            "getMetrics",
            "Prometheus metrics, in its text format (a token unless "
            "GPUSchedService.authenticate_metrics is off)",
            {"type": "string"},
            content_type="text/plain",
        )
    },
}


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
            "schemas": {**copy.deepcopy(SCHEMAS), "QueueSettings": copy.deepcopy(QUEUE_SETTINGS)},
            "securitySchemes": copy.deepcopy(SECURITY_SCHEMES),
        },
    }
