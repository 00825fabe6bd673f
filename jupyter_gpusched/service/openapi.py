"""The OpenAPI 3 description of the REST API (served at ``api/openapi.json``).

``tests/test_service_api.py`` checks that every route the service serves is described here
and nothing more, and fuzzes the API from this document.
"""

from __future__ import annotations

from .requests import JOB_FIELDS

_ERROR = {
    "type": "object",
    "properties": {"error": {"type": "string"}, "field": {"type": ["string", "null"]}},
    "required": ["error"],
}

JOB_REQUEST = {
    "type": "object",
    "additionalProperties": False,
    "required": ["gpus"],
    "properties": {
        "command": {"type": "string"},
        "notebook": {"type": "string"},
        "kind": {"type": "string", "enum": ["batch", "notebook"]},
        "name": {"type": "string", "maxLength": 200},
        "gpus": {"type": "integer", "minimum": 1},
        "gpu_fraction": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "gpus_per_node": {"type": "integer", "minimum": 1},
        "tier": {"type": "integer", "enum": [1, 2, 3]},
        "queue": {"type": "string"},
        "gpu_model": {
            "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]
        },
        "walltime": {"oneOf": [{"type": "number", "exclusiveMinimum": 0}, {"type": "string"}]},
        "cpus": {"type": "number", "minimum": 0},
        "memory_gb": {"type": "number", "minimum": 0},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "env": {"type": "object", "additionalProperties": {"type": "string"}},
        "cwd": {"type": "string"},
        "held": {"type": "boolean"},
        "server_name": {"type": "string", "maxLength": 255},
    },
}
for _name, _text in JOB_FIELDS.items():
    JOB_REQUEST["properties"][_name]["description"] = _text


def _op(summary, *, body=None, params=(), ok=200, admin=False):
    operation = {
        "summary": summary + (" (admin)" if admin else ""),
        "parameters": [
            {"name": name, "in": where, "required": where == "path", "schema": {"type": kind}}
            for name, where, kind in params
        ],
        "responses": {
            str(ok): {"description": "OK", "content": {"application/json": {}}},
            "400": {
                "description": "bad input",
                "content": {"application/json": {"schema": _ERROR}},
            },
            "401": {"description": "not authenticated"},
            "403": {"description": "not allowed"},
            "404": {"description": "no such job or node of yours"},
        },
    }
    if body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": body}},
        }
    return operation


_JOB = [("id", "path", "string")]
_NODE = [("name", "path", "string")]
_PAGE = [("limit", "query", "integer"), ("offset", "query", "integer")]

