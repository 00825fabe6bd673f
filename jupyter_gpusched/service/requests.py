"""Turning a JSON request body into a job, with a 400 that names the field for anything wrong.

The submitting user never comes from the body: it is the hub identity of the caller.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

from ..core.durations import parse_duration
from ..core.jobs import TIERS

# The fields of POST api/jobs, with what each must be (used in messages and in the OpenAPI doc).
JOB_FIELDS = {
    "command": "a shell command to run (string); exactly one of command and notebook",
    "notebook": "the path of a notebook to execute with nbclient (string)",
    "kind": "batch (default) or notebook (a notebook server: allocation only, no command)",
    "name": "a label for you (string, at most 200 characters)",
    "gpus": "how many GPUs (whole number >= 1)",
    "gpu_fraction": "a share of one GPU, in (0, 1]; below 1 only with gpus = 1",
    "gpus_per_node": "the gang shape: GPUs on each node; must divide gpus",
    "tier": "1 (never pre-empted, within the queue's guarantee), 2 (default) or 3 (pre-emptible)",
    "queue": "the queue path, e.g. research/vision (default: your first queue)",
    "gpu_model": "a GPU model, or alternatives as a list or 'A100|H100'",
    "walltime": "the longest it runs: seconds or 30m, 2h, 1d",
    "cpus": "CPUs for the whole job (number >= 0)",
    "memory_gb": "memory for the whole job in GB (number >= 0)",
    "labels": "node labels that must match (object of strings)",
    "env": "environment variables for the job (object of strings)",
    "cwd": "working directory (absolute path)",
    "held": "submit on hold (true/false): it waits until released",
    "server_name": "kind notebook: the hub's name of the server ('' for the default server)",
}

# -- bounds: what one request may ask for -----------------------------------------------------
# The server enforces these (RequestError, 400, naming the field) and the OpenAPI document
# (service/openapi.py) declares the same numbers, so a schema-driven tool sends what we accept.
MAX_BODY_BYTES = 1 << 20  # the default of GPUSchedService.max_body_bytes: the whole body
MAX_NAME = 200  # 'name': characters
MAX_COMMAND = 65_536  # 'command': characters (a shell command line, not a script file)
MAX_PATH = 4096  # 'notebook' and 'cwd': characters (PATH_MAX)
MAX_QUEUE = 500  # 'queue': characters of a queue path
MAX_SERVER_NAME = 255  # 'server_name': characters, as JupyterHub allows
MAX_ENV_VARS = 256  # 'env': variables
MAX_ENV_NAME = 128  # 'env': characters of one name
MAX_ENV_BYTES = 65_536  # 'env': characters of all names and values together
MAX_LABELS = 32  # 'labels': entries
MAX_LABEL_KEY = 63  # 'labels': characters of a key (as Kubernetes label names)
MAX_LABEL_VALUE = 253  # 'labels': characters of a value
MAX_GPU_MODELS = 16  # 'gpu_model': alternatives
MAX_GPU_MODEL = 100  # 'gpu_model': characters of one model name
MIN_GPU_FRACTION = 0.01  # 'gpu_fraction': the smallest share of a GPU
MAX_WALLTIME = 365 * 86_400.0  # 'walltime': seconds (one year)
MAX_CPUS = 65_536.0  # 'cpus' for one job
MAX_MEMORY_GB = 1_048_576.0  # 'memory_gb' for one job (1 PB)
QUOTE = 80  # error messages quote at most this many characters of bad input


def quote(value) -> str:
    """``repr(value)``, cut to :data:`QUOTE` characters: an error never echoes a whole body."""
    text = repr(value)
    return text if len(text) <= QUOTE else text[: QUOTE - 3] + "..."


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESERVED_ENV = ("CUDA_VISIBLE_DEVICES", "GPUSCHED_")


class RequestError(ValueError):
    """A bad request: ``message`` says what to fix, ``field`` names the field (or None)."""

    def __init__(self, message: str, field: str | None = None, status: int = 400):
        super().__init__(message)
        self.message, self.field, self.status = message, field, status


@dataclass
class JobRequest:
    """A validated POST api/jobs body (defaults filled in by the service)."""

    gpus: int
    kind: str = "batch"
    command: str | None = None
    notebook: str | None = None
    name: str | None = None
    gpu_fraction: float = 1.0
    gpus_per_node: int | None = None
    tier: int | None = None
    queue: str | None = None
    gpu_models: frozenset[str] | None = None
    walltime: float | None = None
    cpus: float | None = None
    memory_gb: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    held: bool = False
    server_name: str | None = None


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def parse_body(body: bytes) -> dict:
    """The JSON object in ``body``, or RequestError. Strict JSON: no NaN or Infinity, no lone
    surrogates (``"\\ud800"``: not text, and no database could store it)."""
    try:
        data = json.loads(body or b"null", parse_constant=_no_constant)
        json.dumps(data, ensure_ascii=False).encode()
    except (ValueError, UnicodeError) as exc:
        raise RequestError(f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise RequestError("the body is not valid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise RequestError("the body must be a JSON object")
    return data


def parse_job_request(data: dict) -> JobRequest:
    if "user" in data:
        raise RequestError("the user is your hub identity; remove 'user' from the body", "user")
    for key in data:
        if key not in JOB_FIELDS:
            raise RequestError(
                f"unknown field {key!r}; known fields: {', '.join(JOB_FIELDS)}", str(key)[:100]
            )
    if "gpus" not in data:
        raise RequestError("'gpus' is required: " + JOB_FIELDS["gpus"], "gpus")
    request = JobRequest(gpus=_whole(data, "gpus", minimum=1))
    request.kind = _choice(data, "kind", ("batch", "notebook"), "batch")
    request.command = _text(data, "command")
    request.notebook = _text(data, "notebook")
    request.name = _text(data, "name", max_length=200)
    if request.kind == "batch" and (request.command is None) == (request.notebook is None):
        raise RequestError("a batch job needs exactly one of 'command' and 'notebook'", "command")
    if request.kind == "notebook" and (request.command or request.notebook):
        field_name = "command" if request.command else "notebook"
        raise RequestError("a notebook-server job has no command or notebook", field_name)
    if "gpu_fraction" in data:
        fraction = _number(data, "gpu_fraction")
        if not 0 < fraction <= 1 or (fraction < 1 and request.gpus != 1):
            raise RequestError(JOB_FIELDS["gpu_fraction"], "gpu_fraction")
        request.gpu_fraction = fraction
    if data.get("gpus_per_node") is not None:
        per_node = _whole(data, "gpus_per_node", minimum=1)
        if request.gpus % per_node:
            raise RequestError(
                f"'gpus_per_node' ({per_node}) must divide 'gpus' ({request.gpus})",
                "gpus_per_node",
            )
        request.gpus_per_node = per_node
    if data.get("tier") is not None:
        tier = _whole(data, "tier", minimum=1)
        if tier not in TIERS:
            raise RequestError(JOB_FIELDS["tier"], "tier")
        request.tier = tier
    request.queue = _text(data, "queue", max_length=500)
    request.gpu_models = _models(data.get("gpu_model"))
    if data.get("walltime") is not None:
        try:
            request.walltime = parse_duration(data["walltime"])
        except (ValueError, TypeError, OverflowError) as exc:
            raise RequestError(str(exc), "walltime") from None
        if request.walltime <= 0 or not math.isfinite(request.walltime):
            raise RequestError("'walltime' must be longer than 0", "walltime")
    for name in ("cpus", "memory_gb"):
        if data.get(name) is not None:
            setattr(request, name, _number(data, name))
    request.labels = _strings(data, "labels")
    request.env = _strings(data, "env")
    for name in request.env:
        if not _ENV_NAME.match(name):
            raise RequestError(f"environment variable name {name!r} is not valid", "env")
        if name.startswith(_RESERVED_ENV):
            raise RequestError(f"{name} is set by the scheduler; remove it from 'env'", "env")
    request.cwd = _text(data, "cwd", max_length=4096)
    if request.cwd is not None and not request.cwd.startswith("/"):
        raise RequestError("'cwd' must be an absolute path", "cwd")
    if data.get("server_name") is not None:
        server = data["server_name"]
        if request.kind != "notebook":
            raise RequestError(
                "'server_name' is for notebook servers (kind notebook)", "server_name"
            )
        if not isinstance(server, str) or len(server) > 255 or "\x00" in server:
            raise RequestError(
                "'server_name' must be a string of at most 255 characters", "server_name"
            )
        request.server_name = server
    if "held" in data:
        if not isinstance(data["held"], bool):
            raise RequestError("'held' must be true or false", "held")
        request.held = data["held"]
    return request


MAX_WHOLE = 2**31 - 1  # what an INTEGER column holds on every database


def _whole(data, name, minimum) -> int:
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_WHOLE:
        raise RequestError(
            f"'{name}' must be a whole number from {minimum} to {MAX_WHOLE}, got {value!r}", name
        )
    return value


def _number(data, name) -> float:
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"'{name}' must be a number, got {value!r}", name)
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float, e.g. 10**400
        number = math.inf
    if not 0 <= number < math.inf:
        raise RequestError(f"'{name}' must be a finite number >= 0, got {value!r}", name)
    return number


def _text(data, name, max_length=100_000) -> str | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise RequestError(f"'{name}' must be a non-empty string", name)
    if len(value) > max_length or "\x00" in value:
        raise RequestError(f"'{name}' must be at most {max_length} characters, no NUL", name)
    return value


def _choice(data, name, choices, default) -> str:
    value = data.get(name, default)
    if value not in choices:
        raise RequestError(f"'{name}' must be one of {', '.join(choices)}, got {value!r}", name)
    return value


def _strings(data, name) -> dict[str, str]:
    value = data.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and "\x00" not in k + v for k, v in value.items()
    ):
        raise RequestError(f"'{name}' must be an object of strings", name)
    return dict(value)


def _models(value) -> frozenset[str] | None:
    if value is None:
        return None
    names = value.split("|") if isinstance(value, str) else value
    if (
        not isinstance(names, list)
        or not names
        or not all(isinstance(n, str) and n.strip() for n in names)
    ):
        raise RequestError(JOB_FIELDS["gpu_model"], "gpu_model")
    return frozenset(n.strip() for n in names)
