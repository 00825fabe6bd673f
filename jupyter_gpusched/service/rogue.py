"""Rogue GPU use: processes on a GPU that no allocation accounts for.

A GPU can be used behind the scheduler's back: a process started outside it (ssh to the node, a
cron job, a forgotten ``nohup``), or a job's process escaping its ``CUDA_VISIBLE_DEVICES``. Every
``rogue_check_interval`` the service samples the GPUs of the nodes its own machine can see
(``GPUSchedService.local_gpu_nodes``; NVML, or the simulated backend where there is no GPU: see
``jupyter_gpusched.backends.gpu``), finds each GPU process's job from its environment
(``$GPUSCHED_JOB_ID``, set by the spawner and the launchers and inherited by kernels and job
children: :func:`~jupyter_gpusched.backends.gpu.discover.job_of_process`), and compares with the
engine's allocations (:func:`~jupyter_gpusched.backends.gpu.discover.rogue_processes`).

What then happens is the reaper setting ``rogue_processes``, which admins change at run time
(``PUT api/reaper``, ``jupyter-gpusched reaper set rogue_processes=kill``):

* ``report`` (the default): each rogue process is audited once (event ``rogue-process``, with
  its PID, GPU, use and why), listed for admins at ``GET api/rogue-processes`` and counted in the
  gauge ``gpusched_rogue_processes``;
* ``kill``: the same, then, once a process is seen at two checks in a row, SIGTERM, and SIGKILL
  after ``rogue_kill_grace`` seconds if it is still there (event ``rogue-killed``);
* ``off``: no checks.

The environment of another user's process is readable only by root; a process whose job cannot be
read is not reported (unknown is not rogue). The service must run as root to kill other users'
processes. This finds the careless, not the malicious: a process can set the variable itself.
Never reported: the service and its ancestors, and system GPU processes by name
(``GPUSchedService.rogue_ignore_processes``: Xorg, DCGM, the MPS daemon ...). A process is
signalled through the handle taken when it was found, so a PID reused meanwhile is never hit.
NVML's PIDs are the host's: run the service in the host's PID namespace (not in a container of
its own) for these checks. On the simulated backend the watch sees only the loads in this
service's own folder (``$GPUSCHED_SIM_GPU_DIR``: the demo hub gives each hub its own, beside its
state directory) on the nodes of its own cluster file, and only loads written by root or by the
loaded process's own user (docs/gpu.md): it never reports or kills the processes of another demo
on the same host, nor a process that someone else named in a load they made up. With the Slurm
launcher the checks are off: the GPU indices a Slurm job gets are Slurm's, not the engine's
(docs/slurm.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import asdict

import psutil
from prometheus_client import Gauge

from ..backends.gpu.discover import RogueProcess, job_of_process, rogue_processes
from .gpu_sampling import allocated_gpus

log = logging.getLogger("jupyter_gpusched.service")


#: GPU processes that belong to the machine, not to a user: never reported or killed.
SYSTEM_PROCESSES = (
    "Xorg",
    "Xwayland",
    "gnome-shell",
    "nv-hostengine",
    "nvidia-persistenced",
    "nvidia-cuda-mps-server",
    "nvidia-cuda-mps-control",
    "dcgm-exporter",
)


class RogueWatch:
    """Checks ``telemetries`` (node name ->
    :class:`~jupyter_gpusched.backends.gpu.telemetry.Telemetry`) at most every ``interval`` seconds,
    from :meth:`LiveScheduler.poll`. ``ignore``: process names never reported (default
    :data:`SYSTEM_PROCESSES`)."""

    def __init__(
        self,
        live,
        telemetries: dict,
        interval: float,
        kill_grace: float,
        metrics=None,
        ignore=SYSTEM_PROCESSES,
    ):
        self.live = live
        self.telemetries = telemetries
        self.interval = interval
        self.kill_grace = kill_grace
        self.ignore = frozenset(ignore)
        self.found: dict[tuple[str, int, float], dict] = {}  # (node, pid, created) -> view
        self._processes: dict[tuple[str, int, float], psutil.Process] = {}
        self._checked = -float("inf")
        self._killing: set[tuple[str, int, float]] = set()
        self._mine = _self_and_ancestors()
        self.gauge = None
        if metrics is not None:
            self.gauge = Gauge(
                "gpusched_rogue_processes",
                "GPU processes no allocation accounts for, at the last check",
                registry=metrics.registry,
            )

    def tick(self) -> None:
        now = self.live.clock()
        if now - self._checked < self.interval:
            return
        self._checked = now
        mode = self.live.reaper.settings()["rogue_processes"] if self.live.reaper else "report"
        if mode == "off":
            self.found.clear()
            self._processes.clear()
            return
        seen: dict[tuple[str, int, float], dict] = {}
        for node, telemetry in self.telemetries.items():
            sampled_at = time.time()
            try:
                samples = telemetry.sample()
            except Exception:
                log.exception("sampling the GPUs of %s failed", node)
                continue
            for rogue in rogue_processes(samples, self.allocations(node), job_of_process):
                process = self._process(node, rogue.pid, sampled_at)
                if process is None:
                    continue
                key = (node, rogue.pid, process.create_time())
                view = self.found.get(key) or self._report(node, rogue, now)
                self._processes[key] = process
                view.update(utilization_percent=rogue.utilization_percent)
                view.update(memory_used_gb=rogue.memory_used_gb, last_seen=now)
                view["sightings"] += 1
                seen[key] = view
                # two checks in a row: not a process caught between its job's end and exit
                if mode == "kill" and view["sightings"] >= 2 and key not in self._killing:
                    self._killing.add(key)
                    self.live._spawn(self._kill(key, view, process))
        self.found = seen
        self._processes = {key: self._processes[key] for key in seen}
        if self.gauge is not None:
            self.gauge.set(len(seen))

    def _process(self, node: str, pid: int, sampled_at: float) -> psutil.Process | None:
        """The process NVML (or the simulated backend) sampled, if it is one to report: it
        existed before the sample (not a new process under a reused PID), it is not this
        service or its ancestors, and not a system process."""
        try:
            process = psutil.Process(pid)
            if process.create_time() > sampled_at + 1.0:  # create_time is rounded: 1 s of slack
                return None
            if pid in self._mine or process.name() in self.ignore:
                return None
        except psutil.Error:
            return None
        return process

    def allocations(self, node: str) -> dict[str, list[int]]:
        """Job id -> the GPU indices it holds on ``node`` (running jobs and pre-emption claims)."""
        held: dict[str, list[int]] = {}
        for job_id, gpus in allocated_gpus(self.live).items():
            indices = [index for name, index in gpus if name == node]
            if indices:
                held[job_id] = indices
        return held

    def listing(self) -> list[dict]:
        """What ``GET api/rogue-processes`` shows, oldest first."""
        return sorted(self.found.values(), key=lambda view: (view["first_seen"], view["pid"]))

    def _report(self, node: str, rogue: RogueProcess, now: float) -> dict:
        view = {"node": node, **asdict(rogue), "first_seen": now, "killed": False, "sightings": 0}
        view["allowed"] = list(rogue.allowed)
        view["description"] = f"{node}: {rogue.describe()}"
        event = self.live._event("rogue-process", None, "service", view["description"])
        event["data"] = dict(view)
        self.live.store.add_event(event)
        log.warning("rogue GPU use on %s", view["description"])
        return view

    async def _kill(self, key: tuple[str, int, float], view: dict, process: psutil.Process):
        node, pid, _ = key
        try:
            for signame, wait in (("SIGTERM", self.kill_grace), ("SIGKILL", 0.0)):
                try:  # psutil refuses to signal a PID that now names another process
                    if not process.is_running():
                        break
                    (process.terminate if signame == "SIGTERM" else process.kill)()
                except psutil.NoSuchProcess:
                    break
                except psutil.Error as exc:
                    log.warning("could not signal rogue process %s: %s", pid, exc)
                    return
                message = f"{node}: rogue process {pid} sent {signame} ({view['description']})"
                event = self.live._event("rogue-killed", None, "service", message)
                event["data"] = {"node": node, "pid": pid, "signal": signame}
                self.live.store.add_event(event)
                view["killed"] = True
                await asyncio.sleep(wait)
        finally:
            self._killing.discard(key)


def _self_and_ancestors() -> frozenset[int]:
    pids = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        pids.update(p.pid for p in psutil.Process().parents())
    return frozenset(pids)
