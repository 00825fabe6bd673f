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
MAX_DURATION_TEXT = 64  # 'walltime' as text ('1h30m'): characters
MAX_LIST_LIMIT = 100_000  # '?limit' of api/queue and api/jobs (and '?offset' stays a whole number)
MAX_EVENTS_LIMIT = 10_000  # '?limit' of api/events
MAX_LOG_BYTES = 1 << 20  # '?bytes' of api/jobs/{id}/log: the most one request returns
MAX_SAMPLE_DEVICES = 64  # POST api/usage-samples: 'devices' entries
MAX_SAMPLE_KERNELS = 1000  # POST api/usage-samples: 'kernels' entries
MAX_PROFILE = 200  # 'profile' (a hub profile's slug) of a notebook job and a monitor's report
MAX_BACKEND = 40  # POST api/usage-samples: characters of 'backend'
MAX_TELEMETRY_ERROR = 1000  # POST api/usage-samples: characters of 'telemetry_error'
MAX_REAPER_LIST = 1000  # PUT api/reaper: names in each exempt_* list, and profile_timeouts
MAX_DOCUMENT_ITEMS = 10_000  # PUT api/quotas: JSON values in the document (1000 queues or so)
MAX_DOCUMENT_DEPTH = 32  # PUT api/quotas: nesting of the document (a queue tree ~15 deep)
MAX_DOCUMENT_TEXT = 500  # PUT api/quotas, PUT api/reaper: characters of any key or string


# The fields of POST api/jobs, with what each must be (used in messages and in the OpenAPI doc).
JOB_FIELDS = {
    "command": f"a shell command to run (string, at most {MAX_COMMAND} characters); exactly one of "
    "command and notebook",
    "notebook": f"the path of a notebook to execute with nbclient (at most {MAX_PATH} characters)",
    "kind": "batch (default) or notebook (a notebook server: allocation only, no command)",
    "name": f"a label for you (string, at most {MAX_NAME} characters)",
    "gpus": "how many GPUs (whole number >= 0; 0: a CPU-only job, which must ask for cpus or "
    "memory_gb)",
    "gpu_fraction": f"a share of one GPU, from {MIN_GPU_FRACTION} to 1; below 1 only with gpus = 1",
    "gpus_per_node": "the gang shape: GPUs on each node; must divide gpus",
    "tier": "1 (never pre-empted, within the queue's guarantee), 2 (default) or 3 (pre-emptible)",
    "queue": "the queue path, e.g. research/vision (default: your first queue)",
    "gpu_model": f"a GPU model, or up to {MAX_GPU_MODELS} alternatives as a list or 'A100|H100'",
    "walltime": "the longest it runs: seconds or 30m, 2h, 1d; more than 0, at most a year",
    "cpus": f"CPUs for the whole job (number from 0 to {MAX_CPUS:g})",
    "memory_gb": f"memory for the whole job in GB (number from 0 to {MAX_MEMORY_GB:g})",
    "labels": f"node labels that must match (object of at most {MAX_LABELS} strings)",
    "env": f"environment variables for the job (object of at most {MAX_ENV_VARS} strings, "
    f"{MAX_ENV_BYTES} characters in all)",
    "cwd": f"working directory: an absolute path of at most {MAX_PATH} characters that you may "
    "enter (default: your home directory)",
    "held": "submit on hold (true/false): it waits until released",
    "server_name": "kind notebook: the hub's name of the server ('' for the default server)",
    "profile": "kind notebook: the slug of the hub profile the server starts with",
}


def quote(value) -> str:
    """``repr(value)``, cut to :data:`QUOTE` characters: an error never echoes a whole body."""
    if isinstance(value, str) and len(value) > QUOTE:
        value = value[:QUOTE]  # no repr of a megabyte to keep 80 characters of it
    text = repr(value)
    return text if len(text) <= QUOTE else text[: QUOTE - 3] + "..."


