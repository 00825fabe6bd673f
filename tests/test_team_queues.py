"""Team queues under a real hub with the demo's cluster and queue files (issue 15, point 1):
a server started without a queue lands in the queue that names its user (alice, by name in
research/vision and by group in research, not the catch-all sandbox), the spawn form lists
the user's queues with GPUs in use / guaranteed / limit and the default preselected, a chosen
queue reaches the job, and a queue the user may not use is refused with the scheduler's
message (not a 500).

One hub for the module (``hub_harness.running_hub``) on ``hub_config/demo-cluster.yaml`` (2 x
4 H100) and ``hub_config/demo-queues.yaml`` with simulated GPUs.
"""

from __future__ import annotations

import html
import re
import time

import hub_harness
import pytest
import requests

DEMO_ENV = {
    "GPUSCHED_CLUSTER_FILE": str(hub_harness.ROOT / "hub_config" / "demo-cluster.yaml"),
    "GPUSCHED_QUEUE_FILE": str(hub_harness.ROOT / "hub_config" / "demo-queues.yaml"),
    "GPUSCHED_GPU_BACKEND": "simulated",
}
SERVER_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def demo_hub():
    with hub_harness.running_hub(env=DEMO_ENV) as hub:
        yield hub


@pytest.fixture
def hub(demo_hub):
    yield demo_hub
    for user in hub_harness.DEMO_USERS:  # the next test starts on an empty cluster
        response = _hub_api(demo_hub, "DELETE", f"users/{user}/server", user)
        assert response.status_code in (202, 204, 400), response.text
    for user in hub_harness.DEMO_USERS:
        _wait(lambda user=user: not _server(demo_hub, user), f"{user}'s server to stop")


def _hub_api(hub, method, path, user, **kwargs):
    headers = {"Authorization": f"token {hub.token(user)}"}
    return requests.request(method, hub.api_url + path, headers=headers, timeout=30, **kwargs)


def _server(hub, user) -> dict:
    response = _hub_api(hub, "GET", f"users/{user}", "admin")
    assert response.status_code == 200, response.text
    return (response.json().get("servers") or {}).get("", {})


def _wait(predicate, what: str, timeout: float = SERVER_TIMEOUT):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return value


def _state(hub, view: str, token: str) -> str:
    return hub.service("GET", view, token).json()["state"]


def _login(hub, user) -> requests.Session:
    """A browser session of ``user`` on the hub (the spawn page takes no API token)."""
    session = requests.Session()
    session.get(hub.url + "/hub/login", timeout=10)
    form = {"username": user, "password": hub.password, "_xsrf": session.cookies.get("_xsrf")}
    response = session.post(hub.url + "/hub/login", data=form, timeout=10)
    assert response.status_code == 200, response.text
    return session


def _spawn_form(hub, session: requests.Session, **fields) -> requests.Response:
    """POST the spawn form as the user of ``session`` (what the browser's Start sends)."""
    fields["_xsrf"] = session.cookies.get("_xsrf")
    return session.post(hub.url + "/hub/spawn", data=fields, timeout=30, allow_redirects=False)


def _my_jobs(hub, user) -> list[dict]:
    response = hub.service("GET", "api/jobs?state=running&state=pending", hub.token(user))
    assert response.status_code == 200, response.text
    return response.json()["jobs"]


def _start(hub, user, options) -> dict:
    response = _hub_api(hub, "POST", f"users/{user}/server", user, json=options)
    assert response.status_code in (201, 202), response.text
    _wait(lambda: _server(hub, user).get("ready"), f"{user}'s server")
    (job,) = [j for j in _my_jobs(hub, user) if j["kind"] == "notebook"]
    return job


