"""``jupyter-gpusched serve`` as a real process on SQLite: killed with SIGKILL and started again
on the same database, it finds every job where it was; running jobs keep their processes and
their GPUs; a job that ended while it was down is finished from its exit record. A bad file
stops it at start-up with exit code 2 and a message that says where."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from service_helpers import (
    CLUSTER,
    ROOT,
    TOKENS,
    JSONClient,
    process_gone,
    wait_job,
    wait_until,
    write_token_file,
)
from tornado.testing import bind_unused_port


def free_port() -> int:
    sock, port = bind_unused_port()
    sock.close()
    return port


class Server:
    """One ``jupyter-gpusched serve`` process; ``start`` again after ``kill`` for a restart."""

    def __init__(self, tmp_path: Path, **options: str):
        """``options``: command-line options (``cluster``, ``queues``, ...) to add or replace."""
        self.tmp_path = tmp_path
        self.db = tmp_path / "gpusched.sqlite"
        self.tokens = write_token_file(tmp_path / "tokens.yaml")
        self.options = {
            "cluster": str(CLUSTER),
            "token-file": str(self.tokens),
            "db": f"sqlite:///{self.db}",
            "log-dir": str(tmp_path / "logs"),
            "GPUSchedService.poll_interval": "0.1",
            "GPUSchedService.cancel_grace": "1",
            "LocalLauncher.run_as_submitting_user": "False",
            **options,
        }
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"

    def argv(self, port: int) -> list[str]:
        options = {**self.options, "bind-url": f"http://127.0.0.1:{port}/"}
        return [
            sys.executable,
            "-m",
            "jupyter_gpusched",
            "serve",
            *(f"--{name}={value}" for name, value in options.items()),
        ]

    async def start(self) -> None:
        """Start (again: on the same port and database) and wait until it answers."""
        port = self.port
        self.starts += 1
        output = open(self.tmp_path / f"serve-{self.starts}.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            self.argv(port), stdout=output, stderr=subprocess.STDOUT, cwd=ROOT
        )
        output.close()

        async def up():
            if self.process.poll() is not None:
                raise AssertionError(f"serve exited with {self.process.returncode}: {self.log()}")
            try:
                return (await self.client(None).get("api/openapi.json"))[0] == 200
            except ConnectionError:
                return False

        await wait_until(up, 60, 0.1, "the service to answer")

    def client(self, user: str | None) -> JSONClient:
        return JSONClient(self.url, TOKENS[user] if user else None)

    def kill(self) -> None:
        """SIGKILL: no clean-up at all."""
        self.process.kill()
        self.process.wait(10)

    def log(self) -> str:
        return (self.tmp_path / f"serve-{self.starts}.log").read_text(errors="replace")

    def handles(self) -> dict[str, dict]:
        """job id -> the launcher's handle, read from the database."""
        with contextlib.closing(sqlite3.connect(self.db)) as db:
            rows = db.execute("SELECT id, handle FROM jobs WHERE handle IS NOT NULL").fetchall()
        return {job_id: json.loads(handle) for job_id, handle in rows}


@pytest.fixture
async def server(tmp_path):
    server = Server(tmp_path)
    yield server
    if server.process is not None and server.process.poll() is None:
        server.kill()
    for handle in server.handles().values():  # whatever the jobs left running
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if not process_gone(handle["pid"]):
                os.killpg(handle["pgid"], signal.SIGKILL)


async def snapshot(server: Server) -> dict:
    admin = server.client("admin")
    status, jobs = await admin.get("api/jobs", params={"limit": 1000})
    assert status == 200, jobs
    _, queue = await admin.get("api/queue")
    _, cluster = await admin.get("api/cluster")
    fields = ("state", "user", "gpus", "tier", "held", "priority", "runs", "start_time", "command")
    return {
        "jobs": {job["id"]: {key: job[key] for key in fields} for job in jobs["jobs"]},
        "order": [entry["id"] for entry in queue["jobs"]],
        "held": [entry["id"] for entry in queue["held"]],
        "gpus": {
            (node["name"], gpu["index"]): [holder["job"] for holder in gpu["jobs"]]
            for node in cluster["nodes"]
            for gpu in node["gpu_list"]
        },
        "nodes": {node["name"]: (node["state"], node["maintenance"]) for node in cluster["nodes"]},
    }


