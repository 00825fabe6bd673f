"""The reaper acts only on measurements (issue 16, points 2 and 3): the service's own GPU
readings say which backend made them; a service that does not run the simulated cluster
(``gpu_backend`` auto, as in production) warns, shuts kernels down and culls on NVML and DCGM
readings only, never on simulated ones, and one that does (the demo's and the tests' case,
``gpu_backend = simulated``) acts on simulated samples. The monitors' reports only say which
kernels hold GPU memory, and only when their backend is trusted too; the monitor of a server
where NVML cannot be loaded reports that it has no telemetry, never an idle GPU.

In-process services (``tests/service_helpers.py``) without a hub; the readings a real cluster's
node agents would give come from :class:`Agents` (this machine has no NVML); the reports are
posted as the server's user, over HTTP, as ``serverext/monitor.py`` does (the last test uses
the monitor itself).
"""

from __future__ import annotations

import sys
import time

import pytest
from service_helpers import TOKENS, start_service, wait_until

from jupyter_gpusched.core.errors import ConfigError
from jupyter_gpusched.notebook.serverext.monitor import GPUMonitor
from jupyter_gpusched.notebook.serverext.proxy import ServiceClient, build_status
from jupyter_gpusched.service.gpu_sampling import GPUReading, ReadingSource, allocated_gpus

FAST = {"timeout_tier_2": 1.0, "warning_lead": 0.6, "shutdown_kernels_first": True}


def idle_report(job_id: str, **fields) -> dict:
    """An idle server whose kernel holds GPU memory (what shutdown_kernels_first acts on)."""
    return {
        "job_id": job_id,
        "server": {"utilization": 0.0, "memory_gb": 4.0, "gpus": [0]},
        "devices": [{"index": 0, "utilization": 0.0, "memory_gb": 4.0}],
        "kernels": {"k1": {"utilization": 0.0, "memory_gb": 4.0}},
        **fields,
    }


class Agents(ReadingSource):
    """Node agents as a real cluster has them: idle readings (0%, 4 GB held) of each GPU of the
    jobs in ``backends`` (job id -> the backend that measured it); no reading of other GPUs."""

    name = "node-agent"

    def __init__(self, live):
        self.live = live
        self.backends: dict[str, str] = {}

    def covers(self, node: str) -> bool:
        return True

    async def read(self, nodes: set[str]) -> list[GPUReading]:
        now = time.time()
        return [
            GPUReading(node, index, 0.0, 4.0, self.backends[job_id], now)
            for job_id, gpus in allocated_gpus(self.live).items()
            if job_id in self.backends
            for node, index in gpus
            if node in nodes
        ]


def with_agents(service) -> Agents:
    agents = Agents(service.live)
    sampler = service.live.reaper.sampler
    sampler.sources, sampler.interval = [*sampler.sources, agents], 0.1
    return agents


async def notebook(service, user="alice") -> str:
    status, job = await service.client(user).post("api/jobs", {"gpus": 1, "kind": "notebook"})
    assert status == 201, job
    await wait_until(lambda: job["id"] in service.live.engine.running, what="running")
    return job["id"]


async def reaper_events(service, job_id: str) -> list[str]:
    status, events = await service.client("admin").get("api/events", params={"job_id": job_id})
    assert status == 200, events
    return [e["kind"] for e in events["events"] if e["kind"].startswith("reaper-")]


