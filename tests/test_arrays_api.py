"""Job arrays through the real service (``POST api/jobs`` with ``"array"``,
``DELETE api/arrays/<id>``): the 201's shape, the 400s, all-or-nothing, the ``%max_running`` cap
the engine keeps, cancelling an array as one, and each element's GPUSCHED_ARRAY_INDEX in its log.

Cluster and queues as in ``tests/test_service_api.py`` (24 GPUs; dave may keep 2 jobs pending).
"""

from __future__ import annotations

import jsonschema
import pytest
from service_helpers import services, wait_job, wait_log, wait_until

from jupyter_gpusched.core.arrays import MAX_ARRAY_ELEMENTS, parse_array
from jupyter_gpusched.core.errors import ConfigError
from jupyter_gpusched.service.openapi import openapi_document
from jupyter_gpusched.service.openapi_arrays import ARRAY_FIELD


@pytest.fixture
async def service(tmp_path):
    async with services(tmp_path) as make:
        yield await make()


def body(array, command="sleep 60", **more):
    return {"gpus": 1, "command": command, "array": array, **more}


async def test_an_array_is_created_in_one_request_with_its_ids_and_indices(service):
    alice = service.client("alice")
    status, answer = await alice.post("api/jobs", body("1,3,5-7"))
    assert status == 201, answer
    assert set(answer) == {"array_id", "jobs"}
    array_id = answer["array_id"]
    assert array_id.startswith("a-")
    jobs = answer["jobs"]
    assert [job["array_index"] for job in jobs] == [1, 3, 5, 6, 7]
    assert {job["array_id"] for job in jobs} == {array_id}
    assert len({job["id"] for job in jobs}) == 5
    # the array's id is its first job's number; every element is stored (a restart keeps them)
    assert array_id[2:] == jobs[0]["id"][2:]
    for job in jobs:
        assert service.app.store.get_job(job["id"])["array_id"] == array_id
    assert conforms("JobArray", answer)
    # a plain job carries the fields as null
    status, plain = await alice.post("api/jobs", {"gpus": 1, "command": "true"})
    assert (status, plain["array_id"], plain["array_index"]) == (201, None, None)


@pytest.mark.parametrize(
    ("array", "says"),
    [
        ("5-2", "must go upwards"),
        ("0-9%0", "from 1 to"),
        # beyond what a database integer holds: once a 500 that left the started elements
        # running in the engine, with no rows, for nobody to cancel
        ("0-3%99999999999999999999999", f"from 1 to {MAX_ARRAY_ELEMENTS}"),
        ("x", "Slurm's syntax"),
        ("0-", "Slurm's syntax"),
        (7, "Slurm's syntax"),
        (f"0-{MAX_ARRAY_ELEMENTS}", f"more than {MAX_ARRAY_ELEMENTS} elements"),
        ("0-2000000", "indices go up to"),
    ],
)
async def test_a_bad_array_is_a_400_naming_the_field_and_stores_nothing(service, array, says):
    alice = service.client("alice")
    status, error = await alice.post("api/jobs", body(array))
    assert status == 400, error
    assert error["field"] == "array" and says in error["error"]
    assert service.app.store.jobs() == [] and not service.live.engine.jobs


async def test_elements_the_database_refuses_are_taken_back_though_the_pass_started_them(
    service, monkeypatch
):
    """The pass after a submission runs before its group commit: elements it started must not
    stay in the engine, holding GPUs with no row, when the commit fails (a 503 to retry)."""
    alice, engine, store = service.client("alice"), service.live.engine, service.live.store

    def refused(rows, events):
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(store, "add_jobs", refused)
        status, error = await alice.post("api/jobs", body("0-3"))
    assert status == 503 and "disk full" in error["error"]
    assert not engine.jobs and not engine.running and store.jobs() == []
    assert engine.state.free_total == 24 and not service.live.extras
    status, answer = await alice.post("api/jobs", body("0-3"))  # and the next one is whole
    assert status == 201 and [job["state"] for job in answer["jobs"]] == ["running"] * 4
    assert engine.state.free_total == 20


async def test_an_array_of_notebook_servers_is_refused(service):
    alice = service.client("alice")
    status, error = await alice.post("api/jobs", {"gpus": 1, "kind": "notebook", "array": "0-1"})
    assert (status, error["field"]) == (400, "array")


async def test_nothing_is_half_created_when_the_pending_limit_refuses_an_element(service):
    dave = service.client("dave")  # dave may keep 2 jobs pending (service_helpers.QUEUES)
    status, error = await dave.post("api/jobs", body("0-2", held=True))
    assert status == 429, error
    assert "asks for 3 more" in error["error"]
    assert service.app.store.jobs() == [] and not service.live.engine.jobs
    status, answer = await dave.post("api/jobs", body("0-1", held=True))
    assert status == 201 and len(answer["jobs"]) == 2


