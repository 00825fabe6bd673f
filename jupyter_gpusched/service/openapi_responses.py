"""What the REST API answers, as JSON Schemas: the ``components.schemas`` of ``api/openapi.json``.

Each schema is the exact shape a handler sends (``additionalProperties: false`` where the
handler builds the object itself), so that a tool that validates responses against the document
(Schemathesis' ``response_schema_conformance``, ``tests/test_schemathesis.py``) notices when a
handler and this file drift apart. The request schemas are in :mod:`.openapi`.
"""

from __future__ import annotations

from ..core.jobs import JobState
from ..core.jobspec import FIELDS, SpecField
from ..core.runtime_estimates import PLAN_SOURCES


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(kind: str | dict) -> dict:
    if isinstance(kind, str):
        return {"type": [kind, "null"]}
    return {"anyOf": [kind, {"type": "null"}]}


def strict(properties: dict, required: list | None = None) -> dict:
    """An object with exactly these properties (all required unless ``required`` says)."""
    return {
        "type": "object",
        "additionalProperties": False,
        "required": list(properties) if required is None else required,
        "properties": properties,
    }


STRING, NUMBER, INTEGER, BOOLEAN = ({"type": t} for t in ("string", "number", "integer", "boolean"))
NAMES = {"type": "array", "items": STRING}
JOB_STATES = [state.value for state in JobState]

REASON = nullable(
    strict(
        {
            # capacity | placement | policy (core/reasons); rejected: could never run here
            "family": {"type": "string", "enum": ["capacity", "placement", "policy", "rejected"]},
            "detail": STRING,
            "message": STRING,
            "eta": nullable("number"),
        }
    )
)

# The spec's fields in a job view (core/jobspec.py; service/records.py public_job), each as its
# column holds it: the type its column says, its choices, a whole number's least value.
_COLUMN_ANSWERS = {"integer": "integer", "double": "number", "boolean": "boolean"}
_SPECIAL_ANSWERS = {  # by the field's parse
    "gpu_model": NAMES,
    "strings": {"type": "object", "additionalProperties": STRING},
    # a share of a GPU: more than 0 (the request's least share may change; stored jobs stay)
    "gpu_fraction": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
}


def answer_schema(spec_field: SpecField) -> dict:
    """The response schema of one spec field's value in a job view."""
    spec, column = spec_field.spec, spec_field.spec.column
    schema = _SPECIAL_ANSWERS.get(spec.parse) or {
        "type": _COLUMN_ANSWERS.get(column.type, "string")
    }
    if spec.choices:
        schema = {**schema, "enum": list(spec.choices)}
    elif spec.parse == "whole" and spec.minimum is not None and not column.nullable:
        schema = {**schema, "minimum": spec.minimum}
    if column.nullable or spec.parse == "strings":  # a view of an older row may lack it
        schema = {**schema, "type": [schema["type"], "null"]}
    return {**schema, "description": spec.help} if spec.help else schema


def view_fields(view: str, fields=FIELDS) -> dict:
    """The schemas of the spec fields a job view of this kind (public, owner) holds."""
    return {
        f.column_name: answer_schema(f)
        for f in fields
        if f.spec.column is not None and f.spec.view == view
    }


# service/records.py public_job: always these ...
_JOB_ALWAYS = {
    "id": {"type": "string", "pattern": "^j-[0-9]+$"},
    "state": {"type": "string", "enum": JOB_STATES},
    **view_fields("public"),
    "submit_time": NUMBER,
    "start_time": nullable("number"),
    "end_time": nullable("number"),
    "runs": INTEGER,
    "preemptions": INTEGER,
    "deadline_missed": BOOLEAN,  # unfinished at its deadline (core/deadlines.py)
    "reason": ref("Reason"),
    "position": {"type": ["integer", "null"], "minimum": 0},
    "mine": BOOLEAN,
}
# ... the caller's own job (or any, for an admin) also these ...
_JOB_FULL = {
    **view_fields("owner"),
    "exit_code": nullable("integer"),
    "message": nullable("string"),
}
# ... and a running job these (api_handler.py APIHandler.view)
_JOB_RUNNING = {
    "allocation": {
        "type": "array",
        "items": strict(
            {
                "node": STRING,
                "gpus": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                "gpu_fraction": NUMBER,
            }
        ),
    },
    "utilization": nullable(
        strict(
            {
                "percent": nullable("number"),
                "measured_at": nullable("number"),
                "devices": {
                    "type": "array",
                    "items": strict({"index": {}, "utilization": nullable("number")}),
                },
            }
        )
    ),
    "stopping": {"type": ["string", "null"], "enum": ["cancelled", "preempted", None]},
}
# what the engine plans a job to run (service/records.py planned_view)
PLANNED_RUN_TIME = strict(
    {
        "seconds": NUMBER,
        "from": {"type": "string", "enum": list(PLAN_SOURCES)},
        "message": STRING,  # "planned to run 2 min, estimated from earlier runs like it"
    }
)
# ... and an unfinished job of the caller's own (or any, for an admin) this
_JOB_UNFINISHED = {"planned_run_time": PLANNED_RUN_TIME}

