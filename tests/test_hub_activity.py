"""The reaper's reading of the hub's ``last_activity`` (service/hub_activity.py) does not take
the service's own notice posts for the user's use: the proxy records a post as activity of the
server as soon as it passes, so a post still under way (its answer not back yet) must already
mask what the hub says. Real HTTP: a tornado app plays the hub's ``GET /users`` and the server
extension's notices endpoint, which holds the post open while the reaper reads."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
import tornado.web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from jupyter_gpusched.service.hub_activity import HubActivity
from jupyter_gpusched.service.hubclient import HubClient

EARLIER = 1_700_000_000.0  # bob's server's activity before the notice


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, timezone.utc).isoformat().replace("+00:00", "Z")


class FakeHubAndServer:
    """``GET /hub/api/users``: bob's server, last active when the proxy last passed a request to
    it; ``POST /user/bob/gpusched/api/notices``: recorded as activity on arrival (as the proxy
    does), answered only once ``release`` is set."""

    def __init__(self):
        self.last_activity = EARLIER
        self.arrived = asyncio.Event()
        self.release = asyncio.Event()
        owner = self

        class Users(tornado.web.RequestHandler):
            def get(self):
                servers = {"": {"last_activity": _iso(owner.last_activity)}}
                self.write(json.dumps([{"name": "bob", "servers": servers}]))

        class Notices(tornado.web.RequestHandler):
            async def post(self):
                owner.last_activity = time.time()
                owner.arrived.set()
                await owner.release.wait()
                self.write("{}")

        self.app = tornado.web.Application(
            [(r"/hub/api/users", Users), (r"/user/bob/gpusched/api/notices", Notices)]
        )


@pytest.fixture
async def hub_and_server():
    fake = FakeHubAndServer()
    sockets = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(fake.app)
    server.add_sockets(sockets)
    url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
    client = HubClient(url + "/hub/api", "secret", url)
    yield fake, client
    fake.release.set()
    server.stop()


def _live(client: HubClient) -> SimpleNamespace:
    job = SimpleNamespace(user="bob", kind="notebook")
    return SimpleNamespace(
        clock=time.time,
        hub=client,
        engine=SimpleNamespace(jobs={"nb": job}),
        extras={"nb": SimpleNamespace(server_name="")},
    )


async def test_a_notice_post_under_way_is_not_taken_for_use(hub_and_server):
    fake, client = hub_and_server
    activity = HubActivity(_live(client), interval=0)
    await activity.read()
    assert activity.latest("nb") == pytest.approx(EARLIER)
    post = asyncio.create_task(client.post_notice("bob", "", {"kind": "idle"}))
    await asyncio.wait_for(fake.arrived.wait(), 10)
    assert fake.last_activity > EARLIER + 1000  # what the hub now says: the post's moment
    await activity.read()  # while the post is still under way
    assert activity.latest("nb") == pytest.approx(EARLIER)
    fake.release.set()
    assert await post
    await activity.read()  # and once it is answered
    assert activity.latest("nb") == pytest.approx(EARLIER)


async def test_use_after_a_notice_post_is_taken(hub_and_server):
    fake, client = hub_and_server
    activity = HubActivity(_live(client), interval=0)
    await activity.read()
    fake.release.set()
    assert await client.post_notice("bob", "", {"kind": "idle"})
    used = time.time() + 5  # a request of the user's, after the post's slack
    fake.last_activity = used
    await activity.read()
    assert activity.latest("nb") == pytest.approx(used)
