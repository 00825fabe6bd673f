"""Turning a JSON request body into a job, with a 400 that names the field for anything wrong.

The submitting user never comes from the body: it is the hub identity of the caller.
"""

from __future__ import annotations

import functools
import json
import re

from ..core.arrays import parse_array
from ..core.errors import ConfigError

# The job's bounds are declared with its spec (core/jobspec.py); the service, its tests and tools
# have always found them here, with the value readers' names (noqa: re-exported).
from ..core.jobspec import (
    MAX_COMMAND,  # noqa: F401
    MAX_CPUS,  # noqa: F401
    MAX_ENV_BYTES,
    MAX_ENV_NAME,  # noqa: F401
    MAX_ENV_VARS,  # noqa: F401
    MAX_GPU_MODEL,  # noqa: F401
    MAX_GPU_MODELS,  # noqa: F401
    MAX_LABEL_KEY,  # noqa: F401
    MAX_LABEL_VALUE,  # noqa: F401
    MAX_LABELS,  # noqa: F401
    MAX_MEMORY_GB,  # noqa: F401
    MAX_NAME,  # noqa: F401
    MAX_PATH,  # noqa: F401
    MAX_PROFILE,
    MAX_QUEUE,  # noqa: F401
    MAX_SERVER_NAME,
    MAX_WALLTIME,  # noqa: F401
    MIN_GPU_FRACTION,
    REQUEST_FIELDS,
    JobSpec,
    SpecField,
    spec_fields,
)
from .request_values import (
    MAX_DURATION_TEXT,  # noqa: F401
    MAX_WHOLE,  # noqa: F401
    QUOTE,
    RequestError,
    quote,
    read_choice,
    read_deadline,
    read_models,
    read_number,
    read_strings,
    read_text,
    read_walltime,
    read_whole,
    whole_number,  # noqa: F401
)

# -- bounds: what one request may ask for -----------------------------------------------------
# The server enforces these (RequestError, 400, naming the field) and the OpenAPI document
# (service/openapi.py) declares the same numbers, so a schema-driven tool sends what we accept.
# A job's own fields are bounded in core/jobspec.py; these bound the bodies and queries.
MAX_BODY_BYTES = 1 << 20  # the default of GPUSchedService.max_body_bytes: the whole body
MAX_LIST_LIMIT = 100_000  # '?limit' of api/queue and api/jobs (and '?offset' stays a whole number)
MAX_EVENTS_LIMIT = 10_000  # '?limit' of api/events
MAX_LOG_BYTES = 1 << 20  # '?bytes' of api/jobs/{id}/log: the most one request returns
MAX_SAMPLE_DEVICES = 64  # POST api/usage-samples: 'devices' entries
MAX_SAMPLE_KERNELS = 1000  # POST api/usage-samples: 'kernels' entries
MAX_BACKEND = 40  # POST api/usage-samples: characters of 'backend'
MAX_TELEMETRY_ERROR = 1000  # POST api/usage-samples: characters of 'telemetry_error'
MAX_REAPER_LIST = 1000  # PUT api/reaper: names in each exempt_* list, and profile_timeouts
MAX_DOCUMENT_ITEMS = 10_000  # PUT api/quotas: JSON values in the document (1000 queues or so)
MAX_DOCUMENT_DEPTH = 32  # PUT api/quotas: nesting of the document (a queue tree ~15 deep)
MAX_DOCUMENT_TEXT = 500  # PUT api/quotas, PUT api/reaper: characters of any key or string


# The fields of POST api/jobs, with what each must be (used in messages and in the OpenAPI doc).
JOB_FIELDS = {f.wire: f.spec.help for f in REQUEST_FIELDS}


ENV_NAME = "^[A-Za-z_][A-Za-z0-9_]*$"  # an env name, as the OpenAPI document declares it
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # the same, with fullmatch: no "A\n"
_RESERVED_ENV = ("CUDA_VISIBLE_DEVICES", "GPUSCHED_")


