"""The reaper's measurements are the service's own (issue 16, point 2): the GPU sampler reads its
sources for the nodes of running notebook servers and maps the readings to the GPUs the engine
allocated; untrusted backends and failing sources leave a server without measurements, which
``decide`` handles by the setting ``unmonitored`` (warn, cull, keep) once it has lasted
``unmonitored_after``.

The sampler runs in an in-process service (``tests/service_helpers.py``) over a source that
stands for node agents (``ReadingSource``, the seam service/gpu_sources.py implements):
this machine has no NVML, and the readings must say ``nvml`` to count on a real cluster."""

from __future__ import annotations

import time

import pytest
from service_helpers import start_service, wait_until
from test_reaper import NOW, session, settings

from jupyter_gpusched.service.gpu_sampling import (
    GPUReading,
    ReadingSource,
    SourceError,
    allocated_gpus,
)
from jupyter_gpusched.service.reaper import Cull, Unmonitored, Warn, decide
from jupyter_gpusched.service.reaper_measure import take_readings

CLUSTER = {
    "nodes": [
        {"name": "real", "gpus": 4, "gpu_model": "H100"},
        {"name": "sim", "gpus": 4, "gpu_model": "H100"},
        {"name": "down", "gpus": 4, "gpu_model": "H100"},
    ]
}


def util_of(node: str, index: int) -> float:
    """A figure that names its GPU: readings mapped to the wrong GPU show it."""
    return {"real": 10.0, "sim": 50.0, "down": 70.0}[node] + index


class AgentLike(ReadingSource):
    """Readings of ``backends``' nodes (node -> backend) at util_of; ``broken``: every read
    fails."""

    def __init__(self, name: str, backends: dict[str, str], broken: bool = False):
        self.name, self.backends, self.broken = name, backends, broken
        self.asked: list[set[str]] = []

    def covers(self, node: str) -> bool:
        return node in self.backends

    async def read(self, nodes: set[str]) -> list[GPUReading]:
        self.asked.append(set(nodes))
        if self.broken:
            raise SourceError("http://127.0.0.1:9/metrics: connection refused")
        now = time.time()
        return [
            GPUReading(node, i, util_of(node, i), 1.0, self.backends[node], now)
            for node in sorted(nodes)
            for i in range(4)
        ]


# -- decide: unmonitored -------------------------------------------------------------------------
def never_measured(**kw):
    return session(last_measured=None, unmonitored_reason="no source covers node gpu9", **kw)


def test_unmonitored_warn_tells_once_and_keeps():
    s = never_measured()  # started 2 h ago, no trusted measurement since
    since = s.started + 300  # unmonitored_after (5 min) past its start
    actions = decide([s], settings(), NOW)
    assert actions == [Unmonitored("j-000001", since, "no source covers node gpu9", True)]
    s.unmonitored_reported = NOW  # the reaper told the admins; the owner's notice did not arrive
    assert decide([s], settings(), NOW + 1) == [
        Unmonitored("j-000001", since, "no source covers node gpu9", True, report=False)
    ]
    s.unmonitored_told = NOW + 1  # it did
    assert decide([s], settings(), NOW + 3600) == []  # once per stretch, never culled


def test_unmonitored_keep_reports_without_telling_the_owner():
    s = never_measured()
    actions = decide([s], settings(unmonitored="keep"), NOW)
    assert actions == [Unmonitored("j-000001", s.started + 300, s.unmonitored_reason, False)]
    s.unmonitored_reported = NOW
    assert decide([s], settings(unmonitored="keep"), NOW + 3600) == []