ENV_NAME = "^[A-Za-z_][A-Za-z0-9_]*$"  # an env name, as the OpenAPI document declares it
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # the same, with fullmatch: no "A\n"
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
    profile: str | None = None  # kind notebook: the hub profile (the reaper's timeout)


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
    """The job ``data`` asks for, every field within its bound; RequestError names the first
    field that is not (its message quotes at most :data:`QUOTE` characters of it)."""
    if "user" in data:
        raise RequestError("the user is your hub identity; remove 'user' from the body", "user")
    for key in data:
        if key not in JOB_FIELDS:
            raise RequestError(
                f"unknown field {quote(key)}; known fields: {', '.join(JOB_FIELDS)}",
                str(key)[:QUOTE],
            )
    if "gpus" not in data:
        raise RequestError("'gpus' is required: " + JOB_FIELDS["gpus"], "gpus")
    request = JobRequest(gpus=_whole(data, "gpus", minimum=0))
    request.kind = _choice(data, "kind", ("batch", "notebook"), "batch")
    request.command = _text(data, "command", MAX_COMMAND)
    request.notebook = _text(data, "notebook", MAX_PATH)
    request.name = _text(data, "name", MAX_NAME)
    if request.kind == "batch" and (request.command is None) == (request.notebook is None):
        raise RequestError("a batch job needs exactly one of 'command' and 'notebook'", "command")
    if request.kind == "notebook" and (request.command or request.notebook):
        field_name = "command" if request.command else "notebook"
        raise RequestError("a notebook-server job has no command or notebook", field_name)
    if "gpu_fraction" in data:
        fraction = _number(data, "gpu_fraction", 1.0)
        if fraction < MIN_GPU_FRACTION or (fraction < 1 and request.gpus != 1):
            raise RequestError(
                f"'gpu_fraction' must be from {MIN_GPU_FRACTION} to 1, and below 1 only with "
                f"gpus = 1; got {quote(data['gpu_fraction'])} with gpus = {request.gpus}",
                "gpu_fraction",
            )
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
    request.queue = _text(data, "queue", MAX_QUEUE)
    request.gpu_models = _models(data.get("gpu_model"))
    if data.get("walltime") is not None:
        request.walltime = _walltime(data["walltime"])
    request.cpus = _number(data, "cpus", MAX_CPUS) if data.get("cpus") is not None else None
    if data.get("memory_gb") is not None:
        request.memory_gb = _number(data, "memory_gb", MAX_MEMORY_GB)
    request.labels = _strings(data, "labels", MAX_LABELS, MAX_LABEL_KEY, MAX_LABEL_VALUE)
    request.env = _strings(data, "env", MAX_ENV_VARS, MAX_ENV_NAME, MAX_ENV_BYTES)
    size = sum(len(name) + len(value) for name, value in request.env.items())
    if size > MAX_ENV_BYTES:
        raise RequestError(
            f"'env' holds {size} characters of names and values; at most {MAX_ENV_BYTES}", "env"
        )
    for name in request.env:
        if not _ENV_NAME.fullmatch(name):
            raise RequestError(f"environment variable name {quote(name)} is not valid", "env")
        if name.startswith(_RESERVED_ENV):
            raise RequestError(f"{name} is set by the scheduler; remove it from 'env'", "env")
    request.cwd = _text(data, "cwd", MAX_PATH)
    if request.cwd is not None and not request.cwd.startswith("/"):
        raise RequestError("'cwd' must be an absolute path", "cwd")
    if data.get("server_name") is not None:
        server = data["server_name"]
        if request.kind != "notebook":
            raise RequestError(
                "'server_name' is for notebook servers (kind notebook)", "server_name"
            )
        if not isinstance(server, str) or len(server) > MAX_SERVER_NAME or "\x00" in server:
            raise RequestError(
                f"'server_name' must be a string of at most {MAX_SERVER_NAME} characters",
                "server_name",
            )
        request.server_name = server
    if data.get("profile") is not None:
        if request.kind != "notebook":
            raise RequestError("'profile' is for notebook servers (kind notebook)", "profile")
        request.profile = _text(data, "profile", MAX_PROFILE)
    if "held" in data:
        if not isinstance(data["held"], bool):
            raise RequestError("'held' must be true or false", "held")
        request.held = data["held"]
    return request


