"""The Slurm backend against a real Slurm (``scripts/slurm.sh``: nodes n1 and n2, 4 fake GPUs
each): the service decides, Slurm runs the jobs on the nodes it chose.

- a gang over both nodes runs as one Slurm job on them, each task seeing its GPUs;
- pre-emption delivers the signal: the job's trap writes a checkpoint, the job is requeued and
  resumes from it;
- Slurm drains n2: the engine stops placing there; Slurm downs n2 under a job: it is requeued
  and finishes on n1;
- a placement Slurm refuses comes back with Slurm's message;
- ``kill -9`` of the service while Slurm jobs run: the restarted service re-attaches them, and
  no job is submitted twice;
- the inventory (``nodes: slurm``) and the parsing of Slurm's output, without Slurm too.

The services here run in-process (``tests/service_helpers.py``), except the one killed with
SIGKILL, which is a real ``jupyter-gpusched serve``. Jobs run as root in Slurm
(``SlurmLauncher.run_as_submitting_user = False``): the token file's users need no account.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from service_helpers import (
    ROOT,
    TOKENS,
    JSONClient,
    Service,
    services,
    wait_job,
    wait_log,
    wait_until,
    write_token_file,
    write_yaml,
)
from tornado.httpserver import HTTPServer
from tornado.ioloop import PeriodicCallback
from tornado.testing import bind_unused_port
from traitlets.config import Config

from jupyter_gpusched.backends.local.launcher import Exit, LaunchSpec
from jupyter_gpusched.backends.slurm.ends import exit_for
from jupyter_gpusched.backends.slurm.inventory import SlurmNodeSync, cluster_document, load_cluster
from jupyter_gpusched.backends.slurm.launcher import SlurmLauncher, SlurmRefused
from jupyter_gpusched.backends.slurm.parse import (
    engine_state,
    expand_nodes,
    parse_gres,
    parse_oneliner,
)
from jupyter_gpusched.core import Cluster
from jupyter_gpusched.service import app as service_app
from jupyter_gpusched.service.app import GPUSchedService

QUEUES = {
    "queues": {"team": {"guaranteed": 8, "users": ["alice", "bob"]}},
    "default_queue": "team",
}
#: pre-emption within seconds: tier 3 gets a 10 s grace, deep passes run every second
POLICY = {
    "tiers": {3: {"grace_period": "10s", "minimum_run_time": 0}},
    "backfill": {"interval": "1s"},
}


# -- the service on Slurm, in-process --------------------------------------------------------
async def start_slurm_service(
    tmp_path: Path,
    slurm,
    monkeypatch,
    *,
    cluster: dict | None = None,
    policy: dict | None = POLICY,
    node_sync_interval: float = 0.3,
) -> Service:
    """A service on ``slurm`` with a ``nodes: slurm`` cluster file (or ``cluster``), whose
    poll runs a :class:`SlurmNodeSync` first."""
    # files.load_cluster does not read `nodes: slurm` (yet): the service reads it with ours
    monkeypatch.setattr(service_app, "load_cluster", load_cluster)
    tmp_path.mkdir(parents=True, exist_ok=True)
    config = Config()
    c = config.GPUSchedService
    document = cluster or {"nodes": "slurm", "slurm": {"slurm_conf": slurm.conf}}
    c.cluster_file = str(write_yaml(tmp_path / "cluster.yaml", document))
    c.queue_file = str(write_yaml(tmp_path / "queues.yaml", QUEUES))
    if policy is not None:
        c.policy_file = str(write_yaml(tmp_path / "policy.yaml", policy))
    c.db_url = f"sqlite:///{tmp_path / 'gpusched.sqlite'}"
    c.token_file = str(write_token_file(tmp_path / "tokens.yaml"))
    c.log_dir = str(tmp_path / "logs")
    c.poll_interval = 0.1
    c.cancel_grace = 3.0
    c.launcher_class = SlurmLauncher
    config.SlurmLauncher.slurm_conf = slurm.conf
    config.SlurmLauncher.run_as_submitting_user = False
    config.SlurmLauncher.state_cache = 0.2
    config.SlurmLauncher.kill_wait = 30.0
    sock, port = bind_unused_port()
    c.bind_url = f"http://127.0.0.1:{port}/"
    app = GPUSchedService(config=config)
    app.live = app.build()
    sync = SlurmNodeSync(app.live, interval=node_sync_interval)

    def tick():
        sync.sync()
        app.live.poll()

    server = HTTPServer(app.make_app())
    server.add_sockets([sock])
    poller = PeriodicCallback(tick, 100)
    poller.start()
    service = Service(app, server, port, poller)
    service.pids = list  # no local process groups: Slurm's jobs are cancelled by the fixture
    service.sync = sync
    return service


@pytest.fixture
async def slurm_service(tmp_path, slurm, monkeypatch):
    """``await make(**options)``: a service on the Slurm cluster (stopped after the test)."""
    started: list[Service] = []

    async def make(**options) -> Service:
        service = await start_slurm_service(
            tmp_path / f"service{len(started)}", slurm, monkeypatch, **options
        )
        started.append(service)
        return service

    yield make
    for service in started:
        await service.stop()


async def running_handle(service: Service, client: JSONClient, job_id: str, timeout=30.0):
    """The job's launcher handle once it runs (submitted to Slurm)."""
    await wait_job(client, job_id, "running", timeout)

    def handle():
        extra = service.live.extras.get(job_id)
        return extra.handle if extra is not None else None

    return await wait_until(handle, timeout, what=f"{job_id} to be submitted")