async def test_a_real_clusters_service_acts_on_nvml_and_dcgm_readings_only(tmp_path):
    """Four idle servers past the timeout: the two whose GPUs NVML and DCGM measured are warned
    and culled (the NVML one's kernel first, which its trusted report named), the one whose
    monitor has no telemetry included; the two measured by the simulated backend are left
    alone. The reports of the simulated backend, without telemetry or naming no backend are
    counted as ignored with the reason (in the answer to the monitor and in api/reaper)."""
    service = await start_service(tmp_path, gpu_backend="auto")
    try:
        alice, admin = service.client("alice"), service.client("admin")
        status, _ = await admin.put("api/reaper", FAST)
        assert status == 200
        agents = with_agents(service)
        jobs = {
            kind: await notebook(service)
            for kind in ("nvml", "simulated", "no-telemetry", "no-backend")
        }
        measured_by = {"nvml": "nvml", "no-telemetry": "dcgm"}  # the others: simulated
        agents.backends = {job: measured_by.get(kind, "simulated") for kind, job in jobs.items()}
        fields = {
            "nvml": {"backend": "nvml"},
            "simulated": {"backend": "simulated"},
            "no-telemetry": {"backend": None, "telemetry_error": "nvidia-ml-py is missing"},
            "no-backend": {},
        }
        answers: dict[str, dict] = {}

        async def report_all():
            for kind, job_id in jobs.items():
                if job_id in service.live.engine.running:
                    status, answer = await alice.post(
                        "api/usage-samples", idle_report(job_id, **fields[kind])
                    )
                    if status == 404 and job_id not in service.live.engine.running:
                        continue  # culled while the reports before it were answered
                    assert status == 200, answer
                    answers[kind] = answer
            running = service.live.engine.running
            return jobs["nvml"] not in running and jobs["no-telemetry"] not in running

        await wait_until(report_all, 20, interval=0.1, what="the measured servers' culls")
        assert await reaper_events(service, jobs["nvml"]) == [
            "reaper-cull",
            "reaper-kernels",
            "reaper-warning",
        ]  # newest first
        # its monitor has no telemetry, its report is ignored: the service measured it idle
        assert await reaper_events(service, jobs["no-telemetry"]) == [
            "reaper-cull",
            "reaper-warning",
        ]
        assert answers["nvml"]["ignored"] is None
        status, view = await admin.get("api/reaper")
        sessions = {s["job_id"]: s for s in view["sessions"]}
        for kind in ("simulated", "no-backend"):
            job_id = jobs[kind]
            assert job_id in service.live.engine.running, kind
            assert await reaper_events(service, job_id) == [], kind
            session = sessions[job_id]
            assert session["last_report"] is None and session["last_sample"] is None, kind
            assert session["ignored_reports"] >= 1 and session["warned"] is None, kind
            assert session["ignored_reason"] == answers[kind]["ignored"], kind
            assert session["measured_by"] is None, kind  # simulated readings: not a measurement
        assert "simulated GPU backend" in answers["simulated"]["ignored"]
        assert "gpu_backend" in answers["simulated"]["ignored"]
        assert "nvidia-ml-py is missing" in answers["no-telemetry"]["ignored"]
        assert "does not say which GPU backend" in answers["no-backend"]["ignored"]
        assert sessions[jobs["simulated"]]["backend"] == "simulated"
        # the job view shows measured numbers only
        status, job = await alice.get(f"api/jobs/{jobs['simulated']}")
        assert job["utilization"] is None
    finally:
        await service.stop()


async def test_the_simulated_clusters_service_acts_on_simulated_samples(tmp_path):
    """The demo's case: the service runs the simulated cluster, so the simulated backend's
    samples are its measurements (its own, of the loads in its folder), and the simulated
    monitor's report names the kernel: warned, kernel shut down, culled."""
    service = await start_service(tmp_path, gpu_backend="simulated", gpu_load_dir=tmp_path / "g")
    try:
        alice = service.client("alice")
        status, _ = await service.client("admin").put("api/reaper", FAST)
        assert status == 200
        job_id = await notebook(service)
        service.load(job_id, 0, memory_gb=4.0)  # an idle kernel holding GPU memory

        async def reported_until_culled():
            if job_id in service.live.engine.running:
                report = idle_report(job_id, backend="simulated")
                status, answer = await alice.post("api/usage-samples", report)
                culled = status == 404 and job_id not in service.live.engine.running
                assert culled or (status == 200 and answer["ignored"] is None), answer
            return job_id not in service.live.engine.running

        await wait_until(reported_until_culled, 20, interval=0.1, what="the cull")
        kinds = await reaper_events(service, job_id)
        assert kinds == ["reaper-cull", "reaper-kernels", "reaper-warning"]
    finally:
        await service.stop()