def run_headers(log: str, job_id: str) -> list[str]:
    """The lines the launcher writes at the start of each run of the job."""
    return [
        line
        for line in log.splitlines()
        if line.startswith("=====") and f"job {job_id} " in line and "CUDA_VISIBLE_DEVICES" in line
    ]


def log_of(server: Server, job_id: str, user: str) -> str:
    return (server.tmp_path / "logs" / user / f"{job_id}.log").read_text()


async def test_a_killed_service_finds_its_jobs_again(server, tmp_path):
    await server.start()
    alice, bob, admin = (server.client(u) for u in ("alice", "bob", "admin"))
    go = tmp_path / "go"
    waiter = f"while [ ! -e {go} ]; do sleep 0.1; done; echo finishing; exit 0"

    async def submit(client, body):
        status, job = await client.post("api/jobs", body)
        assert status == 201, job
        return job["id"]

    # the whole cluster busy: 8 + 8 H100, 4 + 4 L40S
    running = {
        "steady": await submit(alice, {"gpus": 8, "gpu_model": "H100", "command": "sleep 60"}),
        "killed": await submit(bob, {"gpus": 8, "gpu_model": "H100", "command": "sleep 60"}),
        "finishes": await submit(alice, {"gpus": 4, "gpu_model": "L40S", "command": waiter}),
        "other": await submit(bob, {"gpus": 4, "gpu_model": "L40S", "command": "sleep 60"}),
    }
    pending = []
    for i in range(96):
        body = {"gpus": 1 + i % 8, "tier": 2 + i % 2, "command": "sleep 30"}
        if i % 7 == 0:
            body["gpu_model"] = "H100"
        if i in (10, 50):
            body["held"] = True
        pending.append(await submit(alice if i % 3 else bob, body))
    status, _ = await admin.put(f"api/jobs/{pending[80]}/priority", {"priority": 5})
    assert status == 200
    assert (await admin.post("api/nodes/l40s2/drain"))[0] == 200  # it keeps its running job
    window = {"start": "2099-01-01T00:00:00Z"}
    assert (await admin.put("api/nodes/gpu1/maintenance", window))[0] == 200
    before = await snapshot(server)
    assert before["nodes"]["l40s2"] == ("drain", None)
    assert before["nodes"]["gpu1"] == ("up", 4070908800.0)
    assert len(before["jobs"]) == 100
    assert [before["jobs"][j]["state"] for j in running.values()] == ["running"] * 4
    assert {before["jobs"][j]["state"] for j in pending} == {"pending"}
    assert before["order"][0] == pending[80]  # the priority override goes first
    assert len(before["order"]) == 94 and before["held"] == [pending[10], pending[50]]
    handles = server.handles()
    assert set(handles) == set(running.values())
    pids = {name: handles[job_id]["pid"] for name, job_id in running.items()}

    # 1. kill -9 the service and start it again: everything is where it was
    server.kill()
    assert not any(process_gone(pid) for pid in pids.values())
    await server.start()
    after = await snapshot(server)
    assert after == before
    assert server.handles() == handles  # the same processes, not relaunched
    for name, job_id in running.items():
        assert not process_gone(pids[name]), name
        user = "alice" if name in ("steady", "finishes") else "bob"
        assert len(run_headers(log_of(server, job_id, user), job_id)) == 1
    # its GPUs are still held: with the cluster full, a new job waits
    status, extra = await alice.post("api/jobs", {"gpus": 1, "command": "true"})
    assert (status, extra["state"]) == (201, "pending"), extra
    assert (await alice.delete(f"api/jobs/{extra['id']}"))[0] == 200

    # 2. while it is down, one job is killed and another finishes
    server.kill()
    os.killpg(handles[running["killed"]]["pgid"], signal.SIGKILL)
    go.touch()
    for name in ("killed", "finishes"):
        await wait_until(lambda name=name: process_gone(pids[name]), 10, what=name)
    await server.start()
    finished = await wait_job(alice, running["finishes"], ("completed", "failed"))
    assert (finished["state"], finished["exit_code"]) == ("completed", 0), finished
    assert "after a restart" in finished["message"]
    killed = await wait_job(bob, running["killed"], ("completed", "failed"))
    assert killed["state"] == "failed" and killed["exit_code"] is None, killed
    assert "after a restart" in killed["message"]
    _, events = await admin.get("api/events", params={"job_id": running["killed"]})
    assert events["events"][0]["kind"] == "failed"
    assert events["events"][0]["message"] == killed["message"]
    steady = await wait_job(alice, running["steady"], "running")
    assert steady["start_time"] == before["jobs"][running["steady"]]["start_time"]
    assert not process_gone(pids["steady"])
    # the freed GPUs go to the queue; the steady job keeps its own

    async def busy():
        _, cluster = await admin.get("api/cluster")
        return cluster if cluster["allocated_gpus"] > 8 + 4 else None

    cluster = await wait_until(busy, 10, what="jobs from the queue to start")
    holders = {
        (node["name"], gpu["index"]): [h["job"] for h in gpu["jobs"]]
        for node in cluster["nodes"]
        for gpu in node["gpu_list"]
    }
    steady_gpus = [gpu for gpu, jobs in before["gpus"].items() if running["steady"] in jobs]
    assert len(steady_gpus) == 8
    assert all(holders[gpu] == [running["steady"]] for gpu in steady_gpus)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


