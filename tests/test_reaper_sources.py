"""The idle reaper acts on the samples of node agents and of Prometheus (issue 16, point 2):
the service samples none of its cluster's GPUs itself (``local_gpu_nodes = []``); two real
``jupyter-gpusched node-agent --backend simulated`` processes on this machine (nodes gpu1 and
gpu2 of one cluster file, one load folder) measure them, read either directly
(``GPUSchedService.node_agents``) or through Debian's real ``prometheus`` scraping both every
second (``GPUSchedService.gpu_metrics_url``).

Each test starts an in-process service (``tests/service_helpers.py``) on the module's agents; a
server's GPU load is a child process's (:meth:`Service.load`, in the agents' load folder). The
agents' readings say ``backend="simulated"``: they count because the service runs the simulated
cluster (``gpu_backend = simulated``), and not for a service of a real one. gpu1's agent is the
one stopped (last test).
"""

from __future__ import annotations

import time

import pytest
from node_agents import running_agents, running_prometheus
from service_helpers import start_service, wait_until
from test_reaper_backends import notebook

from jupyter_gpusched.service.gpu_sampling import allocated_gpus

#: idle servers are warned 1.5 s before their 3 s timeout; 2 s without a measurement is unmonitored
FAST = {"timeout_tier_2": 3.0, "warning_lead": 1.5, "unmonitored_after": 2.0}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("agents")
    with running_agents(root, ["gpu1", "gpu2"], gpus=1) as (agents, _):
        yield {"root": root, "agents": agents}


@pytest.fixture(scope="module")
def prometheus(world, tmp_path_factory):
    root = tmp_path_factory.mktemp("prometheus")
    with running_prometheus(root, world["agents"], ports=range(9480, 9490)) as url:
        yield url


def agent_urls(world) -> dict[str, str]:
    return {node: agent.url for node, agent in world["agents"].items()}


async def sampled_service(tmp_path, world, **traits):
    """A service of the agents' cluster that samples no GPU itself, every 0.5 s; ``traits``: its
    sources (and other GPUSchedService traits)."""
    traits.setdefault("gpu_sample_interval", 0.5)
    service = await start_service(
        tmp_path, cluster=world["root"] / "cluster.yaml", queues=None, local_gpu_nodes=[], **traits
    )
    service.load_dir = world["root"] / "loads"  # Service.load: where the agents read loads
    return service


async def reaper_sessions(service) -> dict[str, dict]:
    status, view = await service.client("admin").get("api/reaper")
    assert status == 200, view
    return {s["job_id"]: s for s in view["sessions"]}


async def reaper_events(service, job_id: str) -> list[dict]:
    """The job's reaper-* audit events, newest first."""
    status, events = await service.client("admin").get("api/events", params={"job_id": job_id})
    assert status == 200, events
    return [e for e in events["events"] if e["kind"].startswith("reaper-")]


def node_of(service, job_id: str) -> str:
    ((node, _),) = allocated_gpus(service.live)[job_id]
    return node


async def measured(service, job_id: str, utilization: float, by: str) -> dict:
    """The job's api/reaper session once its last sample, by ``by``, says ``utilization``."""

    async def found():
        session = (await reaper_sessions(service)).get(job_id)
        sample = session and session["last_sample"]
        if sample and sample["utilization"] == utilization and session["measured_by"] == by:
            return session
        return None

    return await wait_until(found, 20, what=f"{job_id} measured at {utilization}% by {by}")


@pytest.mark.parametrize("via", ["node-agent", "prometheus"])
async def test_busy_is_kept_and_idle_culled_on_the_sources_samples(tmp_path, world, request, via):
    """Two servers, one per node: the one whose GPU is loaded (90%, as the agents measure it)
    is kept past its timeout and never warned; the idle one is warned, then culled, with the
    source's samples as the cull's evidence."""
    if via == "node-agent":
        sources = {"node_agents": agent_urls(world)}
    else:
        sources = {"gpu_metrics_url": request.getfixturevalue("prometheus")}
    service = await sampled_service(tmp_path, world, **sources)
    try:
        busy, idle = await notebook(service), await notebook(service)
        assert {node_of(service, busy), node_of(service, idle)} == {"gpu1", "gpu2"}
        service.load(busy, 90)
        by = f"{via} (simulated)"
        session = await measured(service, busy, 90, by)
        assert session["last_sample"]["devices"] == [
            {
                "node": node_of(service, busy),
                "index": 0,
                "utilization": 90,
                "memory_gb": 4,
                "backend": "simulated",
            }
        ]
        assert (await measured(service, idle, 0, by))["unmonitored_since"] is None
        status, _ = await service.client("admin").put("api/reaper", FAST)
        assert status == 200
        await wait_until(lambda: idle not in service.live.engine.running, 30, what="the cull")
        culled = time.time()
        cull, warning = await reaper_events(service, idle)  # newest first
        assert (cull["kind"], warning["kind"]) == ("reaper-cull", "reaper-warning")
        evidence = cull["data"]["samples"][-1]
        assert evidence["measured_by"] == by and evidence["utilization"] == 0
        # the busy server: past its timeout, never warned, still measured busy
        assert busy in service.live.engine.running
        assert await reaper_events(service, busy) == []
        session = service.live.reaper.sessions[busy]
        await wait_until(lambda: session.last_busy > culled, 10, what="busy since")
        assert session.warned is None
        assert (await reaper_sessions(service))[busy]["measured_by"] == by
    finally:
        await service.stop()


