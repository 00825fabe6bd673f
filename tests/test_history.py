"""The service's history (core/history.py, service/history.py) and ``GET api/history``, the web
page at the service's root (service/page.py), and api/me's fair-share order: through a real
service in this process (tests/service_helpers.py); the page in Chromium is
tests/test_page_browser.py."""

from __future__ import annotations

import re

import pytest
from service_helpers import QUEUES, TOKENS, services, wait_job, wait_until
from tornado.httpclient import AsyncHTTPClient

from jupyter_gpusched.core.cluster import Cluster
from jupyter_gpusched.core.fairshare import fair_share_rank
from jupyter_gpusched.core.history import snapshot, thin, waited_gpu_hours
from jupyter_gpusched.core.jobs import Job
from jupyter_gpusched.core.quotas import QueueTree
from jupyter_gpusched.core.scheduler import Scheduler
from jupyter_gpusched.service.records import utilization_series
from jupyter_gpusched.service.store import Store


@pytest.fixture
async def service_factory(tmp_path):
    async with services(tmp_path) as make:
        yield make


def _row(time, **pending):
    return {"time": time, "pending": {"capacity": 0, "placement": 0, "policy": 0, **pending}}


# -- core ----------------------------------------------------------------------------------------
def test_a_snapshot_counts_running_gpus_by_tier_and_queue_and_pending_by_family():
    cluster = Cluster.from_dict({"nodes": [{"name": "n[1-2]", "gpus": 4, "gpu_model": "A100"}]})
    tree = QueueTree.from_dict(
        {"queues": {"a": {"guaranteed": 4, "limit": 4}, "b": {"guaranteed": 4}}}, 8, "queues"
    )
    engine = Scheduler(cluster, tree)
    engine.submit(Job(id="j1", user="u", queue="a", gpus=4, tier=1, submit_time=0.0), 0.0)
    engine.submit(Job(id="j2", user="u", queue="b", gpus=2, tier=3, submit_time=0.0), 0.0)
    engine.submit(Job(id="j3", user="u", queue="a", gpus=2, tier=2, submit_time=0.0), 0.0)
    engine.schedule(1.0)
    row = snapshot(engine, {2: (2.0, 41.25)}, 5.0)
    assert row["time"] == 5.0 and row["total_gpus"] == 8
    assert row["allocated"] == {"1": 4.0, "3": 2.0}
    assert row["queues"] == {"a": 4.0, "b": 2.0}
    assert row["pending"] == {"capacity": 0, "placement": 0, "policy": 2}  # a at its limit
    assert row["measured"] == {"2": {"gpus": 2.0, "utilization": 41.2}}


def test_waited_gpu_hours_counts_each_rows_pending_gpus_until_the_next():
    rows = [_row(0.0, capacity=2), _row(1800.0, policy=4), _row(3600.0)]
    hours = waited_gpu_hours(rows, until=7200.0)
    assert hours == {"capacity": 1.0, "placement": 0.0, "policy": 2.0}
    assert waited_gpu_hours([_row(0.0, placement=1)], until=3600.0)["placement"] == 1.0
    assert waited_gpu_hours([], until=10.0) == {"capacity": 0.0, "placement": 0.0, "policy": 0.0}


def test_thin_keeps_at_most_so_many_rows_evenly_and_the_last():
    rows = list(range(10_001))
    thinned = thin(rows, 2000)
    assert len(thinned) == 2000 and thinned[0] == 0 and thinned[-1] == 10_000
    assert thinned == sorted(thinned)
    assert thin(rows[:5], 2000) == rows[:5]


def test_the_fair_share_rank_is_shared_by_equal_factors():
    """Out of all the leaves, as in a race: not "2nd of 2" on three queues (distinct factors
    counted, as before)."""
    factors = {"a": 1.0, "b": 0.5, "c": 0.5, "d": 0.25}
    assert fair_share_rank(factors, "a") == (1, 4)
    assert fair_share_rank(factors, "c") == (2, 4) == fair_share_rank(factors, "b")
    assert fair_share_rank(factors, "d") == (4, 4)
    assert fair_share_rank(factors, "elsewhere") is None