JOB = {
    "description": "A job as the caller sees it: their own in full, other users' without who "
    "and what (user, name, command, environment, directory are left out).",
    **strict(
        {**_JOB_ALWAYS, **_JOB_FULL, **_JOB_RUNNING, **_JOB_UNFINISHED},
        required=list(_JOB_ALWAYS),
    ),
}

QUEUE_ENTRY = strict(
    {
        "position": {"type": ["integer", "null"], "minimum": 0},
        "id": _JOB_ALWAYS["id"],
        "mine": BOOLEAN,
        "user": nullable("string"),
        "name": nullable("string"),
        "queue": STRING,
        "tier": _JOB_ALWAYS["tier"],
        "gpus": INTEGER,
        "gpu_fraction": NUMBER,
        "submit_time": NUMBER,
        "deadline": nullable("number"),  # epoch seconds, as submit_time
        "deadline_missed": BOOLEAN,
        "reason": ref("Reason"),
        "array_id": nullable("string"),
        "array_index": nullable("integer"),
        "array_max_running": nullable("integer"),
    }
)

GPU_HOLDER = strict(
    {
        "job": nullable("string"),
        "fraction": NUMBER,
        "user": nullable("string"),
        "tier": INTEGER,
        "reserved": BOOLEAN,
    }
)

NODE = strict(
    {
        "name": STRING,
        "gpu_model": STRING,
        "gpus": INTEGER,
        "free": {"type": "integer", "minimum": 0},
        "state": {"type": "string", "enum": ["up", "drain", "down"]},
        "maintenance": nullable("number"),
        "leaf": nullable("string"),
        "spine": nullable("string"),
        "labels": {"type": "object", "additionalProperties": STRING},
        "gpu_list": {
            "type": "array",
            "items": strict(
                {"index": INTEGER, "jobs": {"type": "array", "items": ref("GPUHolder")}}
            ),
        },
    }
)

EVENT = strict(
    {
        "id": INTEGER,
        "time": NUMBER,
        "kind": STRING,
        "job_id": nullable("string"),
        "user": nullable("string"),
        "actor": nullable("string"),
        "node": nullable("string"),
        "message": nullable("string"),
        "data": {"description": "what the event is about (kind-specific), or null"},
    }
)

_DURATION_SETTING = {"type": ["number", "null"], "minimum": 0}
REAPER_SETTINGS = strict(
    {
        "enabled": BOOLEAN,
        "idle_threshold": {"type": "number", "minimum": 0, "maximum": 100},
        "warning_lead": {"type": "number", "minimum": 0},
        "timeout_tier_1": _DURATION_SETTING,
        "timeout_tier_2": _DURATION_SETTING,
        "timeout_tier_3": _DURATION_SETTING,
        "profile_timeouts": {"type": "object", "additionalProperties": _DURATION_SETTING},
        "profile_idle_timeouts": {"type": "object", "additionalProperties": {"type": "number"}},
        "exempt_users": NAMES,
        "exempt_groups": NAMES,
        "exempt_profiles": NAMES,
        "max_lifetime": _DURATION_SETTING,
        "stale_after": {"type": "number", "minimum": 0},
        "shutdown_kernels_first": BOOLEAN,
        "rogue_processes": {"type": "string", "enum": ["report", "kill", "off"]},
        "unmonitored": {"type": "string", "enum": ["warn", "cull", "keep"]},
        "unmonitored_after": {"type": "number", "minimum": 0},
    }
)

SESSION = strict(
    {
        "job_id": STRING,
        "user": STRING,
        "profile": nullable("string"),
        "tier": INTEGER,
        "gpus": NUMBER,
        "started": NUMBER,
        "last_report": nullable("number"),
        "idle_since": NUMBER,
        "timeout": nullable("number"),
        "exempt": BOOLEAN,
        "warned": nullable("number"),
        "stop_at": nullable("number"),
        # the service's own measurements (service/gpu_sampling.py, the hub's activity)
        "measured_by": nullable("string"),
        "last_measured": nullable("number"),
        "last_sample": {"type": ["object", "null"]},
        "utilization_history": {
            "type": "array",
            "items": {
                "type": "array",
                "prefixItems": [NUMBER, nullable("number")],
                "minItems": 2,
                "maxItems": 2,
            },
        },
        "unmonitored_since": nullable("number"),
        "unmonitored_reason": nullable("string"),
        "kernels": {"type": "object"},  # the monitor's latest report: kernel attribution
        "backend": nullable("string"),
        "ignored_reports": {"type": "integer", "minimum": 0},
        "ignored_reason": nullable("string"),
    }
)

