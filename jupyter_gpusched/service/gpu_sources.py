"""GPU samples of nodes the service does not see itself: node agents, or an existing Prometheus.

Two sources for the reaper's GPU sampler (``gpu_sampling.py``), both speaking NVIDIA DCGM
exporter's metric names (``DCGM_FI_DEV_GPU_UTIL`` in percent, ``DCGM_FI_DEV_FB_USED`` in MiB,
label ``gpu`` the GPU index):

* :class:`AgentSource` scrapes ``jupyter-gpusched node-agent`` (``node_agent.py``) or
  dcgm-exporter itself at the URL given per node (``c.GPUSchedService.node_agents``). The
  reading's time is when it was scraped (the agent serves no sample that went stale).
* :class:`PrometheusSource` asks a Prometheus that already scrapes such exporters
  (``c.GPUSchedService.gpu_metrics_url``), mapping the series' ``Hostname`` label (or another:
  ``gpu_metrics_node_label``) to the cluster file's node names. The reading's time is the sample's
  own timestamp, so that the last value of an exporter that died is old, not fresh.

A reading's backend is the series' ``backend`` label (the node agent's: ``nvml`` or
``simulated``), else ``dcgm`` (dcgm-exporter measured it). Series of MIG instances (a ``GPU_I_ID``
label) are left out: the engine allocates whole GPUs. Every read is bounded (``timeout``, a
largest body). A source that cannot be read raises :class:`SourceError` naming it, the URL and
why; one node agent down does not hide the others: its node is in :attr:`AgentSource.failures`
(node -> why), the other nodes' readings come back, and SourceError comes only when none could be
read.

Which source reads which node (``configured_sources``): the service's own GPUs first (the local
source, ``local_gpu_nodes``), then a node agent, then Prometheus.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from urllib.parse import urlencode, urlparse

from prometheus_client.parser import text_string_to_metric_families
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from traitlets import Dict, Float, HasTraits, Unicode

from ..core.errors import ConfigError
from .gpu_sampling import GPUReading, ReadingSource, SourceError

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
MIB_PER_GIB = 1024.0
AGENT_MAX_BYTES = 1 << 20  # a node's metrics: a few kB per GPU (dcgm-exporter's full set too)
PROMETHEUS_MAX_BYTES = 16 << 20  # one query's answer for a whole cluster's GPUs


class GPUSourceSettings(HasTraits):
    """The settings of these sources: traits of ``GPUSchedService``, which inherits them (set as
    ``c.GPUSchedService.node_agents`` and the like; not a Configurable of its own, so that they
    have one name only)."""

    node_agents = Dict(
        value_trait=Unicode(),
        help="""GPU nodes whose samples the reaper reads from a node agent: node name (of the
        cluster file) -> its metrics URL, e.g. {"gpu1": "http://10.0.0.11:9400/metrics"}
        (`jupyter-gpusched node-agent`, or NVIDIA's dcgm-exporter, on that node; docs/gpu.md).
        A node the service sees itself (local_gpu_nodes) is read there instead.""",
    ).tag(config=True)
    gpu_metrics_url = Unicode(
        "",
        help="""A Prometheus that scrapes the GPU nodes' DCGM exporters (or node agents), e.g.
        http://prometheus.internal:9090: the reaper reads DCGM_FI_DEV_GPU_UTIL and
        DCGM_FI_DEV_FB_USED there for the nodes neither the service nor a node agent covers.""",
    ).tag(config=True)
    gpu_metrics_node_label = Unicode(
        "Hostname",
        help="""The label of the Prometheus series that names the node (dcgm-exporter's
        Hostname); its value is matched to the cluster's node names, also without a domain or
        port (gpu1.example.org and gpu1:9400 are gpu1).""",
    ).tag(config=True)
    gpu_metrics_timeout = Float(
        5.0,
        help="Seconds a read of a node agent or of gpu_metrics_url may take.",
    ).tag(config=True)


def _http_url(url: str, field: str, entry: str | None = None) -> str:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(
            f"expected an http:// or https:// URL, got {url!r}", field=field, entry=entry
        )
    return url


def configured_sources(app, cluster) -> list[ReadingSource]:
    """The node-agent and Prometheus sources ``app``'s settings ask for, in the order the sampler
    asks them (after the local source). ConfigError (exit code 2 at start) for a node the cluster
    does not have, a URL that is not one, or a timeout that is not > 0."""
    names = {node.name for node in cluster.nodes}
    timeout = app.gpu_metrics_timeout
    if not (math.isfinite(timeout) and timeout > 0):
        raise ConfigError(
            f"must be a number of seconds > 0, got {timeout}",
            field="GPUSchedService.gpu_metrics_timeout",
        )
    field = "GPUSchedService.node_agents"
    for node, url in app.node_agents.items():
        if node not in names:
            known = ", ".join(sorted(names)[:10])
            raise ConfigError(
                f"no node named {node!r} in the cluster file (nodes: {known})",
                field=field,
                entry=node,
            )
        _http_url(url, field, node)
    sources: list[ReadingSource] = []
    if app.node_agents:
        sources.append(AgentSource(dict(app.node_agents), timeout))
    if app.gpu_metrics_url:
        url = _http_url(app.gpu_metrics_url, "GPUSchedService.gpu_metrics_url")
        if not app.gpu_metrics_node_label:
            raise ConfigError("must name a label", field="GPUSchedService.gpu_metrics_node_label")
        sources.append(PrometheusSource(url, timeout, app.gpu_metrics_node_label, names))
    return sources


async def _fetch(url: str, timeout: float, max_bytes: int, what: str) -> str:
    """The body of GET ``url`` as text; SourceError saying ``what`` failed, where and why."""
    client = AsyncHTTPClient(force_instance=True, max_body_size=max_bytes)
    try:
        response = await client.fetch(url, request_timeout=timeout, connect_timeout=timeout)
    except HTTPClientError as exc:
        raise SourceError(f"{what} {url}: {exc}") from None
    except (OSError, asyncio.TimeoutError) as exc:  # refused, unreachable, a body too big
        raise SourceError(f"{what} {url}: {exc.strerror or exc}") from None
    except Exception as exc:  # tornado's stream errors are of several kinds
        raise SourceError(f"{what} {url}: {type(exc).__name__}: {exc}") from None
    finally:
        client.close()
    return response.body.decode("utf-8", errors="replace")


def _gpu_index(labels: dict) -> int | None:
    """The GPU index of a DCGM series, None for a MIG instance's or a series without one."""
    if labels.get("GPU_I_ID"):
        return None
    text = labels.get("gpu", "")
    return int(text) if text.isdigit() else None


class AgentSource(ReadingSource):
    """Scrapes each node's metrics URL (a node agent, or dcgm-exporter)."""

    name = "node-agent"

    def __init__(self, urls: dict[str, str], timeout: float):
        self.urls = dict(urls)
        self.timeout = timeout
        self.failures: dict[str, str] = {}  # node -> why its last read failed

    def covers(self, node: str) -> bool:
        return node in self.urls

    async def read(self, nodes: set[str]) -> list[GPUReading]:
        wanted = sorted(node for node in nodes if node in self.urls)
        results = await asyncio.gather(
            *(self._read_node(node) for node in wanted), return_exceptions=True
        )
        readings: list[GPUReading] = []
        failures: dict[str, str] = {}
        for node, result in zip(wanted, results, strict=True):
            if isinstance(result, SourceError):
                failures[node] = str(result)
            elif isinstance(result, BaseException):
                raise result
            else:
                readings.extend(result)
        self.failures = failures
        if failures and len(failures) == len(wanted):
            raise SourceError("; ".join(failures[node] for node in wanted))
        return readings

    async def _read_node(self, node: str) -> list[GPUReading]:
        url = self.urls[node]
        text = await _fetch(url, self.timeout, AGENT_MAX_BYTES, "node agent")
        scraped = time.time()
        try:
            return parse_metrics(text, node, scraped)
        except ValueError as exc:
            raise SourceError(f"node agent {url}: not Prometheus metrics: {exc}") from None


def parse_metrics(text: str, node: str, scraped: float) -> list[GPUReading]:
    """The readings of one node's exposition text (ValueError where it does not parse)."""
    found: dict[int, dict] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in (GPU_UTIL, FB_USED):
            continue
        for sample in family.samples:
            index = _gpu_index(sample.labels)
            if index is None or not math.isfinite(sample.value):
                continue
            entry = found.setdefault(index, {"backend": sample.labels.get("backend") or "dcgm"})
            entry[family.name] = sample.value
    return [_reading(node, index, entry, scraped) for index, entry in sorted(found.items())]


def _reading(node: str, index: int, entry: dict, taken: float) -> GPUReading:
    """The reading of one GPU's series values (``entry``: metric -> value, and "backend")."""
    used = entry.get(FB_USED)
    return GPUReading(
        node=node,
        index=index,
        utilization=entry.get(GPU_UTIL),
        memory_used_gb=None if used is None else used / MIB_PER_GIB,
        backend=entry["backend"],
        time=taken,
    )


class PrometheusSource(ReadingSource):
    """Reads the DCGM series of a Prometheus (its HTTP API's instant queries)."""

    name = "prometheus"

    def __init__(
        self,
        url: str,
        timeout: float,
        node_label: str = "Hostname",
        nodes: set[str] | None = None,
    ):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.node_label = node_label
        self.nodes = None if nodes is None else set(nodes)  # the cluster's; None: any

    def covers(self, node: str) -> bool:
        return self.nodes is None or node in self.nodes

    def node_of(self, value: str, wanted: set[str]) -> str | None:
        """The cluster node a label value names: itself, or its part before a port or domain."""
        if value in wanted:
            return value
        short = value.split(":")[0].split(".")[0]
        return short if short in wanted else None

    async def _query(self, expression: str) -> list[dict]:
        url = f"{self.url}/api/v1/query?{urlencode({'query': expression})}"
        text = await _fetch(url, self.timeout, PROMETHEUS_MAX_BYTES, "Prometheus")
        try:
            answer = json.loads(text)
            if answer.get("status") != "success":
                raise SourceError(f"Prometheus {url}: {answer.get('error') or answer}")
            return list(answer["data"]["result"])
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SourceError(f"Prometheus {url}: not a query answer: {exc}") from None

    async def read(self, nodes: set[str]) -> list[GPUReading]:
        wanted = {node for node in nodes if self.covers(node)}
        if not wanted:
            return []
        # a metric's values, and timestamp() of each: the time of the sample, not of the query
        expressions = [
            m for metric in (GPU_UTIL, FB_USED) for m in (metric, f"timestamp({metric})")
        ]
        answers = await asyncio.gather(*(self._query(e) for e in expressions))
        found: dict[tuple[str, int], dict] = {}
        for expression, answer in zip(expressions, answers, strict=True):
            metric = expression.removeprefix("timestamp(").removesuffix(")")
            key = "time" if expression.startswith("timestamp(") else metric
            for series in answer:
                labels = series.get("metric", {})
                node = self.node_of(str(labels.get(self.node_label, "")), wanted)
                index = _gpu_index(labels)
                try:
                    value = float(series["value"][1])
                except (KeyError, IndexError, TypeError, ValueError):
                    continue
                if node is None or index is None or not math.isfinite(value):
                    continue
                entry = found.setdefault(
                    (node, index), {"backend": labels.get("backend") or "dcgm", "times": []}
                )
                if key == "time":
                    entry["times"].append(value)
                else:
                    entry[metric] = value
        return [
            _reading(node, index, entry, min(entry["times"]))  # the older metric's sample
            for (node, index), entry in sorted(found.items())
            if entry["times"] and (GPU_UTIL in entry or FB_USED in entry)
        ]
