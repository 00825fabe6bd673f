"""Submission latency and throughput of the scheduler service, with hub authentication on.

Starts a real JupyterHub (with configurable-http-proxy) that runs the service on SQLite (the
test harness in tests/hub_harness.py), gets an API token for a user, then talks to the service's
own port (the hub checks each token once; the service caches the answer, as in production):

- open loop: POST api/jobs at a steady RATE per second for DURATION seconds; latency is measured
  from the moment each request was *due*, so a stall shows up in every request it delays;
- closed loop: CLIENTS clients, each submitting as soon as its previous answer came back.

The cluster (hub_config/cluster.yaml, 24 GPUs) fills within the first submissions and every
later job waits in the queue, so what is measured is the submission path: auth, validation, the
engine's pass over the new job, the database commit, the reply. Prints JSON.

    python benchmarks/bench_service.py [--rate 200] [--duration 30] [--clients 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from urllib.parse import urlparse

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

BODY = json.dumps({"gpus": 1, "command": "sleep 3600", "walltime": "1h"}).encode()


class Connection:
    """One keep-alive HTTP/1.1 connection (enough HTTP for JSON requests and answers). An answer
    with ``Connection: close`` closes it; the next request opens a new one."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def request(self, method: str, path: str, token: str, body: bytes = b"") -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Authorization: token {token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        self.writer.write(head.encode() + body)
        await self.writer.drain()
        status_line = await self.reader.readline()
        length, close = 0, False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
            if name.lower() == "connection" and value.strip().lower() == "close":
                close = True
        await self.reader.readexactly(length)
        if close:
            self.close()
        return int(status_line.split()[1])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def open_loop(host, port, path, token, rate: float, duration: float) -> dict:
    idle: list[Connection] = []
    latencies, statuses = [], {}
    start = time.perf_counter() + 0.2
    count = int(rate * duration)

    async def one(due: float):
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        conn = idle.pop() if idle else Connection(host, port)
        status = await conn.request("POST", path, token, BODY)
        latencies.append(time.perf_counter() - due)
        statuses[status] = statuses.get(status, 0) + 1
        idle.append(conn)

    await asyncio.gather(*(one(start + i / rate) for i in range(count)))
    return {
        "rate_per_s": rate,
        "duration_s": duration,
        "requests": count,
        "statuses": statuses,
        "p50_ms": round(1000 * percentile(latencies, 0.50), 2),
        "p99_ms": round(1000 * percentile(latencies, 0.99), 2),
        "max_ms": round(1000 * max(latencies), 2),
    }


async def closed_loop(host, port, path, token, clients: int, duration: float) -> dict:
    statuses: dict[int, int] = {}
    done = 0
    stop = time.perf_counter() + duration

    async def client():
        nonlocal done
        conn = Connection(host, port)
        while time.perf_counter() < stop:
            status = await conn.request("POST", path, token, BODY)
            statuses[status] = statuses.get(status, 0) + 1
            done += 1

    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - began
    return {
        "clients": clients,
        "duration_s": round(elapsed, 2),
        "requests": done,
        "statuses": statuses,
        "submissions_per_s": round(done / elapsed, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--closed-duration", type=float, default=15.0)
    args = parser.parse_args()
    from hub_harness import running_hub  # tests/ is put on the path above

    # a queue file without per-user caps: thousands of submissions from one user
    scratch = tempfile.mkdtemp(prefix="bench-service-")
    queues = os.path.join(scratch, "queues.yaml")
    with open(queues, "w") as f:
        f.write("queues:\n  sandbox: {guaranteed: 0}\n")
    os.environ["GPUSCHED_QUEUE_FILE"] = queues
    with running_hub() as hub:
        token = hub.token("alice")
        host, port = "127.0.0.1", hub.service_port
        path = urlparse(hub.service_url).path.rstrip("/") + "/api/jobs"
        results = {"service": f"http://{host}:{port}{path}", "database": "sqlite"}
        results["auth"] = "jupyterhub (HubOAuth, token checked with the hub, cached)"
        # warm-up, not measured: the first jobs fill the cluster (24 GPUs) and launch
        asyncio.run(closed_loop(host, port, path, token, 4, 2.0))
        time.sleep(1.0)
        results["open_loop"] = asyncio.run(
            open_loop(host, port, path, token, args.rate, args.duration)
        )
        results["closed_loop"] = asyncio.run(
            closed_loop(host, port, path, token, args.clients, args.closed_duration)
        )
        print(json.dumps(results, indent=2), flush=True)
        # drain the nodes (so that the queued jobs stay queued), then cancel what runs: the
        # hub then stops with no job left behind
        admin = hub.token("admin")
        for node in hub.service("GET", "api/cluster", admin).json()["nodes"]:
            hub.service("POST", f"api/nodes/{node['name']}/drain", admin)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            running = hub.service("GET", "api/jobs?state=running", token).json()["jobs"]
            if not running:
                break
            for job in running:
                hub.service("DELETE", f"api/jobs/{job['id']}", token)
            time.sleep(1.0)
    shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
