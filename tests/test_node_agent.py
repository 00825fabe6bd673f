"""``jupyter-gpusched node-agent`` and the sources that read it (service/gpu_sources.py).

Three real agents on this machine (simulated backend, nodes gpu1-gpu3 of one cluster file, one
load folder), a GPU loaded by a child process with ``simulate_load``, and Debian's real
``prometheus`` scraping all three every second. gpu3's agent is the one stopped (last test).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
from node_agents import agent_command, running_agents, running_prometheus, wait_for
from service_helpers import wait_until
from tornado import web
from traitlets.config import Config

from jupyter_gpusched.backends.gpu.backend import get_telemetry
from jupyter_gpusched.backends.gpu.simulated_loads import simulated_uuid
from jupyter_gpusched.backends.gpu.telemetry import TelemetryUnavailable
from jupyter_gpusched.core.errors import ConfigError
from jupyter_gpusched.files import load_cluster
from jupyter_gpusched.service.app import GPUSchedService
from jupyter_gpusched.service.gpu_sampling import SourceError
from jupyter_gpusched.service.gpu_sources import (
    AgentSource,
    PrometheusSource,
    configured_sources,
    parse_metrics,
)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("agents")
    with running_agents(root, ["gpu1", "gpu2", "gpu3"], gpus=2) as (agents, env):
        # a kernel's load: 70% and 3 GiB on gpu1's GPU 1, for as long as the child lives
        loader = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys\nfrom jupyter_gpusched.backends.gpu import simulate_load\n"
                "simulate_load(util=70, memory_gb=3, seconds=None, gpus=[1], node='gpu1')\n"
                "print('loaded', flush=True)\nsys.stdin.read()",
            ],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert loader.stdout.readline().strip() == "loaded"
            yield {"root": root, "cluster": root / "cluster.yaml", "agents": agents, "env": env}
        finally:
            loader.stdin.close()
            loader.wait(timeout=15)


def test_metrics_carry_dcgm_names_labels_and_the_load(world):
    agent = world["agents"]["gpu1"]
    found = wait_for(
        lambda: (m := agent.metrics()).get(("DCGM_FI_DEV_GPU_UTIL", "1"), (0,))[0] == 70 and m,
        what="the load in gpu1's metrics",
    )
    value, labels = found[("DCGM_FI_DEV_GPU_UTIL", "1")]
    assert labels == {
        "gpu": "1",
        "UUID": simulated_uuid("gpu1", 1),
        "pci_bus_id": "00000000:11:00.0",
        "device": "nvidia1",
        "modelName": "h100",
        "Hostname": "gpu1",
        "backend": "simulated",
    }
    assert found[("DCGM_FI_DEV_FB_USED", "1")][0] == 3 * 1024  # MiB
    assert found[("DCGM_FI_DEV_FB_FREE", "1")][0] == 77 * 1024
    assert found[("DCGM_FI_DEV_GPU_UTIL", "0")][0] == 0  # the other GPU: idle, not absent
    assert found[("DCGM_FI_DEV_FB_USED", "0")][0] == 0
    value, labels = found["info"]
    assert value == 1 and labels["node"] == "gpu1" and labels["backend"] == "simulated"
    assert labels["version"]
    # gpu2's agent reads the same load folder and reports none of gpu1's load
    other = world["agents"]["gpu2"].metrics()
    assert other[("DCGM_FI_DEV_GPU_UTIL", "1")][0] == 0
    assert other[("DCGM_FI_DEV_GPU_UTIL", "1")][1]["Hostname"] == "gpu2"


async def test_agent_source_reads_each_node(world):
    agents = world["agents"]
    source = AgentSource({n: a.url for n, a in agents.items()}, timeout=5)
    assert source.covers("gpu2") and not source.covers("gpu9")
    before = time.time()
    readings = await source.read({"gpu1", "gpu2", "gpu9"})  # gpu9: not this source's
    assert source.failures == {}
    by_key = {(r.node, r.index): r for r in readings}
    assert set(by_key) == {("gpu1", 0), ("gpu1", 1), ("gpu2", 0), ("gpu2", 1)}
    loaded = by_key[("gpu1", 1)]
    assert loaded.utilization == 70 and loaded.memory_used_gb == 3
    assert loaded.backend == "simulated"
    assert before <= loaded.time <= time.time()
    assert by_key[("gpu2", 1)].utilization == 0 and by_key[("gpu2", 1)].memory_used_gb == 0


def test_parse_metrics_of_a_real_dcgm_exporter():
    # dcgm-exporter's own text: no backend label (dcgm measured it), a MIG instance left out
    text = (
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA L4",'
        'Hostname="gpu1",DCGM_FI_DRIVER_VERSION="580.105.08"} 97\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",device="nvidia1",GPU_I_ID="3",'
        'Hostname="gpu1"} 5\n'
        "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a",device="nvidia0",Hostname="gpu1"} 2048\n'
    )
    (reading,) = parse_metrics(text, "gpu1", 123.0)
    assert (reading.index, reading.utilization, reading.memory_used_gb) == (0, 97, 2)
    assert reading.backend == "dcgm" and reading.time == 123.0


async def test_agent_source_errors_name_the_url():
    silent = socket.socket()  # listens, never answers: the timeout
    silent.bind(("127.0.0.1", 0))
    silent.listen()

    class Big(web.RequestHandler):
        def get(self):
            self.finish("# " + "x" * (2 << 20) + "\n")

    class Garbage(web.RequestHandler):
        def get(self):
            self.finish('DCGM_FI_DEV_GPU_UTIL{gpu="0" 12\n')

    server = web.Application([(r"/big", Big), (r"/garbage", Garbage)]).listen(
        0, address="127.0.0.1"
    )
    port = next(iter(server._sockets.values())).getsockname()[1]
    urls = {
        "gpu1": f"http://127.0.0.1:{silent.getsockname()[1]}/metrics",
        "gpu2": f"http://127.0.0.1:{port}/big",
        "gpu3": f"http://127.0.0.1:{port}/garbage",
    }
    try:
        source = AgentSource(urls, timeout=1)
        with pytest.raises(SourceError) as caught:
            await source.read({"gpu1", "gpu2", "gpu3"})
    finally:
        server.stop()
        silent.close()
    assert set(source.failures) == {"gpu1", "gpu2", "gpu3"}
    for node, url in urls.items():
        assert url in source.failures[node] and url in str(caught.value)
    assert "imeout" in source.failures["gpu1"]
    assert "not Prometheus metrics" in source.failures["gpu3"]


def test_bad_options_exit_2(world):
    cases = [
        (["--backend", "cuda"], "--backend"),
        (["--bind", "nonsense"], "--bind"),
        (["--bind", "127.0.0.1:99999"], "--bind"),
        (["--bind", "192.0.2.1:9410"], "--bind"),  # not an address of this machine
        (["--interval", "0"], "--interval"),
        (["--node", "gpu9", "--cluster", str(world["cluster"])], "--node"),
    ]
    for options, field in cases:
        if "--backend" not in options:
            options = ["--backend", "simulated", *options]
        result = subprocess.run(
            agent_command(*options), env=world["env"], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 2, (options, result.stderr)
        assert field in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_auto_without_nvml_exits_2_naming_the_library_and_setting(world):
    try:
        get_telemetry("auto").close()
        pytest.skip("NVML works on this machine")
    except TelemetryUnavailable:
        pass
    result = subprocess.run(
        agent_command("--backend", "auto", "--bind", "127.0.0.1:0"),
        env=world["env"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "nvidia-ml-py" in result.stderr and "--backend" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def prometheus(world, tmp_path_factory):
    root = tmp_path_factory.mktemp("prometheus")
    with running_prometheus(root, world["agents"], ports=range(9490, 9500)) as url:
        yield url


async def test_prometheus_source_reads_both_nodes(world, prometheus):
    source = PrometheusSource(prometheus, timeout=5, nodes={"gpu1", "gpu2", "gpu3"})

    async def loaded():
        readings = await source.read({"gpu1", "gpu2"})
        by_key = {(r.node, r.index): r for r in readings}
        hit = by_key.get(("gpu1", 1))
        return by_key if hit and hit.utilization == 70 else None

    by_key = await wait_until(loaded, what="gpu1's load in prometheus")
    assert set(by_key) == {("gpu1", 0), ("gpu1", 1), ("gpu2", 0), ("gpu2", 1)}  # not gpu3
    reading = by_key[("gpu1", 1)]
    assert reading.memory_used_gb == 3 and reading.backend == "simulated"
    # the sample's own time (one of the scrapes' timestamps), not the query's
    assert time.time() - 10 < reading.time <= time.time()
    query = urllib.parse.urlencode({"query": 'DCGM_FI_DEV_GPU_UTIL{Hostname="gpu1",gpu="1"}[10s]'})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query?{query}", timeout=5) as response:
        (series,) = json.load(response)["data"]["result"]
    assert reading.time in {float(t) for t, _ in series["values"]}
    assert by_key[("gpu2", 1)].utilization == 0
    # another label naming the node (the targets' node="gpuN.cluster.internal"): mapped
    by_target = PrometheusSource(prometheus, timeout=5, node_label="node", nodes={"gpu2"})
    readings = await by_target.read({"gpu1", "gpu2"})
    assert {(r.node, r.index) for r in readings} == {("gpu2", 0), ("gpu2", 1)}
    assert not by_target.covers("gpu1")


async def test_prometheus_source_errors():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    with pytest.raises(SourceError, match=re.escape(url)):
        await PrometheusSource(url, timeout=2).read({"gpu1"})


async def test_stopped_agent_fails_alone_and_goes_stale(world, prometheus):
    agents = world["agents"]
    source = AgentSource({n: a.url for n, a in agents.items()}, timeout=2)
    assert {r.node for r in await source.read({"gpu1", "gpu2", "gpu3"})} == {
        "gpu1",
        "gpu2",
        "gpu3",
    }
    stopped = time.time()
    assert agents["gpu3"].stop() == 0  # SIGTERM: a clean exit
    assert "stopped" in "".join(agents["gpu3"].lines)
    readings = await source.read({"gpu1", "gpu2", "gpu3"})
    assert {r.node for r in readings} == {"gpu1", "gpu2"}
    assert list(source.failures) == ["gpu3"] and agents["gpu3"].url in source.failures["gpu3"]
    # prometheus: gpu3's series end (stale, no fresh value) while gpu1's stay fresh
    through = PrometheusSource(prometheus, timeout=5, nodes={"gpu1", "gpu2", "gpu3"})

    async def gpu3_stale():
        readings = await through.read({"gpu1", "gpu3"})
        gpu3 = [r for r in readings if r.node == "gpu3"]
        fresh = [r for r in readings if r.node == "gpu1" and r.time > stopped]
        return (all(r.time <= stopped for r in gpu3), fresh) if len(fresh) == 2 else None

    stale, _ = await wait_until(gpu3_stale, what="gpu1 fresh in prometheus")
    assert stale


def service(**settings):
    config = Config()
    for key, value in settings.items():
        setattr(config.GPUSchedService, key, value)
    return GPUSchedService(config=config)


def test_configured_sources(world):
    cluster = load_cluster(str(world["cluster"]))
    assert configured_sources(service(), cluster) == []
    agents, prometheus = configured_sources(
        service(
            node_agents={"gpu1": "http://127.0.0.1:9410/metrics"},
            gpu_metrics_url="http://127.0.0.1:9490/",
        ),
        cluster,
    )
    assert agents.name == "node-agent" and agents.covers("gpu1") and not agents.covers("gpu2")
    assert prometheus.name == "prometheus" and prometheus.url == "http://127.0.0.1:9490"
    assert prometheus.covers("gpu2") and not prometheus.covers("gpu9")
    with pytest.raises(ConfigError) as caught:
        configured_sources(service(node_agents={"gpu9": "http://127.0.0.1:9410/"}), cluster)
    assert caught.value.field == "GPUSchedService.node_agents" and caught.value.entry == "gpu9"
    assert "gpu1" in caught.value.message
    with pytest.raises(ConfigError, match="gpu_metrics_url"):
        configured_sources(service(gpu_metrics_url="prometheus:9090"), cluster)
    with pytest.raises(ConfigError, match="gpu_metrics_timeout"):
        configured_sources(service(gpu_metrics_timeout=0.0), cluster)
