"""A Python client of the scheduler service, for notebooks and scripts.

Inside a single-user server started by :class:`~jupyter_gpusched.hub.spawner.GPUSchedSpawner` it
needs no setup: the spawner sets ``GPUSCHED_SERVICE_URL`` and ``GPUSCHED_SERVICE_TOKEN``. Elsewhere
give the URL and a token (``Client(url, token)``, or those environment variables)::

    from jupyter_gpusched import client
    job = client.submit(command="python train.py", gpus=2, walltime="2h")
    job.logs(follow=True)       # prints the output as it comes, until the job ends
    job.wait()                  # -> "completed"

    job = client.submit(function=train, args=(config,), gpus=1)
    model_path = job.result()   # waits, then the function's return value

Errors from the service raise :class:`GPUSchedError` with the service's message and field.
See ``docs/notebook.md`` for what a ``function=`` job captures.
"""

from __future__ import annotations

import html
import os
import pickle
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import requests

from . import payloads
from .environment import JobEnvironment

__all__ = [
    "Client",
    "GPUSchedError",
    "Job",
    "JobFailedError",
    "cluster",
    "jobs",
    "queue",
    "submit",
]

FINISHED = frozenset({"completed", "failed", "cancelled", "preempted", "rejected"})
ACTIVE = ("pending", "running")
MAX_LOG_BYTES = 1 << 20  # the most the service returns in one log request


class GPUSchedError(Exception):
    """An error from the scheduler service (``status``: the HTTP status, None when the service
    could not be reached) or from using the client; ``field`` names the request field at fault."""

    def __init__(self, message: str, field: str | None = None, status: int | None = None):
        super().__init__(message)
        self.message, self.field, self.status = message, field, status

    def __str__(self) -> str:
        where = f" (field {self.field!r})" if self.field else ""
        return f"{self.message}{where}"


class JobFailedError(GPUSchedError):
    """A ``function=`` job raised, or ended without a result. ``remote_traceback``: the job's
    traceback as text; ``__cause__`` is the job's exception when it could be unpickled."""

    def __init__(self, message: str, remote_traceback: str | None = None):
        super().__init__(message)
        self.remote_traceback = remote_traceback


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
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
        name: str | None = None,
        **more,
    ) -> Job:
        """Submit a batch job: exactly one of ``command`` (a shell command), ``notebook`` (a
        notebook path, executed with nbclient) and ``function`` (a Python callable, called with
        ``args`` and ``kwargs`` in the job; see :meth:`Job.result`). The job's Python is
        ``$GPUSCHED_PYTHON``, the one the launcher chose for your account. ``cwd`` defaults to
        the current directory, or your home if the job could not enter it (a warning says so).
        ``more``: other fields of POST api/jobs
        (``gpus_per_node``, ``gpu_fraction``, ``cpus``, ``memory_gb``, ``labels``, ``held``)."""
        given = [n for n, v in (("command", command), ("notebook", notebook)) if v is not None]
        if function is not None:
            given.append("function")
        if len(given) != 1:
            raise GPUSchedError(
                "give exactly one of command=, notebook= and function=", (given or ["command"])[0]
            )
        payload = None
        if function is not None:
            try:
                call = payloads.pickled_call(function, args, kwargs or {})
            except payloads.PayloadError as exc:
                raise GPUSchedError(exc.message, exc.field) from None
            name = name or getattr(function, "__qualname__", None) or "function"

            def payload(where):
                return payloads.function_payload(call, where)

        if notebook is not None:  # relative to this directory, wherever the job runs
            notebook = os.path.abspath(os.fspath(notebook))
        fields: dict[str, Any] = {"gpus": gpus, **more}
        for key, value in (
            ("notebook", notebook),
            ("tier", tier),
            ("queue", queue),
            ("gpu_model", gpu_model),
            ("walltime", walltime),
            ("env", env),
            ("name", name),
        ):
            if value is not None:
                fields[key] = value
        return self._submit(fields, command=command, payload=payload, cwd=cwd)

    def _submit(self, fields: dict, command=None, payload=None, cwd=None) -> Job:
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

    def _post(self, fields: dict, command, payload, cwd: str) -> Job:
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

    def log(self, job_id: str, nbytes: int = 64 * 1024) -> str:
        """The end of a job's output (at most ``nbytes``; "" while it has none)."""
        try:
            return self.request("GET", f"api/jobs/{job_id}/log", params={"bytes": nbytes})
        except GPUSchedError as exc:
            if exc.status != 404:
                raise
            self.request("GET", f"api/jobs/{job_id}")  # a 404 of its own if there is no such job
            return ""


