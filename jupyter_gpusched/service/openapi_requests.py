"""The request schemas of ``api/openapi.json``: what each body and parameter may be, exactly as
the server checks it (:mod:`.requests`), built from the same named bounds so that the two
cannot drift. Used by :mod:`.openapi`; ``tests/test_service_fuzz.py`` draws jobs from
:data:`JOB_REQUEST`.
"""

from __future__ import annotations

from dataclasses import MISSING

from ..core.jobspec import REQUEST_FIELDS, SpecField
from .openapi_responses import ref
from .requests import (
    ENV_NAME,
    MAX_BACKEND,
    MAX_DOCUMENT_DEPTH,
    MAX_DOCUMENT_ITEMS,
    MAX_DOCUMENT_TEXT,
    MAX_DURATION_TEXT,
    MAX_GPU_MODEL,
    MAX_GPU_MODELS,
    MAX_PROFILE,
    MAX_REAPER_LIST,
    MAX_SAMPLE_DEVICES,
    MAX_SAMPLE_KERNELS,
    MAX_TELEMETRY_ERROR,
    MAX_WALLTIME,
    MAX_WHOLE,
)

# -- building blocks ---------------------------------------------------------------------------
NO_NUL = "^[^\\u0000]*$"
NON_BLANK = "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$"  # some non-space character, no NUL
JOB_ID = "^j-[0-9]+$"
NODE_NAME = "^[A-Za-z0-9_.@-]+$"  # what a cluster file's hostlists expand to
QUEUE_NAME = "^[A-Za-z0-9_.@-]+$"  # core/quotas.py _NAME
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
# a deadline as text: a duration from now, or an ISO 8601 time with its zone (Z or an offset)
DEADLINE_TEXT = (
    f"^(?:{WALLTIME_TEXT.strip('^$')})$"
    r"|^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}:\d{2})$"
)

