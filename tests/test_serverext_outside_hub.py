"""The server extension in a user's own ``jupyter lab``: the wheel's jupyter_server_config.d
file enables it in every server of the environment, hub or not. With no JUPYTERHUB_* or
GPUSCHED_* variables it must stay quiet and harmless: no error or warning logged, nothing sent to
a scheduler service that is not there, and the Lab extension's status read answered locally.

pytest-jupyter's fixtures are imported here only (see tests/test_serverext.py for why).
"""

from __future__ import annotations

import json
import logging
import os
import sys

import pytest
from pytest_jupyter.jupyter_server import *  # noqa: F403 (the fixtures, for this module only)

from jupyter_gpusched.notebook.serverext.monitor import SETTINGS_KEY, GPUMonitor


@pytest.fixture
def outside_a_hub(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("GPUSCHED_", "JUPYTERHUB_")):
            monkeypatch.delenv(name)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # a laptop without NVIDIA's NVML


@pytest.fixture
def jp_server_config(outside_a_hub, capfd):
    # capfd first: it captures the server's log (stderr) from its start on, before the test,
    # which caplog does not see (the server sets its logging up itself)
    return {"ServerApp": {"jpserver_extensions": {"jupyter_gpusched.serverext": True}}}


def test_it_loads_quietly_and_answers_locally(jp_fetch, jp_serverapp, jp_asyncio_loop, capfd):
    run = jp_asyncio_loop.run_until_complete
    monitor = jp_serverapp.web_app.settings[SETTINGS_KEY]
    assert monitor.service_url == "" and monitor.job_id == ""  # reports go nowhere
    assert "nvidia-ml-py" in monitor.telemetry_error

    status = json.loads(run(jp_fetch("gpusched", "api", "status")).body)
    assert status["configured"] is False and status["job_id"] is None
    assert status["utilization"] is None  # unknown, not 0%
    notices = json.loads(run(jp_fetch("gpusched", "api", "notices")).body)
    assert notices["notices"] == []
    run(monitor.tick())  # one sample: nothing sent, so nothing failed
    assert monitor.reports_failed == 0 and monitor.ignored_by_service is None
    log = capfd.readouterr().err
    # what the server printed from its start on (its warnings and errors): nothing of ours
    ours = [line for line in log.splitlines() if "gpusched" in line and not line.startswith("[D")]
    assert ours == [], ours


def test_a_scheduler_jobs_server_without_telemetry_still_logs_the_error(
    outside_a_hub, monkeypatch, caplog
):
    """The contrast: where the scheduler started the server, no telemetry is an error."""
    monkeypatch.setenv("GPUSCHED_JOB_ID", "j-000007")
    monitor = GPUMonitor(serverapp=None, log=logging.getLogger("test-monitor"))
    with caplog.at_level(logging.INFO, logger="test-monitor"):
        monitor.start()
        monitor.stop()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "nvidia-ml-py" in errors[0].getMessage()