class Job:
    """A job of mine. ``data`` is the service's last view of it (refreshed by :meth:`status`)."""

    def __init__(self, client: Client, job_id: str, data: dict | None = None, result_path=None):
        self.client = client
        self.id = job_id
        self.data = dict(data or {})
        self._result_path = result_path
        if result_path is None:
            self._result_path = payloads.result_path_from_command(self.data.get("command"))

    # -- state ---------------------------------------------------------------------------------
    @property
    def state(self) -> str | None:
        """The state as last seen (no request; :meth:`status` refreshes)."""
        return self.data.get("state")

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    def refresh(self) -> Job:
        self.data = self.client.request("GET", f"api/jobs/{self.id}")
        return self

    def status(self) -> str:
        """Refresh from the service; the state: pending, running, completed, failed,
        cancelled, preempted or rejected."""
        return self.refresh().state

    def wait(self, timeout: float | None = None, interval: float = 1.0) -> str:
        """Until the job ends; its final state. TimeoutError after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = min(0.1, interval)
        while self.status() not in FINISHED:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {self.id} is still {self.state} after {timeout:g} s")
            pause = delay if deadline is None else min(delay, max(0, deadline - time.monotonic()))
            time.sleep(pause)
            delay = min(interval, delay * 2)
        return self.state

    def cancel(self) -> str:
        """Cancel it (pending: dropped; running: signalled, then killed after the grace);
        the new state. GPUSchedError (409) if it has already ended."""
        self.data = self.client.cancel(self.id)
        return self.state

    # -- output --------------------------------------------------------------------------------
    def logs(self, follow: bool = False, file: IO[str] | None = None, interval: float = 0.5):
        """Without ``follow``: the end of the output (up to 1 MiB). With ``follow``: write the
        output to ``file`` (default stdout) as it comes, until the job ends; return all of it."""
        if not follow:
            return self.client.log(self.id, MAX_LOG_BYTES)
        out = file or sys.stdout
        seen = []
        for chunk in self.stream_logs(interval=interval):
            out.write(chunk)
            out.flush()
            seen.append(chunk)
        return "".join(seen)

    def stream_logs(self, interval: float = 0.5, timeout: float | None = None) -> Iterator[str]:
        """The job's output in pieces as it is written, until the job ends."""
        deadline = None if timeout is None else time.monotonic() + timeout
        previous = ""
        while True:
            ended = self.status() in FINISHED  # before reading: no output is missed at the end
            text = self.client.log(self.id, MAX_LOG_BYTES)
            new = _new_text(previous, text)
            if new:
                yield new
            previous = text
            if ended:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {self.id} is still {self.state} after {timeout:g} s")
            time.sleep(interval)

    def result(self, timeout: float | None = None) -> Any:
        """For a ``function=`` job: wait for it, then its function's return value. If the
        function raised, :class:`JobFailedError` with the job's traceback (its exception as
        ``__cause__``); the same if the job ended without a result (cancelled, killed)."""
        if self._result_path is None:
            raise GPUSchedError(f"job {self.id} was not submitted with function=", "function")
        state = self.wait(timeout)
        path = Path(self._result_path)
        if not path.exists():
            raise JobFailedError(
                f"job {self.id} ended {state} without a result; see job.logs()"
                + (f": {self.data.get('message')}" if self.data.get("message") else "")
            )
        with path.open("rb") as f:
            outcome = pickle.load(f)
        if outcome["ok"]:
            return outcome["value"]
        error = JobFailedError(
            f"the function of job {self.id} raised {outcome['type']}: {outcome['message']}\n"
            f"--- traceback in the job ---\n{outcome['traceback']}",
            outcome["traceback"],
        )
        cause = None
        if outcome.get("exception") is not None:
            try:
                cause = pickle.loads(outcome["exception"])
            except Exception:
                cause = None
        raise error from cause

    # -- display -------------------------------------------------------------------------------
    def summary(self) -> dict[str, str]:
        """What the displays show, as text."""
        d = self.data
        reason = d.get("reason") or {}
        out = {
            "id": self.id,
            "name": d.get("name") or "",
            "state": (d.get("state") or "?")
            + (f" (stopping: {d['stopping']})" if d.get("stopping") else ""),
            "gpus": _gpus_text(d),
            "tier": str(d.get("tier", "")),
            "queue": d.get("queue") or "",
        }
        if d.get("state") == "pending":
            position = d.get("position")
            out["position"] = f"#{position + 1}" if position is not None else ""
            out["reason"] = reason.get("message") or reason.get("detail") or ""
            out["eta"] = _clock(reason.get("eta"))
        if d.get("allocation"):
            out["where"] = ", ".join(_where(part) for part in d["allocation"])
        if d.get("state") == "running":
            out["utilization"] = utilization_text(d.get("utilization"))
        if d.get("state") in FINISHED and d.get("exit_code") is not None:
            out["exit code"] = str(d["exit_code"])
        if d.get("message") and d.get("state") in FINISHED:
            out["message"] = d["message"]
        return out

    def __repr__(self) -> str:
        s = self.summary()
        parts = [f"{s['gpus']} GPU", f"tier {s['tier']}", s["queue"]]
        if s.get("position"):
            parts.append(f"queued {s['position']}")
        if s.get("eta"):
            parts.append(f"ETA {s['eta']}")
        name = f" {s['name']!r}" if s["name"] else ""
        return f"<Job {self.id}{name} {s['state']}: {' · '.join(p for p in parts if p)}>"

    def _repr_html_(self) -> str:
        s = self.summary()
        colour = {"running": "#2e7d32", "pending": "#ef6c00", "completed": "#1565c0"}.get(
            s["state"], "#c62828" if s["state"] in ("failed", "rejected") else "#616161"
        )
        rows = "".join(
            f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(k)}</th>"
            f"<td style='text-align:left'>{html.escape(v)}</td></tr>"
            for k, v in s.items()
            if v and k not in ("id", "state")
        )
        return (
            f"<div class='gpusched-job'><b>Job {html.escape(self.id)}</b> "
            f"<span style='color:{colour};font-weight:bold'>{html.escape(s['state'])}</span>"
            f"<table style='font-size:90%'>{rows}</table></div>"
        )

    def _repr_mimebundle_(self, include=None, exclude=None):
        """Plain text and HTML; in a kernel with ipywidgets, a small live widget too (the state
        refreshing until the job ends, a cancel button)."""
        bundle = {"text/plain": repr(self), "text/html": self._repr_html_()}
        try:
            from .widgets import job_widget_bundle
        except ImportError:  # no ipywidgets
            return bundle
        return job_widget_bundle(self, bundle)