# -- POST api/jobs -------------------------------------------------------------------------------
# Each field's schema, by its spec's parse (core/jobspec.py): the plain kinds from its declared
# bounds, the special cases under their names, as service/requests.py reads them.
_FIELD_SCHEMAS = {
    "text": lambda f: text(f.spec.maximum, minLength=1),
    "whole": lambda f: whole(f.spec.minimum, null=f.spec.null_is_absent),
    "number": lambda f: number(f.spec.maximum),
    "choice": lambda f: {"type": "string", "enum": list(f.spec.choices)},
    "boolean": lambda f: {"type": "boolean"},
    "strings": lambda f: {
        "type": ["object", "null"],
        "maxProperties": f.spec.maximum,
        "propertyNames": {"maxLength": f.spec.key_length, "pattern": NO_NUL},
        "additionalProperties": text(f.spec.value_length, NO_NUL, null=False),
    },
    "gpu_fraction": lambda f: {"type": "number", "minimum": f.spec.minimum, "maximum": 1},
    "tier": lambda f: {"type": ["integer", "null"], "enum": [*f.spec.choices, None]},
    "gpu_model": lambda f: {
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
    "walltime": lambda f: {
        "anyOf": [
            {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": f.spec.maximum},
            {"type": "string", "maxLength": MAX_DURATION_TEXT, "pattern": WALLTIME_TEXT},
        ]
    },
    "deadline": lambda f: {
        "anyOf": [
            {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": f.spec.maximum},
            {"type": "string", "maxLength": MAX_DURATION_TEXT, "pattern": DEADLINE_TEXT},
        ]
    },
    "server_name": lambda f: text(f.spec.maximum, NO_NUL),
    "profile": lambda f: text(f.spec.maximum, minLength=1),
}
# A cross-field check that one field's schema says alone (the others are the allOf below).
_CHECK_SCHEMAS = {
    "absolute_cwd": lambda f: text(f.spec.maximum, "^/[^\\u0000]*$"),
    "env_names": lambda f: {
        **_FIELD_SCHEMAS["strings"](f),
        "propertyNames": {
            "maxLength": f.spec.key_length,
            "pattern": ENV_NAME,
            "not": {"pattern": RESERVED_ENV},
        },
    },
}


def field_schema(spec_field: SpecField) -> dict:
    """The request schema of one spec field, with its help as the description."""
    build = _FIELD_SCHEMAS[spec_field.spec.parse]
    for check in spec_field.spec.checks:
        build = _CHECK_SCHEMAS.get(check, build)
    return {**build(spec_field), "description": spec_field.spec.help}


def job_request_schema(fields=REQUEST_FIELDS) -> dict:
    """The schema of a POST api/jobs body of these spec fields (core/jobspec.py)."""
    return {
        "type": "object",
        "additionalProperties": False,
        "required": [f.wire for f in fields if f.default is MISSING],
        "properties": {f.wire: field_schema(f) for f in fields},
        "allOf": _JOB_RULES,
    }


# The rules between fields (service/requests.py's checks, and core/resources.py's CPU-only job).
_JOB_RULES = [
    {  # a notebook server: an allocation, nothing to run
        "if": {"required": ["kind"], "properties": {"kind": {"const": "notebook"}}},
        "then": {"properties": {"command": {"type": "null"}, "notebook": {"type": "null"}}},
        "else": {  # a batch job: exactly one of command and notebook; no server name
            "properties": {"server_name": {"type": "null"}, "profile": {"type": "null"}},
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
    {  # a CPU-only job: placed by its CPUs or memory, no GPU shape (core/resources.py)
        "if": {"properties": {"gpus": {"const": 0}}},
        "then": {
            "properties": {"gpus_per_node": {"type": "null"}, "gpu_model": False},
            "anyOf": [
                {
                    "required": ["cpus"],
                    "properties": {"cpus": {"type": "number", "exclusiveMinimum": 0}},
                },
                {
                    "required": ["memory_gb"],
                    "properties": {"memory_gb": {"type": "number", "exclusiveMinimum": 0}},
                },
            ],
        },
    },
]
JOB_REQUEST = job_request_schema()

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
        "unmonitored": {"type": "string", "enum": ["warn", "cull", "keep"]},
        "unmonitored_after": _DURATION,
    },
}

_GPUS = {"type": ["number", "null"], "minimum": 0}
_RESOURCE_LIMIT = {  # a queue's cpus / memory_gb (core/resources.py)
    "type": "object",
    "additionalProperties": False,
    "required": ["limit"],
    "properties": {"limit": {"type": "number", "minimum": 0}},
}
QUEUE_SETTINGS = {
    "type": ["object", "null"],
    "additionalProperties": False,
    "properties": {
        "guaranteed": _GPUS,
        "limit": _GPUS,
        "cpus": _RESOURCE_LIMIT,
        "memory_gb": _RESOURCE_LIMIT,
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
        "user_limits": {
            "type": ["object", "null"],
            "description": "user name (or 'default') -> that user's caps across all queues "
            "(core/user_limits.py)",
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "gpus": {"type": ["number", "null"], "minimum": 0},
                    "running_jobs": {"type": ["integer", "null"], "minimum": 0},
                    "pending_jobs": {"type": ["integer", "null"], "minimum": 0},
                },
            },
        },
    },
}

USAGE_SAMPLE_REQUEST = {
    "type": "object",
    "required": ["job_id"],
    "description": "One report of a notebook server's GPU monitor (serverext/monitor.py).",
    "properties": {
        "job_id": {"type": "string", "pattern": JOB_ID},
        "profile": {"type": ["string", "null"], "maxLength": MAX_PROFILE},
        "backend": {
            "type": ["string", "null"],
            "maxLength": MAX_BACKEND,
            "description": "what measured the samples: nvml, or simulated (acted on only by a "
            "service that runs the simulated cluster); null: no telemetry",
        },
        "telemetry_error": {"type": ["string", "null"], "maxLength": MAX_TELEMETRY_ERROR},
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
