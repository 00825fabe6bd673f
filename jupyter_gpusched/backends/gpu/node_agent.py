"""``jupyter-gpusched node-agent``: a GPU node's utilization and memory for the service to read.

The admin runs one on each GPU node the service does not see itself (a systemd unit, a Slurm
prolog, a DaemonSet; docs/gpu.md shows the unit). It samples the node's GPUs every ``--interval``
seconds in a thread of its own and serves the latest sample at ``GET /metrics`` in the Prometheus
text format, under NVIDIA DCGM exporter's metric names, help texts and labels
(``DCGM_FI_DEV_GPU_UTIL`` in percent, ``DCGM_FI_DEV_FB_USED`` and ``DCGM_FI_DEV_FB_FREE`` in MiB;
labels ``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname``), so that the
Prometheus queries and dashboards written for dcgm-exporter work on it unchanged. Two additions:
a ``backend`` label on each series (``nvml`` or ``simulated``: who measured it, so that the
service never takes simulated numbers for real ones) and ``gpusched_node_agent_info{node,
backend,version} 1``.

A scrape never waits for NVML: it reads the sample the thread took last. A sample older than
three intervals (NVML hung, the sampling thread failing) is not served at all: the series are
absent, which the service reads as "unknown", never as an idle GPU. A value the driver does not
give (``None``) is left out for the same reason.

Like dcgm-exporter it is unauthenticated and shows GPU numbers only (no processes, no users):
bind it to the node's private address (docs/security.md). The backend follows
:func:`~jupyter_gpusched.backends.gpu.backend.get_telemetry`'s rules: ``auto`` means NVML or exit
code 2 naming the missing library and the setting; ``simulated`` only when chosen.
"""

from __future__ import annotations

import asyncio
import logging
import math
import signal
import threading
import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from tornado import httpserver, netutil, web

from ... import __version__
from ...core.errors import ConfigError
from .backend import get_telemetry
from .telemetry import (
    BACKENDS,
    Telemetry,
    TelemetryUnavailable,
    configured_backend,
    short_hostname,
)

log = logging.getLogger("jupyter_gpusched.backends.gpu.node_agent")

DEFAULT_BIND = "127.0.0.1:9400"  # dcgm-exporter's port: an agent replaces it, not both
MIB_PER_GIB = 1024.0
#: dcgm-exporter's labels, in its order (etc/default-counters.csv names the fields)
DCGM_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "backend")
#: (metric, dcgm-exporter's help text)
GPU_UTIL = ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).")
FB_USED = ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).")
FB_FREE = ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).")
STALE_INTERVALS = 3  # a sample older than this many intervals is not served


class SampleLoop(threading.Thread):
    """Samples ``telemetry`` every ``interval`` seconds; :attr:`latest` is the last good sample
    and when it was taken (``(0.0, [])`` before the first)."""

    def __init__(self, telemetry: Telemetry, interval: float):
        super().__init__(name="gpu-samples", daemon=True)
        self.telemetry = telemetry
        self.interval = interval
        self.latest: tuple[float, list] = (0.0, [])
        self._halt = threading.Event()
        self._last_error = ""

    def sample_once(self) -> None:
        try:
            samples = self.telemetry.sample()
        except Exception as exc:  # NVML errors included: the old sample goes stale, no crash
            message = f"{type(exc).__name__}: {exc}"
            if message != self._last_error:  # once per distinct error, not every interval
                log.warning("cannot sample the GPUs: %s", message)
            self._last_error = message
            return
        self._last_error = ""
        self.latest = (time.time(), samples)  # one reference swap: scrapes see whole samples

    def run(self) -> None:
        while not self._halt.wait(self.interval):
            self.sample_once()

    def stop(self) -> None:
        self._halt.set()


class AgentCollector:
    """The Prometheus collector of the latest sample (a scrape reads, never samples)."""

    def __init__(self, samples: SampleLoop, node: str, backend: str):
        self.samples = samples
        self.node = node
        self.backend = backend

    def collect(self):
        info = GaugeMetricFamily(
            "gpusched_node_agent_info",
            "The jupyter-gpusched node agent: its node, telemetry backend and version.",
            labels=("node", "backend", "version"),
        )
        info.add_metric((self.node, self.backend, __version__), 1)
        yield info
        taken, samples = self.samples.latest
        if time.time() - taken > STALE_INTERVALS * self.samples.interval:
            return  # absent, not old numbers served as fresh
        families = {
            key: GaugeMetricFamily(*key, labels=DCGM_LABELS) for key in (GPU_UTIL, FB_USED, FB_FREE)
        }
        for sample in samples:
            device = sample.device
            labels = (
                str(device.index),
                device.uuid,
                device.pci_bus_id,
                f"nvidia{device.index}",
                device.model,
                self.node,
                sample.backend,
            )
            if sample.utilization_percent is not None:
                families[GPU_UTIL].add_metric(labels, sample.utilization_percent)
            if sample.memory_used_gb is not None:
                used = sample.memory_used_gb * MIB_PER_GIB
                families[FB_USED].add_metric(labels, round(used, 1))
                free = max(0.0, device.memory_total_gb * MIB_PER_GIB - used)
                families[FB_FREE].add_metric(labels, round(free, 1))
        yield from families.values()


