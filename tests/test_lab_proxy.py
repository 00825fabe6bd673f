"""What the JupyterLab panel reads and changes through the server extension's proxy
(``serverext/proxy.py``), in a real jupyter-server forwarding to a real scheduler service:
``me`` (admin or not), the reaper's settings (admins change them; others get the service's
403), and my jobs with their GPU utilization.

As in ``tests/test_serverext.py``, pytest-jupyter's fixtures are imported here only and the
tests are plain functions driving the server's event loop; the service runs on a loop of its own
in a thread (``ThreadedService`` of ``tests/test_client.py``).
"""

from __future__ import annotations

import json
import time

import pytest
from pytest_jupyter.jupyter_server import *  # noqa: F403 (the fixtures, for this module only)
from service_helpers import TOKENS
from test_client import ThreadedService
from tornado.httpclient import HTTPClientError

from jupyter_gpusched.notebook.serverext.proxy import SETTINGS_KEY, ServiceClient


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"jupyter_gpusched.notebook.serverext": True}}}


@pytest.fixture
def service(tmp_path):
    running = ThreadedService(tmp_path, gpu_load_dir=tmp_path / "gpus")
    yield running
    running.close()


@pytest.fixture
def lab(jp_serverapp, jp_fetch, jp_asyncio_loop, service):
    """``lab(user)``: a function fetching ``gpusched/api/<path>`` from the server as if the
    server were ``user``'s (its proxy holds ``user``'s service token)."""

    def as_user(user: str):
        jp_serverapp.web_app.settings[SETTINGS_KEY] = ServiceClient(service.url, TOKENS[user])

        def fetch(path: str, **kwargs):
            return jp_asyncio_loop.run_until_complete(
                jp_fetch("gpusched", "api", *path.split("/"), **kwargs)
            )

        return fetch

    return as_user


def test_me_tells_the_panel_who_is_an_admin(lab):
    assert json.loads(lab("alice")("me").body)["admin"] is False
    admin = json.loads(lab("admin")("me").body)
    assert admin["admin"] is True and admin["name"] == "admin"


def test_an_admin_changes_reaper_timeouts_through_the_proxy(lab, service):
    admin = lab("admin")
    body = json.dumps({"timeout_tier_3": 600, "timeout_tier_1": None})
    answer = json.loads(admin("reaper", method="PUT", body=body).body)
    assert (
        answer["settings"]["timeout_tier_3"] == 600 and answer["settings"]["timeout_tier_1"] is None
    )
    # the service reports it (to everybody), and audited the change
    settings = service.client("alice").request("GET", "api/reaper")["settings"]
    assert settings["timeout_tier_3"] == 600
    events = service.client("admin").request(
        "GET", "api/events", params={"kind": "reaper-settings"}
    )
    latest = events["events"][0]
    assert latest["actor"] == "admin" and latest["data"]["changes"]["timeout_tier_3"] == 600

    # a bad value: the service's 400 with its message and field, passed on as it is
    with pytest.raises(HTTPClientError) as bad:
        admin("reaper", method="PUT", body=json.dumps({"timeout_tier_2": "soon"}))
    assert bad.value.code == 400
    error = json.loads(bad.value.response.body)
    assert error["field"] == "timeout_tier_2" and "duration" in error["error"]


def test_a_user_may_not_change_the_reaper(lab, service):
    with pytest.raises(HTTPClientError) as refused:
        lab("alice")("reaper", method="PUT", body=json.dumps({"timeout_tier_2": 60}))
    assert refused.value.code == 403
    assert "not an admin" in json.loads(refused.value.response.body)["error"]
    assert (
        service.client("alice").request("GET", "api/reaper")["settings"]["timeout_tier_2"] == 2700
    )


def test_my_jobs_carry_the_utilization_the_panel_shows(lab, service):
    alice = service.client("alice")
    server = alice.request("POST", "api/jobs", {"kind": "notebook", "gpus": 1})
    service.service.load(server["id"], 73.0)  # what the service's own GPU samples measure
    deadline = time.monotonic() + 15
    while (alice.job(server["id"]).data["utilization"] or {}).get("percent") != 73.0:
        assert time.monotonic() < deadline, "the service never measured the load"
        time.sleep(0.05)
    jobs = json.loads(lab("alice")("jobs").body)["jobs"]
    mine = {j["id"]: j for j in jobs}
    assert mine[server["id"]]["utilization"]["percent"] == 73.0
