"""Replay your own cluster, measured: a real scheduler service with the demo's cluster and queues
runs a seeded workload for a few minutes (batch jobs of three users in three tiers, and notebook
servers whose simulated GPUs are busy, then idle), then its history is exported with
``jupyter-gpusched export-trace`` and replayed with the service's own cluster, queue and policy
files. Prints JSON: per tier, the recorded and the replayed mean and p95 wait, and the
idle-timeout what-if of a shorter timeout on the servers' recorded utilization.

    python benchmarks/bench_own_history.py [--seconds 240] [--seed 1] [--out DIR]

Everything runs for real: ``jupyter-gpusched serve`` (a token file for the users; jobs are
``sleep`` commands run by the local launcher; the simulated GPUs of the demo cluster, whose load
files the workload writes for the servers' GPUs), the export command, ``replay`` and ``reaper
what-if``, each as its own process. The state (the service's SQLite database, logs) stays in
DIR for a look afterwards (tests/test_own_history.py compares the trace with it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "hub_config" / "demo-cluster.yaml"  # gpu1, gpu2: 4 H100 each
QUEUES = ROOT / "hub_config" / "demo-queues.yaml"  # alice: research/vision, bob: research/nlp ...
USERS = ("alice", "bob", "carol")
TOKENS = {user: f"{user}-own-history-token-0001" for user in (*USERS, "admin")}
# Short enough to see reclaims, pre-emptions and culls within minutes (the defaults are minutes
# to hours); the replay reads the same file.
POLICY = {
    "tiers": {
        2: {"grace_period": "2s", "minimum_run_time": "5s"},
        3: {"grace_period": "1s", "minimum_run_time": 0},
    },
    "backfill": {"interval": 0},
    "reaper": {"timeout_tier_2": "40s", "timeout_tier_3": "30s", "warning_lead": "10s"},
}
WHAT_IF = ("--timeout-tier-2", "20s", "--timeout-tier-3", "15s", "--warning-lead", "5s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    """``jupyter-gpusched serve`` on the demo cluster, in ``state``."""

    def __init__(self, state: Path):
        self.state = state
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.gpu_dir = state / "gpus"
        self.gpu_dir.mkdir(parents=True, exist_ok=True)
        tokens = {t: {"user": u, "admin": u == "admin"} for u, t in TOKENS.items()}
        token_file = state / "tokens.yaml"
        token_file.write_text(yaml.safe_dump({"tokens": tokens}))
        token_file.chmod(0o600)
        (state / "policy.yaml").write_text(yaml.safe_dump(POLICY))
        nodes = ["gpu1", "gpu2"]  # the service samples both (the demo's simulated GPUs)
        args = [
            sys.executable,
            "-m",
            "jupyter_gpusched",
            "serve",
            f"--GPUSchedService.cluster_file={CLUSTER}",
            f"--GPUSchedService.queue_file={QUEUES}",
            f"--GPUSchedService.policy_file={state / 'policy.yaml'}",
            f"--GPUSchedService.db_url=sqlite:///{state / 'gpusched.sqlite'}",
            f"--GPUSchedService.token_file={token_file}",
            f"--GPUSchedService.log_dir={state / 'logs'}",
            f"--GPUSchedService.bind_url={self.url}",
            "--GPUSchedService.poll_interval=0.2",
            "--GPUSchedService.gpu_backend=simulated",
            *[f"--GPUSchedService.local_gpu_nodes={node}" for node in nodes],
            "--GPUSchedService.gpu_sample_interval=1",
            "--GPUSchedService.history_interval=5",
            "--LocalLauncher.run_as_submitting_user=False",
        ]
        env = {**os.environ, "GPUSCHED_SIM_GPU_DIR": str(self.gpu_dir)}
        self.log = (state / "service.log").open("w")
        self.process = subprocess.Popen(args, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_up()

    def wait_up(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the service exited: see {self.state / 'service.log'}")
            try:
                self.call("admin", "GET", "api/me")
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("the service did not answer within a minute")

    def call(self, user: str, method: str, path: str, body=None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Authorization": f"token {TOKENS[user]}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"{}")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


# A training job saves a checkpoint when signalled, and takes its grace period to do so (a
# pre-emption's victim holds its GPUs until the kill, as the replay assumes); with
# --exit-on-signal the jobs die at once instead, and the recorded waits behind victims shorten.
CHECKPOINTING = "trap 'sleep 5; exit 143' TERM; sleep {duration} & wait"
EXITING = "sleep {duration}"


def workload(seconds: float, seed: int, command: str = CHECKPOINTING) -> list[dict]:
    """The seeded submissions: (time, user, request, and for a server its load pattern)."""
    rng = random.Random(seed)
    scale = seconds / 240.0
    items = []
    t = 0.0
    while t < seconds * 0.8:
        t += rng.expovariate(1 / (4.0 * scale))
        user = rng.choice(USERS)
        tier = rng.choices((1, 2, 3), (1, 6, 3))[0]
        gpus = rng.choice((1, 1, 1, 2, 2, 4)) if tier != 1 else 1
        duration = round(rng.uniform(3, 25) * scale, 1)
        request = {
            "command": command.format(duration=duration),
            "gpus": gpus,
            "tier": tier,
            "walltime": math.ceil(duration * 2),
            "name": f"train-{len(items)}",
        }
        items.append({"at": round(t, 2), "user": user, "request": request})
    for n in range(max(3, round(6 * scale))):  # servers: busy, then idle, then maybe busy
        user = USERS[n % len(USERS)]
        at = round(rng.uniform(0, seconds * 0.3), 2)
        busy = round(rng.uniform(5, 25) * scale, 1)
        idle = round(rng.uniform(20, 90) * scale, 1)
        again = rng.random() < 0.4
        lifetime = round(busy + idle + (rng.uniform(10, 30) * scale if again else 0), 1)
        request = {"kind": "notebook", "gpus": rng.choice((1, 1, 2)), "tier": 2}
        server = {"busy": busy, "idle": idle, "again": again, "lifetime": lifetime}
        items.append({"at": at, "user": user, "request": request, "server": server})
    items.sort(key=lambda item: item["at"])
    return items


def run_workload(service: Service, items: list[dict], seconds: float) -> dict:
    """Submit each item at its time; drive the servers' simulated GPU loads; stop each server
    at the end of its lifetime (unless the reaper culled it); wait for the batch jobs."""
    from jupyter_gpusched.backends.gpu.simulated_loads import simulate_load

    start = time.monotonic()
    servers: dict[str, dict] = {}  # job id -> its item, holder process, the load it has
    pending = list(items)
    submitted = []
    while pending or servers:
        now = time.monotonic() - start
        while pending and pending[0]["at"] <= now:
            item = pending.pop(0)
            job = service.call(item["user"], "POST", "api/jobs", item["request"])
            submitted.append(job["id"])
            if "server" in item:
                servers[job["id"]] = {**item, "submitted": now, "load": None, "holder": None}
        for job_id, server in list(servers.items()):
            view = service.call("admin", "GET", f"api/jobs/{job_id}")
            if view["state"] != "running" and view["state"] != "pending":
                _end_holder(server)
                del servers[job_id]  # culled by the reaper (or ended otherwise)
                continue
            if view["state"] != "running":
                continue
            server.setdefault("started", now)
            ran = now - server["started"]
            plan = server["server"]
            if ran >= plan["lifetime"]:
                service.call(server["user"], "DELETE", f"api/jobs/{job_id}")
                _end_holder(server)
                del servers[job_id]
                continue
            busy = ran < plan["busy"] or (plan["again"] and ran >= plan["busy"] + plan["idle"])
            util = 85 if busy else 0
            if server["load"] != util:
                if server["holder"] is None:
                    server["holder"] = subprocess.Popen(["sleep", str(int(seconds * 3))])
                for part in view["allocation"] or ():
                    simulate_load(
                        util,
                        4.0,
                        None,
                        part["gpus"],
                        node=part["node"],
                        pid=server["holder"].pid,
                        state_dir=service.gpu_dir,
                    )
                server["load"] = util
        time.sleep(0.25)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # the batch jobs still queued or running
        if not service.call("admin", "GET", "api/jobs?state=pending&state=running")["jobs"]:
            break
        time.sleep(0.5)
    return {"submitted": len(submitted), "took_s": round(time.monotonic() - start, 1)}


def _end_holder(server: dict) -> None:
    holder = server.get("holder")
    if holder is not None:
        holder.kill()
        holder.wait()
        server["holder"] = None


def cli(*args: str, token: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **({"JUPYTERHUB_API_TOKEN": token} if token else {})}
    return subprocess.run(
        [sys.executable, "-m", "jupyter_gpusched", *args],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=600,
    )


def waits_by_tier(figures: dict) -> dict:
    return {
        tier: {k: figures["wait_s_by_tier"][tier][k] for k in ("mean", "p95")}
        for tier in ("1", "2", "3")
    }


def per_job_waits(jobs_csv: Path) -> dict:
    """How closely the replay's waits follow the recorded ones, job by job: Pearson's r and
    the mean absolute difference (seconds)."""
    import csv

    waits: dict[str, dict[str, float]] = {}
    with jobs_csv.open() as handle:
        for row in csv.DictReader(handle):
            if row["wait_s"] != "":
                waits.setdefault(row["job_id"], {})[row["policy"]] = float(row["wait_s"])
    pairs = [(w["recorded"], w["gpusched"]) for w in waits.values() if len(w) == 2]
    n = len(pairs)
    if n < 2:
        return {"jobs": n, "r": None, "mean_abs_diff_s": None}
    xs, ys = zip(*pairs, strict=True)
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in pairs)
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    r = sxy / math.sqrt(sxx * syy) if sxx and syy else None
    diff = sum(abs(x - y) for x, y in pairs) / n
    return {"jobs": n, "r": None if r is None else round(r, 3), "mean_abs_diff_s": round(diff, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=240.0, help="the workload's length")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default="own-history-out", help="folder for everything")
    parser.add_argument(
        "--exit-on-signal",
        action="store_true",
        help="jobs die at a pre-emption's signal instead of using their grace to checkpoint",
    )
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    service = Service(out)
    try:
        command = EXITING if args.exit_on_signal else CHECKPOINTING
        ran = run_workload(service, workload(args.seconds, args.seed, command), args.seconds)
        trace = out / "trace.csv"
        cli("export-trace", "--url", service.url, "--since", "1d", "--out", str(trace),
            token=TOKENS["admin"])  # fmt: skip
    finally:
        service.stop()
    replay = out / "replay"
    cli("replay", str(trace), "--cluster", str(CLUSTER), "--queues", str(out / "trace-queues.yaml"),
        "--config", str(out / "policy.yaml"), "--policy", "gpusched", "--out", str(replay),
        "--quiet", "--no-report")  # fmt: skip
    figures = json.loads((replay / "metrics.json").read_text())["policies"]
    # current: the settings in force at the export (trace-reaper.json); candidate: WHAT_IF
    what_if = cli("reaper", "what-if", str(trace), *WHAT_IF, "--json")
    result = {
        "seconds": args.seconds,
        "seed": args.seed,
        "jobs_exit_on_signal": args.exit_on_signal,
        **ran,
        "jobs": figures["recorded"]["jobs"],
        "waits": {name: waits_by_tier(f) for name, f in figures.items()},
        "wait_s": {name: f["wait_s"]["mean"] for name, f in figures.items()},
        "per_job_wait": per_job_waits(replay / "jobs.csv"),
        "what_if": json.loads(what_if.stdout),
        "out": str(out),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
