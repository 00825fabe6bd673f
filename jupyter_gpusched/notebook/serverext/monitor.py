"""The per-kernel GPU monitor of a notebook server.

Every :attr:`GPUMonitor.interval` seconds it samples the GPU telemetry
(:mod:`jupyter_gpusched.backends.gpu`: NVML, or the simulated GPUs when ``gpu_backend`` /
``$GPUSCHED_GPU_BACKEND`` chooses them), maps each GPU process to a kernel by walking up the
process's parents to a kernel's PID (the kernel manager knows them; processes a kernel started, e.g.
a DataLoader worker or ``subprocess.run("python train.py")``, count for that kernel), and keeps per
kernel and for the whole server: utilization (summed over GPUs, percent of one GPU), memory (GiB)
and the last time it used a GPU (utilization at or above ``busy_threshold``).

* ``GET <base_url>gpusched/api/kernels``: ``{"time", "interval", "server": {...}, "kernels":
  {kernel_id: {...}}, "devices": [...]}`` (authenticated like every jupyter-server API).
* While the server's GPUs are busy, the server and its busy kernels are marked active
  (``last_activity_times["gpusched_gpu"]`` in the web app's settings, which
  ``ServerApp.last_activity()`` and so JupyterHub's activity tracking read; and each busy kernel's
  ``last_activity``, which the kernel culler reads): a long training cell with no browser open
  is not idle.
* Each interval it reports to the scheduler service: ``POST {GPUSCHED_SERVICE_URL}api/
  usage-samples`` with the job id (``GPUSCHED_JOB_ID``) and the sample, authenticated with
  ``GPUSCHED_SERVICE_TOKEN`` (else ``JUPYTERHUB_API_TOKEN``). The service's reaper decides on
  idleness from these reports (``docs/service.md``). Without a service URL nothing is reported.
* Each snapshot and report names the backend that measured it (``backend``: ``nvml`` or
  ``simulated``): the service does not act on simulated numbers unless it runs the simulated
  cluster itself. Where there is no telemetry (NVML cannot be loaded and the simulated GPUs were
  not chosen), the monitor logs the reason as an error at start and its reports say so
  (``backend: null``, ``telemetry_error``, no samples): never a made-up idle GPU.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import time

import psutil
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.ioloop import PeriodicCallback
from traitlets import Bool, Float, Unicode, default
from traitlets.config import LoggingConfigurable

from ...backends.gpu.telemetry import BACKEND_ENV, TelemetryUnavailable, configured_backend
from ..environment import JobEnvironment
from . import ROUTE_PREFIX
from .service_client import ServiceClient

SETTINGS_KEY = "gpusched_monitor"
ACTIVITY_KEY = "gpusched_gpu"
SERVER = "_server"  # processes of the server's tree that belong to no kernel


def _utcnow():
    return datetime.datetime.now(datetime.timezone.utc)


def _empty(now: float | None = None) -> dict:
    return {"utilization": 0.0, "memory_gb": 0.0, "gpus": [], "last_gpu_use": None, "since": now}


class GPUMonitor(LoggingConfigurable):
    interval = Float(5.0, help="Seconds between GPU samples (and reports to the service).").tag(
        config=True
    )
    busy_threshold = Float(
        5.0,
        help="Utilization (percent) at or above which a kernel or the server is GPU-busy, and "
        "marked active for JupyterHub and the kernel culler. The idle reaper does not read it: "
        "it decides from the service's own samples with its idle_threshold.",
    ).tag(config=True)
    service_url = Unicode(
        help="The scheduler service's URL (up to its prefix); default $GPUSCHED_SERVICE_URL. "
        "Empty: no reports."
    ).tag(config=True)
    report = Bool(True, help="Report samples to the scheduler service.").tag(config=True)
    mark_active = Bool(True, help="Mark the server and busy kernels active while GPU-busy.").tag(
        config=True
    )

    gpu_backend = Unicode(
        help="Where GPU samples come from: 'auto' or 'nvml' (NVIDIA's NVML, through "
        "nvidia-ml-py), or 'simulated' (the demo's and the tests' simulated GPUs; only when "
        f"chosen). Default ${BACKEND_ENV}, else 'auto'. Without telemetry the monitor reports "
        "that it has none, never an idle GPU."
    ).tag(config=True)

    @default("gpu_backend")
    def _gpu_backend_default(self):
        return configured_backend()

    @default("service_url")
    def _service_url_default(self):
        return JobEnvironment.read().service_url

    def __init__(self, serverapp=None, telemetry=None, **kwargs):
        super().__init__(**kwargs)
        self.serverapp = serverapp
        self._telemetry = telemetry
        env = JobEnvironment.read()
        self.job_id, self.token, self.profile = env.job_id, env.token, env.profile
        self.kernels: dict[str, dict] = {}
        self.server = _empty(time.time())
        self.devices: list[dict] = []
        self.last_sample: float | None = None
        self.notes: list[str] = []
        self.reports_failed = 0
        self._callback: PeriodicCallback | None = None
        self._parents: dict[tuple[int, float], int | None] = {}  # (pid, created) -> kernel pid
        self._reporting = False
        self.telemetry_error: str | None = None  # why there is no telemetry (None: there is)
        self.ignored_by_service: str | None = None  # why the service did not act on a report

    @property
    def telemetry(self):
        """The GPU telemetry, or None (``telemetry_error`` says why; logged once: as an error in a
        scheduler job's server)."""
        if self._telemetry is None and self.telemetry_error is None:
            from ...backends.gpu import get_telemetry

            try:  # ValueError: an unknown gpu_backend, named in the message
                self._telemetry = get_telemetry(self.gpu_backend)
            except (TelemetryUnavailable, ValueError) as exc:
                self.telemetry_error = str(exc)
                if self.job_id:
                    self.log.error(
                        "gpusched monitor: %s. This server's reports to the scheduler say it has "
                        "no GPU samples.",
                        exc,
                    )
                else:  # a server of its own (`jupyter lab`, not a scheduler job's): no GPUs are
                    # expected of it and it reports to nobody, so this is not an error
                    self.log.info("gpusched monitor: %s", exc)
        return self._telemetry

    @property
    def backend(self) -> str | None:
        return getattr(self.telemetry, "backend", None)

    def start(self) -> None:
        self.telemetry  # noqa: B018 (at start: a missing NVML is logged now, not at the first tick)
        self._callback = PeriodicCallback(self.tick, self.interval * 1000)
        self._callback.start()

    def stop(self) -> None:
        if self._callback is not None:
            self._callback.stop()

    # -- one sample --------------------------------------------------------------------------
    def kernel_pids(self) -> dict[int, str]:
        """pid -> kernel id of the running kernels."""
        pids: dict[int, str] = {}
        manager = getattr(self.serverapp, "kernel_manager", None)
        if manager is None:
            return pids
        for kernel_id in list(manager.list_kernel_ids()):
            try:
                kernel = manager.get_kernel(kernel_id)
            except KeyError:
                continue
            provisioner = getattr(kernel, "provisioner", None)
            pid = getattr(provisioner, "pid", None) or getattr(
                getattr(provisioner, "process", None), "pid", None
            )
            if pid:
                pids[int(pid)] = kernel_id
        return pids

    def _owner(self, pid: int, kernels: dict[int, str], server_pid: int) -> str | None:
        """The kernel id of ``pid`` (itself or an ancestor is a kernel), SERVER for another
        process of this server's tree, None for a process of someone else."""
        if pid in kernels:
            return kernels[pid]
        try:
            process = psutil.Process(pid)
            key = (pid, process.create_time())
            if key not in self._parents:
                ancestors = [p.pid for p in process.parents()]
                self._parents[key] = next(
                    (a for a in ancestors if a in kernels or a == server_pid), None
                )
            ancestor = self._parents[key]
        except psutil.Error:
            return None
        if ancestor is None:
            return SERVER if pid == server_pid else None
        return kernels.get(ancestor, SERVER)

    def sample(self, now: float | None = None) -> dict:
        now = time.time() if now is None else now
        kernels = self.kernel_pids()
        server_pid = os.getpid()
        telemetry = self.telemetry
        if telemetry is None:  # nothing measured: unknown, not zero
            self.server.update(utilization=None, memory_gb=None, gpus=[])
            self.devices, self.notes, self.last_sample = [], [self.telemetry_error], now
            return self.snapshot()
        samples = telemetry.sample()
        visible = _visible()
        per: dict[str, dict] = {}
        devices = []
        notes = []
        for device_sample in samples:
            index = device_sample.device.index
            mine = visible is None or index in visible
            if mine:
                devices.append(
                    {
                        "index": index,
                        "uuid": device_sample.device.uuid,
                        "utilization": device_sample.utilization_percent,
                        "memory_gb": device_sample.memory_used_gb,
                    }
                )
                if not device_sample.processes_known:
                    notes.append(f"GPU {index}: process list not readable")
            for process in device_sample.processes:
                owner = self._owner(process.pid, kernels, server_pid)
                if owner is None:
                    continue
                entry = per.setdefault(owner, {"utilization": 0.0, "memory_gb": 0.0, "gpus": []})
                util = process.utilization_percent
                if util is None:  # unknown: the device's utilization is an upper bound
                    util = device_sample.utilization_percent or 0.0
                entry["utilization"] += util
                entry["memory_gb"] += process.memory_used_gb or 0.0
                if index not in entry["gpus"]:
                    entry["gpus"].append(index)
        # forget kernels that are gone; keep the last use of those still running
        live_ids = set(kernels.values())
        self.kernels = {k: v for k, v in self.kernels.items() if k in live_ids}
        for kernel_id in live_ids:
            state = self.kernels.setdefault(kernel_id, _empty(now))
            entry = per.get(kernel_id, {"utilization": 0.0, "memory_gb": 0.0, "gpus": []})
            state.update(entry)
            if entry["utilization"] >= self.busy_threshold:
                state["last_gpu_use"] = now
        total = {"utilization": 0.0, "memory_gb": 0.0, "gpus": []}
        for entry in per.values():
            total["utilization"] += entry["utilization"]
            total["memory_gb"] += entry["memory_gb"]
            total["gpus"] = sorted(set(total["gpus"]) | set(entry["gpus"]))
        self.server.update(total)
        busy = total["utilization"] >= self.busy_threshold or any(
            (d["utilization"] or 0) >= self.busy_threshold for d in devices
        )
        if busy:
            self.server["last_gpu_use"] = now
        self.devices, self.notes, self.last_sample = devices, notes, now
        if busy and self.mark_active:
            self._mark_active(
                [k for k, s in self.kernels.items() if s["last_gpu_use"] == now], kernels
            )
        return self.snapshot()

    def _mark_active(self, kernel_ids: list[str], kernels: dict[int, str]) -> None:
        app = self.serverapp
        if app is None:
            return
        stamp = _utcnow()
        web_app = getattr(app, "web_app", None)
        if web_app is not None:
            web_app.settings.setdefault("last_activity_times", {})[ACTIVITY_KEY] = stamp
        manager = getattr(app, "kernel_manager", None)
        for kernel_id in kernel_ids:
            with contextlib.suppress(KeyError, AttributeError):
                manager.get_kernel(kernel_id).last_activity = stamp

    def snapshot(self) -> dict:
        return {
            "time": self.last_sample,
            "interval": self.interval,
            "job_id": self.job_id or None,
            "busy_threshold": self.busy_threshold,
            "server": dict(self.server),
            "kernels": {k: dict(v) for k, v in self.kernels.items()},
            "devices": list(self.devices),
            "notes": list(self.notes),
            "backend": self.backend,
            "telemetry_error": self.telemetry_error,
        }

    # -- the loop ----------------------------------------------------------------------------
    async def tick(self) -> None:
        try:
            snapshot = self.sample()
        except Exception:
            self.log.exception("gpusched monitor: sampling failed")
            return
        if self.report and self.service_url and self.job_id and not self._reporting:
            self._reporting = True
            try:
                await self.send(snapshot)
            finally:
                self._reporting = False

    async def send(self, snapshot: dict) -> bool:
        body = {
            "job_id": self.job_id,
            "profile": self.profile,
            **{k: snapshot[k] for k in ("time", "interval", "server", "kernels", "devices")},
            "backend": snapshot["backend"],
        }
        if snapshot["backend"] is None:  # no telemetry: say so, with no numbers to misread
            body.update(server=None, kernels={}, devices=[])
            body["telemetry_error"] = (snapshot["telemetry_error"] or "no GPU telemetry")[:1000]
        client = ServiceClient(self.service_url, self.token)
        status, _, answer = await client.fetch(
            "POST", "api/usage-samples", json.dumps(body).encode(), max(2.0, self.interval)
        )
        if not 200 <= status < 300:
            self.reports_failed += 1
            if self.reports_failed in (1, 10) or self.reports_failed % 100 == 0:
                why = f"HTTP {status}: {answer[:200].decode(errors='replace')}"
                url = client.url + "api/usage-samples"
                self.log.warning("gpusched monitor: report to %s failed: %s", url, why)
            return False
        self.reports_failed = 0
        self._note_ignored(answer)
        return True

    def _note_ignored(self, body: bytes) -> None:
        """Log (once per reason) when the service says it does not act on these reports."""
        try:
            ignored = json.loads(body).get("ignored")
        except (ValueError, AttributeError):
            return
        if ignored and ignored != self.ignored_by_service:
            self.log.warning(
                "gpusched monitor: the scheduler does not act on its reports: %s", ignored
            )
        self.ignored_by_service = ignored


def _visible() -> set[int] | None:
    """The GPUs given to this server (CUDA_VISIBLE_DEVICES indices); None: all."""
    env = JobEnvironment.read()
    value, node = env.visible_devices, env.node
    if value is None:
        return None
    from ...backends.gpu.simulated_loads import visible_gpus

    return set(visible_gpus(node, value))


class KernelsHandler(APIHandler):
    @web.authenticated
    def get(self):
        self.finish(json.dumps(self.settings[SETTINGS_KEY].snapshot()))


def setup_monitor(serverapp) -> GPUMonitor:
    web_app = serverapp.web_app
    monitor = GPUMonitor(serverapp=serverapp, parent=serverapp)
    web_app.settings[SETTINGS_KEY] = monitor
    route = url_path_join(web_app.settings.get("base_url", "/"), ROUTE_PREFIX, "kernels")
    web_app.add_handlers(".*$", [(route, KernelsHandler)])
    monitor.start()
    return monitor