async def events_of(client: JSONClient, job_id: str) -> list[dict]:
    status, body = await client.get("api/events", params={"job_id": job_id, "limit": 100})
    assert status == 200, body
    return list(reversed(body["events"]))  # oldest first


# -- end to end ------------------------------------------------------------------------------
async def test_a_gang_runs_on_the_nodes_the_engine_chose(slurm_service, slurm):
    service = await slurm_service()
    before = set(slurm.jobs())
    alice = service.client("alice")
    # the inventory came from Slurm: two nodes, 4 h100 each, features as labels, one leaf
    status, cluster = await alice.get("api/cluster")
    assert status == 200
    nodes = {n["name"]: n for n in cluster["nodes"]}
    assert sorted(nodes) == ["n1", "n2"]
    assert all(n["gpus"] == 4 and n["gpu_model"] == "h100" for n in nodes.values())
    assert nodes["n1"]["labels"] == {"fast": "true"} and nodes["n1"]["leaf"] == "leaf1"

    command = (
        'echo "task on $SLURMD_NODENAME sees $CUDA_VISIBLE_DEVICES ($GPUSCHED_JOB_ID)"; '
        '"$GPUSCHED_PYTHON" -c "import jupyter_gpusched, os; '
        "print('python on', os.environ['SLURMD_NODENAME'])\""
    )
    status, job = await alice.post("api/jobs", {"gpus": 4, "gpus_per_node": 2, "command": command})
    assert status == 201, job
    done = await wait_job(alice, job["id"], ("completed", "failed"), timeout=60)
    assert done["state"] == "completed", done
    _, events = await alice.get("api/events", params={"job_id": job["id"], "kind": "started"})
    started = events["events"][0]["message"]  # "started on n1 GPU 0,1; n2 GPU 0,1"
    chosen = sorted(part.split()[0] for part in started.removeprefix("started on ").split("; "))
    assert chosen == ["n1", "n2"]

    handle = service.live.store.get_job(job["id"])["handle"]
    assert handle is None  # finished: the handle is dropped; Slurm's record is checked instead
    ours = [j for j, (name, _, _) in slurm.jobs(since=before).items() if name.endswith(job["id"])]
    assert len(ours) == 1
    record = slurm.job(ours[0])
    assert record["JobState"] == "COMPLETED" and record["NumNodes"] == "2"
    assert sorted(expand_nodes(record["NodeList"])) == chosen
    assert "gpu:2" in record.get("TresPerNode", "")
    log = (await alice.get(f"api/jobs/{job['id']}/log"))[1]
    for node in chosen:
        assert f"task on {node} sees 0,1 ({job['id']})" in log, log
        assert f"===== {node}: CUDA_VISIBLE_DEVICES=0,1" in log, log
        assert f"python on {node}" in log, log  # $GPUSCHED_PYTHON: SlurmLauncher.python


