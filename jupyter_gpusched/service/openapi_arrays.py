"""Job arrays in ``api/openapi.json``: the ``array`` of a POST api/jobs body, the answer that
submits an array (``JobArray``), the id of ``DELETE api/arrays/{array_id}``, and the arrays
``GET api/queue`` lists (``QueueArrays``).

Apart from :mod:`.openapi_requests` because ``array`` is not a field of one job (the job spec,
core/jobspec.py, has no such field: it is the request for many); a body without it is the one
job's schema, JOB_REQUEST, unchanged (``POST api/estimate`` takes that one).
"""

from __future__ import annotations

import copy

from ..core.arrays import ARRAY_PATTERN, MAX_ARRAY_ELEMENTS, MAX_ARRAY_INDEX, MAX_ARRAY_TEXT
from .openapi_requests import JOB_REQUEST
from .openapi_responses import ref, strict
from .requests import MAX_LIST_LIMIT

ARRAY_ID = "^a-[0-9]+$"

ARRAY_FIELD = {
    "type": ["string", "null"],
    "maxLength": MAX_ARRAY_TEXT,
    "pattern": ARRAY_PATTERN,
    "description": "a job array, in Slurm's --array syntax: indices and ranges separated by "
    "commas (N, N-M, N-M:STEP), then optionally %MAX_RUNNING, e.g. '0-99%8'; at most "
    f"{MAX_ARRAY_ELEMENTS} elements, indices up to {MAX_ARRAY_INDEX}, ranges upwards, "
    f"MAX_RUNNING from 1 to {MAX_ARRAY_ELEMENTS} (a 400 naming 'array' otherwise); batch jobs "
    "only. Answered with "
    "a JobArray: one job per index, each with GPUSCHED_ARRAY_INDEX and GPUSCHED_ARRAY_ID",
}


def _with_array(schema: dict) -> dict:
    body = copy.deepcopy(schema)
    body["properties"]["array"] = ARRAY_FIELD
    body["allOf"].append(  # no array of notebook servers
        {
            "if": {"required": ["kind"], "properties": {"kind": {"const": "notebook"}}},
            "then": {"properties": {"array": {"type": "null"}}},
        }
    )
    return body


SUBMIT_REQUEST = _with_array(JOB_REQUEST)  # the body of POST api/jobs

JOB_ARRAY = {
    "description": "The jobs one POST api/jobs with 'array' created, in index order.",
    **strict(
        {
            "array_id": {"type": "string", "pattern": ARRAY_ID},
            "jobs": {"type": "array", "items": ref("Job")},
        }
    ),
}
SUBMITTED = {"anyOf": [ref("Job"), ref("JobArray")]}  # the 201 of POST api/jobs
QUEUE_ARRAYS = {
    "description": "Each job array with pending elements among the queue's 'jobs': the one "
    "row they are listed as, Slurm's way, its id and the indices still pending with its "
    "%MAX_RUNNING: {'a-000012': 'a-000012_[2-5%2]'} (as the command line's queue lists it).",
    "type": "object",
    "maxProperties": MAX_LIST_LIMIT,
    "propertyNames": {"pattern": ARRAY_ID},
    "additionalProperties": {"type": "string", "pattern": r"^a-[0-9]+_\[[0-9,%-]+\]$"},
}
ARRAY_SCHEMAS = {"JobArray": JOB_ARRAY, "QueueArrays": QUEUE_ARRAYS}