def test_a_servers_samples_become_its_sparkline():
    samples = [
        {"time": 1.0, "utilization": 80.0, "devices": [{"index": 0, "utilization": 40.0}]},
        {"time": 2.0, "utilization": None, "devices": []},
        {"utilization": 5.0},  # no time: not a point
    ]
    assert utilization_series(samples, 2.0) == [[1.0, 40.0], [2.0, None]]


def test_the_store_drops_history_older_than_the_retention(tmp_path):
    with Store(f"sqlite:///{tmp_path / 'db.sqlite'}") as store:
        for t in range(10):
            store.add_history(_row(float(t), policy=t), keep_after=t - 3.0)
        rows = store.history(0.0, 100.0, limit=100)
        assert [r["time"] for r in rows] == [6.0, 7.0, 8.0, 9.0]  # 3 s kept before the last
        assert rows[-1]["pending"]["policy"] == 9
        assert [r["time"] for r in store.history(0.0, 100.0, limit=2)] == [8.0, 9.0]
        assert store.history(6.5, 8.0, limit=100)[0]["time"] == 7.0


# -- the service ---------------------------------------------------------------------------------
async def test_the_service_records_its_history_and_answers_it_by_caller(service_factory):
    service = await service_factory(history_interval=0.1)
    alice, carol, admin = (service.client(u) for u in ("alice", "carol", "admin"))
    status, job = await alice.post(
        "api/jobs", {"command": "sleep 60", "gpus": 2, "queue": "team", "tier": 3}
    )
    assert status == 201, job
    await wait_job(alice, job["id"], {"running"})
    _, mine = await carol.post("api/jobs", {"command": "sleep 60", "gpus": 1})
    await wait_job(carol, mine["id"], {"running"})

    async def with_both():
        _, answer = await admin.get("api/history")
        rows = answer["rows"]
        return answer if rows and len(rows[-1]["queues"]) == 2 else None

    history = await wait_until(with_both, what="a row with both jobs")
    last = history["rows"][-1]
    assert last["allocated"] == {"3": 2.0, "2": 1.0} and last["total_gpus"] == 24
    assert last["queues"] == {"team": 2.0, "private": 1.0}
    assert history["interval"] == 0.1
    assert set(history["waited_gpu_hours"]) == {"capacity", "placement", "policy"}
    assert [r["time"] for r in history["rows"]] == sorted(r["time"] for r in history["rows"])
    # a user sees the cluster's totals, and the queues they may use only
    _, theirs = await alice.get("api/history")
    assert theirs["rows"][-1]["allocated"] == last["allocated"]  # both still run
    assert all(set(r["queues"]) <= {"team", "small"} for r in theirs["rows"])
    assert any(r["queues"].get("team") == 2.0 for r in theirs["rows"])
    _, carols = await carol.get("api/history")
    assert all(set(r["queues"]) <= {"private"} for r in carols["rows"])
    # bounded, and bad periods are a 400 naming the field
    until = history["until"]
    status, error = await admin.get("api/history", params={"since": until, "until": until})
    assert status == 400 and error["field"] == "since"
    status, error = await admin.get("api/history", params={"since": until - 40 * 86400})
    assert status == 400 and error["field"] == "since" and "31 days" in error["error"]
    status, error = await admin.get("api/history", params={"since": "soon"})
    assert status == 400 and error["field"] == "since"
    status, old = await admin.get("api/history", params={"until": until - 3600})
    assert status == 200 and old["rows"] == []