async def test_a_cpu_only_job_runs_on_slurm_without_a_gpu(slurm_service, slurm):
    service = await slurm_service()
    before = set(slurm.jobs())
    alice = service.client("alice")
    command = 'echo "cpu task on $SLURMD_NODENAME sees [$CUDA_VISIBLE_DEVICES]"'
    status, job = await alice.post("api/jobs", {"gpus": 0, "cpus": 1, "command": command})
    assert status == 201, job
    done = await wait_job(alice, job["id"], ("completed", "failed"), timeout=60)
    assert done["state"] == "completed", done
    _, events = await alice.get("api/events", params={"job_id": job["id"], "kind": "started"})
    started = re.fullmatch(r"started on (n[12]) no GPU", events["events"][0]["message"])
    assert started, events
    node = started.group(1)
    (ours,) = [j for j, (name, _, _) in slurm.jobs(since=before).items() if job["id"] in name]
    record = slurm.job(ours)
    assert record["JobState"] == "COMPLETED" and "gpu" not in record.get("TresPerNode", "")
    log = (await alice.get(f"api/jobs/{job['id']}/log"))[1]
    assert f"cpu task on {node} sees []" in log, log


async def test_preemption_signals_checkpoints_requeues_and_resumes(slurm_service, tmp_path):
    service = await slurm_service()
    alice, bob = service.client("alice"), service.client("bob")
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    victim_command = (
        'C="$CKPT/$SLURMD_NODENAME"; '
        'if [ -f "$C" ]; then echo "resumed from $(cat "$C") on $SLURMD_NODENAME"; exit 0; fi; '
        'trap \'echo step-42 > "$C"; echo "checkpointed on $SLURMD_NODENAME"; exit 0\' TERM; '
        'echo "working on $SLURMD_NODENAME"; while :; do sleep 0.1; done'
    )
    status, victim = await bob.post(
        "api/jobs",
        {
            "gpus": 8,
            "gpus_per_node": 4,
            "tier": 3,
            "command": victim_command,
            "env": {"CKPT": str(checkpoints)},
        },
    )
    assert status == 201, victim
    await running_handle(service, bob, victim["id"], timeout=60)
    await wait_log(bob, victim["id"], "working on n1", timeout=30)
    await wait_log(bob, victim["id"], "working on n2", timeout=30)

    # a tier-1 job needs 4 of the 8 GPUs: the tier-3 gang is pre-empted
    status, urgent = await alice.post(
        "api/jobs", {"gpus": 4, "tier": 1, "command": "echo urgent on $SLURMD_NODENAME"}
    )
    assert status == 201, urgent
    done = await wait_job(alice, urgent["id"], ("completed", "failed"), timeout=60)
    assert done["state"] == "completed", done
    final = await wait_job(bob, victim["id"], ("completed", "failed"), timeout=60)
    assert final["state"] == "completed" and final["runs"] == 2, final
    assert final["preemptions"] == 1
    kinds = [e["kind"] for e in await events_of(bob, victim["id"])]
    assert kinds[:5] == ["submitted", "started", "preempted", "requeued", "started"], kinds
    log = (await bob.get(f"api/jobs/{victim['id']}/log"))[1]
    for node in ("n1", "n2"):
        assert f"checkpointed on {node}" in log, log
        assert f"resumed from step-42 on {node}" in log, log
        assert (checkpoints / node).read_text().strip() == "step-42"


