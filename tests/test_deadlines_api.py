"""Deadlines through the REST API, against an in-process service with real job processes
(``tests/service_helpers.py``): a deadline the engine says can be met is taken and shown, one
it cannot meet is a 400 on ``deadline`` giving the earliest finish, and nothing queued changes;
a job that misses anyway is reported (event, metric, the view's ``deadline_missed``) and, per
the policy's ``deadlines.on_miss``, left or cancelled (service/deadlines.py).

Cluster: gpu1, gpu2 with 8 H100 each, l40s1, l40s2 with 4 L40S (hub_config/cluster.yaml). No
policy file: a batch job without a walltime is planned as 24 h.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
from service_helpers import services, start_service, wait_job, wait_until
from test_estimate_api import everything
from test_service_api import fill_h100, h100, submit

from jupyter_gpusched.service.deadlines import utc_text

DAY = 86400.0


@pytest.fixture
async def service_factory(tmp_path):
    async with services(tmp_path) as make:
        yield make


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat()


async def test_a_deadline_that_can_be_met_is_taken_and_shown(service_factory):
    service = await service_factory()
    alice = service.client("alice")
    await fill_h100(alice)
    before = time.time()
    job = await submit(alice, h100(2, gpu_model="L40S", walltime="1h", deadline="6h"))
    after = time.time()
    assert job["state"] == "running" and job["deadline_missed"] is False
    assert before + 6 * 3600 <= job["deadline"] <= after + 6 * 3600  # epoch s, as submit_time
    # a time with its zone; pending behind the running jobs, and shown in the queue too
    when = time.time() + 3 * DAY
    waiting = await submit(alice, h100(8, walltime="2h", deadline=iso(when)))
    assert waiting["state"] == "pending" and waiting["deadline"] == pytest.approx(when)
    _, queue = await alice.get("api/queue")
    entry = next(e for e in queue["jobs"] if e["id"] == waiting["id"])
    assert entry["deadline"] == waiting["deadline"] and entry["deadline_missed"] is False
    _, again = await alice.get(f"api/jobs/{waiting['id']}")
    assert again["deadline"] == waiting["deadline"]
    # jobs without one say so
    plain = await submit(alice, {"gpus": 1, "command": "true"})
    assert plain["deadline"] is None and plain["deadline_missed"] is False


async def test_a_deadline_that_cannot_be_met_is_a_400_with_the_earliest_finish(service_factory):
    service = await service_factory()
    alice = service.client("alice")
    running = await fill_h100(alice)  # planned as 24 h each (no walltime)
    free_at = min(job["start_time"] for job in running) + DAY  # the first 8 H100 free then
    before, number = await everything(service), service.live.submissions.number
    body = h100(8, walltime="2h", deadline="6h")
    status, error = await alice.post("api/jobs", body)
    assert (status, error["field"]) == (400, "deadline"), error
    message = error["error"]
    assert "cannot be met" in message and "walltime 2 h" in message, message
    assert f"the earliest this job can finish is {utc_text(free_at + 7200)}" in message, message
    assert f"it would start at {utc_text(free_at)}" in message, message
    # the same answer from POST api/estimate (but for the deadline itself: "6h" from now may
    # be a second later there)
    estimate_status, estimated = await alice.post("api/estimate", body)
    assert (estimate_status, estimated["field"]) == (status, "deadline")
    assert estimated["error"].split(" cannot be met: ")[1] == message.split(" cannot be met: ")[1]
    # without a walltime, the message says what it was planned with and what to give
    status, error = await alice.post("api/jobs", h100(8, deadline="30h"))
    assert (status, error["field"]) == (400, "deadline"), error
    assert "no walltime, planned as the default 1 d" in error["error"], error
    assert utc_text(free_at + DAY) in error["error"], error
    # a job array: refused as a whole, nothing of it queued
    status, error = await alice.post("api/jobs", {**body, "array": "0-3"})
    assert (status, error["field"]) == (400, "deadline"), error
    assert await everything(service) == before
    assert service.live.submissions.number == number
    # a deadline after the earliest finish is taken; the estimate gives that finish
    later = h100(8, walltime="2h", deadline=iso(free_at + 7200 + 600))
    status, answer = await alice.post("api/estimate", later)
    assert status == 200 and answer["earliest_finish"] == pytest.approx(free_at + 7200), answer
    job = await submit(alice, later)
    assert job["state"] == "pending"


async def test_the_estimate_of_a_job_without_a_deadline_has_no_finish(service_factory):
    service = await service_factory()
    status, answer = await service.client("alice").post("api/estimate", h100(1))
    assert status == 200 and answer["earliest_finish"] is None and answer["start_now"]


@pytest.mark.parametrize(
    "deadline, says",
    [
        ("2026-12-24T18:00:00", "no time zone"),  # naive: which 18:00?
        (iso(time.time() - 3600), "later than now"),  # past
        ("1000d", "at most 730 days"),  # too far
        ("soon", "a time with its zone"),
        (0, "later than now"),
        (True, "a time with its zone"),
    ],
)
async def test_bad_deadlines_are_a_400_naming_it_and_change_nothing(
    service_factory, deadline, says
):
    service = await service_factory()
    alice = service.client("alice")
    before = await everything(service)
    for path in ("api/jobs", "api/estimate"):
        status, error = await alice.post(path, {"gpus": 1, "command": "true", "deadline": deadline})
        assert (status, error["field"]) == (400, "deadline"), error
        assert says in error["error"], error
    assert await everything(service) == before


async def test_each_element_of_an_array_carries_the_deadline(service_factory):
    service = await service_factory()
    alice = service.client("alice")
    status, answer = await alice.post(
        "api/jobs", {**h100(1, walltime="1h", deadline="1d"), "array": "0-2"}
    )
    assert status == 201, answer
    deadlines = {job["deadline"] for job in answer["jobs"]}
    assert len(answer["jobs"]) == 3 and len(deadlines) == 1 and None not in deadlines


# -- a job that misses anyway -----------------------------------------------------------------
async def _missed(service, alice) -> dict:
    """Every H100 held by jobs planned as 2 s that run a minute; then an 8-H100 job with a
    walltime of 1 s and a deadline 4 s away: feasible when submitted (they should be gone by
    then), missed as they go on. Its view once the service says it missed."""
    for _ in range(2):
        job = await submit(alice, h100(8, walltime=2))
        assert job["state"] == "running", job
    late = await submit(alice, h100(8, walltime=1, deadline=4))
    assert late["state"] == "pending" and late["deadline_missed"] is False, late

    async def missed():
        _, view = await alice.get(f"api/jobs/{late['id']}")
        return view if view["deadline_missed"] else None

    return await wait_until(missed, what=f"{late['id']} to miss its deadline")


async def _miss_events(service, job_id: str) -> list[dict]:
    _, events = await service.client("admin").get("api/events", params={"job_id": job_id})
    return [e for e in events["events"] if e["kind"] == "deadline-missed"]


async def test_a_job_that_misses_is_reported_and_kept_by_default(service_factory):
    service = await service_factory()
    alice = service.client("alice")
    view = await _missed(service, alice)
    assert view["state"] == "pending" and view["reason"] is not None  # its one reason stays
    [event] = await _miss_events(service, view["id"])
    assert event["data"]["action"] == "kept" and "stays pending" in event["message"], event
    assert event["data"]["deadline"] == pytest.approx(view["deadline"])
    _, text = await alice.get("metrics")
    assert 'gpusched_deadline_misses_total{action="kept"} 1.0' in text
    assert 'gpusched_deadline_misses_total{action="cancelled"} 0.0' in text
    _, queue = await alice.get("api/queue")
    entry = next(e for e in queue["jobs"] if e["id"] == view["id"])
    assert entry["deadline_missed"] is True


async def test_a_pending_job_that_misses_is_cancelled_under_on_miss_cancel(service_factory):
    service = await service_factory(policy={"deadlines": {"on_miss": "cancel"}})
    alice = service.client("alice")
    view = await _missed(service, alice)
    view = await wait_job(alice, view["id"], "cancelled")
    assert view["deadline_missed"] is True and "deadline" in view["message"], view
    [event] = await _miss_events(service, view["id"])
    assert event["data"]["action"] == "cancelled", event
    _, text = await alice.get("metrics")
    assert 'gpusched_deadline_misses_total{action="cancelled"} 1.0' in text
    # stored so: the database row says what the view said
    row = service.live.store.get_job(view["id"])
    assert (row["state"], bool(row["deadline_missed"])) == ("cancelled", True)
    assert view["id"] not in service.live.engine.jobs  # forgotten, as a cancelled job is


async def test_a_running_job_that_misses_is_stopped_under_on_miss_cancel(service_factory):
    service = await service_factory(policy={"deadlines": {"on_miss": "cancel"}})
    alice = service.client("alice")
    job = await submit(alice, h100(1, walltime=1, deadline=3))  # planned as 1 s; runs a minute
    assert job["state"] == "running", job
    view = await wait_job(alice, job["id"], "cancelled")
    assert view["deadline_missed"] is True, view
    assert view["message"].startswith("cancelled: its deadline "), view
    assert "passed while it ran" in view["message"], view
    [event] = await _miss_events(service, job["id"])
    assert event["data"]["action"] == "cancelled" and "stopping it" in event["message"], event
    _, text = await alice.get("metrics")
    assert 'gpusched_deadline_misses_total{action="cancelled"} 1.0' in text


async def test_a_miss_is_reported_once_across_a_restart(tmp_path):
    """The flag is stored: the restarted engine, whose deadline has passed, says nothing more."""
    service = await start_service(tmp_path)
    try:
        view = await _missed(service, service.client("alice"))
    finally:
        await service.stop()  # (its jobs' processes are killed: the restart finds them gone)
    again = await start_service(tmp_path)
    try:
        alice = again.client("alice")
        # it starts once the restart has ended the jobs ahead of it: passes have run since
        started = await wait_job(alice, view["id"], "running")
        assert started["deadline_missed"] is True, started
        assert len(await _miss_events(again, view["id"])) == 1
        _, text = await alice.get("metrics")
        assert 'gpusched_deadline_misses_total{action="kept"} 0.0' in text
    finally:
        await again.stop()