def test_unmonitored_cull_warns_first_with_the_whole_lead_then_culls():
    s = never_measured()
    cull = settings(unmonitored="cull")
    assert decide([s], cull, NOW) == [
        Unmonitored("j-000001", s.started + 300, s.unmonitored_reason, False),
        # unmeasured time counts as idle since its start: past its 45 min, warned first
        Warn("j-000001", NOW + 600, 2700.0, s.started, "unmonitored"),
    ]
    s.unmonitored_reported, s.warned, s.warn_deadline = NOW, NOW, NOW + 600
    assert decide([s], cull, NOW + 599) == []
    assert decide([s], cull, NOW + 600) == [Cull("j-000001", "unmonitored", 2700.0, s.started)]


def test_not_unmonitored_before_unmonitored_after_and_a_measurement_ends_it():
    # measured 200 s ago (past stale_after, within unmonitored_after): left alone, even with cull
    s = session(last_busy=NOW - 3 * 3600, last_measured=NOW - 200)
    assert decide([s], settings(unmonitored="cull"), NOW) == []
    assert decide([s], settings(unmonitored="cull", unmonitored_after=100), NOW)[0] == (
        Unmonitored("j-000001", NOW - 100, "no trusted GPU measurement", False)
    )
    s.unmonitored_reported = NOW
    reading = GPUReading("gpu1", 0, 1.0, 0.0, "nvml", NOW + 1)
    assert take_readings(s, [reading], 1, 5.0, "node-agent (nvml)")
    assert s.unmonitored_reported is None and s.last_measured == NOW + 1  # a new stretch


def test_idle_needs_every_gpu_measured_busy_needs_one():
    s = session(gpus=2, last_busy=None, last_measured=None)
    idle_0 = GPUReading("gpu1", 0, 0.0, 0.0, "nvml", NOW)
    assert not take_readings(s, [idle_0], 2, 5.0, "x")  # GPU 1 unmeasured: may be busy
    busy_1 = GPUReading("gpu1", 1, 80.0, 2.0, "nvml", NOW + 1)
    assert take_readings(s, [idle_0, busy_1], 2, 5.0, "x") and s.last_busy == NOW + 1
    assert not take_readings(s, [idle_0, busy_1], 2, 5.0, "x")  # the same readings again


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"unmonitored": "kill"}, "unmonitored"),
        ({"unmonitored_after": "soon"}, "unmonitored_after"),
    ],
)
def test_bad_unmonitored_settings_name_the_field(changes, field):
    from jupyter_gpusched.service.reaper import validate
    from jupyter_gpusched.service.requests import RequestError

    with pytest.raises(RequestError) as raised:
        validate(changes)
    assert raised.value.field == field