QUEUE_WITH_AN_ERROR = """\
queues:
  team:
    guaranteed: 4
    users: [alice]
  small:
    guaranteed: 0
    limit: -3
"""


@pytest.mark.parametrize(
    ("option", "name", "text", "where", "field"),
    [
        pytest.param("queues", "queues.yaml", QUEUE_WITH_AN_ERROR, ":7", "limit", id="queue-limit"),
        pytest.param(
            "queues", "queues.yaml", "queues:\n  team: {guaranteed: [}\n", ":2", None, id="yaml"
        ),
        pytest.param(
            "cluster",
            "cluster.yaml",
            "nodes:\n  - {name: n1, gpus: 8}\n  - {name: n2, gpus: -8}\n",
            ":3",
            "gpus",
            id="cluster-gpus",
        ),
        pytest.param(
            "policy-file",
            "policy.yaml",
            "# policy\npreemption_signal: SIGFOO\n",
            ":2",
            None,
            id="policy-signal",
        ),
        pytest.param(
            "policy-file",
            "policy.yaml",
            "walltime:\n  batch: 1h\ncolour: red\n",
            ":3",
            "colour",
            id="policy-section",
        ),
        pytest.param(
            "policy-file",
            "policy.yaml",
            "backfill:\n  interval: 30\n  depth: -1\n",
            ":3",
            "backfill.depth",
            id="policy-field-line",
        ),
        pytest.param(
            "queues",
            "queues.yaml",
            f"queues:\n  team:\n    limit: 1{'0' * 400}\n",
            ":3",
            "limit",
            id="queue-huge-number",
        ),
        pytest.param(
            "policy-file",
            "policy.yaml",
            "tiers: 7\n",
            ":1",
            "tiers",
            id="policy-tiers-scalar",
        ),
        pytest.param(
            "policy-file",
            "policy.yaml",
            "reaper:\n  timeout_tier_2: 1h\n  timout_tier_3: 30m\n",
            ":3",
            "reaper.timout_tier_3",
            id="policy-reaper-key",
        ),
        pytest.param(
            "policy-file",
            "policy.yaml",
            "walltime:\n  batch: 1h\nreaper:\n  enabled: true\n  timeout_tier_2: soon\n",
            ":5",
            "reaper.timeout_tier_2",
            id="policy-reaper-value",
        ),
    ],
)
def test_a_bad_file_stops_the_service_before_it_listens(tmp_path, option, name, text, where, field):
    path = write(tmp_path / name, text)
    sock, port = bind_unused_port()  # held: a service that tried to listen would fail otherwise
    with contextlib.closing(sock):
        server = Server(tmp_path, **{option: str(path)})
        server.port = port
        proc = subprocess.run(server.argv(port), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    message = proc.stderr
    assert f"{path}{where}" in message, message
    if field is not None:
        assert f"field '{field}'" in message, message
    assert "Traceback" not in message
    assert not server.db.exists()  # nothing opened


def test_a_bad_token_file_stops_the_service_with_exit_code_2(tmp_path):
    server = Server(tmp_path)
    server.tokens.chmod(0o644)
    sock, port = bind_unused_port()
    with contextlib.closing(sock):
        proc = subprocess.run(server.argv(port), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "chmod 600" in proc.stderr and "Traceback" not in proc.stderr


async def test_a_cancel_or_preemption_cut_short_by_a_crash_is_finished_after_restart(tmp_path):
    """The service records when it starts stopping a job: after kill -9 in the grace period,
    a cancelled job is finished as cancelled (its processes killed), and a pre-empted batch
    job that left meanwhile is requeued, not marked failed."""
    policy = write(tmp_path / "policy.yaml", "tiers:\n  3: {grace_period: 60s}\n")
    server = Server(tmp_path, **{"policy-file": str(policy), "GPUSchedService.cancel_grace": "60"})
    try:
        await server.start()
        alice, bob = server.client("alice"), server.client("bob")
        stubborn = "trap '' TERM; echo ready; sleep 60"
        polite = "trap 'exit 0' TERM; echo ready; sleep 60 & wait $!"

        async def submit(client, body):
            status, job = await client.post("api/jobs", body)
            assert status == 201, job
            return job["id"]

        cancelled = await submit(alice, {"gpus": 4, "gpu_model": "L40S", "command": stubborn})
        victim = await submit(bob, {"gpus": 16, "gpu_model": "H100", "tier": 3, "command": polite})
        for job_id, user in ((cancelled, "alice"), (victim, "bob")):  # its traps are set

            async def ready(job_id=job_id, user=user):
                return "ready" in log_of(server, job_id, user)

            await wait_until(ready, 10, 0.1, f"{job_id} ready")
        assert (await alice.delete(f"api/jobs/{cancelled}"))[0] == 200  # it ignores TERM
        urgent = {"gpus": 8, "gpu_model": "H100", "tier": 1, "command": "sleep 60"}
        await submit(alice, urgent)  # pre-empts the victim, which leaves at once
        handles = server.handles()
        await wait_until(lambda: process_gone(handles[victim]["pid"]), 10, 0.1, "victim gone")
        server.kill()
        assert not process_gone(handles[cancelled]["pid"])  # the cancel was cut short
        await server.start()
        _, job = await alice.get(f"api/jobs/{cancelled}")
        assert job["state"] == "cancelled", job
        await wait_until(lambda: process_gone(handles[cancelled]["pid"]), 10, 0.1, "killed")
        _, job = await bob.get(f"api/jobs/{victim}")
        assert job["state"] in ("pending", "running") and job["preemptions"] == 1, job
    finally:
        if server.process is not None and server.process.poll() is None:
            server.kill()
        for handle in server.handles().values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(handle["pgid"], signal.SIGKILL)


async def test_a_cpu_only_job_keeps_no_gpu_after_a_restart(server):
    """A running CPU-only job is restored on its node without any GPU: none of the node's GPUs
    counts as taken or shared by it, so a share of a GPU still lands on a real GPU."""
    await server.start()
    alice = server.client("alice")
    status, job = await alice.post("api/jobs", {"gpus": 0, "cpus": 2, "command": "sleep 60"})
    assert status == 201 and job["state"] == "running", job
    (part,) = job["allocation"]
    assert part["gpus"] == []
    server.kill()
    await server.start()
    restored = await wait_job(alice, job["id"], "running")
    assert restored["allocation"] == job["allocation"]
    assert restored["start_time"] == job["start_time"]
    _, cluster = await alice.get("api/cluster")
    assert cluster["allocated_gpus"] == 0
    node = next(n for n in cluster["nodes"] if n["name"] == part["node"])
    assert all(gpu["jobs"] == [] for gpu in node["gpu_list"]), node
    status, share = await alice.post(
        "api/jobs", {"gpus": 1, "gpu_fraction": 0.5, "command": "sleep 60"}
    )
    assert status == 201 and share["state"] == "running", share
    assert len(share["allocation"][0]["gpus"]) == 1, share
