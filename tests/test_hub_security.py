"""Least privilege under a real JupyterHub (``hub_harness.py``): scheduler admin rights come from
the token's scopes, the hub's answers about a token are cached only briefly (so revoked tokens
and deleted users' tokens stop working), login never redirects off the service, and a big body
is a 413 through the proxy too.

The service runs with a short ``--HubAuthenticated.auth_cache_max_age`` so that the expiry can
be seen without long waits.
"""

from __future__ import annotations

import re
import time

import hub_harness
import pytest
import requests
from test_hub import ACCESS, browser_login

from jupyter_gpusched.service.auth import stay_under

CACHE_AGE = 2  # seconds: the service's HubAuth cache in this module


@pytest.fixture(scope="module")
def hub():
    args = (f"--HubAuthenticated.auth_cache_max_age={CACHE_AGE}",)
    with hub_harness.running_hub(service_args=args) as running:
        yield running


def me(hub, token):
    return hub.service("GET", "api/me", token)


def hub_api(hub, method, path, token, **kwargs):
    kwargs.setdefault("timeout", 10)
    return requests.request(
        method, hub.api_url + path, headers={"Authorization": f"token {token}"}, **kwargs
    )


def wait_refused(hub, token, within: float) -> float:
    """Seconds until the service answers 401 to ``token`` (AssertionError after ``within``)."""
    start = time.monotonic()
    while True:
        status = me(hub, token).status_code
        if status == 401:
            return time.monotonic() - start
        assert status == 200, status
        assert time.monotonic() - start < within, f"still accepted after {within} s"
        time.sleep(0.2)


def test_admin_rights_come_from_the_tokens_scopes_not_the_users_admin_flag(hub):
    full = hub.token("admin")
    assert me(hub, full).json()["admin"] is True  # role gpusched-admin: the custom scope
    # A hub admin's token down-scoped to the service's access scope: the hub still says
    # admin: true of its user, but the token does not hold custom:gpusched:admin.
    limited = hub.token("admin", scopes=[ACCESS])
    assert hub_api(hub, "GET", "user", limited).json()["admin"] is True
    assert me(hub, limited).json()["admin"] is False
    response = hub.service("POST", "api/nodes/gpu1/drain", limited)
    assert response.status_code == 403, response.text
    assert "not an admin" in response.json()["error"]
    assert hub.service("GET", "api/cluster", full).json()["nodes"][0]["state"] != "drain"


def test_the_admins_browser_session_is_an_admin_and_a_users_is_not(hub):
    for user, admin in (("admin", True), ("bob", False)):
        session = browser_login(hub, user)
        response = session.get(
            hub.service_url + "login", params={"next": "/services/gpusched/api/me"}, timeout=10
        )
        assert response.status_code == 200, response.text
        assert (response.json()["name"], response.json()["admin"]) == (user, admin)


@pytest.mark.parametrize(
    "next_url",
    [
        "/services/gpusched/../../hub/admin",
        "/services/gpusched/%2e%2e/%2e%2e/hub/admin",
        "/services/gpusched/api/..%2f..%2f..%2fhub/admin",
    ],
)
def test_login_never_redirects_off_the_service(hub, next_url):
    session = browser_login(hub, "bob")
    session.get(hub.service_url + "login", timeout=10)  # the service's OAuth cookie
    response = session.get(
        hub.service_url + "login", params={"next": next_url}, timeout=10, allow_redirects=False
    )
    assert response.status_code == 302, response.text
    assert response.headers["Location"] == "/services/gpusched/"  # the web page


