"""Schemathesis hooks for the scheduler's API (``SCHEMATHESIS_HOOKS=schemathesis_hooks`` with
``tests`` on ``PYTHONPATH``; ``tests/schemathesis.toml`` says how to run it).

* :func:`map_case`: no generated command runs as a real user: a valid ``command`` becomes
  ``true``, and a job that would execute a notebook is submitted held (it never starts);
* :func:`after_call`: a job (or job array) a case submitted is cancelled as soon as it is
  answered, so that generated jobs never fill the cluster (later cases would only see jobs
  waiting); a valid ``array`` is made ``0-1`` first by :func:`map_case` (two jobs, not 10,000);
* :func:`filter_failure`: ``DELETE api/jobs/{id}`` cancels a job, which stays readable (ended:
  cancelled, or completed for a notebook server's allocation; its log): a 200 for it after the
  DELETE is what the API promises, not the use after free Schemathesis' ``use_after_free``
  takes it for; only that is dropped;
* :func:`positive_data_acceptance_here`: Schemathesis' ``positive_data_acceptance`` (excluded
  on the command line), less the 400s (of ``POST api/jobs``, and of ``POST api/estimate``, which
  refuses what a submission would) the document says JSON Schema cannot describe
  (``service/openapi.py``): a job must fit this cluster and name one of its queues and GPU
  models, ``gpus_per_node`` must divide ``gpus``, ``cwd`` must be a directory the user may enter,
  a ``deadline`` must be after now (a time, or a duration that is not ~0) and one the engine can
  meet (service/deadlines.py),
  a queue document must keep the queues, and ``since`` must be before ``until`` (for
  ``api/history``, at most 31 days before it; for ``api/export``, 366, and its ``queue`` one of
  the service's). Only those operations, only a 400 naming those
  fields with those messages (:data:`STATE_DEPENDENT`).

``GPUSCHED_ADMIN_TOKEN`` (the cancelling) must be set, as for the config.
"""

from __future__ import annotations

import os
import re

import requests
import schemathesis
from schemathesis.openapi.checks import UseAfterFree
from schemathesis.specs.openapi.checks import positive_data_acceptance

from jupyter_gpusched.core.arrays import parse_array
from jupyter_gpusched.core.errors import ConfigError
from jupyter_gpusched.service.requests import MAX_COMMAND

NEVER_HERE = "^this job can never run here"
# (method, path) -> {field the 400 names: what its message must say}
STATE_DEPENDENT = {
    ("POST", "/api/jobs"): {
        # more than this cluster has (GPUs, gang shape, labels, CPUs, memory, a tier-1 job
        # beyond its queue's guarantee)
        **dict.fromkeys(("gpus", "labels", "cpus", "memory_gb", "tier"), NEVER_HERE),
        "gpus_per_node": f"{NEVER_HERE}|must divide 'gpus'",
        "queue": "^no queue |belongs to no queue",
        "gpu_model": "^no GPU of model ",
        # a directory the user may enter: which ones, the file system says
        "cwd": "^the working directory .* does not exist or .* may not enter it",
        # and a notebook it may read there
        "notebook": "^the notebook .* is not a file .* may read",
        # an array's ranges upwards, its size and %MAX_RUNNING within bounds (core/arrays.py)
        "array": "must go upwards|must be from 1 to|elements$|indices go up to",
        # after now (the clock's), and one the engine can meet (its queue, its walltime)
        "deadline": "^'deadline' must be a time with its zone .*later than now|cannot be met: ",
    },
    # a queue document must keep the queues; limits at least the guarantees, guarantees within
    # the cluster, the default queue one of them
    ("PUT", "/api/quotas"): dict.fromkeys(
        (None, "queues", "guaranteed", "limit", "default_queue", "user_limits", "name"), ""
    ),
    ("GET", "/api/usage"): {"since": "^'since' must be before 'until'"},
    # and for the history, a period of at most 31 days (until is now unless given)
    ("GET", "/api/history"): {"since": "^'since' must be before 'until'|^a period of at most "},
    # an export: the same, at most 366 days, and one of this service's queues
    ("GET", "/api/export"): {
        "since": "^'since' must be before 'until'|^a period of at most |jobs ran in this period",
        "queue": "^no queue ",
    },
}
# what refuses a submission refuses an estimate of it
STATE_DEPENDENT[("POST", "/api/estimate")] = STATE_DEPENDENT[("POST", "/api/jobs")]


@schemathesis.hook
def map_case(context, case):
    body = case.body
    if case.operation.path == "/api/jobs" and isinstance(body, dict):
        command = body.get("command")
        # only a valid one: an invalid one must still be refused (negative mode)
        if isinstance(command, str) and command.strip() and len(command) <= MAX_COMMAND:
            body["command"] = "true"
        if isinstance(body.get("notebook"), str) and body.get("held") in (None, False):
            body["held"] = True
        # a valid array stays valid but small: "0-9999" would queue 10,000 jobs per case
        array = body.get("array")
        if isinstance(array, str):
            try:
                parse_array(array)
            except ConfigError:
                pass
            else:
                body["array"] = "0-1"
    return case


@schemathesis.hook
def after_call(context, case, response):
    if (case.method.upper(), case.operation.path) != ("POST", "/api/jobs"):
        return
    if response.status_code != 201:
        return
    answer = response.json()
    token = os.environ["GPUSCHED_ADMIN_TOKEN"]
    if "array_id" in answer and "jobs" in answer:  # a job array: cancelled as one
        url = response.request.url.rstrip("/").removesuffix("jobs") + "arrays/"
        done = requests.delete(
            url + answer["array_id"], headers={"Authorization": f"token {token}"}, timeout=30
        )
        assert done.status_code in (200, 404), done.text
        return
    if answer.get("state") in ("pending", "running"):
        url = response.request.url.rstrip("/") + "/" + answer["id"]
        done = requests.delete(url, headers={"Authorization": f"token {token}"}, timeout=30)
        assert done.status_code in (200, 409), done.text


@schemathesis.hook
def filter_failure(context, failure, case, response):
    """False (drop it) only for a job read after its DELETE ended it."""
    if not isinstance(failure, UseAfterFree):
        return True
    deleted = re.fullmatch(r"DELETE /api/jobs/(j-[0-9]+)", failure.free)
    usage = failure.usage.split("?")[0]
    if deleted is None or usage not in (
        f"GET /api/jobs/{deleted[1]}",
        f"GET /api/jobs/{deleted[1]}/log",
    ):
        return True
    if usage.endswith("/log"):
        return False  # the output of an ended job
    job = response.json()
    # a running job that DELETE signalled (``stopping``: "cancelled") ends once its processes
    # do, after at most the cancel grace: only a job DELETE left pending, or running without
    # being signalled, is a failure
    return job.get("state") == "pending" or (
        job.get("state") == "running" and not job.get("stopping")
    )


@schemathesis.check
def positive_data_acceptance_here(ctx, response, case):
    try:
        return positive_data_acceptance(ctx, response, case)
    except AssertionError:
        fields = STATE_DEPENDENT.get((case.method.upper(), case.operation.path), {})
        error = response.json() if response.status_code == 400 else {}
        expected = fields.get(error.get("field"), None)
        if expected is not None and re.search(expected, error.get("error", "")):
            return None
        raise