JobRequest = JobSpec  # a validated POST api/jobs body (queue, tier, user filled in by the service)


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _no_repeats(pairs: list) -> dict:
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"{key!r} is given twice: keep one")
        seen[key] = value
    return seen


def parse_body(body: bytes) -> dict:
    """The JSON object in ``body``, or RequestError. Strict JSON: no NaN or Infinity, no lone
    surrogates (``"\\ud800"``: not text, and no database could store it), no key given twice
    in an object (which one counts would be a guess)."""
    try:
        data = json.loads(
            body or b"null", parse_constant=_no_constant, object_pairs_hook=_no_repeats
        )
        json.dumps(data, ensure_ascii=False).encode()
    except (ValueError, UnicodeError) as exc:
        raise RequestError(f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise RequestError("the body is not valid JSON: nested too deeply") from None
    if not isinstance(data, dict):
        raise RequestError("the body must be a JSON object")
    return data


def parse_job_request(data: dict, spec_class: type = JobSpec):
    """The job ``data`` asks for, every field within its bound; RequestError names the first
    field that is not (its message quotes at most :data:`QUOTE` characters of it). The fields
    are checked in the spec's order, each by the parser its ``parse`` names, then by its
    ``checks`` (the cross-field rules, with what has been read so far). ``spec_class``: the
    spec the body is read as (another than JobSpec in tests only)."""
    fields = request_fields(spec_class)
    known = [f.wire for f in fields]
    if "user" in data:
        raise RequestError("the user is your hub identity; remove 'user' from the body", "user")
    for key in data:
        if key not in known:
            raise RequestError(
                f"unknown field {quote(key)}; known fields: {', '.join(known)}",
                str(key)[:QUOTE],
            )
    if "gpus" not in data:
        raise RequestError("'gpus' is required: " + JOB_FIELDS["gpus"], "gpus")
    values: dict = {}
    for spec_field in fields:
        given = spec_field.wire in data
        if spec_field.spec.null_is_absent:
            given = data.get(spec_field.wire) is not None
        if given:
            values[spec_field.name] = _PARSERS[spec_field.spec.parse](data, spec_field, values)
        else:
            values[spec_field.name] = spec_field.default_value()
        for check in spec_field.spec.checks:
            _CHECKS[check](values)
    return spec_class(**values)


@functools.cache
def request_fields(spec_class: type) -> tuple[SpecField, ...]:
    """The fields of a request body read as ``spec_class``."""
    if spec_class is JobSpec:
        return REQUEST_FIELDS
    return tuple(f for f in spec_fields(spec_class) if f.spec.help is not None)


def _plain(parse):
    """A parser of a plain kind, from the field's declared bounds."""
    return lambda data, f, values: parse(data, f)


_PARSERS = {
    "text": _plain(lambda data, f: read_text(data, f.wire, f.spec.maximum)),
    "whole": _plain(lambda data, f: read_whole(data, f.wire, minimum=f.spec.minimum)),
    "number": _plain(lambda data, f: read_number(data, f.wire, f.spec.maximum)),
    "choice": _plain(lambda data, f: read_choice(data, f.wire, f.spec.choices, f.default)),
    "strings": _plain(
        lambda data, f: read_strings(
            data, f.wire, f.spec.maximum, f.spec.key_length, f.spec.value_length
        )
    ),
    "boolean": _plain(lambda data, f: _boolean(data, f.wire)),
    "gpu_model": _plain(lambda data, f: read_models(data.get(f.wire))),
    "walltime": _plain(lambda data, f: read_walltime(data[f.wire])),
    "deadline": _plain(lambda data, f: read_deadline(data[f.wire], latest=f.spec.maximum)),
}


def _parser(function):
    """A special case's parser, under the name a spec field's ``parse`` gives."""
    _PARSERS[function.__name__.lstrip("_")] = function
    return function


def _check(function):
    """A cross-field check, under the name a spec field's ``checks`` lists."""
    _CHECKS[function.__name__.lstrip("_")] = function
    return function


_CHECKS: dict = {}


@_parser
def _gpu_fraction(data, f: SpecField, values) -> float:
    fraction = read_number(data, f.wire, 1.0)
    if fraction < MIN_GPU_FRACTION or (fraction < 1 and values["gpus"] != 1):
        raise RequestError(
            f"'gpu_fraction' must be from {MIN_GPU_FRACTION} to 1, and below 1 only with "
            f"gpus = 1; got {quote(data['gpu_fraction'])} with gpus = {values['gpus']}",
            "gpu_fraction",
        )
    return fraction


@_parser
def _tier(data, f: SpecField, values) -> int:
    tier = read_whole(data, "tier", minimum=1)
    if tier not in f.spec.choices:
        raise RequestError(f"'tier' must be {JOB_FIELDS['tier']}; got {quote(tier)}", "tier")
    return tier


@_parser
def _server_name(data, f: SpecField, values) -> str:
    server = data["server_name"]
    if values["kind"] != "notebook":
        raise RequestError("'server_name' is for notebook servers (kind notebook)", "server_name")
    if not isinstance(server, str) or len(server) > MAX_SERVER_NAME or "\x00" in server:
        raise RequestError(
            f"'server_name' must be a string of at most {MAX_SERVER_NAME} characters",
            "server_name",
        )
    return server


@_parser
def _profile(data, f: SpecField, values) -> str | None:
    if values["kind"] != "notebook":
        raise RequestError("'profile' is for notebook servers (kind notebook)", "profile")
    return read_text(data, "profile", MAX_PROFILE)


@_check
def _command_or_notebook(values) -> None:
    kind, command, notebook = values["kind"], values["command"], values["notebook"]
    if kind == "batch" and (command is None) == (notebook is None):
        raise RequestError("a batch job needs exactly one of 'command' and 'notebook'", "command")
    if kind == "notebook" and (command or notebook):
        field_name = "command" if command else "notebook"
        raise RequestError("a notebook-server job has no command or notebook", field_name)


@_check
def _divides_gpus(values) -> None:
    per_node = values["gpus_per_node"]
    if per_node is not None and values["gpus"] % per_node:
        raise RequestError(
            f"'gpus_per_node' ({per_node}) must divide 'gpus' ({values['gpus']})",
            "gpus_per_node",
        )


@_check
def _env_names(values) -> None:
    env = values["env"]
    size = sum(len(name) + len(value) for name, value in env.items())
    if size > MAX_ENV_BYTES:
        raise RequestError(
            f"'env' holds {size} characters of names and values; at most {MAX_ENV_BYTES}", "env"
        )
    for name in env:
        if not _ENV_NAME.fullmatch(name):
            raise RequestError(f"environment variable name {quote(name)} is not valid", "env")
        if name.startswith(_RESERVED_ENV):
            raise RequestError(f"{name} is set by the scheduler; remove it from 'env'", "env")


@_check
def _absolute_cwd(values) -> None:
    cwd = values["cwd"]
    if cwd is not None and not cwd.startswith("/"):
        raise RequestError("'cwd' must be an absolute path", "cwd")


def _boolean(data, name) -> bool:
    if not isinstance(data[name], bool):
        raise RequestError(f"'{name}' must be true or false", name)
    return data[name]


def take_array(data: dict):
    """The job array a POST api/jobs body asks for with ``"array": "0-99%8"`` (core/arrays.py),
    taken out of ``data`` (the rest is one job's fields); None without one (or with null).
    RequestError naming ``array`` for a bad one, and for an array of notebook servers."""
    text = data.pop("array", None)
    if text is None:
        return None
    try:
        array = parse_array(text)
    except ConfigError as exc:
        raise RequestError(exc.message, "array") from None
    if data.get("kind") == "notebook":
        raise RequestError("'array' is for batch jobs, not notebook servers", "array")
    return array


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