def test_a_change_by_cookie_needs_the_pages_xsrf_token(hub):
    """A browser's cookie reads the API; it changes something only with the XSRF token the web
    page was given (a cross-site form has the cookie, never the token)."""
    session = browser_login(hub, "bob")
    page = session.get(hub.service_url, timeout=10)
    assert page.status_code == 200, page.text
    (xsrf,) = re.findall(r'data-xsrf="([^"]+)"', page.text)
    job = {"command": "sleep 30", "gpus": 1}
    for headers in ({}, {"X-XSRFToken": "not-the-token"}):
        response = session.post(hub.service_url + "api/jobs", json=job, headers=headers, timeout=10)
        assert response.status_code == 403, response.text
        assert "X-XSRFToken" in response.json()["error"]
    response = session.post(
        hub.service_url + "api/jobs", json=job, headers={"X-XSRFToken": xsrf}, timeout=10
    )
    assert response.status_code == 201, response.text
    assert response.json()["user"] == "bob"
    job_url = hub.service_url + f"api/jobs/{response.json()['id']}"
    assert session.delete(job_url, timeout=10).status_code == 403  # no token: refused
    response = session.delete(job_url, headers={"X-XSRFToken": xsrf}, timeout=10)
    assert response.status_code == 200, response.text
    # another user's session cannot use bob's token
    other = browser_login(hub, "carol")
    other.get(hub.service_url, timeout=10)
    response = other.post(
        hub.service_url + "api/jobs", json=job, headers={"X-XSRFToken": xsrf}, timeout=10
    )
    assert response.status_code == 403, response.text


def test_a_revoked_token_stops_working_within_the_cache_age(hub):
    created = hub_api(
        hub, "POST", "users/alice/tokens", hub.harness_token, json={"expires_in": 600}
    )
    assert created.status_code == 201, created.text
    token, token_id = created.json()["token"], created.json()["id"]
    assert me(hub, token).status_code == 200  # now in the service's cache
    revoked = hub_api(hub, "DELETE", f"users/alice/tokens/{token_id}", hub.harness_token)
    assert revoked.status_code == 204, revoked.text
    assert wait_refused(hub, token, within=CACHE_AGE + 5) <= CACHE_AGE + 5


def test_a_deleted_users_token_stops_working(hub):
    admin = hub.token("admin")
    created = hub_api(hub, "POST", "users/ghost", admin)
    assert created.status_code == 201, created.text
    token = hub.token("ghost")
    answer = me(hub, token)
    assert answer.status_code == 200 and answer.json()["name"] == "ghost", answer.text
    deleted = hub_api(hub, "DELETE", "users/ghost", admin)
    assert deleted.status_code == 204, deleted.text
    # The hub forgets the token with its user at once; only the service's cache remembered it.
    assert hub_api(hub, "GET", "user", token).status_code in (401, 403)
    assert wait_refused(hub, token, within=CACHE_AGE + 5) <= CACHE_AGE + 5


def test_a_big_body_is_a_413_through_the_proxy(hub):
    alice = hub.token("alice")
    body = b'{"gpus": 1, "command": "' + b"x" * (2 << 20) + b'"}'
    for data in (body, iter([body[i : i + 65536] for i in range(0, len(body), 65536)])):
        response = hub.service(
            "POST",
            "api/jobs",
            alice,
            data=data,
            headers={"Content-Type": "application/json"},
        )
        assert response.status_code == 413, response.text[:200]
        assert response.json()["field"] is None and "1048576 bytes" in response.json()["error"]
    assert me(hub, alice).status_code == 200
    assert hub.service("GET", "api/jobs", alice).json()["jobs"] == []


@pytest.mark.parametrize(
    "url",
    [
        "/services/gpusched/../../hub/admin",
        "/services/gpusched/%2e%2e/%2e%2e/hub/admin",
        "/services/gpusched/%2E%2E/x",
        "/services/gpusched/api/..%2f..%2f..%2fhub/admin",
        "/services/gpusched/..",
        "/services/gpuschedule/",
        "//evil.example/services/gpusched/",
        "https://evil.example/services/gpusched/",
        "/services/gpusched/\\..\\..\\hub",
        "services/gpusched/api/queue",
    ],
)
def test_login_never_sends_the_browser_off_the_service(url):
    assert stay_under(url, "/services/gpusched/") is None


def test_login_goes_to_the_normalised_path_under_the_service():
    prefix = "/services/gpusched/"
    assert stay_under(prefix + "api/jobs/j-000001", prefix) == prefix + "api/jobs/j-000001"
    assert stay_under(prefix + "api/x/../queue?a=1", prefix) == prefix + "api/queue?a=1"
    assert stay_under(prefix + "api/queue?a=%0d%0a", prefix) == prefix + "api/queue?a=%0d%0a"
    assert "\n" not in stay_under(prefix + "api/queue?a=\r\nX: 1", prefix)