# -- helpers ---------------------------------------------------------------------------------
def _new_text(previous: str, text: str) -> str:
    """What ``text`` (a fresh tail of the log) adds to ``previous`` (the last tail)."""
    if text.startswith(previous):
        return text[len(previous) :]
    # the tail window moved past the start: find where the old end is in the new text
    anchor = previous[-4096:]
    index = text.rfind(anchor) if anchor else -1
    return text[index + len(anchor) :] if index >= 0 else text


def _where(part: dict) -> str:
    """``gpu1:0,1``; a part without GPUs (a CPU-only job) is its node alone."""
    gpus = ",".join(map(str, part["gpus"]))
    return f"{part['node']}:{gpus}" if gpus else part["node"]


def _gpus_text(d: dict) -> str:
    gpus, fraction = d.get("gpus"), d.get("gpu_fraction") or 1.0
    if gpus is None:
        return ""
    if gpus == 0:  # a CPU-only job: the displays say "no GPU", not "0 GPU"
        return "no"
    text = f"{fraction:g}" if fraction < 1 else f"{gpus:g}"
    if d.get("gpu_models"):
        text += "x " + "|".join(d["gpu_models"])
    return text


UNKNOWN = "\u2014"  # an em dash: what a display shows for a figure nobody measured


def utilization_text(utilization: dict | None) -> str:
    """A running job's ``utilization`` (the service's job view) as text: ``"63% at 14:02:05"``
    (the mean over its GPUs, and when its notebook server's GPU monitor measured it), or an em
    dash when unknown (a batch job, or a server that has not reported)."""
    if not utilization or utilization.get("percent") is None:
        return UNKNOWN
    text = f"{utilization['percent']:.0f}%"
    measured = utilization.get("measured_at")
    if measured:
        text += " at " + datetime.fromtimestamp(measured).strftime("%H:%M:%S")
    return text


def _clock(epoch: float | None) -> str:
    if not epoch:
        return ""
    moment = datetime.fromtimestamp(epoch)
    if moment.date() == datetime.now().date():
        return moment.strftime("%H:%M")
    return moment.strftime("%Y-%m-%d %H:%M")


# -- module-level shortcuts (a client from the environment) -----------------------------------
def _client(client: Client | None) -> Client:
    return client if client is not None else Client()


def submit(command: str | None = None, *, client: Client | None = None, **options) -> Job:
    """:meth:`Client.submit` with the client from the environment (see :class:`Client`)."""
    return _client(client).submit(command, **options)


def jobs(state: str | list[str] | None = None, *, client: Client | None = None) -> list[Job]:
    return _client(client).jobs(state)


def queue(*, client: Client | None = None) -> dict:
    return _client(client).queue()


def cluster(*, client: Client | None = None) -> dict:
    return _client(client).cluster()
