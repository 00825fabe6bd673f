"""Real node agents and a real Prometheus on this machine, for the tests of the service's GPU
sources (tests/test_node_agent.py) and of the reaper acting on them (tests/test_reaper_sources.py).

    with running_agents(root, ["gpu1", "gpu2"], gpus=2) as (agents, env):
        ...   # agents["gpu1"].url; loads in env[STATE_DIR_ENV] show in their metrics
        with running_prometheus(root, agents, ports=range(9480, 9490)) as url:
            ...   # url: Prometheus scraping every agent each second, all targets up

Each agent is ``jupyter-gpusched node-agent --backend simulated`` in a child process, on a free
port of 127.0.0.1, for one node of one cluster file (``root/cluster.yaml``: the nodes, each with
``gpus`` H100 of 80 GB); all read one load folder (``root/loads``).
Prometheus is Debian's ``/usr/bin/prometheus`` (the test is skipped with the way to install it
where it is missing).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from jupyter_gpusched.backends.gpu.simulated_loads import STATE_DIR_ENV, make_load_dir

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
SERVING = re.compile(r"serving http://127\.0\.0\.1:(\d+)/metrics")


def wait_for(predicate, timeout=20.0, what=""):
    """``predicate()``'s first truthy value, polled until the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def agent_command(*options) -> list[str]:
    return [sys.executable, "-m", "jupyter_gpusched", "node-agent", *options]


class Agent:
    """One node agent in a child process; ``url`` once it listens."""

    def __init__(self, node: str, env: dict, cluster: Path):
        self.node = node
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            agent_command(
                *f"--node {node} --bind 127.0.0.1:0 --backend simulated --interval 0.2".split(),
                *("--cluster", str(cluster)),
            ),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        found = wait_for(self._port, what=f"{node}'s agent to listen ({self.lines})")
        self.port = int(found)
        self.url = f"http://127.0.0.1:{self.port}/metrics"

    def _read(self):
        for line in self.process.stderr:
            self.lines.append(line)

    def _port(self):
        for line in self.lines:
            match = SERVING.search(line)
            if match:
                return match.group(1)
        assert self.process.poll() is None, "".join(self.lines)
        return None

    def metrics(self) -> dict:
        """{(metric, gpu): (value, labels)} of a scrape, and the info series under "info"."""
        with urllib.request.urlopen(self.url, timeout=5) as response:
            assert response.headers["Content-Type"].startswith("text/plain")
            text = response.read().decode()
        found = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = "info" if family.name == "gpusched_node_agent_info" else None
                found[key or (family.name, sample.labels["gpu"])] = (sample.value, sample.labels)
        return found

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=15)


@contextlib.contextmanager
def running_agents(root: Path, nodes: list[str], gpus: int):
    """``(agents, env)``: an :class:`Agent` per node (a dict by node name) of the cluster file
    ``root/cluster.yaml`` (``nodes``, each with ``gpus`` H100 of 80 GB), all stopped on the way
    out; ``env``: their environment, whose ``STATE_DIR_ENV`` is the load folder ``root/loads``
    they read."""
    cluster = root / "cluster.yaml"
    cluster.write_text(
        yaml.safe_dump(
            {
                "nodes": [
                    {"name": n, "gpus": gpus, "gpu_model": "h100", "gpu_memory_gb": 80}
                    for n in nodes
                ]
            }
        )
    )
    env = dict(os.environ, **{STATE_DIR_ENV: str(make_load_dir(root / "loads"))})
    env.pop("GPUSCHED_GPU_BACKEND", None)  # --backend says it
    agents: dict[str, Agent] = {}
    try:
        for node in nodes:
            agents[node] = Agent(node, env, cluster)
        yield agents, env
    finally:
        for agent in agents.values():
            agent.stop()


def free_port(ports) -> int:
    for port in ports:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    pytest.skip(f"no free port in {ports} for prometheus")


@contextlib.contextmanager
def running_prometheus(root: Path, agents: dict[str, Agent], ports):
    """The URL of Debian's prometheus (on the first free port of ``ports``) scraping each of
    ``agents`` every second, once all its targets are up; each target also has the label
    ``node="<node>.cluster.internal"`` (another label naming the node than the agents' own)."""
    if not os.access(PROMETHEUS, os.X_OK):
        pytest.skip(
            "/usr/bin/prometheus is missing: run scripts/install-system.sh "
            "(apt-get install prometheus)"
        )
    root.mkdir(parents=True, exist_ok=True)
    targets = [
        {"targets": [f"127.0.0.1:{agent.port}"], "labels": {"node": f"{name}.cluster.internal"}}
        for name, agent in agents.items()
    ]
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
        "scrape_configs": [{"job_name": "gpusched-node-agents", "static_configs": targets}],
    }
    (root / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = free_port(ports)
    log = open(root / "prometheus.log", "w")  # noqa: SIM115 (closed below)
    process = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={root / 'prometheus.yml'}",
            f"--storage.tsdb.path={root / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def all_up():
        assert process.poll() is None, (root / "prometheus.log").read_text()
        try:
            with urllib.request.urlopen(f"{url}/api/v1/targets", timeout=2) as response:
                active = json.load(response)["data"]["activeTargets"]
        except OSError:
            return False
        return len(active) == len(agents) and all(t["health"] == "up" for t in active)

    try:
        wait_for(all_up, timeout=60, what="prometheus's targets up")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
