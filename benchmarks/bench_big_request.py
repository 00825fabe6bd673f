"""What a 10 MB request costs other users: ``GET api/me`` latency alone, while clients send small
requests as fast as the service answers (what a normal request costs), and while they send 10 MB
bodies to ``POST api/jobs`` over and over (target: about what the small ones cost).

Starts ``jupyter-gpusched serve`` as its own process (token-file auth, SQLite, the cluster of
hub_config/cluster.yaml), as the service runs in production. Bob asks ``GET api/me`` every
``--interval`` seconds, ``--requests`` times on one kept-alive connection, latency measured from
the moment each request was due (a stall shows in every request it delays). The load comes from
``--senders`` processes of their own (this one's event loop would be busy copying their bodies):
first bodies of 150 bytes (refused with 400, 'gpus' 0), then bodies of 10 MB (an ``env`` of
10 MB, the size that froze the API for 6.6 s before the body limit), which the service reads and
drops, keeping at most ``max_body_bytes``, and refuses with 413. Reported per phase: p50, p95 and
max of bob's latency, the senders' requests and mean time, the service's CPU seconds; then the
jobs and events stored (0) and the service's memory before and after. Prints JSON.

    python benchmarks/bench_big_request.py [--requests 500] [--interval 0.01] [--senders 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import psutil
from bench_service import Connection, percentile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CLUSTER = os.path.join(ROOT, "hub_config", "cluster.yaml")
TOKENS = {"alice": "alice-bench-token-000000001", "bob": "bob-bench-token-00000000001"}
BIG = 10 << 20


async def me_latency(port: int, count: int, interval: float) -> dict:
    conn = Connection("127.0.0.1", port)
    latencies, statuses = [], {}
    start = time.perf_counter() + 0.05
    for i in range(count):
        due = start + i * interval
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        status = await conn.request("GET", "/api/me", TOKENS["bob"])
        latencies.append(time.perf_counter() - due)
        statuses[status] = statuses.get(status, 0) + 1
    conn.close()
    return {
        "requests": count,
        "statuses": statuses,
        "p50_ms": round(1000 * percentile(latencies, 0.50), 2),
        "p95_ms": round(1000 * percentile(latencies, 0.95), 2),
        "max_ms": round(1000 * max(latencies), 2),
    }


def body_of(size: int) -> bytes:
    """A POST api/jobs body of about ``size`` bytes: an ``env`` of that size (refused: over the
    body limit, or for a small one, 'gpus' 0)."""
    return json.dumps({"gpus": 0, "command": "true", "env": {"A": "x" * size}}).encode()


async def send_requests(port: int, size: int, stop, counts) -> None:
    """Send bodies of ``size`` bytes to POST api/jobs until ``stop`` is set; add to
    ``counts``."""
    body = body_of(size)
    expected = "413" if size > (1 << 20) else "400"
    conn = Connection("127.0.0.1", port)
    while not stop.is_set():
        began = time.perf_counter()
        try:
            status = str(await conn.request("POST", "/api/jobs", TOKENS["alice"], body))
        except (ConnectionError, asyncio.IncompleteReadError):
            status = "connection closed"
            conn.close()
        with counts.get_lock():
            counts[0] += 1
            counts[1] += time.perf_counter() - began
            if status != expected:
                counts[2] += 1
    conn.close()


def sender_process(port: int, size: int, stop, counts) -> None:
    asyncio.run(send_requests(port, size, stop, counts))


def during_requests(
    port: int, service: psutil.Process, count: int, interval: float, senders: int, size: int
) -> dict:
    """Bob's latency while ``senders`` processes (not this one: its event loop would be busy
    copying their bodies) send bodies of ``size`` bytes as fast as the service answers."""
    stop = multiprocessing.Event()
    counts = multiprocessing.Array("d", 3)  # sent, seconds taken, answers other than 413
    processes = [
        multiprocessing.Process(target=sender_process, args=(port, size, stop, counts))
        for _ in range(senders)
    ]
    for process in processes:
        process.start()
    time.sleep(1.0)  # the big requests under way
    began, cpu = counts[0], service.cpu_times()
    me = asyncio.run(me_latency(port, count, interval))
    during = counts[0] - began
    used = service.cpu_times()
    cpu_s = used.user + used.system - cpu.user - cpu.system
    stop.set()
    for process in processes:
        process.join(30)
    me["other_requests"] = {
        "senders": senders,
        "body_bytes": len(body_of(size)),
        "sent_while_measured": int(during),
        "sent": int(counts[0]),
        "unexpected_statuses": int(counts[2]),
        "mean_ms": round(1000 * counts[1] / counts[0], 1) if counts[0] else None,
    }
    me["service_cpu_s"] = round(cpu_s, 2)
    return me


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_service(scratch: str, port: int) -> subprocess.Popen:
    tokens = os.path.join(scratch, "tokens.yaml")
    with open(tokens, "w") as f:
        json.dump({"tokens": {t: {"user": u} for u, t in TOKENS.items()}}, f)
    os.chmod(tokens, 0o600)
    queues = os.path.join(scratch, "queues.yaml")
    with open(queues, "w") as f:
        f.write("queues:\n  sandbox: {guaranteed: 0}\n")
    command = [
        sys.executable,
        "-m",
        "jupyter_gpusched",
        "serve",
        f"--cluster={CLUSTER}",
        f"--queues={queues}",
        f"--db=sqlite:///{scratch}/gpusched.sqlite",
        f"--token-file={tokens}",
        f"--log-dir={scratch}/logs",
        f"--bind-url=http://127.0.0.1:{port}/",
        "--GPUSchedService.local_gpu_nodes=[]",
    ]
    log = os.path.join(scratch, "service.log")
    with open(log, "wb") as out:
        process = subprocess.Popen(command, cwd=scratch, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            with open(log) as f:
                raise RuntimeError(f.read()[-2000:])
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return process
        time.sleep(0.1)
    process.kill()
    raise RuntimeError("the service did not start")


async def stored(port: int) -> dict:
    """How many jobs and events the service holds (each request refused stored none)."""
    counts = {}
    for path in ("api/jobs", "api/events"):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"GET /{path} HTTP/1.1\r\nHost: x\r\nAuthorization: token {TOKENS['alice']}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        data = await reader.read()
        writer.close()
        payload = json.loads(data.partition(b"\r\n\r\n")[2])
        counts[path.split("/")[1]] = len(next(iter(payload.values())))
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--interval", type=float, default=0.01)
    parser.add_argument("--senders", type=int, default=2)
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="bench-big-request-")
    port = free_port()
    service = start_service(scratch, port)
    try:
        memory = psutil.Process(service.pid)
        results = {"service": f"http://127.0.0.1:{port}/", "auth": "token file"}
        asyncio.run(me_latency(port, 50, 0.0))  # warm-up, not measured
        rss_before = memory.memory_info().rss
        results["alone"] = asyncio.run(me_latency(port, args.requests, args.interval))
        for name, size in (("during_small_requests", 100), ("during_10mb_requests", BIG)):
            results[name] = during_requests(
                port, memory, args.requests, args.interval, args.senders, size
            )
        results["stored"] = asyncio.run(stored(port))
        results["service_rss_mb"] = {
            "before": round(rss_before / 2**20, 1),
            "after": round(memory.memory_info().rss / 2**20, 1),
        }
        print(json.dumps(results, indent=2), flush=True)
    finally:
        service.terminate()
        try:
            service.wait(10)
        except subprocess.TimeoutExpired:
            service.kill()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