async def test_slurm_drain_and_down_reach_the_engine(slurm_service, slurm, tmp_path):
    # node states are read every 2 s: the job's NODE_FAIL may be seen first, and must still
    # end in a requeue (the launcher waits for the node sync)
    service = await slurm_service(node_sync_interval=2.0)
    alice, admin = service.client("alice"), service.client("admin")
    before = set(slurm.jobs())

    async def node_state(name):
        _, cluster = await alice.get("api/cluster")
        return {n["name"]: n["state"] for n in cluster["nodes"]}[name]

    slurm.set_node("n2", "drain", "bad fan")
    await wait_until(lambda: _eq(node_state("n2"), "drain"), 10, what="n2 drained")
    _, events = await admin.get("api/events", params={"kind": "node-drain"})
    assert events["events"][0]["actor"] == "slurm", events

    go = tmp_path / "go"  # the first job runs until this file exists
    first_command = f"while [ ! -f {go} ]; do sleep 0.1; done; echo first on $SLURMD_NODENAME"
    second_command = (
        'echo "second, run $GPUSCHED_RUN, on $SLURMD_NODENAME"; '
        'if [ "$GPUSCHED_RUN" = 1 ]; then sleep 120; fi'
    )
    _, first = await alice.post("api/jobs", {"gpus": 4, "command": first_command})
    _, second = await alice.post("api/jobs", {"gpus": 4, "command": second_command})
    view = await wait_job(alice, first["id"], "running")
    assert [p["node"] for p in view["allocation"]] == ["n1"]
    await asyncio.sleep(1.0)
    _, pending = await alice.get(f"api/jobs/{second['id']}")
    assert pending["state"] == "pending", pending  # n2 is free, but drained

    slurm.set_node("n2", "resume")
    view = await wait_job(alice, second["id"], "running", timeout=15)
    assert [p["node"] for p in view["allocation"]] == ["n2"]
    await wait_log(alice, second["id"], "second, run 1, on n2", timeout=30)

    # n2 dies under the second job: requeued; it runs again on n1 once the first is done
    slurm.set_node("n2", "down", "dead disk")
    requeued = await wait_job(alice, second["id"], "pending", timeout=15)
    assert requeued["runs"] == 1 and requeued["reason"]["family"] == "capacity", requeued
    assert await node_state("n2") == "down"
    go.touch()
    final = await wait_job(alice, second["id"], ("completed", "failed"), timeout=60)
    assert final["state"] == "completed" and final["runs"] == 2, final
    await wait_log(alice, second["id"], "second, run 2, on n1")
    kinds = [(e["kind"], e["message"]) for e in await events_of(alice, second["id"])]
    assert ("requeued", "node n2 is down") in kinds, kinds
    assert (await alice.get(f"api/jobs/{first['id']}"))[1]["state"] == "completed"
    # in Slurm: the second job's first run ended with its node, the second ran on n1
    ours = {j: v for j, v in slurm.jobs(since=before).items() if v[0].endswith(second["id"])}
    assert sorted((state, nodes) for _, state, nodes in ours.values()) == [
        ("COMPLETED", "n1"),
        ("NODE_FAIL", "n2"),
    ]

    slurm.set_node("n2", "resume")
    await wait_until(lambda: _eq(node_state("n2"), "up"), 10, what="n2 back")


async def test_a_job_whose_node_goes_down_restarts_at_once_elsewhere(slurm_service, slurm):
    service = await slurm_service(node_sync_interval=0.3)
    alice = service.client("alice")
    command = (
        'echo "run $GPUSCHED_RUN on $SLURMD_NODENAME"; '
        'if [ "$GPUSCHED_RUN" = 1 ]; then sleep 120; fi'
    )
    _, job = await alice.post("api/jobs", {"gpus": 4, "command": command})
    view = await wait_job(alice, job["id"], "running")
    node = view["allocation"][0]["node"]
    await wait_log(alice, job["id"], f"run 1 on {node}", timeout=30)
    slurm.set_node(node, "down", "dead disk")
    final = await wait_job(alice, job["id"], ("completed", "failed"), timeout=60)
    assert final["state"] == "completed" and final["runs"] == 2, final


async def _eq(value, expected):
    return (await value) == expected


async def test_a_placement_slurm_refuses_goes_back_to_pending_and_is_retried(slurm_service, slurm):
    # the cluster file claims 8 GPUs on n1; Slurm knows 4
    cluster = {"nodes": [{"name": "n1", "gpus": 8, "gpu_model": "h100"}]}
    policy = {**POLICY, "launch": {"retry_delay": "1s", "max_retry_delay": "2s"}}
    service = await slurm_service(cluster=cluster, policy=policy)
    alice = service.client("alice")
    _, job = await alice.post("api/jobs", {"gpus": 6, "command": "true"})

    async def refused_twice():
        events = await events_of(alice, job["id"])
        requeued = [e for e in events if e["kind"] == "requeued"]
        return requeued if len(requeued) >= 2 else None

    requeued = await wait_until(refused_twice, 30, what="two refusals")
    for event in requeued:  # never failed: back to pending each time, with Slurm's word
        assert "Slurm refused the placement (n1: 6 GPUs)" in event["message"], event
        assert "Requested node configuration is not available" in event["message"]
    status, view = await alice.get(f"api/jobs/{job['id']}")
    assert view["state"] in ("pending", "running"), view  # between retries, or retrying
    if view["state"] == "pending":
        assert view["reason"]["detail"] == "launch-refused", view
        assert "Slurm refused the placement" in view["reason"]["message"]
    assert view["runs"] >= 2
    status, view = await alice.delete(f"api/jobs/{job['id']}")
    assert status == 200, view
    final = await wait_job(alice, job["id"], "cancelled", timeout=10)
    assert final["state"] == "cancelled"


