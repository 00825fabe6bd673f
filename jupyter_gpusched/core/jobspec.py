"""The job specification: every field a job asks for, declared once, with what each surface
needs to know about it.

:class:`JobSpec` is what one job asks for (a validated POST api/jobs body, plus who submitted it
and an admin's priority). Each of its fields carries a :class:`Field` in its metadata: the help
line (the OpenAPI description, and the 400 messages that quote it), how the request parser reads
it and within which bounds, its database column, its trace column, who sets it and who sees it.
The surfaces are derived from these declarations at import, never from a list of their own:

- the request parser's field loop (``service/requests.py``), and the OpenAPI request schema
  (``service/openapi_requests.py``), from ``parse``, the bounds and ``help``;
- the ``jobs`` table's request columns (``service/models.py``), from ``column``;
- the rows and API views of a job (``service/records.py``, ``openapi_responses.py``), from
  ``column``, ``on_job`` and ``view``;
- the trace columns (``sim/trace.py``), from ``trace``;
- the engine's :class:`~.jobs.Job` (its request block is checked against this spec by
  ``tests/test_jobspec.py``; :meth:`.jobs.Job.from_spec` builds one).

A ``parse`` that is not one of the plain kinds (text, whole, number, choice, strings, boolean)
names a special case: the parser and the OpenAPI module each keep a small function under that
name. Adding a field is one declaration here plus a migration (``tests/test_store.py`` compares
the columns with the alembic head's).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

KINDS = ("batch", "notebook")
TIERS = (1, 2, 3)

# -- bounds: what one request may ask for ------------------------------------------------------
# The server enforces these (a 400 naming the field) and the OpenAPI document declares the same
# numbers, so a schema-driven tool sends what we accept.
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
MAX_DEADLINE = 2 * 365 * 86_400.0  # 'deadline': at most this long after submission (two years)
MAX_CPUS = 65_536.0  # 'cpus' for one job
MAX_MEMORY_GB = 1_048_576.0  # 'memory_gb' for one job (1 PB)
MAX_PROFILE = 200  # 'profile' (a hub profile's slug) of a notebook job and a monitor's report

NO_DEFAULT = object()  # a column without a default: a row must give it (or it is NULL)


@dataclass(frozen=True)
class Column:
    """A field's column in the ``jobs`` table. ``type``: integer, double, boolean, text, json,
    or string:N (VARCHAR(N)); ``default``: what a row that leaves it out stores."""

    type: str
    nullable: bool = True
    default: Any = NO_DEFAULT
    name: str | None = None  # when it is not the field's name


@dataclass(frozen=True)
class Field:
    """What the surfaces know of one :class:`JobSpec` field (see the module docstring)."""

    help: str | None = None  # the one-line help; None: not in a request body
    parse: str | None = None  # a plain kind or a special case's name (None: not parsed)
    wire: str | None = None  # its name in a request body or trace, when not the attribute's
    minimum: float | None = None
    maximum: float | None = None  # a number's bound, a text's length, a mapping's entries
    key_length: int | None = None  # a mapping's keys: characters
    value_length: int | None = None  # a mapping's values: characters
    choices: tuple | None = None
    null_is_absent: bool = True  # False: a null in the body is refused, not "not given"
    checks: tuple[str, ...] = ()  # cross-field checks run right after it (service/requests.py)
    column: Column | None = None
    trace: bool = False  # a column of the trace file (under its wire name)
    setter: str = "user"  # user (the request body) | admin (later) | engine (the service)
    on_job: bool = True  # an attribute of the engine's Job (else only the service keeps it)
    view: str | None = "public"  # in the API view: public, owner (own jobs/admins), or None


def declare(default: Any = None, **spec) -> Any:
    """A :class:`JobSpec` field with ``default`` (a dict: a fresh one each) and its
    :class:`Field` metadata."""
    factory = dataclasses.MISSING
    if isinstance(default, dict):
        default, factory = dataclasses.MISSING, dict
    return dataclasses.field(
        default=default, default_factory=factory, metadata={"spec": Field(**spec)}
    )


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """What one job asks for. The declaration order is the order the parser checks fields in
    (the first bad one is the 400), and the order of the known fields it lists."""

    gpus: int = declare(
        dataclasses.MISSING,
        help="how many GPUs (whole number >= 0; 0: a CPU-only job, which must ask for cpus or "
        "memory_gb)",
        parse="whole",
        minimum=0,
        null_is_absent=False,
        column=Column("integer", nullable=False),
        trace=True,
    )
    kind: str = declare(
        "batch",
        help="batch (default) or notebook (a notebook server: allocation only, no command)",
        parse="choice",
        choices=KINDS,
        null_is_absent=False,
        column=Column("string:16", nullable=False),
        trace=True,
    )
    command: str | None = declare(
        help=f"a shell command to run (string, at most {MAX_COMMAND} characters); exactly one of "
        "command and notebook",
        parse="text",
        maximum=MAX_COMMAND,
        column=Column("text"),
        on_job=False,
        view="owner",
    )
    notebook: str | None = declare(
        help=f"the path of a notebook to execute with nbclient (at most {MAX_PATH} characters)",
        parse="text",
        maximum=MAX_PATH,
        column=Column("text"),
        on_job=False,
        view="owner",
    )
    name: str | None = declare(
        help=f"a label for you (string, at most {MAX_NAME} characters)",
        parse="text",
        maximum=MAX_NAME,
        # after the three texts: a bad name is refused before a missing command
        checks=("command_or_notebook",),
        column=Column("text"),
        on_job=False,
        view="owner",
    )
    gpu_fraction: float = declare(
        1.0,
        help=f"a share of one GPU, from {MIN_GPU_FRACTION} to 1; below 1 only with gpus = 1",
        parse="gpu_fraction",
        minimum=MIN_GPU_FRACTION,
        maximum=1.0,
        null_is_absent=False,
        column=Column("double", nullable=False, default=1.0),
        trace=True,
    )
    gpus_per_node: int | None = declare(
        help="the gang shape: GPUs on each node; must divide gpus",
        parse="whole",
        minimum=1,
        checks=("divides_gpus",),
        column=Column("integer"),
        trace=True,
    )
    tier: int | None = declare(
        help="1 (never pre-empted, within the queue's guarantee), 2 (default) or 3 (pre-emptible)",
        parse="tier",
        choices=TIERS,
        column=Column("integer", nullable=False),
        trace=True,
    )
    queue: str | None = declare(
        help="the queue path, e.g. research/vision (default: your first queue)",
        parse="text",
        maximum=MAX_QUEUE,
        column=Column("string:255", nullable=False),
        trace=True,
    )
    gpu_models: frozenset[str] | None = declare(
        help=f"a GPU model, or up to {MAX_GPU_MODELS} alternatives as a list or 'A100|H100'",
        parse="gpu_model",
        wire="gpu_model",
        maximum=MAX_GPU_MODELS,
        value_length=MAX_GPU_MODEL,
        column=Column("json"),
        trace=True,
    )
    walltime: float | None = declare(
        help="the longest it runs: seconds or 30m, 2h, 1d; more than 0, at most a year",
        parse="walltime",
        maximum=MAX_WALLTIME,
        column=Column("double"),
        trace=True,
    )
    deadline: float | None = declare(
        help="when it must have finished: a time with its zone (2026-12-24T18:00:00Z) or a "
        "duration from submission (6h, 2d, seconds); later than submission + walltime",
        parse="deadline",
        maximum=MAX_DEADLINE,
        column=Column("double"),
        trace=True,  # in the trace, seconds from the trace start, like submit_time
    )
    cpus: float | None = declare(
        help=f"CPUs for the whole job (number from 0 to {MAX_CPUS:g})",
        parse="number",
        maximum=MAX_CPUS,
        column=Column("double"),
        trace=True,
        view="owner",
    )
    memory_gb: float | None = declare(
        help=f"memory for the whole job in GB (number from 0 to {MAX_MEMORY_GB:g})",
        parse="number",
        maximum=MAX_MEMORY_GB,
        column=Column("double"),
        trace=True,
        view="owner",
    )
    labels: dict[str, str] = declare(  # noqa: RUF009 (a dataclasses.field, a fresh dict each)
        {},
        help=f"node labels that must match (object of at most {MAX_LABELS} strings)",
        parse="strings",
        maximum=MAX_LABELS,
        key_length=MAX_LABEL_KEY,
        value_length=MAX_LABEL_VALUE,
        column=Column("json", nullable=False, default=dict),
        view=None,  # not shown: the placement says where it ran
    )
    env: dict[str, str] = declare(  # noqa: RUF009 (as labels)
        {},
        help=f"environment variables for the job (object of at most {MAX_ENV_VARS} strings, "
        f"{MAX_ENV_BYTES} characters in all)",
        parse="strings",
        maximum=MAX_ENV_VARS,
        key_length=MAX_ENV_NAME,
        value_length=MAX_ENV_BYTES,
        checks=("env_names",),
        column=Column("json", nullable=False, default=dict),
        on_job=False,
        view="owner",
    )
    cwd: str | None = declare(
        help=f"working directory: an absolute path of at most {MAX_PATH} characters that you may "
        "enter (default: your home directory)",
        parse="text",
        maximum=MAX_PATH,
        checks=("absolute_cwd",),
        column=Column("text"),
        on_job=False,
        view="owner",
    )
    server_name: str | None = declare(
        help="kind notebook: the hub's name of the server ('' for the default server)",
        parse="server_name",
        maximum=MAX_SERVER_NAME,
        column=Column("string:255"),
        on_job=False,
        view="owner",
    )
    profile: str | None = declare(
        help="kind notebook: the slug of the hub profile the server starts with",
        parse="profile",
        maximum=MAX_PROFILE,
        column=Column("string:255"),
        on_job=False,
        view="owner",
    )
    held: bool = declare(
        False,
        help="submit on hold (true/false): it waits until released",
        parse="boolean",
        null_is_absent=False,
        column=Column("boolean", nullable=False, default=False),
        setter="admin",  # and the user, at submission
    )
    user: str | None = declare(
        column=Column("string:255", nullable=False), trace=True, setter="engine", view="owner"
    )
    priority: int = declare(0, column=Column("integer", nullable=False, default=0), setter="admin")
    # A job of an array (core/arrays.py; POST api/jobs with "array"): the array's id, this
    # element's index, and the most elements of the array that may run at once (None: no cap).
    # Set by the service from the request's "array", never a field of the body itself; trace
    # columns, so that a replay keeps an array's cap as the live service does.
    array_id: str | None = declare(column=Column("string:64"), setter="engine", trace=True)
    array_index: int | None = declare(column=Column("integer"), setter="engine", trace=True)
    array_max_running: int | None = declare(column=Column("integer"), setter="engine", trace=True)


@dataclass(frozen=True)
class SpecField:
    """One declared field: its attribute ``name``, its ``wire`` name (request body, trace,
    API view), its Python default, and its :class:`Field` metadata as ``spec``."""

    name: str
    wire: str
    default: Any
    spec: Field

    def default_value(self) -> Any:
        """The default, a fresh one where it is a mapping (no two jobs share one)."""
        return dict(self.default) if isinstance(self.default, dict) else self.default

    @property
    def column_name(self) -> str:
        column = self.spec.column
        return (column.name if column and column.name else None) or self.name


def spec_fields(spec_class: type = JobSpec) -> tuple[SpecField, ...]:
    """The declared fields of ``spec_class`` (a JobSpec, or a throwaway spec in a test), in
    declaration order."""
    fields = []
    for item in dataclasses.fields(spec_class):
        meta: Field = item.metadata["spec"]
        default = item.default
        if item.default_factory is not dataclasses.MISSING:
            default = item.default_factory()
        fields.append(SpecField(item.name, meta.wire or item.name, default, meta))
    return tuple(fields)


FIELDS = spec_fields()
REQUEST_FIELDS = tuple(f for f in FIELDS if f.spec.help is not None)  # in a POST api/jobs body
TRACE_FIELDS = tuple(f for f in FIELDS if f.spec.trace)
JOB_ATTRIBUTES = tuple(f.name for f in FIELDS if f.spec.on_job)  # kept on the engine's Job
