"""A Python client of the scheduler service, for notebooks and scripts.

Inside a single-user server started by :class:`~jupyter_gpusched.hub.spawner.GPUSchedSpawner` it
needs no setup: the spawner sets ``GPUSCHED_SERVICE_URL`` and ``GPUSCHED_SERVICE_TOKEN``. Elsewhere
give the URL and a token (``Client(url, token)``, or those environment variables)::

    from jupyter_gpusched import client
    job = client.submit(command="python train.py", gpus=2, walltime="2h")
    client.submit(command="python eval.py", walltime="1h", deadline="6h")   # done within 6 h
    job.logs(follow=True)       # prints the output as it comes, until the job ends
    job.wait()                  # -> "completed"
    client.estimate(command="python train.py", gpus=8)   # -> about 25 min (at 14:05 UTC)

    job = client.submit(function=train, args=(config,), gpus=1)
    model_path = job.result()   # waits, then the function's return value

Errors from the service raise :class:`GPUSchedError` with the service's message and field.
See ``docs/notebook.md`` for what a ``function=`` job captures. This module holds the
:class:`Client` (the HTTP conversation, submitting) and the module-level shortcuts; a submitted
:class:`Job` and its displays are in :mod:`.job`, the errors in :mod:`.errors` (both importable
from here, as before).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

import requests

from . import payloads
from .environment import JobEnvironment
from .errors import GPUSchedError, JobFailedError
from .estimate import Estimate
from .job import Job, JobArray

__all__ = [
    "Client",
    "Estimate",
    "GPUSchedError",
    "Job",
    "JobArray",
    "JobFailedError",
    "cluster",
    "estimate",
    "jobs",
    "queue",
    "submit",
]


class Client:
    """Talks to the scheduler service as one user.

    ``url``: the service's base URL (default ``$GPUSCHED_SERVICE_URL``); ``token``: an API token
    of the user (default ``$GPUSCHED_SERVICE_TOKEN``, then ``$JUPYTERHUB_API_TOKEN``).
    """

    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0):
        env = JobEnvironment.read()
        url, token = url or env.service_url, token or env.token
        missing = [name for name, value in (("url", url), ("token", token)) if not value]
        if missing:
            raise GPUSchedError(
                "no scheduler service "
                + " and ".join(missing)
                + ": outside a single-user server started by the GPU scheduler, pass "
                "Client(url=..., token=...) or set GPUSCHED_SERVICE_URL and "
                "GPUSCHED_SERVICE_TOKEN",
                missing[0],
            )
        self.url = url if url.endswith("/") else url + "/"
        self.token = token
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"token {token}"

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # -- HTTP ----------------------------------------------------------------------------------
    def request(self, method: str, path: str, body=None, params=None) -> Any:
        """The decoded JSON (or text) of a 2xx response; GPUSchedError otherwise."""
        url = self.url + path.lstrip("/")
        try:
            response = self.session.request(
                method, url, json=body, params=params, timeout=self.timeout
            )
        except requests.RequestException as exc:
            raise GPUSchedError(
                f"cannot reach the scheduler service at {self.url}: {exc}"
            ) from None
        is_json = response.headers.get("Content-Type", "").startswith("application/json")
        if response.status_code >= 400:
            message, field = response.text.strip() or response.reason, None
            if is_json:
                try:
                    data = response.json()
                    message, field = data.get("error") or message, data.get("field")
                except ValueError:
                    pass
            raise GPUSchedError(message, field, response.status_code)
        return response.json() if is_json else response.text

    # -- the API -------------------------------------------------------------------------------
    def submit(
        self,
        command: str | None = None,
        *,
        notebook: str | None = None,
        function: Callable | None = None,
        args: tuple = (),
        kwargs: dict | None = None,
        gpus: int = 1,
        tier: int | None = None,
        queue: str | None = None,
        gpu_model: str | list[str] | None = None,
        walltime: str | float | None = None,
        deadline: datetime | timedelta | str | float | None = None,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
        name: str | None = None,
        array: str | Iterable[int] | None = None,
        max_running: int | None = None,
        **more,
    ) -> Job | JobArray:
        """Submit a batch job: exactly one of ``command`` (a shell command), ``notebook`` (a
        notebook path, executed with nbclient) and ``function`` (a Python callable, called with
        ``args`` and ``kwargs`` in the job; see :meth:`Job.result`). The job's Python is
        ``$GPUSCHED_PYTHON``, the one the launcher chose for your account. ``cwd`` defaults to
        the current directory, or your home if the job could not enter it (a warning says so).
        ``deadline``: when it must have finished: a :class:`~datetime.datetime` with its time
        zone, a :class:`~datetime.timedelta` from now, or the API's forms (``"6h"``,
        ``"2026-12-24T18:00Z"``, seconds); a deadline the scheduler says cannot be met (given
        the walltime, the queue and the reservations) is refused with the earliest finish
        (GPUSchedError on ``deadline``). ``more``: other fields of POST api/jobs
        (``gpus_per_node``, ``gpu_fraction``, ``cpus``, ``memory_gb``, ``labels``, ``held``).
        ``array``: a job array, its indices (``range(100)``) or Slurm's text (``"0-99%8"``),
        with at most ``max_running`` elements running at once: a :class:`JobArray` of the
        jobs, each with ``$GPUSCHED_ARRAY_INDEX``, instead of a Job."""
        _exactly_one(command, notebook, function)
        payload = None
        if function is not None:
            try:
                call = payloads.pickled_call(function, args, kwargs or {})
            except payloads.PayloadError as exc:
                raise GPUSchedError(exc.message, exc.field) from None
            name = name or getattr(function, "__qualname__", None) or "function"

            def payload(where):
                return payloads.function_payload(call, where)

        named = {"tier": tier, "queue": queue, "gpu_model": gpu_model, "walltime": walltime}
        named.update(deadline=deadline, env=env, name=name)
        fields = _fields(gpus, more, notebook=notebook, **named)
        if array is not None:
            fields["array"] = _array_field(array, max_running)
        elif max_running is not None:
            raise GPUSchedError("max_running= is for a job array: give array= too", "array")
        return self._submit(fields, command=command, payload=payload, cwd=cwd)

    def estimate(self, command: str | None = None, **options) -> Estimate:
        """When would this job start? The arguments of :meth:`submit`; nothing is submitted
        (nor pickled, nor written: what a job runs does not change when it starts). Returns an
        :class:`~.estimate.Estimate`, printed as "starts now", "about 25 min (at 14:05 UTC)"
        or "waits: <reason>" (with a ``deadline``: and the earliest it can finish); refused as
        the submission would be (GPUSchedError)."""
        notebook, function = options.pop("notebook", None), options.pop("function", None)
        _exactly_one(command, notebook, function)
        if options.get("array") is not None or options.get("max_running") is not None:
            raise GPUSchedError("an estimate is for one job: leave out array=", "array")
        options.pop("array", None), options.pop("max_running", None)
        options.pop("args", None), options.pop("kwargs", None)  # (the function's: not sent)
        cwd = options.pop("cwd", None)
        named = {key: options.pop(key, None) for key in _NAMED_FIELDS}
        fields = _fields(options.pop("gpus", 1), options, notebook=notebook, **named)
        if cwd is not None:  # (None: submit's own fallback would find a directory it may use)
            fields["cwd"] = os.path.abspath(os.fspath(cwd))
        return self._estimate(fields, command)

    def _estimate(self, fields: dict, command: str | None = None) -> Estimate:
        """POST api/estimate with ``fields`` (a placeholder command where there is none: the
        body must have one of command and notebook, and what runs does not matter here)."""
        body = dict(fields)
        if "notebook" not in body:
            body["command"] = command or "true"
        return Estimate(self.request("POST", "api/estimate", body))

    def _submit(self, fields: dict, command=None, payload=None, cwd=None) -> Job | JobArray:
        """POST api/jobs with ``fields``, and ``command`` or the command of ``payload(cwd)``
        (see ``payloads.py``). ``cwd`` None: this directory, or, if the job's user may not
        enter it (the service's 400 for ``cwd``) or the payload cannot be written there, the
        home directory, with a warning: the job should run where its user can work."""
        if cwd is not None:
            return self._post(fields, command, payload, os.path.abspath(os.fspath(cwd)))
        home = os.path.expanduser("~")
        try:
            here = os.getcwd()
        except OSError as exc:  # this directory was removed
            here, problem = None, str(exc)
        else:
            try:
                return self._post(fields, command, payload, here)
            except (GPUSchedError, OSError) as exc:
                refused = isinstance(exc, GPUSchedError) and (exc.status, exc.field) == (400, "cwd")
                if not (refused or isinstance(exc, OSError)) or here == home:
                    raise
                problem = str(exc)
        warnings.warn(
            f"the job cannot run in {here or 'this directory'} ({problem}); it runs in your "
            f"home directory {home}",
            stacklevel=3,
        )
        return self._post(fields, command, payload, home)

    def _post(self, fields: dict, command, payload, cwd: str) -> Job | JobArray:
        result_path = written = None
        if payload is not None:
            command, result_path, written = payload(cwd)
        body = {**fields, "cwd": cwd}
        if command is not None:
            body["command"] = command
        try:
            view = self.request("POST", "api/jobs", body)
        except GPUSchedError:
            payloads.remove(written)
            raise
        if "array_id" in view and "jobs" in view:  # a job array: its jobs, in index order
            jobs = [Job(self, v["id"], v, result_path=result_path) for v in view["jobs"]]
            return JobArray(self, view["array_id"], jobs)
        return Job(self, view["id"], view, result_path=result_path)

    def jobs(self, state: str | list[str] | None = None, limit: int | None = None) -> list[Job]:
        """My jobs, newest first; ``state``: e.g. ``"running"`` or ``["pending", "running"]``."""
        params: dict[str, Any] = {}
        if state:
            params["state"] = [state] if isinstance(state, str) else list(state)
        if limit is not None:
            params["limit"] = limit
        data = self.request("GET", "api/jobs", params=params)
        return [Job(self, view["id"], view) for view in data["jobs"]]

    def job(self, job_id: str) -> Job:
        """One of my jobs by id."""
        return Job(self, job_id, self.request("GET", f"api/jobs/{job_id}"))

    def queue(self) -> dict:
        """``GET api/queue``: ``{"pending", "running", "jobs": [...], "held": [...]}``; each
        entry has ``position``, ``mine``, ``tier``, ``gpus`` and ``reason`` (with ``eta``)."""
        return self.request("GET", "api/queue")

    def cluster(self) -> dict:
        """``GET api/cluster``: ``{"total_gpus", "allocated_gpus", "nodes": [...]}``."""
        return self.request("GET", "api/cluster")

    def cancel(self, job_id: str) -> dict:
        return self.request("DELETE", f"api/jobs/{job_id}")

    def cancel_array(self, array_id: str) -> dict:
        """``DELETE api/arrays/ID``: cancel the array's pending and running jobs;
        ``{"array_id", "jobs": [their views]}``."""
        return self.request("DELETE", f"api/arrays/{array_id}")

    def me(self) -> dict:
        """``GET api/me``: my name, whether I am an admin, my queues (in use, guaranteed,
        limit; the default one)."""
        return self.request("GET", "api/me")

    def quotas(self) -> dict:
        """``GET api/quotas``: every queue (parents too) with its guarantee, limit, weight and
        the GPUs ``running``, ``claimed`` and ``pending`` there; ``document``: the queue
        file in force."""
        return self.request("GET", "api/quotas")

    def usage(self, by: str = "user", since: float | None = None) -> dict:
        """``GET api/usage``: GPU-hours by ``user`` (mine only, unless I am an admin),
        ``queue`` or ``gpu_model``, over the last 30 days or from ``since`` (epoch)."""
        params: dict[str, Any] = {"by": by}
        if since is not None:
            params["since"] = since
        return self.request("GET", "api/usage", params=params)

    def log(self, job_id: str, nbytes: int = 64 * 1024) -> str:
        """The end of a job's output (at most ``nbytes``; "" while it has none)."""
        try:
            return self.request("GET", f"api/jobs/{job_id}/log", params={"bytes": nbytes})
        except GPUSchedError as exc:
            if exc.status != 404:
                raise
            self.request("GET", f"api/jobs/{job_id}")  # a 404 of its own if there is no such job
            return ""


def _exactly_one(command, notebook, function) -> None:
    given = [n for n, v in (("command", command), ("notebook", notebook)) if v is not None]
    if function is not None:
        given.append("function")
    if len(given) != 1:
        raise GPUSchedError(
            "give exactly one of command=, notebook= and function=", (given or ["command"])[0]
        )


_NAMED_FIELDS = ("tier", "queue", "gpu_model", "walltime", "deadline", "env", "name")


def deadline_field(value):
    """The ``deadline`` field of POST api/jobs for ``deadline=``: an aware datetime as ISO 8601,
    a timedelta as seconds from now, anything else as given (the API's ``"6h"``,
    ``"2026-12-24T18:00Z"``, seconds; the service checks them). A naive datetime is a
    ValueError: which zone it means is not known."""
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(
                f"deadline={value!r} has no time zone: add tzinfo (e.g. "
                "datetime(..., tzinfo=timezone.utc), or .astimezone() for this machine's zone)"
            )
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    return value


def _fields(gpus, more: dict, notebook=None, **named) -> dict:
    """The body of POST api/jobs for submit's (and estimate's) arguments, without the command
    and the directory: ``named``, those of :data:`_NAMED_FIELDS` (left out when None), and
    ``more``, the other fields, as given."""
    if notebook is not None:  # relative to this directory, wherever the job runs
        named["notebook"] = os.path.abspath(os.fspath(notebook))
    if named.get("deadline") is not None:
        named["deadline"] = deadline_field(named["deadline"])
    fields: dict[str, Any] = {"gpus": gpus, **more}
    fields.update((key, value) for key, value in named.items() if value is not None)
    return fields


def _array_field(array, max_running: int | None) -> str:
    """The ``array`` field of POST api/jobs: Slurm's text as given, or the text of indices."""
    if isinstance(array, str):
        if max_running is not None:
            array = f"{array.partition('%')[0]}%{max_running}"
        return array
    try:
        indices = sorted({int(i) for i in array})
    except (TypeError, ValueError):
        raise GPUSchedError("array= takes indices (e.g. range(100)) or '0-99%8'", "array") from None
    if not indices:
        raise GPUSchedError("array= has no indices", "array")
    # imported here: the engine's package (numpy and all) is not a kernel's to load for this
    from ..core.arrays import array_text

    return array_text(indices, max_running)


# -- module-level shortcuts (a client from the environment) -----------------------------------
def _client(client: Client | None) -> Client:
    return client if client is not None else Client()


def submit(
    command: str | None = None, *, client: Client | None = None, **options
) -> Job | JobArray:
    """:meth:`Client.submit` with the client from the environment (see :class:`Client`)."""
    return _client(client).submit(command, **options)


def estimate(command: str | None = None, *, client: Client | None = None, **options) -> Estimate:
    """:meth:`Client.estimate` with the client from the environment (see :class:`Client`)."""
    return _client(client).estimate(command, **options)


def jobs(state: str | list[str] | None = None, *, client: Client | None = None) -> list[Job]:
    return _client(client).jobs(state)


def queue(*, client: Client | None = None) -> dict:
    return _client(client).queue()


def cluster(*, client: Client | None = None) -> dict:
    return _client(client).cluster()