# -- kill -9 and restart: a real `jupyter-gpusched serve` ------------------------------------
def _free_port() -> int:
    sock, port = bind_unused_port()
    sock.close()
    return port


async def test_a_killed_service_reattaches_its_slurm_jobs(slurm, tmp_path):
    cluster = cluster_document({"nodes": "slurm", "slurm": {"slurm_conf": slurm.conf}})
    Cluster.from_dict(cluster)
    db = tmp_path / "gpusched.sqlite"
    port = _free_port()
    argv = [
        sys.executable,
        "-m",
        "jupyter_gpusched",
        "serve",
        f"--cluster={write_yaml(tmp_path / 'cluster.yaml', cluster)}",
        f"--queues={write_yaml(tmp_path / 'queues.yaml', QUEUES)}",
        f"--token-file={write_token_file(tmp_path / 'tokens.yaml')}",
        f"--db=sqlite:///{db}",
        f"--log-dir={tmp_path / 'logs'}",
        f"--bind-url=http://127.0.0.1:{port}/",
        "--GPUSchedService.poll_interval=0.1",
        "--GPUSchedService.launcher_class=jupyter_gpusched.backends.slurm.launcher.SlurmLauncher",
        f"--SlurmLauncher.slurm_conf={slurm.conf}",
        "--SlurmLauncher.run_as_submitting_user=False",
    ]
    alice = JSONClient(f"http://127.0.0.1:{port}/", TOKENS["alice"])
    processes: list[subprocess.Popen] = []

    async def start():
        with open(tmp_path / f"serve-{len(processes)}.log", "wb") as output:
            processes.append(
                subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, cwd=ROOT)
            )

        async def up():
            try:
                return (await alice.get("api/queue", timeout=2))[0] == 200
            except (ConnectionError, OSError):
                assert processes[-1].poll() is None, (tmp_path / "serve-0.log").read_text()
                return False

        await wait_until(up, 30, interval=0.1, what="the service to answer")

    def handles() -> dict[str, dict]:
        with sqlite3.connect(db) as conn:
            rows = conn.execute("SELECT id, handle FROM jobs WHERE handle IS NOT NULL").fetchall()
        return {job: json.loads(handle) for job, handle in rows}

    before = set(slurm.jobs())
    try:
        await start()
        _, short = await alice.post("api/jobs", {"gpus": 4, "command": "sleep 2; echo short"})
        _, long = await alice.post("api/jobs", {"gpus": 4, "command": "sleep 12; echo long"})
        await wait_job(alice, short["id"], "running", timeout=30)
        await wait_job(alice, long["id"], "running", timeout=30)
        await wait_until(lambda: len(handles()) == 2, 30, what="both jobs submitted")
        slurm_ids = {job: h["slurm_job_id"] for job, h in handles().items()}

        processes[-1].send_signal(signal.SIGKILL)
        processes[-1].wait()

        # the short one ends while the service is down
        def short_done():
            return slurm.jobs()[slurm_ids[short["id"]]][1] == "COMPLETED"

        await wait_until(short_done, 30, what="the short job to end in Slurm")
        assert slurm.jobs()[slurm_ids[long["id"]]][1] == "RUNNING"

        await start()
        ended = await wait_job(alice, short["id"], ("completed", "failed"), timeout=15)
        assert ended["state"] == "completed", ended
        assert "after a restart" in ended["message"]
        view = await wait_job(alice, long["id"], "running", timeout=5)
        assert view["runs"] == 1
        assert handles()[long["id"]]["slurm_job_id"] == slurm_ids[long["id"]]
        final = await wait_job(alice, long["id"], ("completed", "failed"), timeout=30)
        assert final["state"] == "completed" and final["runs"] == 1, final

        # none duplicated: exactly one Slurm job per service job
        new = {j: name for j, (name, _, _) in slurm.jobs(since=before).items()}
        assert sorted(new.values()) == sorted(f"gpusched-{j}" for j in (short["id"], long["id"]))
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait()