async def test_simulated_readings_count_only_on_the_simulated_cluster(tmp_path, world):
    """The same agents' readings (simulated, idle) for two services: one of a real cluster
    (``gpu_backend = nvml``) does not act on them, its server is unmonitored with the reason,
    never warned nor culled, while the simulated cluster's service, its server started later,
    warns and culls its idle one."""
    real = await sampled_service(
        tmp_path / "real", world, gpu_backend="nvml", node_agents=agent_urls(world)
    )
    simulated = await sampled_service(
        tmp_path / "simulated", world, gpu_backend="simulated", node_agents=agent_urls(world)
    )
    try:
        for service in (real, simulated):
            status, _ = await service.client("admin").put("api/reaper", FAST)
            assert status == 200
        untrusted = await notebook(real)
        node = node_of(real, untrusted)
        control = await notebook(simulated)
        await wait_until(lambda: control not in simulated.live.engine.running, 30, what="cull")
        assert [e["kind"] for e in await reaper_events(simulated, control)] == [
            "reaper-cull",
            "reaper-warning",
        ]
        # its server ran longer, on the same readings: not acted on
        why = f"the readings of {node} are simulated on a real cluster"
        events = await reaper_events(real, untrusted)
        assert [e["kind"] for e in events] == ["reaper-unmonitored"]  # no warning, no cull
        (event,) = events
        assert untrusted in real.live.engine.running
        session = (await reaper_sessions(real))[untrusted]
        assert session["unmonitored_reason"] == why, session
        assert session["measured_by"] is None and session["last_sample"] is None
        assert session["warned"] is None
        assert event["data"]["reason"] == why
        # the readings were there: the sampler has the agent's, untrusted
        reading = real.live.reaper.sampler.latest[(node, 0)]
        assert reading.backend == "simulated" and reading.utilization == 0
    finally:
        await real.stop()
        await simulated.stop()


async def test_a_stopped_agent_makes_its_server_unmonitored(tmp_path, world):
    """Two busy servers, one per node, measured by their agents; gpu1's agent stops: its server
    is unmonitored, with the agent's failure as the reason (api/reaper, the audit event
    reaper-unmonitored) and, under the default ``unmonitored: warn``, keeps running; the server
    on gpu2 stays measured. (Last: the module's gpu1 agent stays stopped.)"""
    service = await sampled_service(tmp_path, world, node_agents=agent_urls(world))
    try:
        jobs = [await notebook(service), await notebook(service)]
        by_node = {node_of(service, job_id): job_id for job_id in jobs}
        assert set(by_node) == {"gpu1", "gpu2"}
        lost, kept = by_node["gpu1"], by_node["gpu2"]
        for job_id in jobs:
            service.load(job_id, 80)
            await measured(service, job_id, 80, "node-agent (simulated)")
        status, _ = await service.client("admin").put("api/reaper", FAST)
        assert status == 200
        agent = world["agents"]["gpu1"]
        assert agent.stop() == 0
        stopped = time.time()

        # the audit event comes at the reaper's tick after api/reaper shows the session so
        (event,) = await wait_until(
            lambda: reaper_events(service, lost), 20, what=f"{lost} reported unmonitored"
        )
        session = (await reaper_sessions(service))[lost]
        reason = session["unmonitored_reason"]
        assert session["unmonitored_since"] is not None
        assert reason.startswith("source node-agent failed: ") and agent.url in reason, reason
        assert event["kind"] == "reaper-unmonitored" and event["data"]["reason"] == reason
        assert event["data"]["unmonitored"] == "warn"
        assert lost in service.live.engine.running
        # the other agent's server: measured all along, after the stop too
        await wait_until(
            lambda: service.live.reaper.sessions[kept].last_measured > stopped + 2,
            10,
            what=f"{kept} measured after the stop",
        )
        session = (await reaper_sessions(service))[kept]
        assert session["unmonitored_since"] is None and session["unmonitored_reason"] is None
        assert session["measured_by"] == "node-agent (simulated)"
        assert await reaper_events(service, kept) == []
    finally:
        await service.stop()
