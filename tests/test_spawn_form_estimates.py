"""The options form's per-profile estimates (GPUSchedSpawner.estimates, render_options_form)
against a real in-process service (``tests/service_helpers.py``), and against a service that
is down or too slow: the form comes without estimates, no later than ``estimate_timeout``.
Through a real hub: tests/test_team_queues.py.

Cluster: gpu1, gpu2 with 8 H100 each, l40s1, l40s2 with 4 L40S; alice's queue is "team".
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from service_helpers import TOKENS, services
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from jupyter_gpusched.hub.profiles import normalize_profiles, render_options_form
from jupyter_gpusched.hub.spawner import GPUSchedSpawner

PROFILES = [
    {"display_name": "1 GPU", "slug": "gpu-1", "gpus": 1},
    {"display_name": "8 H100", "slug": "h100-8", "gpus": 8, "gpu_models": ["H100"]},
    {"display_name": "4 L40S", "slug": "l40s-4", "gpus": 4, "gpu_models": ["L40S"]},
    {"display_name": "small", "slug": "small-2", "gpus": 1, "queue": "small"},
]


class User:
    name = "alice"
    groups = ()


def spawner(url: str, timeout: float = 2.0) -> GPUSchedSpawner:
    made = GPUSchedSpawner(
        user=User(), profiles=PROFILES, service_url=url, estimate_timeout=timeout
    )
    made._service_token = TOKENS["alice"]  # (a hub would make one: spawner_queue.py _token)
    return made


@pytest.fixture
async def service_factory(tmp_path):
    async with services(tmp_path) as make:
        yield make


async def test_each_profile_gets_the_services_estimate(service_factory):
    service = await service_factory()
    alice = service.client("alice")
    made = spawner(service.url)
    profiles = normalize_profiles(PROFILES)
    assert await made.estimates(profiles, None) == {
        "gpu-1": "starts now",
        "h100-8": "starts now",
        "l40s-4": "starts now",
        "small-2": "starts now",
    }
    for _ in range(2):  # every H100 busy for the default walltime; the small queue full
        status, _ = await alice.post(
            "api/jobs", {"gpus": 8, "gpu_model": "H100", "command": "sleep 60"}
        )
        assert status == 201
    status, _ = await alice.post(
        "api/jobs", {"gpus": 2, "gpu_model": "L40S", "queue": "small", "command": "sleep 60"}
    )
    assert status == 201
    _, before = await alice.get("api/queue")
    estimates = await made.estimates(profiles, None)
    assert estimates["gpu-1"] == "starts now"
    assert estimates["h100-8"].startswith("about ") and "UTC" not in estimates["h100-8"]
    # the small queue's job has the default walltime: expected then, and why it waits
    assert estimates["small-2"].startswith("about ") and "small" in estimates["small-2"]
    assert (await alice.get("api/queue"))[1] == before  # nothing queued
    form = render_options_form(profiles, None, None, None, estimates)
    assert f'id="gpusched-estimate-h100-8"> &middot; {estimates["h100-8"]}</small>' in form


async def test_a_stopped_service_gives_a_form_without_estimates_at_once():
    sock, port = bind_unused_port()
    sock.close()  # nothing listens there
    made = spawner(f"http://127.0.0.1:{port}/")
    assert await made.estimates(normalize_profiles(PROFILES), None) == {}


class Slow(web.RequestHandler):
    """Answers "starts now", but only once the test lets it (or after 30 s)."""

    def initialize(self, release: asyncio.Event):
        self.release = release

    async def post(self):
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.release.wait(), 30)
        answer = {"start_now": True, "eta": None, "reason": None, "queue": "team", "position": None}
        self.finish(answer)


async def test_a_slow_service_gets_no_estimate_past_the_estimate_timeout():
    """The estimates come back empty while the service still holds every answer: the spawner
    gave up on them (a spawner that waited would get "starts now" for each profile)."""
    release = asyncio.Event()
    sock, port = bind_unused_port()
    server = HTTPServer(web.Application([(r"/api/estimate", Slow, {"release": release})]))
    server.add_sockets([sock])
    try:
        made = spawner(f"http://127.0.0.1:{port}/", timeout=0.3)
        assert await made.estimates(normalize_profiles(PROFILES), None) == {}
    finally:
        release.set()
        server.stop()


def test_a_profile_without_an_estimate_shows_none():
    profiles = normalize_profiles(PROFILES)
    form = render_options_form(profiles, None, None, None, {"gpu-1": "waits: <team> at its limit"})
    assert 'id="gpusched-estimate-gpu-1"> &middot; waits: &lt;team&gt; at its limit' in form
    assert form.count("gpusched-estimate-") == 1
    assert "gpusched-estimate-" not in render_options_form(profiles)