def test_the_spawn_form_lists_alices_queues_with_figures_and_her_default(hub):
    response = _login(hub, "alice").get(hub.url + "/hub/spawn", timeout=30)
    assert response.status_code == 200, response.text
    page = html.unescape(response.text)
    assert '<select class="form-control" name="queue"' in page
    assert (
        '<option value="research/vision" selected>research/vision: 0 GPUs in use (3 guaranteed, '
        "limit 8) (your default)</option>"
    ) in page
    assert "research/nlp: 0 GPUs in use (3 guaranteed, limit 8)</option>" in page
    assert "sandbox: 0 GPUs in use (none guaranteed, limit 2)</option>" in page


def test_alices_4_gpu_server_lands_in_research_vision_beyond_sandboxs_limit(hub):
    job = _start(hub, "alice", {"profile": "gpu-4"})
    assert (job["queue"], job["gpus"], job["state"]) == ("research/vision", 4, "running")
    me = hub.service("GET", "api/me", hub.token("alice")).json()
    figures = {q["path"]: (q["in_use"], q["default"]) for q in me["queues"]}
    assert figures["research/vision"] == (4, True)


def test_a_queue_chosen_in_the_form_reaches_the_job(hub):
    # bob's default is research/nlp; his group opens research/vision to him too
    response = _spawn_form(hub, _login(hub, "bob"), profile="gpu-1", queue="research/vision")
    assert response.status_code in (200, 302), response.text
    _wait(lambda: _server(hub, "bob").get("ready"), "bob's server")
    (job,) = _my_jobs(hub, "bob")
    assert job["queue"] == "research/vision"


def test_a_queue_the_user_may_not_use_gets_the_schedulers_message_on_the_form(hub):
    response = _spawn_form(hub, _login(hub, "carol"), profile="gpu-1", queue="research/vision")
    assert response.status_code < 500, response.text
    page = html.unescape(response.text)
    assert "carol may not submit to queue research/vision" in page
    assert 'name="queue"' in page  # the form again, to choose another
    assert not _my_jobs(hub, "carol")


def _estimates(page: str) -> dict[str, str]:
    """The spawn form's estimate of each profile, by slug."""
    found = re.findall(r'id="gpusched-estimate-([^"]+)"> &middot; ([^<]*)</small>', page)
    return {slug: html.unescape(text) for slug, text in found}


def test_the_spawn_form_shows_when_each_profile_would_start(hub):
    """Each profile with the scheduler's estimate for alice's default queue: all start now on
    the empty cluster; with every H100 held by batch jobs (1 h and 2 h walltimes), the GPU
    profiles wait about an hour (the first reservation) and the CPU-only one starts now."""
    session = _login(hub, "alice")
    page = session.get(hub.url + "/hub/spawn", timeout=30).text
    assert _estimates(page) == dict.fromkeys(
        ("gpu-1", "gpu-4", "gpu-2-opportunistic", "cpu-only"), "starts now"
    ), page
    held = []
    try:
        for user, walltime in (("bob", "1h"), ("carol", "2h")):
            body = {"gpus": 4, "command": "sleep 600", "walltime": walltime}
            response = hub.service("POST", "api/jobs", hub.token(user), json=body)
            assert response.status_code == 201, response.text
            held.append((user, response.json()["id"]))
            assert response.json()["state"] == "running"
        queue_before = hub.service("GET", "api/queue", hub.token("admin")).json()
        estimates = _estimates(session.get(hub.url + "/hub/spawn", timeout=30).text)
        assert estimates["cpu-only"] == "starts now"
        for slug, gpus in (("gpu-1", "1 GPU"), ("gpu-4", "4 GPUs")):
            when, why = estimates[slug].split(": ", 1)
            assert when in ("about 59 min", "about 1 h"), estimates
            assert why == f"needs {gpus}; 0 free", estimates
        # nothing was queued by showing the form
        assert hub.service("GET", "api/queue", hub.token("admin")).json() == queue_before
    finally:
        for user, job_id in held:
            hub.service("DELETE", f"api/jobs/{job_id}", hub.token(user))
        for user, job_id in held:  # gone, not only signalled: the module's hub stops next
            view, token = f"api/jobs/{job_id}", hub.token(user)
            _wait(lambda v=view, t=token: _state(hub, v, t) != "running", view)