# -- the launcher on its own -----------------------------------------------------------------
async def test_launcher_gang_of_uneven_shares_signal_and_stop(slurm, tmp_path):
    launcher = SlurmLauncher(slurm_conf=slurm.conf, run_as_submitting_user=False, state_cache=0)

    def spec(job_id, command, nodes):
        return LaunchSpec(
            job_id=job_id,
            user="gpusched-test",  # any hub user but root: jobs run as the service's account
            command=command,
            notebook=None,
            gpus=nodes[0][1],
            env={"GREETING": "it's a b,c"},
            cwd=str(tmp_path),
            log_dir=str(tmp_path / "logs"),
            nodes=nodes,
        )

    async def ended(handle, timeout=30.0):
        deadline = time.monotonic() + timeout
        while (exit := launcher.poll(handle)) is None:
            assert time.monotonic() < deadline, "the job did not end"
            await asyncio.sleep(0.1)
        return exit

    # 3 GPUs on n1 and 1 on n2: a heterogeneous Slurm job
    uneven = launcher.start(
        spec("j-uneven", 'echo "$GREETING from $SLURMD_NODENAME"', [("n1", [0, 1, 2]), ("n2", [3])])
    )
    assert launcher.alive(uneven)
    exit = await ended(uneven)
    assert exit.outcome == "completed", exit
    log = Path(launcher.log_path(uneven)).read_text()
    assert "===== n1: CUDA_VISIBLE_DEVICES=0,1,2" in log, log
    assert "===== n2: CUDA_VISIBLE_DEVICES=0" in log, log
    assert "it's a b,c from n2" in log
    assert not launcher.alive(uneven)
    # a task's exit status is the job's (the other tasks are then killed: --kill-on-bad-exit)
    failing = launcher.start(spec("j-fails", "exit 3", [("n1", [0])]))
    assert await ended(failing) == Exit(3, "failed", "exit code 3")

    # stop: the signal first (the trap runs), then scancel for one that ignores it
    polite = "trap 'echo got TERM; exit 0' TERM; echo ready; while :; do sleep 0.1; done"
    trapped = launcher.start(spec("j-trap", polite, [("n1", [0])]))
    await wait_until(lambda: "ready" in Path(trapped["log"]).read_text(), 30)
    exit = await launcher.stop(trapped, "SIGTERM", 10)
    assert exit.outcome == "completed", exit
    assert "got TERM" in Path(trapped["log"]).read_text()
    stubborn = launcher.start(
        spec("j-stubborn", "trap '' TERM; echo ready; while :; do sleep 0.1; done", [("n2", [0])])
    )
    await wait_until(lambda: "ready" in Path(stubborn["log"]).read_text(), 30)
    started = time.monotonic()
    exit = await launcher.stop(stubborn, "SIGTERM", 1)
    assert exit.outcome == "killed" and "cancelled" in exit.message, exit
    assert time.monotonic() - started < 20
    assert not launcher.alive(stubborn)

    with pytest.raises(SlurmRefused, match="Invalid node name specified"):
        launcher.start(spec("j-nowhere", "true", [("n9", [0])]))


@pytest.mark.skipif(os.geteuid() != 0, reason="submitting as another user needs root")
async def test_launcher_submits_as_the_hub_user(slurm):
    """As root, sbatch runs as the job's user: the Slurm job is theirs, and so is its log."""
    launcher = SlurmLauncher(slurm_conf=slurm.conf, state_cache=0)
    logs = Path(slurm.directory) / "logs-nobody"
    logs.mkdir(mode=0o755)
    handle = launcher.start(
        LaunchSpec(
            job_id="j-nobody",
            user="nobody",
            command='echo "I am $(id -un) in $(pwd)"',
            notebook=None,
            gpus=[0],
            env={},
            cwd=None,
            log_dir=str(logs),
            nodes=[("n2", [0])],
        )
    )
    assert handle["user"] == "nobody"
    assert slurm.job(handle["slurm_job_id"])["UserId"].startswith("nobody(")
    deadline = time.monotonic() + 30
    while (exit := launcher.poll(handle)) is None:
        assert time.monotonic() < deadline, "the job did not end"
        await asyncio.sleep(0.1)
    assert exit.outcome == "completed", exit
    log = Path(handle["log"])
    assert "I am nobody in /" in log.read_text()
    assert log.stat().st_uid == pwd.getpwnam("nobody").pw_uid


