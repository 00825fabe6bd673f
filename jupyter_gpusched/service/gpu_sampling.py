"""The service's own GPU samples: what the idle reaper decides on.

The idle reaper must act on measurements the user cannot switch off or forge, so they are not the
reports of the GPU monitor inside the user's notebook server (``serverext/monitor.py``: a user
can turn it off in their own ``jupyter_server_config.py``, or post busy reports with their
server's token). The service samples the GPUs of running notebook servers itself, through
:class:`ReadingSource` objects, in this order of precedence for each node:

* :class:`LocalSource`: the service's own telemetry of ``GPUSchedService.local_gpu_nodes`` (NVML,
  or the simulated GPUs where the service runs the simulated cluster), the same telemetry objects
  the rogue-process watch reads (service/rogue.py);
* a node agent on the node (``GPUSchedService.node_agents``), then a Prometheus that scrapes DCGM
  exporters (``GPUSchedService.gpu_metrics_url``): ``service/gpu_sources.py``.

:class:`GPUSampler` reads, at most every ``GPUSchedService.gpu_sample_interval`` seconds (from the
reaper's tick, off the event loop where a read blocks), the nodes of running notebook servers,
each from the first source that covers it, and keeps the newest reading of each GPU and the last
error of each source. :meth:`GPUSampler.readings_for` gives the trusted readings of the GPUs the
engine allocated to a job; :meth:`GPUSampler.why_unmeasured` says why a GPU of it has none.

Trust: readings measured by ``nvml`` or ``dcgm`` always count; ``simulated`` ones only where the
service runs the simulated cluster (``GPUSchedService.gpu_backend = "simulated"``), see
:func:`jupyter_gpusched.core.reaper.trusted_backends`.

A fractional allocation shares its device with other jobs: the reading is the device's, so
another job's use of the device keeps the server (conservative, never a cull on a guess).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from ..backends.gpu.backend import get_telemetry
from ..backends.gpu.telemetry import TelemetryUnavailable

log = logging.getLogger("jupyter_gpusched.service")


@dataclass(frozen=True)
class GPUReading:
    """One GPU's measurement as the service took it (never from the user's server)."""

    node: str  # the cluster file's node name
    index: int  # the node's GPU index (what the engine allocates)
    utilization: float | None  # percent 0-100, None unknown
    memory_used_gb: float | None  # GiB, None unknown
    backend: str  # "nvml", "dcgm", "simulated": who measured it
    time: float  # epoch seconds it was measured (or scraped)


class SourceError(Exception):
    """A source could not be read (message says which and why)."""


class ReadingSource:
    """Where the service reads GPU samples of some nodes."""

    name: str = "source"  # "local", "node-agent", "prometheus": shown in api/reaper

    def covers(self, node: str) -> bool:
        raise NotImplementedError

    async def read(self, nodes: set[str]) -> list[GPUReading]:
        """The readings of ``nodes`` (those it covers); raises :class:`SourceError`."""
        raise NotImplementedError


class LocalSource(ReadingSource):
    """The GPUs this machine sees: ``telemetries`` maps node names to the service's
    :class:`~jupyter_gpusched.backends.gpu.telemetry.Telemetry` objects (shared with the rogue
    watch). Each ``sample()`` runs in a thread: NVML calls block. Both consumers sampling one object
    only splits its per-process utilization between them; device figures are unaffected."""

    name = "local"

    def __init__(self, telemetries: dict):
        self.telemetries = telemetries

    def covers(self, node: str) -> bool:
        return node in self.telemetries

    async def read(self, nodes: set[str]) -> list[GPUReading]:
        readings: list[GPUReading] = []
        for node in sorted(n for n in nodes if n in self.telemetries):
            try:
                samples = await asyncio.to_thread(self.telemetries[node].sample)
            except Exception as exc:
                raise SourceError(f"sampling the GPUs of {node} here failed: {exc}") from exc
            measured = time.time()
            readings += [
                GPUReading(
                    node=node,
                    index=s.device.index,
                    utilization=s.utilization_percent,
                    memory_used_gb=s.memory_used_gb,
                    backend=s.backend,
                    time=measured,
                )
                for s in samples
            ]
        return readings


def local_telemetries(names, gpu_backend: str, cluster) -> dict:
    """Node name -> this machine's telemetry of it (``gpu_backend``), for each of ``names``
    (``GPUSchedService.local_gpu_nodes``); a node whose telemetry cannot start is left out, with
    a warning (its servers are then unmonitored, and reported as such)."""
    telemetries = {}
    for name in names:
        cluster.node(name)  # ConfigError when the cluster has no such node
        try:
            telemetries[name] = get_telemetry(gpu_backend, node=name, cluster=cluster)
        except (TelemetryUnavailable, ValueError) as exc:
            log.warning("not sampling the GPUs of %s here: %s", name, exc)
    return telemetries


def placement_gpus(live, placement) -> list[tuple[str, int]]:
    """The (node name, GPU index) pairs of ``placement``: a part's node index names a cluster
    node, its mask's bits are GPU indices."""
    nodes = live.cluster.nodes
    return [
        (nodes[part.node].name, i)
        for part in placement.parts
        for i in range(part.mask.bit_length())
        if part.mask >> i & 1
    ]