async def test_api_me_says_where_each_queue_stands_in_the_fair_share_order(service_factory):
    service = await service_factory()
    alice = service.client("alice")
    _, job = await alice.post("api/jobs", {"command": "sleep 60", "gpus": 1, "queue": "team"})
    await wait_job(alice, job["id"], {"running"})
    _, me = await alice.get("api/me")
    shares = {q["path"]: q["fair_share"] for q in me["queues"]}
    assert set(shares) == {"team", "small"}
    for share in shares.values():
        assert share is not None and 1 <= share["rank"] <= share["of"] <= len(QUEUES["queues"])
        assert 0 < share["factor"] <= 1


async def _page(service, path: str = "", **kwargs):
    client = AsyncHTTPClient()
    return await client.fetch(
        service.url + path, raise_error=False, follow_redirects=False, **kwargs
    )


async def test_the_page_is_served_at_the_root_to_a_known_caller_only(service_factory):
    service = await service_factory()
    response = await _page(service, f"?token={TOKENS['alice']}")
    assert response.code == 200, response.body
    html = response.body.decode()
    assert 'data-user="alice"' in html and 'data-admin="false"' in html
    assert 'id="my-jobs"' in html and 'id="cluster"' in html
    assert 'id="showback"' not in html and 'id="reaper-settings"' not in html  # admins only
    assert "script-src 'self'" in response.headers["Content-Security-Policy"]
    admin = (await _page(service, f"?token={TOKENS['admin']}")).body.decode()
    assert 'data-admin="true"' in admin and 'id="showback"' in admin
    # no token, no page (standalone: there is no hub to log in through)
    response = await _page(service)
    assert response.code == 401 and b"?token=" in response.body
    assert (await _page(service, "?token=not-a-token-at-all")).code == 401
    # the page's own files, from the package (no CDN)
    assert "admin.js" not in html and "admin.js" in admin  # admins' sections: their code too
    # versioned by content: a browser may keep them, and gets the new ones after an upgrade
    assert re.search(r'src="/static/page\.js\?v=[0-9a-f]{32,}"', html), html
    for name in ("page.css", "draw.js", "admin.js", "page.js"):
        response = await _page(service, f"static/{name}")
        assert response.code == 200 and len(response.body) > 2000, name


async def test_a_change_by_query_token_or_cookie_needs_a_header_token(service_factory):
    """Standalone, the page sends its ?token= as a header: a change carried only by the query
    (as a cross-site form could) is refused, as it was before the page existed."""
    service = await service_factory()
    response = await _page(
        service,
        f"api/nodes/gpu1/drain?token={TOKENS['admin']}",
        method="POST",
        body=b"",
    )
    assert response.code == 403 and b"X-XSRFToken" in response.body


async def test_a_notebook_servers_measurements_are_its_sparkline_and_the_historys(
    service_factory, tmp_path
):
    """The service's own samples of a notebook server's GPU (simulated load) are the
    sparkline's points in api/reaper and the measured utilization of the history's rows."""
    service = await service_factory(history_interval=0.1, gpu_load_dir=tmp_path / "gpus")
    alice, admin = service.client("alice"), service.client("admin")
    status, job = await alice.post("api/jobs", {"gpus": 1, "kind": "notebook"})
    assert status == 201, job
    await wait_until(lambda: job["id"] in service.live.engine.running, what="running")
    service.load(job["id"], 90)

    async def points():
        _, view = await alice.get("api/reaper")
        mine = [s for s in view["sessions"] if s["job_id"] == job["id"]]  # from its first tick
        return [p for _, p in mine[0]["utilization_history"]] if mine else []

    await wait_until(lambda: _has(points, 90), what="a sample at 90%")
    service.load(job["id"], 30)
    await wait_until(lambda: _has(points, 30), what="a sample at 30%")
    series = await points()
    assert series.index(90) < len(series) - 1 - series[::-1].index(30)  # 90 first, 30 later

    async def measured():
        _, history = await admin.get("api/history")
        return [row["measured"].get("2") for row in history["rows"]]

    found = await wait_until(
        lambda: _has(measured, {"gpus": 1.0, "utilization": 30.0}), what="measured at 30%"
    )
    assert found


async def _has(read, value) -> bool:
    return value in await read()
