"""The service under a real JupyterHub: hub, configurable-http-proxy and the gpusched service as
a managed service (``hub_config/jupyterhub_config.py``), every request through the proxy at
``/services/gpusched/`` with tokens the hub issued. See ``hub_harness.py``."""

from __future__ import annotations

import getpass
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path

import hub_harness
import pytest
import requests

hub = hub_harness.hub  # the fixture: a running hub, module scope

ACCESS = "access:services!service=gpusched"
ADMIN_SCOPE = "custom:gpusched:admin"
NODES = {"gpu1", "gpu2", "l40s1", "l40s2"}  # hub_config/cluster.yaml


def wait_for(hub, token, job_id, states, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        response = hub.service("GET", f"api/jobs/{job_id}", token)
        assert response.status_code == 200, response.text
        job = response.json()
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, f"job {job_id} still {job['state']}: {job}"
        time.sleep(0.2)


def hub_model(hub, token):
    response = requests.get(
        hub.api_url + "user", headers={"Authorization": f"token {token}"}, timeout=10
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_roles_give_users_access_and_the_admin_the_custom_scope(hub):
    alice = hub_model(hub, hub.token("alice"))
    admin = hub_model(hub, hub.token("admin"))
    assert ACCESS in alice["scopes"] and ADMIN_SCOPE not in alice["scopes"]
    assert alice["groups"] == ["research"] and not alice["admin"]
    # The custom scope is listed, unfiltered, in the token model the service sees.
    assert ADMIN_SCOPE in admin["scopes"] and admin["admin"]


def test_a_job_runs_on_its_allocation_as_its_user(hub):
    token = hub.token("alice")
    # The job waits for the gate file: it is still running. Not in the state directory, which
    # is the hub's and the service's alone (0700): alice's job could not see it there.
    gates = Path(tempfile.mkdtemp(prefix="gpusched-gate-"))
    gates.chmod(0o755)
    gate = gates / f"go-{secrets.token_hex(4)}"
    command = (
        'echo "visible=[$CUDA_VISIBLE_DEVICES]"; echo "user=[$(id -un)]"; i=0; '
        f"while [ ! -e {gate} ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done"
    )
    body = {"command": command, "gpus": 2, "name": "hub test", "walltime": "10m"}
    response = hub.service("POST", "api/jobs", token, json=body)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]

    try:
        running = wait_for(hub, token, job_id, {"running", "completed", "failed"})
        assert running["state"] == "running", running
        (part,) = running["allocation"]
        assert len(part["gpus"]) == 2 and part["node"] in NODES, running
    finally:
        gate.touch()
    done = wait_for(hub, token, job_id, {"completed", "failed", "cancelled", "lost"})
    shutil.rmtree(gates)
    log = hub.service("GET", f"api/jobs/{job_id}/log", token)
    assert log.status_code == 200, log.text
    assert done["state"] == "completed", log.text
    assert f"visible=[{','.join(map(str, part['gpus']))}]" in log.text
    # As root (CI), the service runs a job as the submitting user; else as its own user.
    expected = "alice" if os.geteuid() == 0 else getpass.getuser()
    assert f"user=[{expected}]" in log.text

    # Bob cannot see or cancel it.
    bob = hub.token("bob")
    assert hub.service("GET", f"api/jobs/{job_id}", bob).status_code == 404
    assert hub.service("GET", f"api/jobs/{job_id}/log", bob).status_code == 404
    assert hub.service("DELETE", f"api/jobs/{job_id}", bob).status_code == 404


def test_other_users_see_a_job_only_anonymised(hub):
    alice, bob = hub.token("alice"), hub.token("bob")
    body = {"command": "true", "gpus": 1, "name": "alice's secret", "held": True}
    response = hub.service("POST", "api/jobs", alice, json=body)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    try:
        assert hub.service("GET", f"api/jobs/{job_id}", bob).status_code == 404
        assert hub.service("DELETE", f"api/jobs/{job_id}", bob).status_code == 404
        (entry,) = hub.service("GET", "api/queue", bob).json()["held"]
        assert entry["id"] == job_id and entry["gpus"] == 1
        assert entry["user"] is None and entry["name"] is None and not entry["mine"]
        (own,) = hub.service("GET", "api/queue", alice).json()["held"]
        assert own["user"] == "alice" and own["name"] == "alice's secret" and own["mine"]
    finally:
        cancel = hub.service("DELETE", f"api/jobs/{job_id}", alice)
        assert cancel.status_code == 200, cancel.text


def test_only_admins_drain_nodes(hub):
    response = hub.service("POST", "api/nodes/gpu1/drain", hub.token("bob"))
    assert response.status_code == 403, response.text
    assert "not an admin" in response.json()["error"]
    admin = hub.token("admin")
    response = hub.service("POST", "api/nodes/gpu1/drain", admin)
    assert response.status_code == 200, response.text
    assert response.json()["node"] == "gpu1"
    assert hub.service("POST", "api/nodes/gpu1/resume", admin).status_code == 200


def test_a_hub_admin_scope_alone_makes_a_scheduler_admin(hub):
    # admin's token restricted to the service's scopes: not a hub admin's token any more (the
    # model still says admin: true, but the scheduler also accepts the custom scope).
    token = hub.token("admin", scopes=[ACCESS, ADMIN_SCOPE])
    assert set(hub_model(hub, token)["scopes"]) >= {ACCESS, ADMIN_SCOPE}
    response = hub.service("POST", "api/nodes/gpu2/drain", token)
    assert response.status_code == 200, response.text
    assert hub.service("POST", "api/nodes/gpu2/resume", token).status_code == 200


@pytest.mark.parametrize("headers", [{}, {"Accept": "text/html"}], ids=["api", "browser"])
def test_no_token_is_401_not_a_redirect(hub, headers):
    response = hub.service("GET", "api/queue", headers=headers)
    assert response.status_code == 401, response.text
    assert "not authenticated" in response.json()["error"]
    assert hub.service("GET", "api/queue", "not-a-real-token").status_code == 401


def test_a_token_without_the_access_scope_is_refused(hub):
    limited = hub.token("alice", scopes=["read:users:name!user=alice"])
    response = hub.service("GET", "api/queue", limited)
    assert response.status_code == 403, response.text
    assert ACCESS in response.json()["error"]
    # A service with no role granting access (the harness's own token).
    response = hub.service("GET", "api/queue", hub.harness_token)
    assert response.status_code == 403, response.text


def browser_login(hub, user):
    """A browser session: log in to the hub, then to the service (OAuth, no confirmation)."""
    session = requests.Session()
    page = session.get(hub.url + "/hub/login", timeout=10)
    assert page.status_code == 200
    form = {"username": user, "password": hub.password, "_xsrf": session.cookies.get("_xsrf")}
    response = session.post(hub.url + "/hub/login", data=form, timeout=10, allow_redirects=False)
    assert response.status_code == 302, response.text
    assert response.headers["Location"].endswith("/hub/home")  # c.JupyterHub.default_url
    return session


def oauth_token(hub, user):
    """The token of ``user``'s browser session with the service (the hub issued it by OAuth)."""
    response = requests.get(
        hub.api_url + f"users/{user}/tokens",
        headers={"Authorization": f"token {hub.harness_token}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    tokens = response.json()["api_tokens"]
    (token,) = [t for t in tokens if t["oauth_client"] == "JupyterHub service gpusched"]
    return token


def test_browser_sessions_through_oauth(hub):
    alice = hub.token("alice")
    response = hub.service("POST", "api/jobs", alice, json={"command": "true", "gpus": 1})
    job_path = f"/services/gpusched/api/jobs/{response.json()['id']}"

    session = browser_login(hub, "admin")
    response = session.get(hub.service_url + "login", params={"next": job_path}, timeout=10)
    assert response.status_code == 200 and response.url == hub.url + job_path, response.text
    assert response.json()["user"] == "alice"  # an admin sees everybody's jobs in full
    # The browser session's OAuth token carries the admin scope (oauth_client_allowed_scopes).
    assert ADMIN_SCOPE in oauth_token(hub, "admin")["scopes"]

    session = browser_login(hub, "bob")
    response = session.get(hub.service_url + "login", params={"next": job_path}, timeout=10)
    assert response.status_code == 404 and response.url == hub.url + job_path
    assert session.get(hub.service_url + "api/queue", timeout=10).status_code == 200
    # a browser session reads, and POSTs api/estimate (it changes nothing), but submits nothing
    body = {"command": "true", "gpus": 1}
    estimate = session.post(hub.service_url + "api/estimate", json=body, timeout=10)
    assert estimate.status_code == 200 and estimate.json()["start_now"] is True, estimate.text
    refused = session.post(hub.service_url + "api/jobs", json=body, timeout=10)
    assert refused.status_code == 403 and "token in the Authorization" in refused.text
    assert set(oauth_token(hub, "bob")["scopes"]) == {
        ACCESS,
        "read:users:name!user=bob",
        "read:users:groups!user=bob",
    }
    # The hub's Services menu links to the service's root, its web page (service/page.py).
    response = session.get(hub.service_url, timeout=10)
    assert response.status_code == 200 and response.url == hub.service_url
    assert 'data-user="bob"' in response.text
    # a browser with no session there is sent through the service's login and back
    fresh = browser_login(hub, "carol")
    response = fresh.get(hub.service_url, timeout=10, allow_redirects=False)
    assert response.status_code == 302
    assert response.headers["Location"] == "/services/gpusched/login?next=%2Fservices%2Fgpusched%2F"
    assert 'data-user="carol"' in fresh.get(hub.service_url, timeout=10).text


@pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as their users only as root")
def test_bobs_job_cannot_read_alices_command_env_or_log(hub):
    """The demo's state: the scheduler's database and logs are the service's (docs/security.md)."""
    alice, bob = hub.token("alice"), hub.token("bob")
    body = {"command": 'echo "key=$KEY"', "gpus": 1, "env": {"KEY": "alice-s3cr3t"}}
    response = hub.service("POST", "api/jobs", alice, json=body)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    assert wait_for(hub, alice, job_id, {"completed", "failed"})["state"] == "completed"
    state = hub.state_dir / "gpusched"
    log = state / "logs" / "alice" / f"{job_id}.log"
    assert "key=alice-s3cr3t" in log.read_text()
    snoop = f"cat {state}/gpusched.sqlite {state}/gpusched.sqlite-wal {log}; ls {state}; true"
    response = hub.service("POST", "api/jobs", bob, json={"command": snoop, "gpus": 1})
    assert response.status_code == 201, response.text
    spy = response.json()["id"]
    assert wait_for(hub, bob, spy, {"completed", "failed"})["state"] == "completed"
    seen = hub.service("GET", f"api/jobs/{spy}/log", bob).text
    assert "alice-s3cr3t" not in seen
    assert seen.count("Permission denied") >= 4, seen
    assert oct(state.stat().st_mode & 0o777) == "0o700"
