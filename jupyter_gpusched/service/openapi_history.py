"""The OpenAPI description of ``GET api/history`` (service/page.py, service/history.py): its
operation and its schemas, apart from openapi.py (which merges them) to keep each file a
readable size. A row's fields are core/history.py's ``snapshot``."""

from __future__ import annotations

from ..core.history import FAMILIES
from .openapi_operations import TIME, operation
from .openapi_responses import NUMBER, nullable, ref, strict

_GPUS = {"type": "number", "minimum": 0}
_BY_NAME = {"type": "object", "additionalProperties": _GPUS}

HISTORY_SCHEMAS = {
    "HistoryRow": strict(
        {
            "time": NUMBER,
            "total_gpus": {"type": "integer", "minimum": 0},
            "allocated": _BY_NAME,  # tier ("1", "2", "3") -> GPUs of running jobs
            "queues": _BY_NAME,  # leaf queue -> GPUs of running jobs (users: their queues)
            "pending": strict({family: _GPUS for family in FAMILIES}),
            "measured": {  # tier -> the notebook servers' GPUs measured, mean utilization
                "type": "object",
                "additionalProperties": strict(
                    {"gpus": _GPUS, "utilization": {"type": "number", "minimum": 0}}
                ),
            },
        }
    ),
    "History": strict(
        {
            "since": NUMBER,
            "until": NUMBER,
            "interval": nullable("number"),
            "waited_gpu_hours": strict({family: _GPUS for family in FAMILIES}),
            "rows": {"type": "array", "maxItems": 2000, "items": ref("HistoryRow")},
        }
    ),
}


def history_paths() -> dict:
    """The path of ``api/history``."""
    return {
        "/api/history": {
            "get": operation(
                "getHistory",
                "The cluster over time, one row every history_interval seconds, oldest first "
                "(at most 2000, evenly thinned; a period of at most 31 days, default the last "
                "24 h; 'since' must be before 'until'): GPUs by tier and queue (users: their own "
                "queues), pending GPUs by reason family, measured utilization, and the GPU-hours "
                "waited by family",
                ref("History"),
                params=[("since", "query", TIME), ("until", "query", TIME)],
            )
        }
    }
