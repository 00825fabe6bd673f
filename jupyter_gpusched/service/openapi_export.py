"""The OpenAPI description of ``GET api/export`` (service/export.py): its operation and schemas,
apart from openapi.py (which merges them), as the history's are. A job's request columns are
core/jobspec.py's trace fields, described as a job view describes them."""

from __future__ import annotations

from ..core.jobspec import TRACE_FIELDS
from .export import MAX_EXPORT_JOBS, OUTCOMES
from .openapi_operations import TIME, operation
from .openapi_responses import NUMBER, answer_schema, nullable, ref, strict

_SECONDS = {"type": "number", "minimum": 0}

EXPORT_SCHEMAS = {
    "ExportJob": strict(
        {
            "job_id": {"type": "string"},
            "submit_time": NUMBER,
            "duration": {
                **_SECONDS,
                "description": "the work it needed: its last run, and what earlier runs kept "
                "by the policy's checkpoint model",
            },
            **{f.wire: answer_schema(f) for f in TRACE_FIELDS},
            "start_time": {**NUMBER, "description": "its first start"},
            "end_time": {**nullable("number"), "description": "its last run's end; null: running"},
            "run_time": {**_SECONDS, "description": "seconds it held GPUs, all runs together"},
            "preemptions": {"type": "integer", "minimum": 0},
            "outcome": {"type": "string", "enum": list(OUTCOMES)},
            "profile": nullable("string"),
        }
    ),
    "UtilizationRun": strict(
        {
            "job_id": {"type": "string"},
            "start": NUMBER,
            "end": NUMBER,
            "utilization": {"type": "number", "minimum": 0, "maximum": 100},
        }
    ),
    "Export": strict(
        {
            "since": NUMBER,
            "until": NUMBER,
            "queue": nullable("string"),
            "pseudonymized": {"type": "boolean"},
            "jobs": {"type": "array", "maxItems": MAX_EXPORT_JOBS, "items": ref("ExportJob")},
            "utilization": {"type": "array", "items": ref("UtilizationRun")},
            "left_out": {"type": "object", "additionalProperties": {"type": "integer"}},
            "queues": {"type": ["object", "null"], "description": "the queue document in force"},
            "reaper": {
                "anyOf": [ref("ReaperSettings"), {"type": "null"}],
                "description": "the idle reaper's settings in force",
            },
        }
    ),
}


def export_paths() -> dict:
    """The path of ``api/export``."""
    return {
        "/api/export": {
            "get": operation(
                "exportTrace",
                "The jobs and notebook servers that ran in a period (at most 366 days, default "
                "the last 30; 'since' before 'until'), as trace rows with what happened to each "
                "(first start, end, GPU time, pre-emptions, outcome), the servers' recorded GPU "
                "utilization, and the queue document in force; 'queue' keeps one queue and those "
                "below it; 'pseudonymize=true' replaces user names with stable pseudonyms. What "
                "jupyter gpusched export-trace writes",
                ref("Export"),
                params=[
                    ("since", "query", TIME),
                    ("until", "query", TIME),
                    ("queue", "query", {"type": "string"}),
                    ("pseudonymize", "query", {"type": "string", "enum": ["true", "false"]}),
                ],
                admin=True,
            )
        }
    }
