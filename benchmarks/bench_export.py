"""What an export of the service's history costs: ``GET api/export``'s work (the query, each job's
record, the utilization runs) and writing it as files (``export-trace``), on a SQLite store
holding a month of a busy cluster: ``--jobs`` jobs that ran (a tenth of them notebook servers,
some pre-empted once) with their allocations, and ``--runs`` utilization runs per server.

In this process, no HTTP (the service makes the same call, and the JSON, in a thread of its
own: the scheduler's loop goes on meanwhile). Prints JSON: seconds for the export, for
``json.dumps`` of the answer and its size, and for writing the files.

    python benchmarks/bench_export.py [--jobs 100000] [--runs 40] [--live]

``--live`` also starts a real ``jupyter-gpusched serve`` on that database (as
bench_own_history.py does) and times ``GET api/export`` through HTTP, and ``GET api/me`` every
50 ms meanwhile: its slowest answer shows whether the service's loop waited for the export.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from jupyter_gpusched.cli.export import write_export
from jupyter_gpusched.core.settings import PolicySettings
from jupyter_gpusched.service.export import export
from jupyter_gpusched.service.models import allocations_table, utilization_table
from jupyter_gpusched.service.store import Store

T0 = 1_700_000_000.0
MONTH = 30 * 86400.0
QUEUE_DOCUMENT = {"queues": {"research": {"guaranteed": 64}, "prod": {"guaranteed": 64}}}


def fill(store: Store, jobs: int, runs_per_server: int) -> None:
    """``jobs`` ended jobs over a month: every tenth a notebook server with its utilization
    runs, every seventh pre-empted once (two allocation runs)."""
    step = MONTH / jobs
    for first in range(0, jobs, 5000):
        rows, allocations, utilization = [], [], []
        for n in range(first + 1, min(first + 5000, jobs) + 1):
            submit = T0 + n * step
            start, end = submit + 60.0, submit + 3600.0
            kind = "notebook" if n % 10 == 0 else "batch"
            preempted = n % 7 == 0
            rows.append(
                {
                    "id": f"j-{n:06d}",
                    "number": n,
                    "user": f"user{n % 50}",
                    "queue": "research" if n % 2 else "prod",
                    "tier": 1 + n % 3,
                    "kind": kind,
                    "gpus": 1 + n % 8,
                    "walltime": 7200.0,
                    "profile": "gpu-1" if kind == "notebook" else None,
                    "state": "completed",
                    "submit_time": submit,
                    "start_time": start,
                    "first_start": start,
                    "end_time": end,
                    "runs": 2 if preempted else 1,
                    "preemptions": int(preempted),
                }
            )
            bounds = [(start, start + 600.0), (start + 900.0, end)] if preempted else [(start, end)]
            for run, (a, b) in enumerate(bounds, 1):
                allocations.append(
                    {"job_id": f"j-{n:06d}", "run": run, "node": "n1", "gpu_indices": [0],
                     "gpu_model": "H100", "gpus": 1.0, "queue": "research", "user": "u",
                     "tier": 2, "start": a, "end": b}
                )  # fmt: skip
            if kind == "notebook":
                length = (end - start) / runs_per_server
                for r in range(runs_per_server):
                    utilization.append(
                        {"job_id": f"j-{n:06d}", "start": start + r * length,
                         "end": start + (r + 1) * length - 10, "utilization": 90.0 * (r % 2)}
                    )  # fmt: skip
        store.add_jobs(rows, [])
        with store.engine.begin() as conn:
            conn.execute(allocations_table.insert(), allocations)
            if utilization:
                conn.execute(utilization_table.insert(), utilization)


POLLER = """
import json, sys, time, urllib.request
url, token, stop = sys.argv[1:4]
request = urllib.request.Request(url, headers={"Authorization": "token " + token})
times = []
while True:
    started = time.perf_counter()
    urllib.request.urlopen(request, timeout=60).read()
    times.append(time.perf_counter() - started)
    if len(times) > 1 and open(stop).read():
        break
    time.sleep(0.05)
times.sort()
print(json.dumps({"answers": len(times), "median_ms": round(1000 * times[len(times) // 2], 1),
                  "slowest_ms": round(1000 * times[-1], 1)}))
"""


def live(folder: Path) -> dict:
    """A real ``serve`` on the filled database: ``GET api/export`` of it through HTTP and,
    while it runs, ``GET api/me`` every 50 ms from another process: how long those answers
    take says whether the scheduler's loop waited for the export."""
    import subprocess
    import sys
    import urllib.request

    from bench_own_history import TOKENS, Service

    service = Service(folder)
    stop = folder / "stop"
    stop.write_text("")
    try:
        poller = subprocess.Popen(
            [sys.executable, "-c", POLLER, service.url + "api/me", TOKENS["alice"], str(stop)],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(0.5)  # it is polling
        query = f"api/export?since={T0 - 1}&until={T0 + MONTH + 86400}"
        request = urllib.request.Request(
            service.url + query, headers={"Authorization": f"token {TOKENS['admin']}"}
        )
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=600) as response:
            body = response.read()
        took = time.perf_counter() - started
        stop.write_text("stop")
        polled = json.loads(poller.communicate(timeout=120)[0])
    finally:
        service.stop()
    return {
        "http_export_s": round(took, 2),
        "http_jobs": len(json.loads(body)["jobs"]),
        "api_me_during_export": polled,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=40, help="utilization runs per server")
    parser.add_argument(
        "--live", action="store_true", help="also through a real serve, timing api/me meanwhile"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        store = Store(f"sqlite:///{folder}/gpusched.sqlite")
        started = time.perf_counter()
        fill(store, args.jobs, args.runs)
        filled = time.perf_counter() - started
        started = time.perf_counter()
        answer = export(
            store, T0, T0 + MONTH + 86400, None, None, QUEUE_DOCUMENT, PolicySettings(), None
        )
        exported = time.perf_counter() - started
        started = time.perf_counter()
        body = json.dumps(answer)
        encoded = time.perf_counter() - started
        started = time.perf_counter()
        write_export(json.loads(body), Path(folder) / "trace.csv")
        written = time.perf_counter() - started
        store.close()
        through_http = live(Path(folder)) if args.live else {}
    print(
        json.dumps(
            {
                "jobs": len(answer["jobs"]),
                "utilization_runs": len(answer["utilization"]),
                "fill_s": round(filled, 2),
                "export_s": round(exported, 2),
                "json_s": round(encoded, 2),
                "json_mb": round(len(body) / 1e6, 1),
                "write_files_s": round(written, 2),
                **through_http,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
