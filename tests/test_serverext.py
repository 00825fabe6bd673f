"""The jupyter-server extension (``jupyter_gpusched.notebook.serverext``) in a real jupyter-server,
with pytest-jupyter's fixtures (``jp_fetch``: requests with the server's token).

pytest-jupyter's plugin also takes over how every coroutine test runs, which would clash with
pytest-asyncio in the rest of the suite; so it is not registered as a plugin: its fixtures are
imported here only, and these tests are plain functions that drive the server's event loop.
"""

from __future__ import annotations

import json
import time

import pytest
from pytest_jupyter.jupyter_server import *  # noqa: F403 (the fixtures, for this module only)
from tornado.httpclient import HTTPClientError

from jupyter_gpusched.notebook.serverext.notices import MAX_NOTICES, NoticeBoard, parse_notice


@pytest.fixture
def jp_server_config():  # pytest-jupyter's fixture, with the extension enabled
    return {"ServerApp": {"jpserver_extensions": {"jupyter_gpusched.notebook.serverext": True}}}


@pytest.fixture
def fetch(jp_fetch, jp_asyncio_loop):
    def run(*path, **kwargs):
        return jp_asyncio_loop.run_until_complete(jp_fetch(*path, **kwargs))

    return run


def post(fetch, body, **kwargs):
    return fetch("gpusched", "api", "notices", method="POST", body=json.dumps(body), **kwargs)


def test_a_notice_is_kept_logged_and_listed(fetch, caplog):
    empty = json.loads(fetch("gpusched", "api", "notices").body)
    assert empty["notices"] == [] and len(empty["start"]) == 16
    deadline = time.time() + 60
    body = {"kind": "preemption", "message": "GPUs needed by a tier-1 job", "deadline": deadline}
    response = post(fetch, body)
    assert response.code == 201
    notice = json.loads(response.body)
    assert notice["id"] == 1 and notice["kind"] == "preemption"
    assert notice["start"] == empty["start"]  # this start of the server numbered it
    assert notice["deadline"] == deadline and abs(notice["received"] - time.time()) < 30
    post(fetch, {"kind": "info", "message": "second", "job_id": "j-000001"})

    listed = json.loads(fetch("gpusched", "api", "notices").body)["notices"]
    assert [n["message"] for n in listed] == ["GPUs needed by a tier-1 job", "second"]
    assert listed[1]["job_id"] == "j-000001" and listed[1]["deadline"] is None
    assert "gpusched preemption notice" in caplog.text
    assert "GPUs needed by a tier-1 job" in caplog.text


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"message": "no kind"}, "'kind'"),
        ({"kind": "preemption"}, "'message'"),
        ({"kind": "preemption", "message": "x", "deadline": "soon"}, "'deadline'"),
        ({"kind": "preemption", "message": "x", "deadline": True}, "'deadline'"),
        (["not", "an", "object"], "JSON object"),
    ],
)
def test_a_bad_notice_is_400_with_the_field(fetch, body, error):
    with pytest.raises(HTTPClientError) as raised:
        post(fetch, body)
    assert raised.value.code == 400
    assert error in json.loads(raised.value.response.body)["message"]


def test_not_json_is_400(fetch):
    with pytest.raises(HTTPClientError) as raised:
        fetch("gpusched", "api", "notices", method="POST", body="{nope")
    assert raised.value.code == 400


def test_requests_without_the_token_are_refused(fetch):
    wrong = {"Authorization": "token not-the-servers-token"}
    for method, body in (("GET", None), ("POST", json.dumps({"kind": "a", "message": "b"}))):
        with pytest.raises(HTTPClientError) as raised:
            fetch("gpusched", "api", "notices", method=method, body=body, headers=wrong)
        assert raised.value.code in (401, 403)
    assert json.loads(fetch("gpusched", "api", "notices").body)["notices"] == []


def test_only_the_newest_notices_are_kept():
    import logging

    board = NoticeBoard(logging.getLogger("test"), clock=lambda: 1.0)
    for i in range(MAX_NOTICES + 5):
        board.add({"kind": "info", "message": f"n{i}"})
    assert len(board.notices) == MAX_NOTICES
    assert board.notices[0]["message"] == "n5" and board.notices[-1]["id"] == MAX_NOTICES + 5