# POST api/estimate (service/handlers.py EstimateHandler): what a job submitted now would meet
ESTIMATE = strict(
    {
        "start_now": BOOLEAN,
        "eta": nullable("number"),  # epoch seconds: its reservation's start, where it has one
        "reason": ref("Reason"),  # as the job's record would carry it (null: it starts now)
        "queue": STRING,  # the leaf queue it would go to
        "position": {"type": ["integer", "null"], "minimum": 1},  # 1-based; null: starts now
        "earliest_finish": nullable("number"),  # a job with a deadline: epoch s; else null
        "planned_run_time": nullable(PLANNED_RUN_TIME),  # null: none frozen (never for a job)
    }
)

SCHEMAS = {
    "Error": {
        "description": "Every 4xx: what to fix, and the request field it is about (or null).",
        **strict({"error": STRING, "field": nullable("string")}),
    },
    "Reason": REASON,
    "Job": JOB,
    "Estimate": ESTIMATE,
    "JobList": strict({"jobs": {"type": "array", "items": ref("Job")}}),
    "Me": strict(
        {
            "name": STRING,
            "admin": BOOLEAN,
            "groups": NAMES,
            # the caller's leaf queues; default: where a job without a queue goes
            "queues": {
                "type": "array",
                "items": strict(
                    {
                        "path": STRING,
                        "in_use": NUMBER,
                        "guaranteed": NUMBER,
                        "limit": nullable("number"),
                        "default": BOOLEAN,
                        # rank 1 goes first in the fair-share order; null before it is computed
                        "fair_share": nullable(
                            strict(
                                {
                                    "rank": {"type": "integer", "minimum": 1},
                                    "of": {"type": "integer", "minimum": 1},
                                    "factor": {"type": "number", "minimum": 0, "maximum": 1},
                                }
                            )
                        ),
                    }
                ),
            },
            # by hub profile: a new server's idle timeout now, in seconds (null: never)
            "idle_timeouts": {"type": "object", "additionalProperties": nullable("number")},
        },
        required=["name", "admin", "groups", "queues"],
    ),
    "QueueEntry": QUEUE_ENTRY,
    "Queue": strict(
        {
            "pending": {"type": "integer", "minimum": 0},
            "running": {"type": "integer", "minimum": 0},
            "jobs": {"type": "array", "items": ref("QueueEntry")},
            "held": {"type": "array", "items": ref("QueueEntry")},
            "retrying": {"type": "array", "items": ref("QueueEntry")},
            "arrays": ref("QueueArrays"),
        }
    ),
    "GPUHolder": GPU_HOLDER,
    "Node": NODE,
    "Cluster": strict(
        {
            "total_gpus": INTEGER,
            "allocated_gpus": NUMBER,
            "nodes": {"type": "array", "items": ref("Node")},
        }
    ),
    "Quotas": strict(
        {
            "document": {"type": ["object", "null"], "description": "the queue document"},
            "queues": {
                "type": "array",
                "items": strict(
                    {
                        "path": STRING,
                        "guaranteed": NUMBER,
                        "limit": nullable("number"),
                        "weight": NUMBER,
                        "running": NUMBER,
                        "claimed": NUMBER,
                        "in_use": NUMBER,
                        "borrowed": NUMBER,
                        "pending": NUMBER,
                        "cpus_running": NUMBER,
                        "cpu_limit": nullable("number"),
                        "memory_running": NUMBER,
                        "memory_limit": nullable("number"),
                        "leaf": BOOLEAN,
                        "users": NAMES,
                        "groups": NAMES,
                    }
                ),
            },
        }
    ),
    "NodeState": strict({"node": STRING, "state": {"type": "string", "enum": ["up", "drain"]}}),
    "Maintenance": strict({"node": STRING, "maintenance": nullable("number")}),
    "Event": EVENT,
    "Events": strict({"events": {"type": "array", "items": ref("Event")}}),
    "Usage": strict(
        {
            "since": NUMBER,
            "until": NUMBER,
            "by": {"type": "string", "enum": ["queue", "user", "gpu_model"]},
            "usage": {
                "type": "array",
                "items": strict(
                    {"key": nullable("string"), "gpu_hours": NUMBER, "cost": nullable("number")},
                    required=["key", "gpu_hours"],
                ),
            },
        }
    ),
    "ReaperSettings": REAPER_SETTINGS,
    "ReaperSession": SESSION,
    "Reaper": strict(
        {
            "settings": ref("ReaperSettings"),
            "defaults": ref("ReaperSettings"),
            "overrides": {"type": "object"},
            "sessions": {"type": "array", "items": ref("ReaperSession")},
        }
    ),
    "ReaperUpdated": strict({"settings": ref("ReaperSettings"), "overrides": {"type": "object"}}),
    "UsageSampleTaken": strict(
        {
            "job_id": STRING,
            "idle_since": NUMBER,
            "warned": nullable("number"),
            "timeout": nullable("number"),
            "ignored": nullable("string"),
        }
    ),
    "RogueProcesses": strict(
        {
            "watched_nodes": NAMES,
            "mode": {"type": "string", "enum": ["report", "kill", "off"]},
            "processes": {"type": "array", "items": {"type": "object"}},
        }
    ),
}