PATHS = {
    "/api/me": {"get": _op("Who the service takes the caller to be: name, admin, groups")},
    "/api/cluster": {"get": _op("Nodes, GPUs and who holds them (others anonymised)")},
    "/api/queue": {
        "get": _op("Pending jobs in order: position, tier, GPUs, reason, ETA", params=_PAGE[:1])
    },
    "/api/jobs": {
        "post": _op("Submit a batch job", body=JOB_REQUEST, ok=201),
        "get": _op(
            "Your jobs (admins: everybody's, or ?user=)",
            params=[("state", "query", "string"), ("user", "query", "string"), *_PAGE],
        ),
    },
    "/api/jobs/{id}": {
        "get": _op(
            "One of your jobs (running: its allocation; a notebook server: its latest GPU "
            "utilization)",
            params=_JOB,
        ),
        "delete": _op("Cancel one of your jobs", params=_JOB),
    },
    "/api/jobs/{id}/log": {
        "get": _op("The end of a job's output", params=[*_JOB, ("bytes", "query", "integer")])
    },
    "/api/jobs/{id}/hold": {"post": _op("Hold a pending job", params=_JOB, admin=True)},
    "/api/jobs/{id}/release": {"post": _op("Release a held job", params=_JOB, admin=True)},
    "/api/jobs/{id}/priority": {
        "put": _op(
            "Override a job's priority within its tier (higher first)",
            params=_JOB,
            body={
                "type": "object",
                "required": ["priority"],
                "properties": {"priority": {"type": "integer"}},
            },
            admin=True,
        )
    },
    "/api/quotas": {
        "get": _op("Queues: guarantees, limits, weights, what runs; the queue document"),
        "put": _op(
            "Replace the quotas with a queue-file document (same queues)",
            body={"type": "object", "required": ["queues"]},
            admin=True,
        ),
    },
    "/api/nodes/{name}/drain": {"post": _op("Drain a node", params=_NODE, admin=True)},
    "/api/nodes/{name}/resume": {"post": _op("Put a node back", params=_NODE, admin=True)},
    "/api/nodes/{name}/maintenance": {
        "put": _op(
            "Drain a node at a time; until then only jobs that end before it start there",
            params=_NODE,
            body={
                "type": "object",
                "required": ["start"],
                "properties": {"start": {"oneOf": [{"type": "number"}, {"type": "string"}]}},
            },
            admin=True,
        ),
        "delete": _op("Cancel a maintenance window", params=_NODE, admin=True),
    },
    "/api/events": {
        "get": _op(
            "The audit log, newest first (users: their own jobs)",
            params=[
                ("kind", "query", "string"),
                ("job_id", "query", "string"),
                ("user", "query", "string"),
                ("since", "query", "number"),
                ("until", "query", "number"),
                ("before", "query", "integer"),
                ("limit", "query", "integer"),
            ],
        )
    },
    "/api/usage": {
        "get": _op(
            "GPU-hours by queue, user or GPU model over a period (with prices: cost)",
            params=[
                ("by", "query", "string"),
                ("since", "query", "number"),
                ("until", "query", "number"),
            ],
        )
    },
    "/api/reaper": {
        "get": _op("The idle reaper's settings (in force, defaults, overrides) and sessions"),
        "put": _op(
            "Change reaper settings (partial; null turns a timeout off)",
            body={
                "type": "object",
                "properties": {
                    "enabled": {"type": "boolean"},
                    "idle_threshold": {"type": "number", "minimum": 0, "maximum": 100},
                    "warning_lead": {"oneOf": [{"type": "number"}, {"type": "string"}]},
                    "timeout_tier_1": {"oneOf": [{"type": "number"}, {"type": "string"}]},
                    "timeout_tier_2": {"oneOf": [{"type": "number"}, {"type": "string"}]},
                    "timeout_tier_3": {"oneOf": [{"type": "number"}, {"type": "string"}]},
                    "profile_timeouts": {"type": "object"},
                    "exempt_users": {"type": "array", "items": {"type": "string"}},
                    "exempt_groups": {"type": "array", "items": {"type": "string"}},
                    "exempt_profiles": {"type": "array", "items": {"type": "string"}},
                    "max_lifetime": {"oneOf": [{"type": "number"}, {"type": "string"}]},
                    "stale_after": {"oneOf": [{"type": "number"}, {"type": "string"}]},
                    "shutdown_kernels_first": {"type": "boolean"},
                    "rogue_processes": {"type": "string", "enum": ["report", "kill", "off"]},
                },
            },
            admin=True,
        ),
    },
    "/api/rogue-processes": {
        "get": _op(
            "GPU processes no allocation accounts for, on the nodes this service watches",
            admin=True,
        ),
    },
    "/api/usage-samples": {
        "post": _op(
            "A notebook server's GPU monitor reports its sample (the server's user)",
            body={
                "type": "object",
                "required": ["job_id"],
                "properties": {
                    "job_id": {"type": "string"},
                    "profile": {"type": ["string", "null"]},
                    "time": {"type": ["number", "null"]},
                    "server": {"type": "object"},
                    "kernels": {"type": "object"},
                    "devices": {"type": "array", "items": {"type": "object"}},
                },
            },
        )
    },
    "/api/openapi.json": {"get": _op("This document")},
    "/metrics": {"get": _op("Prometheus metrics")},
}


def openapi_document(prefix: str = "/") -> dict:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "jupyter_gpusched scheduler service",
            "version": "1",
            "description": "GPU scheduling for JupyterHub. Authenticate with a hub API token: "
            "'Authorization: token <token>'.",
        },
        "servers": [{"url": prefix.rstrip("/") or "/"}],
        "paths": PATHS,
    }
