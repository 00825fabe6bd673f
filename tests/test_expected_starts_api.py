"""Every pending job's expected start in ``api/queue`` and the job views (service/
expected_starts.py over core/plan.py), against an in-process service with real job processes.

Cluster: gpu1, gpu2 with 8 H100 each, l40s1, l40s2 with 4 L40S (hub_config/cluster.yaml).
"""

from __future__ import annotations

import asyncio
import time

import pytest
from service_helpers import services, wait_job
from test_service_api import fill_h100, h100, submit


@pytest.fixture
async def service_factory(tmp_path):
    async with services(tmp_path) as make:
        yield make


async def etas(client, *job_ids) -> dict | None:
    """Each job's reason's eta, as ``api/queue`` and ``api/jobs/<id>`` give it; None while the
    two differ (a play ended between the requests)."""
    _, queue = await client.get("api/queue")
    listed = {entry["id"]: (entry["reason"] or {}).get("eta") for entry in queue["jobs"]}
    for job_id in job_ids:
        _, view = await client.get(f"api/jobs/{job_id}")
        if (view["reason"] or {}).get("eta") != listed[job_id]:
            return None
    return {job_id: listed[job_id] for job_id in job_ids}


async def until(condition, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while not (value := await condition()):
        assert time.monotonic() < deadline, "no expected start in time"
        await asyncio.sleep(0.05)
    return value


async def test_a_job_behind_the_reservation_gets_its_expected_start(service_factory):
    service = await service_factory(expected_start_interval=0.1)
    alice, bob = service.client("alice"), service.client("bob")
    running = await fill_h100(alice)  # both H100 nodes, the default walltime (24 h)
    ends = sorted(job["start_time"] + 86_400 for job in running)
    first = await submit(alice, h100(8, walltime="10m"))  # reserves the node freed first
    second = await submit(alice, h100(8, walltime="10m"))  # behind it: the other node
    assert first["reason"]["eta"] == pytest.approx(ends[0])  # the reservation's own

    async def both():
        found = await etas(alice, first["id"], second["id"])
        return found if found and found[second["id"]] is not None else None

    found = await until(both)
    assert found[first["id"]] == pytest.approx(ends[0])  # (the reservation's, as it was)
    assert found[second["id"]] == pytest.approx(ends[1])
    # another user sees it too (a queue's times are everyone's; its user is not)
    _, queue = await bob.get("api/queue")
    [entry] = [e for e in queue["jobs"] if e["id"] == second["id"]]
    assert entry["reason"]["eta"] == pytest.approx(ends[1]) and entry["user"] is None
    # a job submitted later, of higher priority, pushes it back at the next play: carol's queue
    # (private, guaranteed 12, idle) ranks first by fair share, and her job takes that node
    carol = service.client("carol")
    await submit(carol, h100(8, walltime="10m", queue="private"))

    async def pushed_back():
        later = ((await etas(alice, second["id"])) or {}).get(second["id"])
        return later if later is not None and later > ends[1] + 1 else None

    assert await until(pushed_back) == pytest.approx(ends[1] + 600, abs=2)


async def test_a_drain_moves_the_expected_start_to_a_node_in_service(service_factory):
    """An admin drains the node whose job ends first: the job that reserved it is expected when
    the other node's job ends, at once (not at the next unrelated event); resumed, back."""
    service = await service_factory(expected_start_interval=0.1)
    alice, admin = service.client("alice"), service.client("admin")
    running = [await submit(alice, h100(8, walltime=f"{hours}h")) for hours in (1, 2)]
    assert [job["state"] for job in running] == ["running", "running"]
    node = running[0]["allocation"][0]["node"]  # the one free first
    ends = [job["start_time"] + hours * 3600 for job, hours in zip(running, (1, 2), strict=True)]
    waiting = await submit(alice, h100(8, walltime="10m"))
    assert waiting["reason"]["eta"] == pytest.approx(ends[0], abs=1)

    async def expected(at):
        found = await etas(alice, waiting["id"])
        eta = found and found[waiting["id"]]
        return eta if eta is not None and eta == pytest.approx(at, abs=1) else None

    status, _ = await admin.post(f"api/nodes/{node}/drain")
    assert status == 200
    await until(lambda: expected(ends[1]))
    status, _ = await admin.post(f"api/nodes/{node}/resume")
    assert status == 200
    await until(lambda: expected(ends[0]))


async def test_a_job_that_will_reclaim_is_expected_when_its_victim_has_left(service_factory):
    """alice's team borrows 4 H100 above its guarantee of 12, with four 4-GPU jobs of a day;
    carol's queue (private) is idle below its guarantee. Her 4-GPU job reserves the first end
    (a day away), but the engine reclaims one of alice's jobs once its minimum run time (10 min)
    and grace (5 min) are over: the estimate, the queue and her job say so."""
    service = await service_factory(expected_start_interval=0.1)
    alice, carol = service.client("alice"), service.client("carol")
    running = [await submit(alice, h100(4, queue="team")) for _ in range(4)]
    assert {job["state"] for job in running} == {"running"}
    reclaim = min(job["start_time"] for job in running) + 600 + 300
    ask = h100(4, queue="private", tier=2)
    status, answer = await carol.post("api/estimate", ask)
    assert status == 200, answer
    assert answer["eta"] == pytest.approx(reclaim, abs=1)
    assert answer["reason"]["eta"] == answer["eta"]  # one time in the answer
    waiting = await submit(carol, ask)
    assert waiting["reason"]["eta"] > reclaim + 3600  # the reservation's: the first end

    async def expected():
        found = await etas(carol, waiting["id"])
        eta = found and found[waiting["id"]]
        return eta if eta is not None and eta == pytest.approx(reclaim, abs=1) else None

    await until(expected)


async def test_an_expected_start_that_passed_is_played_again(service_factory):
    """With learned estimates (walltime.estimate: missing), bob's two day-long jobs are
    expected to end within a second (his queue's 8-GPU jobs ran 0.2 s), and alice's second job
    behind the reservation is expected then. Once they outrun that, nothing happens in the
    engine (no event, no pass), but the expected start has passed: the next play gives it a
    new one (bob's jobs run as long again as they have run), instead of none for as long as
    they run."""
    service = await service_factory(
        expected_start_interval=0.2, policy={"walltime": {"estimate": "missing"}}
    )
    alice, bob = service.client("alice"), service.client("bob")
    for _ in range(3):
        done = await submit(alice, h100(8, command="sleep 0.2"))
        await wait_job(alice, done["id"], "completed")
    running = [await submit(bob, h100(8)) for _ in range(2)]  # sleep 60, no walltime
    assert [job["state"] for job in running] == ["running", "running"]
    started = max(job["start_time"] for job in running)
    first = await submit(alice, h100(8))
    second = await submit(alice, h100(8))

    async def replayed():  # an expected start from a play after the estimates passed
        found = await etas(alice, second["id"])
        eta = found and found[second["id"]]
        return eta if eta is not None and eta > started + 3 else None

    eta = await until(replayed, timeout=20)
    assert eta > time.time()
    _, view = await alice.get(f"api/jobs/{first['id']}")
    assert view["state"] == "pending"


async def test_without_plays_only_the_reservation_has_a_time(service_factory):
    service = await service_factory(expected_start_interval=0)
    alice = service.client("alice")
    await fill_h100(alice)
    first = await submit(alice, h100(8, walltime="10m"))
    second = await submit(alice, h100(8, walltime="10m"))
    for _ in range(10):  # polls (every 0.05 s) that would have played
        await asyncio.sleep(0.05)
    found = await until(lambda: etas(alice, first["id"], second["id"]))
    assert found[first["id"]] is not None and found[second["id"]] is None
    assert service.app.live.expected_starts.starts == {}


async def test_a_job_behind_the_reservation_says_when_gpus_were_freed_since_the_backfill_pass(
    service_factory,
):
    """Between two deep passes (backfill.interval, 30 s here) a quick pass stops at the
    reservation's holder: the job behind it still has the deep pass's "needs 4 GPUs; 0 free".
    The API gives it with the GPUs free now (core/reason_now.py)."""
    service = await service_factory(expected_start_interval=0)
    alice, bob = service.client("alice"), service.client("bob")
    await submit(alice, h100(8))
    short = await submit(alice, h100(4, command="sleep 4"))
    await submit(alice, h100(4))
    holder = await submit(bob, h100(8, walltime="10m"))
    behind = await submit(bob, h100(4, walltime="1m"))
    assert behind["reason"]["message"] == "needs 4 GPUs; 0 free"
    # a pass over the whole queue (a cancel calls for one) is the first, so a deep one: the
    # next comes 30 s after it, and the end of the short job, 4 s after it started, is before
    cancelled = await submit(bob, h100(8, walltime="10m"))
    code, _ = await bob.delete(f"api/jobs/{cancelled['id']}")
    assert code == 200
    await wait_job(alice, short["id"], "completed")
    _, queue = await bob.get("api/queue")
    [entry] = [e for e in queue["jobs"] if e["id"] == behind["id"]]
    assert entry["reason"]["detail"] == "awaiting-backfill"
    message = entry["reason"]["message"]
    assert message.startswith("needs 4 GPUs; 4 free since the last backfill pass; the next one")
    assert message.endswith(f"checks whether it can start before job {holder['id']}")
    _, view = await bob.get(f"api/jobs/{behind['id']}")
    assert view["reason"]["detail"] == "awaiting-backfill"
    assert service.live.engine.jobs[behind["id"]].reason.message == "needs 4 GPUs; 0 free"


def test_an_expected_start_replaces_a_reservation_start_that_has_passed_or_comes_later():
    """A reservation's start on the GPUs of a running job past its planned end (a notebook
    server past the 12 h default) is "now" at every pass, and past by the time it is shown:
    the play's later start is shown instead (core/plan.py played_end). A play that starts the
    holder sooner than its reservation (by pre-emption) is shown too."""
    from types import SimpleNamespace

    from jupyter_gpusched.service.expected_starts import ExpectedStarts

    planner = ExpectedStarts(SimpleNamespace(clock=lambda: 1000.0), interval=10, max_ends=100)
    planner.starts = {"j-1": 5000.0, "j-2": 900.0}
    waiting = {"family": "capacity", "detail": "gpus-busy", "message": "m"}
    assert planner.reason({**waiting, "eta": 990.0}, "j-1")["eta"] == 5000.0  # passed: the play's
    assert planner.reason({**waiting, "eta": 2000.0}, "j-1")["eta"] == 2000.0  # its own, to come
    # ... unless the play starts it sooner (a reclaim: the reservation counts only ends)
    planner.starts["j-4"] = 1500.0
    assert planner.reason({**waiting, "eta": 4000.0}, "j-4")["eta"] == 1500.0
    assert planner.reason({**waiting, "eta": None}, "j-1")["eta"] == 5000.0
    assert planner.reason({**waiting, "eta": 990.0}, "j-2")["eta"] == 990.0  # the play's passed too
    assert planner.reason({**waiting, "eta": 990.0}, "j-3")["eta"] == 990.0  # no play reached it