class MetricsHandler(web.RequestHandler):
    def get(self):
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(self.settings["registry"]))


class IndexHandler(web.RequestHandler):
    def get(self):
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish("jupyter-gpusched node agent: GET /metrics\n")


def _log_request(handler) -> None:
    """Scrapes at DEBUG (one a second from Prometheus would flood the journal), errors higher."""
    status = handler.get_status()
    level = logging.DEBUG if status < 400 else logging.WARNING
    log.log(level, "%d %s %s", status, handler.request.method, handler.request.uri)


def parse_bind(text: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:9400`` for IPv6) as ``(host, port)``; ConfigError naming --bind."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(
            f"expected HOST:PORT (like {DEFAULT_BIND}, or the node's private address), "
            f"got {text!r}",
            field="--bind",
        )
    return host, int(port)


def make_telemetry(backend: str, node: str, cluster: str | None) -> Telemetry:
    """The node's telemetry by get_telemetry's rules; what cannot start is a ConfigError."""
    options = {"node": node}
    if backend == "simulated" and cluster:
        options["cluster"] = cluster
    try:
        return get_telemetry(backend, **options)
    except TelemetryUnavailable as exc:
        raise ConfigError(
            f"{exc}; for the node agent: --backend (auto, nvml or simulated)",
            field="--backend",
        ) from None
    except ConfigError:
        raise  # a bad cluster file names its own file, line and field
    except ValueError as exc:  # a simulated node the cluster file does not have
        raise ConfigError(str(exc), field="--node") from None


async def serve(args) -> int:
    host, port = parse_bind(args.bind)
    if not (math.isfinite(args.interval) and args.interval > 0):
        raise ConfigError(
            f"must be a number of seconds > 0, got {args.interval}", field="--interval"
        )
    node = args.node or short_hostname()
    backend = args.backend or configured_backend()
    telemetry = make_telemetry(backend, node, args.cluster)
    try:
        sockets = netutil.bind_sockets(port, address=host)
    except OSError as exc:  # taken, or not an address of this machine
        telemetry.close()
        raise ConfigError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}", field="--bind"
        ) from None
    samples = SampleLoop(telemetry, args.interval)
    samples.sample_once()  # the first scrape already has numbers
    samples.start()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(samples, node, telemetry.backend))
    app = web.Application(
        [(r"/metrics", MetricsHandler), (r"/", IndexHandler)],
        registry=registry,
        log_function=_log_request,
    )
    server = httpserver.HTTPServer(app)
    server.add_sockets(sockets)
    address = sockets[0].getsockname()
    shown = f"[{address[0]}]" if ":" in address[0] else address[0]
    log.info(
        "node %s, %s backend, %d GPUs, a sample every %g s: serving http://%s:%d/metrics",
        node,
        telemetry.backend,
        len(telemetry.devices()),
        args.interval,
        shown,
        address[1],
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    server.stop()
    samples.stop()
    samples.join(timeout=max(5.0, 2 * args.interval))
    telemetry.close()
    log.info("stopped")
    return 0


def run(args) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s jupyter-gpusched node-agent: %(message)s"
    )
    return asyncio.run(serve(args))


def add_parser(commands) -> None:
    agent = commands.add_parser(
        "node-agent",
        help="serve this GPU node's utilization and memory (DCGM exporter's metric names) for "
        "the service's reaper",
        description="Sample this node's GPUs every --interval seconds and serve the latest "
        "sample at GET /metrics in the Prometheus text format, under NVIDIA DCGM exporter's "
        "names (DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_USED, DCGM_FI_DEV_FB_FREE). "
        "Unauthenticated like dcgm-exporter: bind it to the node's private address.",
    )
    agent.add_argument(
        "--node", help="the node's name in the cluster file (default: the short host name)"
    )
    agent.add_argument(
        "--bind",
        default=DEFAULT_BIND,
        metavar="HOST:PORT",
        help=f"where to listen (default {DEFAULT_BIND}; give the node's private address for "
        "the service to reach it; port 0 picks a free one)",
    )
    agent.add_argument(
        "--backend",
        choices=BACKENDS,
        default=None,
        help="GPU telemetry: auto (NVML, else exit 2 saying what is missing), nvml, or "
        "simulated (the simulated GPUs, for demos and tests); default $GPUSCHED_GPU_BACKEND, "
        "else auto",
    )
    agent.add_argument(
        "--interval",
        type=float,
        default=5.0,
        help="seconds between samples (default 5); a scrape gets the latest",
    )
    agent.add_argument(
        "--cluster",
        default=None,
        help="simulated backend only: the cluster file with this node's GPUs (default "
        "$GPUSCHED_SIM_CLUSTER)",
    )
    agent.set_defaults(run=run)