async def test_a_service_with_an_unknown_gpu_backend_does_not_start(tmp_path):
    with pytest.raises(ConfigError, match="'cuda' is not a GPU backend") as info:
        await start_service(tmp_path, gpu_backend="cuda")
    assert "GPUSchedService.gpu_backend" in str(info.value)


async def test_a_bad_backend_field_is_400(tmp_path):
    service = await start_service(tmp_path)
    try:
        job_id = await notebook(service)
        for body, field in (
            ({"backend": 7}, "backend"),
            ({"backend": "x" * 41}, "backend"),
            ({"telemetry_error": ["no"]}, "telemetry_error"),
        ):
            status, error = await service.client("alice").post(
                "api/usage-samples", idle_report(job_id, **body)
            )
            assert status == 400 and error["field"] == field, error
    finally:
        await service.stop()


async def test_a_monitor_without_nvml_reports_no_samples_and_is_not_acted_on(tmp_path, monkeypatch):
    """The server extension's GPUMonitor on a machine where nvidia-ml-py cannot be imported and
    $GPUSCHED_GPU_BACKEND is unset (production's configuration): no simulated GPUs in their
    place; its snapshot and its report to a real service say there is no telemetry and why;
    the service counts the report as ignored, and never culls the server for it (no source of
    the service measures it either), while a control server measured idle by NVML alongside it
    is culled."""
    monkeypatch.delenv("GPUSCHED_GPU_BACKEND", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    service = await start_service(tmp_path, gpu_backend="auto")
    try:
        status, _ = await service.client("admin").put("api/reaper", FAST)
        assert status == 200
        job_id, control = await notebook(service), await notebook(service)
        with_agents(service).backends = {control: "nvml"}
        monitor = GPUMonitor(serverapp=None, service_url=service.url)
        monitor.job_id, monitor.token = job_id, TOKENS["alice"]
        monitor.start()  # tries the telemetry now: the error is logged at start
        monitor.stop()
        assert monitor.gpu_backend == "auto" and monitor.backend is None
        error = monitor.telemetry_error
        assert "nvidia-ml-py" in error and "GPUSCHED_GPU_BACKEND=simulated" in error

        async def report_both():
            snapshot = monitor.sample()
            assert snapshot["backend"] is None and snapshot["devices"] == []
            assert snapshot["server"]["utilization"] is None  # unknown, not 0%
            assert await monitor.send(snapshot)
            if control in service.live.engine.running:
                report = idle_report(control, backend="nvml")
                await service.client("alice").post("api/usage-samples", report)
            return control not in service.live.engine.running

        await wait_until(report_both, 20, interval=0.1, what="the control server's cull")
        assert "no GPU telemetry" in monitor.ignored_by_service
        session = service.live.reaper.sessions[job_id]
        assert session.ignored_reports >= 5 and session.last_report is None
        assert job_id in service.live.engine.running
        assert await reaper_events(service, job_id) == []
    finally:
        await service.stop()


async def test_the_lab_status_of_a_server_without_telemetry_says_unknown(monkeypatch):
    """What the Lab status bar reads (serverext ``api/status``) from a monitor without GPU
    telemetry: no utilization (unknown, not 0%) and the reason; it was a 500 (None / GPUs)."""
    monkeypatch.delenv("GPUSCHED_GPU_BACKEND", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setenv("GPUSCHED_GPUS", "2")
    monitor = GPUMonitor(serverapp=None)
    monitor.start()
    monitor.stop()
    monitor.sample()
    status = await build_status(ServiceClient("", ""), monitor)  # no service: the local part
    assert status["utilization"] is None and status["devices"] == []
    assert "nvidia-ml-py" in status["telemetry_error"]