async def test_max_running_caps_the_running_elements_with_a_reason(service):
    alice = service.client("alice")
    status, answer = await alice.post("api/jobs", body("0-5%2"))
    assert status == 201, answer
    array_id = answer["array_id"]

    async def states():
        views = [(await alice.get(f"api/jobs/{job['id']}"))[1] for job in answer["jobs"]]
        return [view["state"] for view in views], views

    _, views = await wait_until(lambda: _counted(states, "running", 2), what="two elements running")
    waiting = [view for view in views if view["state"] == "pending"]
    assert len(waiting) == 4
    for view in waiting:
        assert view["reason"]["detail"] == "array-limit"
        assert view["reason"]["message"] == f"array {array_id} is at its limit of 2 running"
    # the cluster has room for all six: only the cap holds them back
    assert service.live.engine.state.free_total >= 4
    # api/queue names the array's pending elements as one row, the command line's way
    status, queue = await alice.get("api/queue")
    assert status == 200 and conforms("Queue", queue)
    pending = sorted(view["array_index"] for view in waiting)
    assert queue["arrays"] == {array_id: f"{array_id}_[{pending[0]}-{pending[-1]}%2]"}
    assert pending == list(range(pending[0], pending[0] + 4))
    # one element ends: the next one starts, and still two run
    first = next(view for view in views if view["state"] == "running")
    status, _ = await alice.delete(f"api/jobs/{first['id']}")
    assert status == 200
    await wait_job(alice, first["id"], "cancelled")
    await wait_until(lambda: _counted(states, "running", 2, done=1), what="the next element")


async def _counted(states, state, count, done=0):
    found, views = await states()
    finished = sum(1 for s in found if s in ("cancelled", "completed"))
    return (found, views) if found.count(state) == count and finished == done else None


async def test_deleting_an_array_cancels_its_pending_and_running_elements(service):
    alice, bob = service.client("alice"), service.client("bob")
    status, answer = await alice.post("api/jobs", body("0-9%3"))
    assert status == 201
    array_id = answer["array_id"]
    first = answer["jobs"][0]["id"]
    await wait_job(alice, first, "running")
    # another user's array is not theirs to cancel: answered as an unknown one
    status, error = await bob.delete(f"api/arrays/{array_id}")
    assert (status, error["field"]) == (404, "array_id")
    status, answer = await alice.delete(f"api/arrays/{array_id}")
    assert status == 200, answer
    assert conforms("JobArray", answer)
    assert len(answer["jobs"]) == 10
    for job in answer["jobs"]:  # pending and running elements alike say who cancelled them
        view = await wait_job(alice, job["id"], "cancelled")
        assert view["message"].startswith("cancelled by alice"), view  # (+ the signal)
    status, _ = await alice.delete(f"api/arrays/{array_id}")
    assert status == 404  # nothing of it is left to cancel
    status, _ = await alice.delete("api/arrays/a-999999")
    assert status == 404


async def test_each_element_sees_its_array_index_and_id(service):
    alice = service.client("alice")
    command = 'echo "index=$GPUSCHED_ARRAY_INDEX of=$GPUSCHED_ARRAY_ID"'
    status, answer = await alice.post("api/jobs", body("4,9", command=command, gpus=0, cpus=1))
    assert status == 201, answer
    for job in answer["jobs"]:
        await wait_job(alice, job["id"], "completed")
        log = await wait_log(alice, job["id"], "index=")
        assert f"index={job['array_index']} of={answer['array_id']}" in log


def conforms(schema_name: str, value) -> bool:
    """``value`` is what api/openapi.json's schema ``schema_name`` describes."""
    components = openapi_document()["components"]
    schema = {"$ref": f"#/components/schemas/{schema_name}", "components": components}
    jsonschema.Draft202012Validator(schema).validate(value)
    return True


@pytest.mark.parametrize(
    "text", ["0", "0-99%8", "1,3,5-7", "0-20:5", "0-99%0", "5-2", "0-9x", "", "%3", "0--1"]
)
def test_the_schemas_pattern_admits_what_the_parser_reads(text):
    """The document's pattern lets through every array the parser reads; what it lets through
    that the parser refuses is what JSON Schema cannot say (ranges upwards, the size, a cap
    from 1 to 10,000: the field's description says so, and the 400 names 'array')."""
    pattern_ok = jsonschema.Draft202012Validator(ARRAY_FIELD).is_valid(text)
    try:
        parse_array(text)
    except ConfigError as exc:
        assert exc.field == "array"
        parsed = False
    else:
        parsed = True
    assert pattern_ok or not parsed
    assert pattern_ok == (text in ("0", "0-99%8", "1,3,5-7", "0-20:5", "0-99%0", "5-2"))