# -- without Slurm: parsing ------------------------------------------------------------------
def test_parse_scontrol_oneliner():
    line = (
        "NodeName=gpu7 Arch=x86_64 CPUTot=64 AvailableFeatures=ib,zone=a Gres=gpu:a100:8(S:0-1)"
        " OS=Linux 6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01) "
        "RealMemory=515000 State=MIXED+DRAIN Reason=bad fan [root@2024-05-01T10:00:00]"
    )
    fields = parse_oneliner(line)
    assert fields["OS"].startswith("Linux 6.1.0-18-amd64 #1 SMP") and fields["CPUTot"] == "64"
    assert fields["Reason"] == "bad fan [root@2024-05-01T10:00:00]"
    assert fields["State"] == "MIXED+DRAIN"


def test_parse_gres_and_host_lists():
    assert parse_gres("gpu:a100:8(S:0-1)") == {"a100": 8}
    assert parse_gres("gpu:h100:4(S:0),gpu:2,shard:8,mps:400") == {"h100": 4, "": 2}
    assert parse_gres("(null)") == {}
    assert expand_nodes("n[1-3],gpu[07-08],x") == ["n1", "n2", "n3", "gpu07", "gpu08", "x"]


@pytest.mark.parametrize(
    ("state", "engine"),
    [
        ("IDLE", "up"),
        ("MIXED", "up"),
        ("ALLOCATED+COMPLETING", "up"),
        ("IDLE+NOT_RESPONDING", "up"),
        ("IDLE+POWERED_DOWN", "up"),
        ("IDLE+DRAIN", "drain"),
        ("MIXED+DRAIN", "drain"),
        ("ALLOCATED+DRAIN+COMPLETING", "drain"),
        ("IDLE+FAIL", "drain"),
        ("IDLE+REBOOT_REQUESTED", "drain"),
        ("DOWN", "down"),
        ("DOWN+DRAIN", "down"),
        ("DOWN*+NOT_RESPONDING", "down"),
        ("FUTURE", "down"),
        ("UNKNOWN", None),
    ],
)
def test_slurm_node_states_map_to_the_engine(state, engine):
    assert engine_state(state) == engine


@pytest.mark.parametrize(
    ("state", "code", "outcome", "exit_code"),
    [
        ("COMPLETED", "0:0", "completed", 0),
        ("FAILED", "3:0", "failed", 3),
        ("FAILED", "0:9", "killed", None),
        ("CANCELLED", "0:15", "killed", None),
        ("TIMEOUT", "0:1", "killed", None),
        ("OUT_OF_MEMORY", "0:125", "failed", None),
        ("NODE_FAIL", "0:0", "lost", None),
        ("PREEMPTED", "0:15", "killed", None),
    ],
)
def test_slurm_job_ends_map_to_exits(state, code, outcome, exit_code):
    exit = exit_for(state, code)
    assert (exit.outcome, exit.code) == (outcome, exit_code)


