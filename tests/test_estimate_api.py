"""``POST api/estimate`` against an in-process service with real job processes
(``tests/service_helpers.py``): the answer is what the job's record says right after a
submission, and nothing is queued, stored, numbered or audited.

Cluster: gpu1, gpu2 with 8 H100 each, l40s1, l40s2 with 4 L40S (hub_config/cluster.yaml).
"""

from __future__ import annotations

import time

import pytest
from service_helpers import services
from test_service_api import BAD_REQUESTS, PAGES, fill_h100, h100, submit

from jupyter_gpusched.service import openapi
from jupyter_gpusched.service.records import job_id_for


@pytest.fixture
async def service_factory(tmp_path):
    async with services(tmp_path) as make:
        yield make


async def everything(service):
    """What a user and an admin can read (and the events), to compare before and after."""
    clients = (service.client("alice"), service.client("admin"))
    pages = [(await client.get(path))[1] for client in clients for path in PAGES]
    return [*pages, (await service.client("admin").get("api/events"))[1]]


async def test_a_free_cluster_starts_now_and_nothing_is_queued(service_factory):
    service = await service_factory()
    alice = service.client("alice")
    before = await everything(service)
    status, answer = await alice.post("api/estimate", {"gpus": 2, "command": "true"})
    assert status == 200, answer
    assert answer == {
        "start_now": True,
        "eta": None,
        "reason": None,
        "queue": "team",
        "position": None,
        "earliest_finish": None,  # (a job with a deadline: tests/test_deadlines_api.py)
        "planned_run_time": {  # (estimates: tests/test_runtime_estimates_api.py)
            "seconds": 86_400,
            "from": "default",
            # (it starts now: the default's advice, to give a walltime, is for a job that waits)
            "message": "planned to run 1 d, the default for a job without a walltime",
        },
    }
    assert await everything(service) == before
    # no job number was used up: the next submission gets the number it would have had
    first = await submit(alice, {"gpus": 1, "command": "true"})
    assert first["id"] == job_id_for(1)


async def test_a_busy_cluster_waits_with_the_reservation_eta_the_job_then_gets(service_factory):
    service = await service_factory()
    alice = service.client("alice")
    running = await fill_h100(alice)  # walltime: the default (the settings' walltime)
    before = await everything(service)
    body = h100(4, walltime="10m")
    status, answer = await alice.post("api/estimate", body)
    assert status == 200, answer
    assert answer["start_now"] is False
    assert answer["queue"] == "team" and answer["position"] == 1
    assert answer["reason"]["family"] == "capacity", answer
    ends = [job["start_time"] for job in running]
    assert answer["eta"] is not None and answer["eta"] >= min(ends)
    assert answer["reason"]["eta"] == answer["eta"]
    assert await everything(service) == before
    # submitted now, its record says what the estimate said (the engine's one estimator)
    job = await submit(alice, body)
    assert job["state"] == "pending"
    assert job["reason"] == answer["reason"] and job["position"] == 0
    # a second estimate stands behind it: second in line, no reservation of its own, and its
    # expected start (core/plan.py): with the first, on the same node's other 4 GPUs
    _, second = await alice.post("api/estimate", body)
    assert (second["position"], second["start_now"], second["reason"]["eta"]) == (2, False, None)
    assert second["eta"] == answer["eta"]


async def test_a_queue_at_its_limit_is_the_reason(service_factory):
    service = await service_factory()
    alice = service.client("alice")
    running = await submit(
        alice, {"gpus": 2, "queue": "small", "command": "sleep 60", "walltime": "10m"}
    )
    _, answer = await alice.post("api/estimate", {"gpus": 1, "queue": "small", "command": "true"})
    assert answer["start_now"] is False
    assert answer["reason"]["family"] == "policy" and answer["queue"] == "small"
    assert "small" in answer["reason"]["message"], answer
    # expected when the queue's job ends as planned (core/plan.py)
    assert answer["eta"] == pytest.approx(running["start_time"] + 600)


async def test_what_a_submission_refuses_an_estimate_refuses(service_factory):
    """The same 400s (naming the field), the same 403 for another's queue, and for a job
    that can never run here; nothing changes, and the refusal is not counted as a submission's."""
    service = await service_factory()
    alice, bob = service.client("alice"), service.client("bob")
    await fill_h100(alice)
    before = await everything(service)
    for what, body, field in BAD_REQUESTS:
        raw = body if isinstance(body, bytes) else None
        status, error = await alice.post("api/estimate", None if raw is not None else body, raw=raw)
        assert (status, error["field"]) == (400, field), (what, error)
        assert error["error"], what
    status, error = await alice.post("api/estimate", {"gpus": 25, "command": "true"})
    assert (status, error["field"]) == (400, "gpus") and "25 GPUs" in error["error"]
    status, error = await bob.post("api/estimate", {"gpus": 1, "queue": "private", "command": "x"})
    assert (status, error["field"]) == (403, "queue")
    status, error = await alice.post("api/estimate", {"gpus": 1, "queue": "nope", "command": "x"})
    assert (status, error["field"]) == (400, "queue") and "team" in error["error"]
    assert await everything(service) == before
    assert service.live.metrics.refusals.labels(field="gpus")._value.get() == 0


async def test_a_user_at_the_pending_limit_gets_the_submission_429(service_factory):
    service = await service_factory()
    dave = service.client("dave")
    await fill_h100(service.client("alice"))
    for _ in range(2):
        await submit(dave, h100(1))
    status, error = await dave.post("api/estimate", h100(1))
    assert status == 429, error


async def test_the_estimate_leaves_the_live_engine_untouched(service_factory):
    """Same jobs, reasons, reservation, fair-share usage and pass count after an estimate."""
    service = await service_factory()
    alice = service.client("alice")
    await fill_h100(alice)
    await submit(alice, h100(8, name="head"))
    engine = service.live.engine

    def state():
        queues = engine.tree.by_path.values()
        tree = [(q.path, q.running, q.usage, q.usage_time, q.claimed) for q in queues]
        jobs = [(j.id, j.state, j.reason, j.start_time) for j in engine.jobs.values()]
        return (jobs, tree, engine.reservation, engine.passes, list(engine.state.free))

    before, number = state(), service.live.submissions.number
    for gpus in (1, 4, 8, 16):
        status, _ = await alice.post("api/estimate", h100(gpus))
        assert status == 200
    assert state() == before and service.live.submissions.number == number


def test_the_openapi_document_describes_the_estimate():
    operation = openapi.PATHS["/api/estimate"]["post"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    submit = openapi.PATHS["/api/jobs"]["post"]["requestBody"]["content"]["application/json"]
    # one job's body: POST api/jobs' but for "array" (an estimate is for one job)
    assert set(submit["schema"]["properties"]) - set(body["properties"]) == {"array"}
    assert {**body["properties"], "array": None} == {
        **submit["schema"]["properties"],
        "array": None,
    }
    assert set(operation["responses"]) == {"200", "400", "401", "403", "405", "413", "429"}
    schema = openapi.SCHEMAS["Estimate"]
    assert set(schema["required"]) == {
        *("start_now", "eta", "reason", "queue", "position", "earliest_finish"),
        "planned_run_time",
    }


async def test_the_eta_is_epoch_seconds(service_factory):
    service = await service_factory()
    alice = service.client("alice")
    await fill_h100(alice)
    _, answer = await alice.post("api/estimate", h100(8))
    assert time.time() < answer["eta"] < time.time() + 10 * 24 * 3600