def allocated_gpus(live) -> dict[str, list[tuple[str, int]]]:
    """Job id -> the (node name, GPU index) pairs the engine allocated to it (running jobs and
    pre-emption claims)."""
    return {
        job_id: placement_gpus(live, placement)
        for job_id, placement in live.engine.state.allocations.items()
    }


class GPUSampler:
    """Reads ``sources`` (precedence in list order) for the nodes of running notebook servers
    at most every ``interval`` seconds; ``trusted_backends``: the backends whose readings count.
    """

    def __init__(self, live, sources: list[ReadingSource], interval: float, trusted_backends):
        self.live = live
        self.sources = list(sources)
        self.interval = interval
        self.trusted_backends = frozenset(trusted_backends)
        self.latest: dict[tuple[str, int], GPUReading] = {}  # the newest reading of each GPU
        self.read_by: dict[str, str] = {}  # node -> the source whose readings it has
        self.errors: dict[str, str] = {}  # source name -> its last error (until it reads again)
        self.failed: dict[str, str] = {}  # node -> why its source could not read it
        self._sampled = -float("inf")
        self._reading = False

    def source_for(self, node: str) -> ReadingSource | None:
        return next((source for source in self.sources if source.covers(node)), None)

    def watched_nodes(self) -> set[str]:
        """The nodes holding GPUs of running notebook servers."""
        running = self.live.engine.running
        return {
            node
            for job_id, gpus in allocated_gpus(self.live).items()
            if job_id in running and running[job_id].kind == "notebook"
            for node, _ in gpus
        }

    def tick(self) -> None:
        """Start a read if one is due and none is under way (the reads are awaited elsewhere:
        a slow source never holds up the poll)."""
        now = self.live.clock()
        # 5% of slack: a poll a few milliseconds early does not put the read off a whole poll
        if self._reading or now - self._sampled < self.interval * 0.95:
            return
        self._sampled = now
        nodes = self.watched_nodes()
        if nodes:
            self._reading = True
            self.live._spawn(self.read(nodes))

    async def read(self, nodes: set[str]) -> None:
        """Read each of ``nodes`` from the first source that covers it."""
        try:
            by_source: dict[int, set[str]] = {}
            for node in nodes:
                source = self.source_for(node)
                if source is not None:
                    by_source.setdefault(id(source), set()).add(node)
            sources = {id(source): source for source in self.sources}
            await asyncio.gather(*(self._read(sources[k], ns) for k, ns in by_source.items()))
        finally:
            self._reading = False

    async def _read(self, source: ReadingSource, nodes: set[str]) -> None:
        try:
            readings = await source.read(nodes)
        except Exception as exc:
            if not isinstance(exc, SourceError):
                log.exception("reading GPU samples from %s failed", source.name)
            why = str(exc) or type(exc).__name__
            if self.errors.get(source.name) != why:
                log.warning("GPU samples: source %s failed: %s", source.name, why)
            self.errors[source.name] = why
            for node in nodes:
                self.failed[node] = f"source {source.name} failed: {why}"
            return
        self.errors.pop(source.name, None)
        # a source of several endpoints (node agents) may have failed for some nodes only
        failures = getattr(source, "failures", None) or {}
        for node in nodes:
            if node in failures:
                self.failed[node] = f"source {source.name} failed: {failures[node]}"
                continue
            self.failed.pop(node, None)
            self.read_by[node] = source.name
        for reading in readings:
            if reading.node in nodes:
                self.latest[(reading.node, reading.index)] = reading

    def _gpus_of(self, job_id: str) -> list[tuple[str, int]]:
        # one job's placement, not every allocation's: called for each server at each tick
        placement = self.live.engine.state.allocations.get(job_id)
        return placement_gpus(self.live, placement) if placement is not None else []

    def readings_for(self, job_id: str) -> list[GPUReading]:
        """The trusted readings of the GPUs allocated to ``job_id`` (those it has)."""
        found = (self.latest.get(gpu) for gpu in self._gpus_of(job_id))
        return [r for r in found if r is not None and r.backend in self.trusted_backends]

    def allocated(self, job_id: str) -> int:
        """How many GPUs (devices) the engine allocated to ``job_id``."""
        return len(self._gpus_of(job_id))

    def why_unmeasured(self, job_id: str) -> str | None:
        """Why a GPU of ``job_id`` has no (new) trusted reading: its source failed, none covers
        its node, its readings are not trusted; None: each has one."""
        whys: list[str] = []
        for node, index in self._gpus_of(job_id):
            reading = self.latest.get((node, index))
            if node in self.failed:  # its earlier readings, if any, are getting old
                why = self.failed[node]
            elif reading is not None and reading.backend in self.trusted_backends:
                continue
            elif self.source_for(node) is None:
                why = f"no source covers node {node}"
            elif reading is not None and reading.backend == "simulated":
                why = f"the readings of {node} are simulated on a real cluster"
            elif reading is not None:
                why = f"the readings of {node} come from an unknown backend {reading.backend!r}"
            else:
                why = f"no reading of {node} yet"
            if why not in whys:
                whys.append(why)
        return "; ".join(whys) or None

    def measured_by(self, job_id: str) -> str | None:
        """``local (simulated)``: the source and backend of the job's readings."""
        names = []
        for reading in self.readings_for(job_id):
            name = f"{self.read_by.get(reading.node, '?')} ({reading.backend})"
            if name not in names:
                names.append(name)
        return ", ".join(names) or None
