"""The scheduler service in-process, for API tests: files, an app listening on a free port, the
poll loop, and a JSON client.

    service = await start_service(tmp_path, queues=QUEUES)
    alice = service.client("alice")
    status, job = await alice.post("api/jobs", {"gpus": 1, "command": "true"})
    ...
    await service.stop()

Async tests start services through :func:`services` (an async context manager that stops every
service it started, and kills their jobs, on the way out). A synchronous test (Hypothesis) can
drive one on an event loop of its own with ``loop.run_until_complete``.

Jobs run as the service's own user (``LocalLauncher.run_as_submitting_user = False``) unless a
test asks otherwise: the token file's users need not exist on this host.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from unittest import mock
from urllib.parse import urlencode

import psutil
import yaml
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.httpserver import HTTPServer
from tornado.ioloop import PeriodicCallback
from tornado.testing import bind_unused_port
from traitlets.config import Config

from jupyter_gpusched.backends.gpu.simulated_loads import (
    STATE_DIR_ENV,
    make_load_dir,
    simulate_load,
)
from jupyter_gpusched.files import load_cluster
from jupyter_gpusched.service.app import GPUSchedService
from jupyter_gpusched.service.gpu_sampling import allocated_gpus

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "hub_config" / "cluster.yaml"  # gpu1, gpu2: 8 H100; l40s1, l40s2: 4 L40S

#: user -> API token (the token file maps them back; "admin" administers the scheduler)
TOKENS = {
    "alice": "alice-token-00000000000001",
    "bob": "bob-token-0000000000000001",
    "carol": "carol-token-00000000000001",
    "dave": "dave-token-000000000000001",
    "admin": "admin-token-00000000000001",
    "gpusched-nobody": "gpusched-nobody-token-00001",  # never a Unix account
    # tests/test_security_accounts.py: a hub user named like root, Unix accounts it creates
    "root": "root-token-000000000000001",
    "gpusched-ann": "gpusched-ann-token-0000001",
    "gpusched-ben": "gpusched-ben-token-0000001",
    "gpusched-sys": "gpusched-sys-token-0000001",
}
ADMINS = {"admin"}

#: A queue file for the tests (24 GPUs): alice and bob share "team"; "small" has a limit of 2
#: GPUs and is the catch-all default_queue (their jobs without a queue still go to "team", the
#: queue that names them: core/quotas.py default_for); only carol may use "private"; dave may
#: have 2 jobs pending at most.
QUEUES = {
    "queues": {
        "team": {"guaranteed": 12, "limit": 24, "users": ["alice", "bob", "dave"]},
        "small": {"guaranteed": 0, "limit": 2, "users": ["alice", "bob"]},
        "private": {"guaranteed": 12, "users": ["carol"]},
    },
    "default_queue": "small",
    "user_limits": {"default": {"pending_jobs": 1000}, "dave": {"pending_jobs": 2}},
}

NO_BODY = object()


def write_token_file(path: Path, tokens: dict[str, str] = TOKENS, admins=ADMINS) -> Path:
    data = {
        "tokens": {token: {"user": user, "admin": user in admins} for user, token in tokens.items()}
    }
    path.write_text(yaml.safe_dump(data))
    path.chmod(0o600)
    return path


def write_yaml(path: Path, data) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class JSONClient:
    """Requests to the service as one caller (``token``; None: no Authorization header)."""

    def __init__(self, base_url: str, token: str | None = None):
        self.base_url = base_url
        self.token = token

    async def request(
        self,
        method: str,
        path: str,
        body=NO_BODY,
        *,
        token: str | None = ...,  # type: ignore[assignment]
        params: dict | list | None = None,
        raw: bytes | None = None,
        headers: dict | None = None,
        timeout: float = 30.0,
    ) -> tuple[int, object]:
        """``(status, data)``: data is the decoded JSON, or the text when the response is not
        JSON. ``body`` is sent as JSON; ``raw`` as it is."""
        token = self.token if token is ... else token
        url = self.base_url + path.lstrip("/")
        if params:
            url += "?" + urlencode(params, doseq=True)
        all_headers = {"Content-Type": "application/json"}
        if token is not None:
            all_headers["Authorization"] = f"token {token}"
        all_headers.update(headers or {})
        if raw is None and body is not NO_BODY:
            raw = json.dumps(body).encode()
        if raw is None and method in ("POST", "PUT", "PATCH"):
            raw = b""
        request = HTTPRequest(
            url,
            method=method,
            headers=all_headers,
            body=raw,
            allow_nonstandard_methods=True,
            request_timeout=timeout,
            follow_redirects=False,
        )
        response = await AsyncHTTPClient().fetch(request, raise_error=False)
        if response.code == 599:  # no HTTP response at all
            raise ConnectionError(f"{method} {url}: {response.error}")
        text = response.body.decode("utf-8", "replace") if response.body else ""
        if response.headers.get("Content-Type", "").startswith("application/json"):
            return response.code, json.loads(text)
        return response.code, text

    async def get(self, path, **kw):
        return await self.request("GET", path, **kw)

    async def post(self, path, body=NO_BODY, **kw):
        return await self.request("POST", path, body, **kw)

    async def put(self, path, body=NO_BODY, **kw):
        return await self.request("PUT", path, body, **kw)

    async def delete(self, path, **kw):
        return await self.request("DELETE", path, **kw)


class Service:
    """A GPUSchedService built and served in this process (see :func:`start_service`)."""

    def __init__(self, app: GPUSchedService, server: HTTPServer, port: int, poller):
        self.app = app
        self.live = app.live
        self.server = server
        self.port = port
        self.url = f"http://127.0.0.1:{port}/"
        self.poller = poller
        self.stopped = False
        self.load_dir: Path | None = None
        self._holders: dict[str, subprocess.Popen] = {}  # job id -> the process of its loads

    def load(self, job_id: str, util, memory_gb: float = 4.0) -> list:
        """Simulated GPU load (this process's) on every GPU the engine allocated to ``job_id``
        (``util``: one percentage for all, or a list, one per GPU in allocation order), in the
        service's own load folder (``start_service(gpu_load_dir=...)``), until replaced by the
        next call or stopped: what the service's GPU samples measure. The load is a child
        process's (one per job, killed at :meth:`stop`), never this test process's."""
        assert self.load_dir is not None, "start_service(gpu_load_dir=...) samples the GPUs"
        gpus = allocated_gpus(self.live).get(job_id, [])
        utils = list(util) if isinstance(util, (list, tuple)) else [util] * len(gpus)
        assert len(utils) == len(gpus), (utils, gpus)
        holder = self._holders.get(job_id)
        if holder is None:
            holder = self._holders[job_id] = subprocess.Popen(["sleep", "600"])
        return [
            simulate_load(
                u, memory_gb, None, [index], node=node, pid=holder.pid, state_dir=self.load_dir
            )
            for (node, index), u in zip(gpus, utils, strict=True)
        ]

    def client(self, user: str | None = None) -> JSONClient:
        """A client with ``user``'s token (None: no token)."""
        return JSONClient(self.url, TOKENS[user] if user else None)

    def pids(self) -> list[int]:
        """Process ids of the running jobs' process groups."""
        return [
            extra.handle["pgid"]
            for job_id in list(self.live.engine.running)
            if (extra := self.live.extras.get(job_id)) is not None and extra.handle
        ]

    async def stop(self) -> None:
        """Stop serving, kill what the jobs left running, close the database."""
        if self.stopped:
            return
        self.stopped = True
        self.poller.stop()
        self.live.close()
        self.server.stop()
        for pgid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        for holder in self._holders.values():
            holder.kill()
            holder.wait()
        tasks = list(self.live._tasks)
        if tasks:
            _, waiting = await asyncio.wait(tasks, timeout=10)
            for task in waiting:
                task.cancel()
        self.app.store.close()


async def start_service(
    tmp_path: Path,
    *,
    queues: dict | None = QUEUES,
    policy: dict | None = None,
    cluster: Path | dict = CLUSTER,
    poll_interval: float = 0.05,
    cancel_grace: float = 5.0,
    run_as_submitting_user: bool = False,
    gpu_backend: str = "simulated",
    gpu_load_dir: Path | None = None,
    **traits,
) -> Service:
    """Build a service on files in ``tmp_path`` (a queue document, a policy document, a cluster
    file or document), listen on a free port of 127.0.0.1 and start the poll loop. ``traits``:
    more GPUSchedService traits (e.g. ``gpu_hour_prices``, ``authenticate_metrics``).
    ``gpu_backend``: the service's own (``simulated``: the tests' cluster is the demo's simulated
    one, so its reaper acts on samples of the simulated backend; ``auto``: a real cluster's).
    ``gpu_load_dir``: the service samples every node of its cluster here, as the demo does, from
    the simulated loads in this folder (:meth:`Service.load`), every 0.1 s unless
    ``gpu_sample_interval`` says otherwise; without it the service samples no GPU (its notebook
    servers are unmonitored)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = Config()
    c = config.GPUSchedService
    if isinstance(cluster, dict):
        cluster = write_yaml(tmp_path / "cluster.yaml", cluster)
    c.cluster_file = str(cluster)
    if queues is not None:
        c.queue_file = str(write_yaml(tmp_path / "queues.yaml", queues))
    if policy is not None:
        c.policy_file = str(write_yaml(tmp_path / "policy.yaml", policy))
    c.db_url = f"sqlite:///{tmp_path / 'gpusched.sqlite'}"
    c.token_file = str(write_token_file(tmp_path / "tokens.yaml"))
    c.log_dir = str(tmp_path / "logs")
    c.poll_interval = poll_interval
    c.cancel_grace = cancel_grace
    c.gpu_backend = gpu_backend
    for name, value in traits.items():
        setattr(c, name, value)
    config.LocalLauncher.run_as_submitting_user = run_as_submitting_user
    sock, port = bind_unused_port()
    c.bind_url = f"http://127.0.0.1:{port}/"
    environment = {}
    if gpu_load_dir is not None:
        make_load_dir(gpu_load_dir)
        environment[STATE_DIR_ENV] = str(gpu_load_dir)  # read when the telemetry is made
        c.local_gpu_nodes = [node.name for node in load_cluster(str(cluster)).nodes]
        if "gpu_sample_interval" not in traits:
            c.gpu_sample_interval = 0.1
    app = GPUSchedService(config=config)
    with mock.patch.dict(os.environ, environment):
        app.live = app.build()
    if gpu_load_dir is not None:  # the loads are the test's: no server's processes to wait for
        app.live.server_stops.local_nodes = set()
    server = HTTPServer(app.make_app())
    server.add_sockets([sock])
    poller = PeriodicCallback(app.live.poll, poll_interval * 1000)
    poller.start()
    service = Service(app, server, port, poller)
    service.load_dir = gpu_load_dir
    return service


@contextlib.asynccontextmanager
async def services(tmp_path: Path):
    """``async with services(tmp_path) as make``: ``await make(**options)`` starts a
    :class:`Service` (options as for :func:`start_service`, each in a directory of its own);
    all are stopped on the way out. A test module turns it into a fixture::

        @pytest.fixture
        async def service_factory(tmp_path):
            async with services(tmp_path) as make:
                yield make
    """
    started: list[Service] = []

    async def make(**options) -> Service:
        service = await start_service(tmp_path / f"service{len(started)}", **options)
        started.append(service)
        return service

    try:
        yield make
    finally:
        for service in started:
            await service.stop()


# -- waiting ---------------------------------------------------------------------------------
async def wait_until(predicate, timeout: float = 15.0, interval: float = 0.05, what: str = ""):
    """Await ``predicate()`` (sync or async) until it returns something truthy; return it."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or predicate}")
        await asyncio.sleep(interval)


async def wait_job(client: JSONClient, job_id: str, states, timeout: float = 15.0) -> dict:
    """The job (as ``client`` sees it) once its state is one of ``states``."""
    states = {states} if isinstance(states, str) else set(states)
    last: dict = {}

    async def reached():
        status, view = await client.get(f"api/jobs/{job_id}")
        assert status == 200, view
        last.update(view)
        return view if view["state"] in states else None

    try:
        return await wait_until(reached, timeout, what=f"{job_id} to be {sorted(states)}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; it is {last.get('state')}: {last}") from None


async def wait_log(client: JSONClient, job_id: str, text: str, timeout: float = 15.0) -> str:
    """The job's log once it contains ``text``."""

    async def has_it():
        status, log = await client.get(f"api/jobs/{job_id}/log")
        return log if status == 200 and text in log else None

    return await wait_until(has_it, timeout, what=f"{text!r} in the log of {job_id}")


def process_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