MAX_WHOLE = 2**31 - 1  # what an INTEGER column holds on every database


def whole_number(value):
    """``value`` as an int if it is a whole number (JSON Schema's integer: ``2.0`` is one, as
    api/openapi.json says), else unchanged."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _whole(data, name, minimum) -> int:
    value = whole_number(data[name])
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_WHOLE:
        raise RequestError(
            f"'{name}' must be a whole number from {minimum} to {MAX_WHOLE}, got {quote(value)}",
            name,
        )
    return value


def _number(data, name, maximum: float) -> float:
    """A number from 0 to ``maximum``."""
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"'{name}' must be a number, got {quote(value)}", name)
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float, e.g. 10**400
        number = math.inf
    if not 0 <= number <= maximum:
        raise RequestError(
            f"'{name}' must be a number from 0 to {maximum:g}, got {quote(value)}", name
        )
    return number


def _walltime(value) -> float:
    """Seconds in (0, MAX_WALLTIME], from a number or a duration text."""
    if isinstance(value, str) and len(value) > MAX_DURATION_TEXT:
        raise RequestError(
            f"'walltime' must be at most {MAX_DURATION_TEXT} characters, got {quote(value)}",
            "walltime",
        )
    try:
        seconds = parse_duration(value)
    except (ValueError, TypeError, OverflowError):
        seconds = math.nan
    if not 0 < seconds <= MAX_WALLTIME:  # NaN too
        raise RequestError(
            f"'walltime' must be seconds or a duration (30m, 2h, 1d) longer than 0 and at most "
            f"{MAX_WALLTIME:g} s (one year), got {quote(value)}",
            "walltime",
        )
    return seconds


def _text(data, name, max_length: int) -> str | None:
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise RequestError(f"'{name}' must be a non-empty string, got {quote(value)}", name)
    if len(value) > max_length or "\x00" in value:
        raise RequestError(
            f"'{name}' must be at most {max_length} characters, no NUL; got {len(value)} "
            f"starting {quote(value)}",
            name,
        )
    return value


def _choice(data, name, choices, default) -> str:
    value = data.get(name, default)
    if not isinstance(value, str) or value not in choices:
        raise RequestError(
            f"'{name}' must be one of {', '.join(choices)}, got {quote(value)}", name
        )
    return value


def _strings(data, name, max_entries: int, max_key: int, max_value: int) -> dict[str, str]:
    """An object of at most ``max_entries`` strings, keys of at most ``max_key`` and values of
    at most ``max_value`` characters."""
    value = data.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError(f"'{name}' must be an object of strings, got {quote(value)}", name)
    if len(value) > max_entries:
        raise RequestError(f"'{name}' has {len(value)} entries; at most {max_entries}", name)
    for key, item in value.items():
        if not isinstance(item, str) or "\x00" in key + item:
            raise RequestError(
                f"'{name}' must be an object of strings (no NUL); {quote(key)} is {quote(item)}",
                name,
            )
        if len(key) > max_key or len(item) > max_value:
            raise RequestError(
                f"'{name}': keys have at most {max_key} and values at most {max_value} "
                f"characters; {quote(key)} has {len(key)} and its value {len(item)}",
                name,
            )
    return dict(value)


def _models(value) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, str) and len(value) > MAX_GPU_MODELS * (MAX_GPU_MODEL + 1):
        raise RequestError(
            f"'gpu_model' is {len(value)} characters; at most {MAX_GPU_MODELS} models of "
            f"{MAX_GPU_MODEL} characters each",
            "gpu_model",
        )
    names = value.split("|") if isinstance(value, str) else value
    if (
        not isinstance(names, list)
        or not names
        or not all(isinstance(n, str) and n.strip() and "\x00" not in n for n in names)
    ):
        raise RequestError(f"{JOB_FIELDS['gpu_model']}; got {quote(value)}", "gpu_model")
    if len(names) > MAX_GPU_MODELS or any(len(n) > MAX_GPU_MODEL for n in names):
        raise RequestError(
            f"'gpu_model': at most {MAX_GPU_MODELS} models of at most {MAX_GPU_MODEL} "
            f"characters each; got {quote(value)}",
            "gpu_model",
        )
    return frozenset(n.strip() for n in names)


# -- the other bodies ------------------------------------------------------------------------
def check_document(document, what: str) -> None:
    """RequestError unless the JSON ``document`` (PUT api/quotas) holds at most
    :data:`MAX_DOCUMENT_ITEMS` values, nested at most :data:`MAX_DOCUMENT_DEPTH` deep, with keys
    and strings of at most :data:`MAX_DOCUMENT_TEXT` characters: checked before it is parsed
    into queues, so that no document costs more than a large real one."""
    items, stack = 0, [(document, 1)]
    while stack:
        value, depth = stack.pop()
        items += 1
        if items > MAX_DOCUMENT_ITEMS:
            raise RequestError(f"{what} has more than {MAX_DOCUMENT_ITEMS} values", None)
        if depth > MAX_DOCUMENT_DEPTH:
            raise RequestError(f"{what} is nested more than {MAX_DOCUMENT_DEPTH} deep", None)
        if isinstance(value, dict):
            for key, item in value.items():
                _short_text(key, what)
                stack.append((item, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, str):
            _short_text(value, what)


def _short_text(text: str, what: str) -> None:
    if len(text) > MAX_DOCUMENT_TEXT:
        raise RequestError(
            f"{what}: keys and strings have at most {MAX_DOCUMENT_TEXT} characters; "
            f"{quote(text)} has {len(text)}",
            None,
        )


def check_reaper_changes(changes) -> None:
    """RequestError unless the PUT api/reaper body is small: each exempt_* list and
    profile_timeouts at most :data:`MAX_REAPER_LIST` entries, names of at most
    :data:`MAX_DOCUMENT_TEXT` characters (the settings are stored and audited whole)."""
    if not isinstance(changes, dict):
        return  # the reaper's own validation says what it must be
    for name, value in changes.items():
        if isinstance(value, (list, dict)):
            if len(value) > MAX_REAPER_LIST:
                raise RequestError(
                    f"'{name}' has {len(value)} entries; at most {MAX_REAPER_LIST}", name
                )
            for item in value:
                if isinstance(item, str) and len(item) > MAX_DOCUMENT_TEXT:
                    raise RequestError(
                        f"'{name}': names have at most {MAX_DOCUMENT_TEXT} characters; "
                        f"{quote(item)} has {len(item)}",
                        name,
                    )


def check_usage_report(report: dict) -> None:
    """RequestError unless a monitor's report (POST api/usage-samples) is within bounds: at most
    :data:`MAX_SAMPLE_DEVICES` devices and :data:`MAX_SAMPLE_KERNELS` kernels, a profile of at
    most :data:`MAX_PROFILE` characters, ``server``, ``kernels`` and each device objects,
    ``backend`` and ``telemetry_error`` short strings (or null)."""
    devices, kernels = report.get("devices"), report.get("kernels")
    if devices is not None and (not isinstance(devices, list) or len(devices) > MAX_SAMPLE_DEVICES):
        raise RequestError(f"'devices' must be a list of at most {MAX_SAMPLE_DEVICES}", "devices")
    if kernels is not None and (not isinstance(kernels, dict) or len(kernels) > MAX_SAMPLE_KERNELS):
        raise RequestError(
            f"'kernels' must be an object of at most {MAX_SAMPLE_KERNELS} kernels", "kernels"
        )
    if report.get("server") is not None and not isinstance(report["server"], dict):
        raise RequestError("'server' must be an object", "server")
    for name, longest in (("backend", MAX_BACKEND), ("telemetry_error", MAX_TELEMETRY_ERROR)):
        value = report.get(name)
        if value is not None and (not isinstance(value, str) or len(value) > longest):
            raise RequestError(f"'{name}' must be a string of at most {longest} characters", name)
    profile = report.get("profile")
    if profile is not None and (not isinstance(profile, str) or len(profile) > MAX_PROFILE):
        raise RequestError(
            f"'profile' must be a string of at most {MAX_PROFILE} characters", "profile"
        )
