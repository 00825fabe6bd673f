"""Job arrays and the command line against the real service: how long an array of 1,000 takes to
be accepted (one POST api/jobs with "array": "0-999"), and what 100 single submissions cost the
service when they come from one kept-alive client or from 100 ``jupyter-gpusched submit``
processes (each a new Python, a new TCP connection and a token check), in server CPU seconds and
submissions per second. Last, in the engine alone: a pass after a job ends while an array of
10,000 elements capped at 8 waits (every pass walks its pending elements: the cost of the cap).

Starts ``jupyter-gpusched serve`` as a process of its own (a token file, SQLite, the tests'
24-GPU cluster, one queue without limits) on 127.0.0.1, so its CPU is its own (psutil). The jobs
are submitted held, so that none starts: what is measured is accepting them. Prints JSON.

    python benchmarks/bench_arrays.py [--array 1000] [--singles 100] [--port 9250]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import requests
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from service_helpers import CLUSTER, TOKENS, write_token_file  # noqa: E402

COMMAND = str(Path(sys.executable).parent / "jupyter-gpusched")
QUEUES = {"queues": {"team": {"guaranteed": 24, "users": ["alice"]}}}
BODY = {"gpus": 1, "command": "sleep 3600", "walltime": "1h", "held": True}


def free_port(first: int) -> int:
    for port in range(first, 9300):  # this project's helpers use 9200-9299
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return port
    raise RuntimeError("no free port in 9200-9299")


@contextlib.contextmanager
def serving(tmp: Path, port: int):
    """``jupyter-gpusched serve`` on ``port`` with its files in ``tmp``, while the block runs
    (its psutil.Process); stopped after."""
    (tmp / "queues.yaml").write_text(yaml.safe_dump(QUEUES))
    args = [
        COMMAND,
        "serve",
        f"--GPUSchedService.cluster_file={CLUSTER}",
        f"--GPUSchedService.queue_file={tmp / 'queues.yaml'}",
        f"--GPUSchedService.db_url=sqlite:///{tmp / 'db' / 'gpusched.sqlite'}",
        f"--GPUSchedService.token_file={write_token_file(tmp / 'tokens.yaml')}",
        f"--GPUSchedService.bind_url=http://127.0.0.1:{port}/",
        f"--GPUSchedService.log_dir={tmp / 'logs'}",
        "--GPUSchedService.gpu_backend=simulated",
        "--LocalLauncher.run_as_submitting_user=False",
    ]
    (tmp / "db").mkdir()
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/api/me"
        deadline = time.monotonic() + 60
        while not _answers(url):
            if time.monotonic() > deadline:
                raise RuntimeError("the service did not start")
            time.sleep(0.2)
        yield psutil.Process(process.pid)
    finally:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)
        process.kill()


def _answers(url: str) -> bool:
    try:
        return requests.get(url, headers=auth(), timeout=2).status_code == 200
    except requests.ConnectionError:
        return False


def auth() -> dict:
    return {"Authorization": f"token {TOKENS['alice']}"}


def cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def measure(service: psutil.Process, work) -> dict:
    before, started = cpu(service), time.perf_counter()
    work()
    wall = time.perf_counter() - started
    return {"wall_s": round(wall, 4), "server_cpu_s": round(cpu(service) - before, 4)}


def capped_array_passes(elements: int = 10_000, passes: int = 20) -> dict:
    """Milliseconds of a pass after a job ends, ``elements`` pending behind a cap of 8."""
    from helpers import cluster, job

    from jupyter_gpusched.core import PolicySettings, Scheduler

    sched = Scheduler(cluster(("n[1-64]", 8, "leaf-1")), None, PolicySettings())
    for i in range(elements):
        element = job(f"j{i}", 1, array_id="a", array_index=i, array_max_running=8)
        sched.submit(element, 0.0)
    sched.schedule(0.0)
    took, now = [], 10.0
    for _ in range(passes):
        sched.job_ended(sorted(sched.running)[0], now, "completed")
        started = time.perf_counter()
        sched.schedule(now)
        took.append(1000 * (time.perf_counter() - started))
        now += 40.0
    took.sort()
    return {
        "elements": elements,
        "p50_ms": round(took[len(took) // 2], 1),
        "max_ms": round(took[-1], 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--array", type=int, default=1000, help="elements of the array")
    parser.add_argument("--singles", type=int, default=100, help="single submissions each way")
    parser.add_argument("--port", type=int, default=9250, help="first port to try")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpusched-bench-arrays-"))
    port = free_port(args.port)
    base = f"http://127.0.0.1:{port}/"
    try:
        with serving(tmp, port) as service:
            print(json.dumps(measure_all(service, base, tmp, args), indent=2))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def measure_all(service: psutil.Process, base: str, tmp: Path, args) -> dict:
    """The figures (see the module docstring) of the service ``service`` at ``base``."""
    session = requests.Session()
    session.headers.update(auth())
    answer: dict = {}

    def array():
        response = session.post(base + "api/jobs", json={**BODY, "array": f"0-{args.array - 1}"})
        assert response.status_code == 201, response.text
        answer.update(response.json())

    arrays = measure(service, array)
    assert len(answer["jobs"]) == args.array

    def kept_alive():
        for _ in range(args.singles):
            response = session.post(base + "api/jobs", json=BODY)
            assert response.status_code == 201, response.text

    env = {
        **os.environ,
        "GPUSCHED_SERVICE_URL": base,
        "GPUSCHED_SERVICE_TOKEN": TOKENS["alice"],
    }

    def processes():
        for _ in range(args.singles):
            subprocess.run(
                [COMMAND, "submit", "--hold", "--walltime", "1h", "sleep", "3600"],
                env=env,
                check=True,
                stdout=subprocess.DEVNULL,
                cwd=tmp,
            )

    singles = measure(service, kept_alive)
    commands = measure(service, processes)
    for figures in (singles, commands):
        figures["per_s"] = round(args.singles / figures["wall_s"], 1)
        figures["server_cpu_ms_each"] = round(1000 * figures["server_cpu_s"] / args.singles, 3)
    result = {
        "array": {"elements": args.array, **arrays, "target_wall_s": 1.0},
        "singles_kept_alive_client": singles,
        "singles_cli_processes": commands,
        "cli_over_client_server_cpu": round(
            commands["server_cpu_s"] / max(singles["server_cpu_s"], 1e-9), 2
        ),
        "cli_over_client_rate": round(commands["per_s"] / singles["per_s"], 3),
        "engine_pass_with_capped_array": capped_array_passes(),
    }
    return result


if __name__ == "__main__":
    sys.exit(main())