def test_cluster_document_from_a_fake_scontrol(tmp_path, monkeypatch):
    """``nodes: slurm`` with a partition, a node without GPUs, and a two-level topology."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    nodes = "\n".join(
        [
            "NodeName=a1 CPUTot=32 AvailableFeatures=ib Gres=gpu:l40s:4 RealMemory=262144 "
            "State=IDLE Partitions=gpu,all",
            "NodeName=a2 CPUTot=32 AvailableFeatures=(null) Gres=gpu:4 RealMemory=262144 "
            "State=IDLE+DRAIN Partitions=gpu Reason=fan",
            "NodeName=b1 CPUTot=32 AvailableFeatures=(null) Gres=gpu:h100:8 RealMemory=1 "
            "State=DOWN Partitions=gpu",
            "NodeName=c1 CPUTot=8 Gres=(null) State=IDLE Partitions=gpu",
            "NodeName=d1 CPUTot=8 Gres=gpu:a10:1 State=IDLE Partitions=other",
        ]
    )
    topology = "\n".join(
        [
            "SwitchName=la Level=0 LinkSpeed=1 Nodes=a[1-2]",
            "SwitchName=lb Level=0 LinkSpeed=1 Nodes=b1",
            "SwitchName=top Level=1 LinkSpeed=1 Switches=la,lb",
        ]
    )
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(
        "#!/bin/sh\n"
        f'case "$2" in node) cat <<"EOF"\n{nodes}\nEOF\n;; topology) cat <<"EOF"\n'
        f"{topology}\nEOF\n;; esac\n"
    )
    scontrol.chmod(0o755)
    document = cluster_document(
        {"nodes": "slurm", "slurm": {"partition": "gpu", "gpu_model": "L40S", "bin_dir": bin_dir}}
    )
    by_name = {n["name"]: n for n in document["nodes"]}
    assert sorted(by_name) == ["a1", "a2", "b1"]  # c1 has no GPUs, d1 is in another partition
    assert by_name["a1"]["gpu_model"] == "l40s" and by_name["a1"]["labels"] == {"ib": "true"}
    assert by_name["a2"]["gpu_model"] == "L40S" and by_name["a2"]["state"] == "drain"
    assert by_name["b1"]["state"] == "down" and "memory_gb" not in by_name["b1"]
    assert by_name["a1"]["memory_gb"] == 256 and by_name["a1"]["cpus"] == 32
    assert document["switches"] == {"top": ["la", "lb"]}
    cluster = Cluster.from_dict(document)
    assert cluster.by_name["b1"].spine == "top" and cluster.by_name["a2"].leaf == "la"

    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"nodes": "slurm", "slurm": {"bin_dir": str(bin_dir)}}))
    assert len(load_cluster(path).nodes) == 4  # every partition
    path.write_text(yaml.safe_dump({"nodes": "slurm", "slurm": {"colour": "red"}}))
    with pytest.raises(Exception, match="unknown option 'colour'"):
        load_cluster(path)
    assert os.access(scontrol, os.X_OK)


async def test_node_sync_follows_slurm_but_never_undoes_an_admin(tmp_path):
    """SlurmNodeSync against a Slurm that is only a dict of node states."""

    class FakeSlurm:
        states: dict = {}  # noqa: RUF012

        def node_states(self):
            return dict(self.states)

    slurm = FakeSlurm()
    async with services(tmp_path) as make:
        service = await make()
        live, admin = service.live, service.client("admin")
        sync = SlurmNodeSync(live, interval=0, launcher=slurm)
        slurm.states = {"gpu1": ("up", ""), "gpu2": ("drain", "fan"), "l40s1": ("down", "psu")}
        assert sorted(sync.sync()) == [("gpu2", "drain"), ("l40s1", "down")]
        assert [live.node_state(n) for n in ("gpu1", "gpu2", "l40s1")] == ["up", "drain", "down"]
        assert sync.sync() == []  # nothing new
        # an admin drains gpu1 through the API; Slurm drains it too, then resumes it
        assert (await admin.post("api/nodes/gpu1/drain"))[0] == 200
        slurm.states["gpu1"] = ("drain", "")
        assert sync.sync() == []
        slurm.states["gpu1"] = ("up", "")
        assert sync.sync() == [] and live.node_state("gpu1") == "drain"
        # Slurm downs gpu2, which it had drained; an unknown state changes nothing
        slurm.states["gpu2"] = ("down", "dead")
        slurm.states["l40s2"] = (None, "")
        assert sync.sync() == [("gpu2", "down")]
        # a new sync (after a restart) still knows which nodes Slurm took out
        again = SlurmNodeSync(live, interval=0, launcher=slurm)
        slurm.states.update(gpu2=("up", ""), l40s1=("up", ""))
        assert sorted(again.sync()) == [("gpu2", "resume"), ("l40s1", "resume")]
        assert [live.node_state(n) for n in ("gpu1", "gpu2", "l40s1")] == ["drain", "up", "up"]
        _, events = await admin.get("api/events", params={"kind": "node-resume"})
        assert {e["actor"] for e in events["events"]} == {"slurm"}
        # Slurm nodes the cluster file does not have are ignored
        slurm.states["elsewhere"] = ("down", "")
        assert again.sync() == []