# -- the sampler in the service ----------------------------------------------------------------
async def test_the_sampler_maps_allocations_trusts_real_backends_and_keeps_errors(tmp_path):
    """A real cluster's service (gpu_backend auto): nvml readings of node "real" count, mapped
    to each job's own GPUs; simulated readings of "sim" do not; "down"'s source fails and its
    error is kept. The servers without trusted readings become unmonitored: listed in
    api/reaper with the reason, audited once, counted in the gauge, and (warn) kept."""
    service = await start_service(
        tmp_path, cluster=CLUSTER, queues=None, gpu_backend="auto", poll_interval=0.05
    )
    try:
        agents = AgentLike("node-agent", {"real": "nvml", "sim": "simulated"})
        broken = AgentLike("prometheus", {"down": "dcgm"}, broken=True)
        sampler = service.live.reaper.sampler
        sampler.sources = [*sampler.sources, agents, broken]
        sampler.interval = 0.1
        admin = service.client("admin")
        status, error = await admin.put("api/reaper", {"unmonitored": "maybe"})
        assert status == 400 and error["field"] == "unmonitored", error
        assert "warn, cull, keep" in error["error"]
        status, _ = await admin.put("api/reaper", {"unmonitored_after": 0.5})
        assert status == 200
        jobs = []
        for gpus in (2, 2, 4, 4):
            status, job = await service.client("alice").post(
                "api/jobs", {"gpus": gpus, "kind": "notebook"}
            )
            assert status == 201, job
            jobs.append(job["id"])
        running = service.live.engine.running
        await wait_until(lambda: all(j in running for j in jobs), what="all running")
        placed = allocated_gpus(service.live)
        node_of = {job: placed[job][0][0] for job in jobs}
        assert set(node_of.values()) == {"real", "sim", "down"}
        on_real = [job for job in jobs if node_of[job] == "real"]
        await wait_until(
            lambda: sampler.readings_for(on_real[-1]) and sampler.errors, what="every node read"
        )
        for job in on_real:
            readings = sampler.readings_for(job)
            assert sorted((r.node, r.index) for r in readings) == sorted(placed[job])
            assert all(r.utilization == util_of(r.node, r.index) for r in readings)
            assert sampler.why_unmeasured(job) is None
        assert sampler.errors == {"prometheus": "http://127.0.0.1:9/metrics: connection refused"}
        assert {"real", "sim"} <= set().union(*agents.asked)
        assert "down" not in set().union(*agents.asked)  # each node from its own source
        lost = {job: node_of[job] for job in jobs if node_of[job] != "real"}
        for job, node in lost.items():
            assert sampler.readings_for(job) == []
            why = sampler.why_unmeasured(job)
            if node == "sim":
                assert why == "the readings of sim are simulated on a real cluster"
            else:
                assert why.startswith("source prometheus failed: ") and "refused" in why

        async def audited():
            _, events = await admin.get("api/events", params={"kind": "reaper-unmonitored"})
            return {e["job_id"]: e for e in events["events"]} if len(events["events"]) >= 2 else 0

        events = await wait_until(audited, what="the unmonitored servers audited")
        assert set(events) == set(lost)
        status, view = await admin.get("api/reaper")
        by_job = {s["job_id"]: s for s in view["sessions"]}
        for job in jobs:
            if job in lost:
                assert by_job[job]["unmonitored_since"] is not None
                assert by_job[job]["unmonitored_reason"] == sampler.why_unmeasured(job)
                assert events[job]["data"]["reason"] == sampler.why_unmeasured(job)
            else:
                assert by_job[job]["unmonitored_since"] is None
                assert by_job[job]["measured_by"] == "node-agent (nvml)"
        gauge = service.app.metrics.registry.get_sample_value("gpusched_unmonitored_servers")
        assert gauge == len(lost)
        await wait_until(lambda: sampler.errors, what="another read")  # still failing
        status, events = await admin.get("api/events", params={"kind": "reaper-unmonitored"})
        assert len(events["events"]) == len(lost)  # once per stretch
        assert all(job in running for job in jobs)  # warn: kept
    finally:
        await service.stop()


async def test_a_source_that_stops_answering_leaves_its_servers_unmonitored(tmp_path):
    """Readings taken before a source failed count until they are old: then the server is
    unmonitored, and the reason is the failure, not the old readings."""
    service = await start_service(
        tmp_path, cluster=CLUSTER, queues=None, gpu_backend="auto", poll_interval=0.05
    )
    try:
        agents = AgentLike("node-agent", {"real": "nvml", "sim": "nvml", "down": "nvml"})
        sampler = service.live.reaper.sampler
        sampler.sources, sampler.interval = [*sampler.sources, agents], 0.1
        status, _ = await service.client("admin").put("api/reaper", {"unmonitored_after": 0.5})
        assert status == 200
        status, job = await service.client("alice").post(
            "api/jobs", {"gpus": 4, "kind": "notebook"}
        )
        assert status == 201, job
        reaper = service.live.reaper
        await wait_until(lambda: (reaper.sessions.get(job["id"]) or session()).measured_by)
        agents.broken = True
        lost = await wait_until(lambda: reaper.sessions[job["id"]].unmonitored_reported)
        assert lost and reaper.sessions[job["id"]].unmonitored_reason == (
            "source node-agent failed: http://127.0.0.1:9/metrics: connection refused"
        )
    finally:
        await service.stop()