def test_each_server_start_names_its_notices():
    """Ids count from 1 at each start; ``start`` tells the starts apart (the Lab extension
    remembers (start, id)), and a caller cannot pass one off as another start's."""
    import logging

    log = logging.getLogger("test")
    before, after = NoticeBoard(log), NoticeBoard(log)  # the server, then the server restarted
    first = before.add({"kind": "idle", "message": "m"})
    again = after.add({"kind": "idle", "message": "m", "start": before.start, "id": 7})
    assert first["id"] == again["id"] == 1
    assert first["start"] == before.start != after.start == again["start"]


def test_parse_notice_keeps_extra_keys():
    notice = parse_notice({"kind": "preemption", "message": "m", "deadline": 5, "grace": 60})
    assert notice == {"kind": "preemption", "message": "m", "deadline": 5, "grace": 60}


def test_a_shutdown_kernels_notice_shuts_down_just_those_kernels(fetch):
    """The reaper's ``shutdown_kernels_first``: the listed kernels go, the others stay."""

    def start_kernel() -> str:
        return json.loads(fetch("api", "kernels", method="POST", body="{}").body)["id"]

    holding, other = start_kernel(), start_kernel()
    try:
        body = {
            "kind": "shutdown-kernels",
            "message": "GPU-idle kernels holding GPU memory were shut down",
            "kernel_ids": [holding, "no-such-kernel"],
        }
        notice = json.loads(post(fetch, body).body)
        assert notice["shut_down"] == [holding]
        running = {k["id"] for k in json.loads(fetch("api", "kernels").body)}
        assert running == {other}
        with pytest.raises(HTTPClientError) as error:  # kernel_ids is required for this kind
            post(fetch, {"kind": "shutdown-kernels", "message": "x", "kernel_ids": "all"})
        assert error.value.code == 400
        assert other in {k["id"] for k in json.loads(fetch("api", "kernels").body)}
    finally:
        fetch("api", "kernels", other, method="DELETE")


def test_a_cull_notice_is_answered_once_the_lab_has_fetched_it(fetch, jp_fetch, jp_asyncio_loop):
    """The reaper posts ``reaper-cull`` and then has the hub stop the server: the answer waits
    for a GET (the Lab's poll) to return the notice, so the Lab shows it before the server goes."""
    import asyncio

    cull = {"kind": "reaper-cull", "message": "culled by the reaper: GPUs idle for 3 min"}

    async def post_then_get():
        lab = {"watching": "1"}  # what an open Lab's polls send
        await jp_fetch("gpusched", "api", "notices", params=lab)
        posted = asyncio.ensure_future(
            jp_fetch("gpusched", "api", "notices", method="POST", body=json.dumps(cull))
        )
        await asyncio.sleep(0.5)
        assert not posted.done()  # held: nobody has fetched it yet
        await jp_fetch("gpusched", "api", "notices")  # another reader: not the Lab
        await asyncio.sleep(0.2)
        assert not posted.done()
        listed = await jp_fetch("gpusched", "api", "notices", params=lab)
        listed = json.loads(listed.body)["notices"]
        assert [n["kind"] for n in listed] == ["reaper-cull"]
        started = time.monotonic()
        answer = await asyncio.wait_for(posted, 5)
        return answer, time.monotonic() - started

    answer, waited = jp_asyncio_loop.run_until_complete(post_then_get())
    assert answer.code == 201 and json.loads(answer.body)["fetched"] is True
    assert waited < 1.0  # answered at the GET, not at the end of the hold


def test_a_cull_notice_waits_only_for_a_lab_that_watches(fetch, monkeypatch):
    """No page has asked for notices: the cull is not delayed. A page that polls but has not
    fetched this notice yet: held for the hold time, then answered."""
    from jupyter_gpusched.notebook.serverext import notices

    monkeypatch.setattr(notices, "HOLD_SECONDS", 0.5)
    cull = {"kind": "reaper-cull", "message": "culled by the reaper"}
    started = time.monotonic()
    assert json.loads(post(fetch, cull).body)["fetched"] is False
    assert time.monotonic() - started < 0.4  # nobody watching: at once

    fetch("gpusched", "api", "notices")  # a reader that is not a Lab page
    started = time.monotonic()
    assert json.loads(post(fetch, cull).body)["fetched"] is False
    assert time.monotonic() - started < 0.4

    fetch("gpusched", "api", "notices", params={"watching": "1"})  # a Lab polls
    started = time.monotonic()
    assert json.loads(post(fetch, cull).body)["fetched"] is False
    assert 0.5 <= time.monotonic() - started < 3  # held for a watching Lab, then answered
    # other kinds are never held
    assert "fetched" not in json.loads(post(fetch, {"kind": "idle", "message": "m"}).body)
