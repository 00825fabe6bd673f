"""The REST API of the scheduler service, route by route, against an in-process service with real
job processes (``tests/service_helpers.py``).

Cluster (``hub_config/cluster.yaml``): gpu1, gpu2 with 8 H100 each, l40s1, l40s2 with 4 L40S.
Queues (:data:`service_helpers.QUEUES`): alice, bob and dave share ``team``; ``small`` is capped
at 2 GPUs; only carol may use ``private``; dave may have 2 pending jobs.
"""

from __future__ import annotations

import asyncio
import copy
import json
import re
import time
from pathlib import Path
from urllib.parse import urlparse

import helpers
import pytest
from service_helpers import (
    QUEUES,
    TOKENS,
    process_gone,
    services,
    wait_job,
    wait_log,
    wait_until,
)
from tornado import web
from tornado.httpclient import AsyncHTTPClient

from jupyter_gpusched.core import Scheduler
from jupyter_gpusched.service import openapi
from jupyter_gpusched.service import routes as service_routes
from jupyter_gpusched.service.identity import Identity
from jupyter_gpusched.service.requests import parse_job_request

SLEEP = "sleep 60"
# Says it is ready, then waits; on SIGTERM it writes 'bye' and exits 0.
POLITE = "trap 'echo bye; exit 0' TERM; echo ready; sleep 60 & wait $!"


@pytest.fixture
async def service_factory(tmp_path):
    """``await service_factory(**options)``: a started service, stopped after the test."""
    async with services(tmp_path) as make:
        yield make


def h100(gpus=8, command=SLEEP, **more):
    return {"gpus": gpus, "gpu_model": "H100", "command": command, **more}


async def submit(client, body, status=201):
    code, view = await client.post("api/jobs", body)
    assert code == status, view
    return view


async def fill_h100(client):
    """Two running 8-GPU jobs: every H100 is busy (the L40S nodes stay free)."""
    jobs = [await submit(client, h100()) for _ in range(2)]
    assert [j["state"] for j in jobs] == ["running", "running"], jobs
    assert {j["allocation"][0]["node"] for j in jobs} == {"gpu1", "gpu2"}
    return jobs


def queue_ids(queue: dict) -> list[str]:
    return [entry["id"] for entry in queue["jobs"]]


# -- submitting and running --------------------------------------------------------------------
async def test_a_job_runs_on_its_gpus_and_completes(service_factory):
    service = await service_factory()
    alice = service.client("alice")
    command = 'echo "CVD=$CUDA_VISIBLE_DEVICES JOB=$GPUSCHED_JOB_ID"'
    job = await submit(alice, {"gpus": 2, "command": command, "name": "hello"})
    assert {"id", "state", "position", "reason"} <= job.keys()
    assert re.fullmatch(r"j-\d+", job["id"])
    assert (job["state"], job["position"], job["reason"]) == ("running", None, None)
    assert (job["user"], job["name"], job["queue"]) == ("alice", "hello", "team")
    [part] = job["allocation"]
    assert len(part["gpus"]) == 2
    done = await wait_job(alice, job["id"], "completed")
    assert (done["exit_code"], done["message"]) == (0, "exit code 0")
    status, log = await alice.get(f"api/jobs/{job['id']}/log")
    assert status == 200
    visible = ",".join(str(i) for i in part["gpus"])
    assert f"CVD={visible} JOB={job['id']}" in log


async def test_a_cpu_only_job_runs_without_gpus_on_a_node_with_the_cpus(service_factory):
    service = await service_factory()
    alice = service.client("alice")
    command = 'echo "CVD=[$CUDA_VISIBLE_DEVICES]"'
    job = await submit(alice, {"gpus": 0, "cpus": 2, "memory_gb": 4, "command": command})
    assert (job["state"], job["gpus"]) == ("running", 0), job
    [part] = job["allocation"]
    assert part["gpus"] == []
    done = await wait_job(alice, job["id"], "completed")
    assert done["exit_code"] == 0
    assert "CVD=[]" in (await alice.get(f"api/jobs/{job['id']}/log"))[1]
    _, cluster = await alice.get("api/cluster")
    assert cluster["allocated_gpus"] == 0


async def test_a_job_that_exits_3_fails_with_exit_code_3(service_factory):
    service = await service_factory()
    alice = service.client("alice")
    job = await submit(alice, {"gpus": 1, "command": "echo failing; exit 3"})
    failed = await wait_job(alice, job["id"], ("failed", "completed"))
    assert (failed["state"], failed["exit_code"]) == ("failed", 3)
    assert failed["message"] == "exit code 3"
    assert "failing" in (await alice.get(f"api/jobs/{job['id']}/log"))[1]


async def test_a_pending_job_has_a_position_and_a_reason(service_factory):
    service = await service_factory()
    alice = service.client("alice")
    await fill_h100(alice)
    first = await submit(alice, h100())
    second = await submit(alice, h100(4))
    assert (first["state"], first["position"]) == ("pending", 0)
    assert (second["state"], second["position"]) == ("pending", 1)
    assert first["reason"]["family"] in ("capacity", "placement")
    assert first["reason"]["message"]
    status, log = await alice.get(f"api/jobs/{first['id']}/log")
    assert status == 404 and log["field"] == "id"  # no log before it runs


# -- bad input -----------------------------------------------------------------------------------
JOB = {"gpus": 1, "command": "true"}
BAD_REQUESTS = [
    ("not JSON", b'{"gpus": 1,', None),
    ("not UTF-8", b'{"gpus": 1, "command": "\xff"}', None),
    ("a JSON array", b'[{"gpus": 1, "command": "true"}]', None),
    ("a JSON string", b'"gpus"', None),
    ("an empty body", b"", None),
    ("NaN", b'{"gpus": 1, "command": "true", "cpus": NaN}', None),
    ("deeply nested", b'{"gpus": 1, "command": "true", "labels": ' + b"[" * 100_000, None),
    ("a lone surrogate", b'{"gpus": 1, "command": "echo \\ud800"}', None),
    ("a key given twice", b'{"gpus": 1, "command": "true", "gpus": 8}', None),
    ("an unknown field", {**JOB, "colour": "red"}, "colour"),
    ("user in the body", {**JOB, "user": "bob"}, "user"),
    ("no gpus", {"command": "true"}, "gpus"),
    ("gpus 0 without cpus or memory", {**JOB, "gpus": 0}, "cpus"),
    ("gpus 0 with a GPU model", {**JOB, "gpus": 0, "cpus": 1, "gpu_model": "H100"}, "gpu_model"),
    ("gpus -1", {**JOB, "gpus": -1}, "gpus"),
    ("gpus 1.5", {**JOB, "gpus": 1.5}, "gpus"),
    ("gpus '2'", {**JOB, "gpus": "2"}, "gpus"),
    ("gpus true", {**JOB, "gpus": True}, "gpus"),
    ("gpus 2**63", {**JOB, "gpus": 2**63}, "gpus"),
    ("tier 4", {**JOB, "tier": 4}, "tier"),
    ("tier 0", {**JOB, "tier": 0}, "tier"),
    ("tier '1'", {**JOB, "tier": "1"}, "tier"),
    ("an unknown queue", {**JOB, "queue": "nope"}, "queue"),
    ("an unknown GPU model", {**JOB, "gpu_model": "A100"}, "gpu_model"),
    ("unknown GPU models", {**JOB, "gpu_model": ["A100", "V100"]}, "gpu_model"),
    ("an empty GPU model list", {**JOB, "gpu_model": []}, "gpu_model"),
    ("walltime 'soon'", {**JOB, "walltime": "soon"}, "walltime"),
    ("walltime 0", {**JOB, "walltime": 0}, "walltime"),
    ("walltime true", {**JOB, "walltime": True}, "walltime"),
    ("gpu_fraction 0.5 with gpus 2", {**JOB, "gpus": 2, "gpu_fraction": 0.5}, "gpu_fraction"),
    ("gpu_fraction 0", {**JOB, "gpu_fraction": 0}, "gpu_fraction"),
    ("gpus_per_node 3 of 8", {**JOB, "gpus": 8, "gpus_per_node": 3}, "gpus_per_node"),
    ("env CUDA_VISIBLE_DEVICES", {**JOB, "env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env"),
    ("env GPUSCHED_*", {**JOB, "env": {"GPUSCHED_JOB_ID": "j-1"}}, "env"),
    ("env with a bad name", {**JOB, "env": {"A=B": "1"}}, "env"),
    ("env with a number", {**JOB, "env": {"A": 1}}, "env"),
    ("a relative cwd", {**JOB, "cwd": "tmp/work"}, "cwd"),
    ("no command", {"gpus": 1}, "command"),
    ("command and notebook", {**JOB, "notebook": "/x.ipynb"}, "command"),
    ("an empty command", {**JOB, "command": "  "}, "command"),
    ("a NUL in the command", {**JOB, "command": "echo \x00"}, "command"),
    ("a notebook server with a command", {**JOB, "kind": "notebook"}, "command"),
    ("an unknown kind", {**JOB, "kind": "daemon"}, "kind"),
    ("a long name", {**JOB, "name": "x" * 201}, "name"),
    ("labels not strings", {**JOB, "labels": {"rack": 1}}, "labels"),
    ("held 'yes'", {**JOB, "held": "yes"}, "held"),
    ("cpus -1", {**JOB, "cpus": -1}, "cpus"),
    ("cpus 10**400", {**JOB, "cpus": 10**400}, "cpus"),
    ("gpu_fraction 10**400", {**JOB, "gpu_fraction": 10**400}, "gpu_fraction"),
    ("walltime 10**400", {**JOB, "walltime": 10**400}, "walltime"),
    ("memory_gb '4G'", {**JOB, "memory_gb": "4G"}, "memory_gb"),
]


async def test_bad_requests_get_400_naming_the_field_and_change_nothing(service_factory):
    service = await service_factory()
    alice, admin = service.client("alice"), service.client("admin")
    await fill_h100(alice)
    await submit(alice, h100(name="waits"))

    async def snapshot():
        return [(await client.get(path))[1] for client in (alice, admin) for path in PAGES]

    before = await snapshot()
    for what, body, field in BAD_REQUESTS:
        raw = body if isinstance(body, bytes) else None
        status, error = await alice.post("api/jobs", None if raw is not None else body, raw=raw)
        assert status == 400, (what, error)
        assert error["field"] == field, (what, error)
        assert error["error"], what
    status, error = await alice.post("api/jobs", {**JOB, "tier": 4})  # says what to fix
    assert error["error"].startswith("'tier' must be 1 (") and error["error"].endswith("got 4")
    status, error = await alice.post("api/jobs", {**JOB, "walltime": "soon"})  # as people write
    assert error["error"] == (
        "'walltime' must be seconds or a duration (30m, 2h, 1d) longer than 0 and at most 365d "
        "(one year), got 'soon'"
    )
    status, error = await alice.post("api/jobs", raw=b'{"gpus": 1, "gpus": 8, "command": "x"}')
    assert error["error"] == "the body is not valid JSON: 'gpus' is given twice: keep one"
    for number in ("1_000", "\uff11", "0x10"):  # float() takes the first two
        status, error = await alice.get("api/jobs", params={"limit": number})
        assert (status, error["field"]) == (400, "limit"), (number, error)
    assert (await alice.get("api/jobs", params={"limit": "1e3"}))[0] == 200
    assert await snapshot() == before


PAGES = ("api/queue", "api/jobs", "api/cluster", "api/quotas")


async def test_a_job_that_can_never_run_is_a_400_naming_the_field(service_factory):
    """More GPUs than the cluster (or a gang shape no set of nodes has) is bad input: 400 with
    the field and the reason; nothing is queued or created, and the refusal is audited."""
    service = await service_factory()
    alice, admin = service.client("alice"), service.client("admin")
    _, queue_before = await alice.get("api/queue")
    _, jobs_before = await alice.get("api/jobs")
    status, error = await alice.post("api/jobs", {"gpus": 25, "command": "true"})
    assert status == 400 and error["field"] == "gpus", error
    assert "25 GPUs" in error["error"] and "24" in error["error"]
    status, error = await alice.post(
        "api/jobs", {"gpus": 18, "gpus_per_node": 6, "command": "true"}
    )
    assert status == 400 and error["field"] == "gpus_per_node", error
    assert (await alice.get("api/queue"))[1] == queue_before
    assert (await alice.get("api/jobs"))[1] == jobs_before
    _, events = await admin.get("api/events", params={"kind": "rejected"})
    assert events["events"] == []  # a refused request stores nothing
    refused = service.live.metrics.refusals
    assert refused.labels(field="gpus")._value.get() == 1
    assert refused.labels(field="gpus_per_node")._value.get() == 1


async def test_a_queue_the_user_is_not_a_member_of_is_forbidden(service_factory):
    service = await service_factory()
    bob = service.client("bob")
    _, before = await bob.get("api/jobs")
    status, error = await bob.post("api/jobs", {**JOB, "queue": "private"})
    assert (status, error["field"]) == (403, "queue")
    assert (await bob.get("api/jobs"))[1] == before
    carol = service.client("carol")
    assert (await submit(carol, JOB))["queue"] == "private"  # her only queue is her default
    assert (await submit(service.client("admin"), {**JOB, "queue": "private"}))["queue"] == (
        "private"
    )


async def test_a_job_without_a_queue_lands_in_the_team_queue_and_me_lists_the_queues(
    service_factory,
):
    """``small`` is the catch-all default_queue and names alice too; her job without a queue
    goes to ``team``, the queue that names her (issue 15: every job went to the catch-all).
    ``api/me`` lists her queues with GPUs in use, guarantee and limit, marking the default."""
    service = await service_factory()
    alice = service.client("alice")
    job = await submit(alice, h100(3))
    assert (job["queue"], job["state"]) == ("team", "running")  # small's limit is 2
    _, me = await alice.get("api/me")
    shares = [q.pop("fair_share") for q in me["queues"]]  # test_history.py checks these
    assert me["queues"] == [
        {"path": "small", "in_use": 0, "guaranteed": 0, "limit": 2, "default": False},
        {"path": "team", "in_use": 3, "guaranteed": 12, "limit": 24, "default": True},
    ]
    assert all(share is None or share["rank"] >= 1 for share in shares)
    _, carol = await service.client("carol").get("api/me")
    assert [(q["path"], q["default"]) for q in carol["queues"]] == [("private", True)]


async def test_my_jobs_are_listed_newest_first(service_factory):
    """docs/service.md and the OpenAPI document say newest first; so does client.jobs()."""
    service = await service_factory()
    bob = service.client("bob")
    ids = [(await submit(bob, {**JOB, "held": True}))["id"] for _ in range(3)]
    _, listed = await bob.get("api/jobs")
    assert [j["id"] for j in listed["jobs"]] == ids[::-1]
    _, page = await bob.get("api/jobs", params={"limit": 1, "offset": 1})
    assert [j["id"] for j in page["jobs"]] == [ids[1]]


async def test_too_many_pending_jobs_get_429(service_factory):
    service = await service_factory()
    dave = service.client("dave")
    held = [await submit(dave, {**JOB, "held": True}) for _ in range(2)]
    _, before = await dave.get("api/jobs")
    status, error = await dave.post("api/jobs", JOB)
    assert status == 429, error
    assert "2 pending jobs" in error["error"]
    assert (await dave.get("api/jobs"))[1] == before
    assert (await dave.delete(f"api/jobs/{held[0]['id']}"))[0] == 200
    assert (await submit(dave, {**JOB, "held": True}))["state"] == "pending"
    # the limit counts the jobs already waiting, even for a job that could start at once
    assert (await dave.post("api/jobs", JOB))[0] == 429


# -- who sees what ----------------------------------------------------------------------------
async def test_other_users_jobs_are_hidden_or_anonymised(service_factory):
    service = await service_factory()
    alice, bob, admin = (service.client(u) for u in ("alice", "bob", "admin"))
    running = await submit(alice, {"gpus": 1, "command": "echo secret-output; sleep 60"})
    waiting = await submit(alice, {"gpus": 24, "command": "echo secret", "name": "secret-name"})
    assert waiting["state"] == "pending"
    await wait_log(alice, running["id"], "secret-output")
    for job in (running, waiting):
        for method, path in (
            ("GET", f"api/jobs/{job['id']}"),
            ("GET", f"api/jobs/{job['id']}/log"),
            ("DELETE", f"api/jobs/{job['id']}"),
        ):
            status, error = await bob.request(method, path)
            assert (status, error["field"]) == (404, "id"), (method, path, error)
    assert (await alice.get(f"api/jobs/{running['id']}"))[1]["state"] == "running"
    assert (await alice.get(f"api/jobs/{waiting['id']}"))[1]["state"] == "pending"

    # the queue: bob sees that the job waits, not whose it is or what it runs
    _, theirs = await bob.get("api/queue")
    [entry] = theirs["jobs"]
    assert entry["id"] == waiting["id"] and entry["gpus"] == 24 and not entry["mine"]
    assert entry["user"] is None and entry["name"] is None and entry.get("command") is None
    _, mine = await alice.get("api/queue")
    [entry] = mine["jobs"]
    assert (entry["user"], entry["name"], entry["mine"]) == ("alice", "secret-name", True)

    # job lists: only one's own, whatever ?user= says (admins: anybody's)
    assert (await bob.get("api/jobs", params={"user": "alice"}))[1]["jobs"] == []
    _, listed = await admin.get("api/jobs", params={"user": "alice"})
    assert {j["id"] for j in listed["jobs"]} == {running["id"], waiting["id"]}
    assert all(j["command"] for j in listed["jobs"])

    # the cluster: the GPU's holder is named to alice and the admin only
    async def holders(client):
        _, cluster = await client.get("api/cluster")
        return [
            (holder["job"], holder["user"])
            for node in cluster["nodes"]
            for gpu in node["gpu_list"]
            for holder in gpu["jobs"]
        ]

    assert await holders(alice) == [(running["id"], "alice")]
    assert await holders(admin) == [(running["id"], "alice")]
    assert await holders(bob) == [(None, None)]
    assert "secret" not in str(await bob.get("api/cluster")) + str(await bob.get("api/queue"))


async def test_a_reason_naming_its_user_reads_its_owner_to_others(service_factory):
    """The queue hides the user a reason names (the catalogue's user arguments, core/reasons.py)
    from other users, not from the owner or an admin."""
    service = await service_factory()
    alice, bob, admin = (service.client(u) for u in ("alice", "bob", "admin"))
    limited = copy.deepcopy(QUEUES)
    limited["user_limits"]["alice"] = {"gpus": 1}
    status, quotas = await admin.put("api/quotas", limited)
    assert status == 200, quotas
    assert (await submit(alice, {"gpus": 1, "command": SLEEP}))["state"] == "running"
    waiting = await submit(alice, {"gpus": 1, "command": SLEEP})
    assert waiting["reason"]["detail"] == "user-limit", waiting["reason"]

    async def message(client):
        _, queue = await client.get("api/queue")
        [entry] = queue["jobs"]
        assert entry["id"] == waiting["id"]
        return entry["reason"]["message"]

    named = "alice already runs 1 GPU; the limit per user is 1"
    assert await message(alice) == named
    assert await message(admin) == named
    assert await message(bob) == "its owner already runs 1 GPU; the limit per user is 1"


# -- cancelling -------------------------------------------------------------------------------
async def test_cancelling_a_pending_job(service_factory):
    service = await service_factory()
    alice = service.client("alice")
    await fill_h100(alice)
    job = await submit(alice, h100())
    status, view = await alice.delete(f"api/jobs/{job['id']}")
    assert (status, view["state"]) == (200, "cancelled")
    assert queue_ids((await alice.get("api/queue"))[1]) == []
    status, error = await alice.delete(f"api/jobs/{job['id']}")
    assert (status, error["field"]) == (409, "id")


async def test_cancelling_a_held_job(service_factory):
    service = await service_factory()
    alice = service.client("alice")
    job = await submit(alice, {**JOB, "held": True})
    assert job["state"] == "pending" and job["held"]
    status, view = await alice.delete(f"api/jobs/{job['id']}")
    assert (status, view["state"]) == (200, "cancelled"), view
    _, queue = await alice.get("api/queue")
    assert queue["held"] == [] and queue["jobs"] == []


async def test_cancelling_a_running_job_signals_it_and_frees_its_gpus(service_factory):
    service = await service_factory()
    alice = service.client("alice")
    job = await submit(alice, {"gpus": 8, "gpu_model": "H100", "command": POLITE})
    assert job["state"] == "running"
    node = job["allocation"][0]["node"]
    await wait_log(alice, job["id"], "ready")
    [pgid] = service.pids()
    status, view = await alice.delete(f"api/jobs/{job['id']}")
    assert status == 200, view
    # signalled, not yet gone (its trap takes a moment): running, and says it is stopping
    assert (view["state"], view["stopping"]) == ("running", "cancelled"), view
    ended = await wait_job(alice, job["id"], ("cancelled", "failed", "completed"))
    assert ended["state"] == "cancelled", ended
    assert ended["message"] == "cancelled by alice (exit code 0)", ended  # (its trap exits 0)
    assert "bye" in (await alice.get(f"api/jobs/{job['id']}/log"))[1]
    assert await wait_until(lambda: process_gone(pgid), 5)
    _, cluster = await alice.get("api/cluster")
    assert cluster["allocated_gpus"] == 0
    assert {n["name"]: n["free"] for n in cluster["nodes"]}[node] == 8
    # all 24 GPUs are free again: a job that needs them all starts
    assert (await submit(alice, {"gpus": 24, "command": "true"}))["state"] == "running"
    status, error = await alice.delete(f"api/jobs/{job['id']}")
    assert (status, error["field"]) == (409, "id")


# -- admin operations ---------------------------------------------------------------------------
async def test_admin_routes_are_forbidden_to_users(service_factory):
    service = await service_factory()
    alice = service.client("alice")
    job = await submit(alice, {**JOB, "held": True})
    in_an_hour = time.time() + 3600
    routes = [
        ("POST", "api/nodes/gpu1/drain", None),
        ("POST", "api/nodes/gpu1/resume", None),
        ("POST", f"api/jobs/{job['id']}/hold", None),
        ("POST", f"api/jobs/{job['id']}/release", None),
        ("PUT", f"api/jobs/{job['id']}/priority", {"priority": 5}),
        ("PUT", "api/quotas", QUEUES),
        ("PUT", "api/nodes/gpu1/maintenance", {"start": in_an_hour}),
        ("DELETE", "api/nodes/gpu1/maintenance", None),
    ]
    before = [(await service.client("admin").get(p))[1] for p in (*PAGES, "api/events")]
    for method, path, body in routes:
        status, error = await alice.request(method, path, body)
        assert status == 403, (method, path, error)
    after = [(await service.client("admin").get(p))[1] for p in (*PAGES, "api/events")]
    assert after == before


async def test_a_drained_node_gets_no_new_jobs_until_resumed(service_factory):
    service = await service_factory()
    alice, admin = service.client("alice"), service.client("admin")
    status, body = await admin.post("api/nodes/gpu1/drain")
    assert (status, body) == (200, {"node": "gpu1", "state": "drain"})
    first = await submit(alice, h100())
    assert first["allocation"][0]["node"] == "gpu2"
    second = await submit(alice, h100())
    assert second["state"] == "pending"
    _, cluster = await alice.get("api/cluster")
    assert {n["name"]: n["state"] for n in cluster["nodes"]}["gpu1"] == "drain"
    status, body = await admin.post("api/nodes/gpu1/resume")
    assert (status, body) == (200, {"node": "gpu1", "state": "up"})
    started = await wait_job(alice, second["id"], "running")
    assert started["allocation"][0]["node"] == "gpu1"
    status, error = await admin.post("api/nodes/gpu9/drain")
    assert (status, error["field"]) == (404, "name")


async def test_a_held_job_waits_until_released(service_factory):
    service = await service_factory()
    alice, admin = service.client("alice"), service.client("admin")
    blockers = await fill_h100(alice)
    job = await submit(alice, h100())
    status, view = await admin.post(f"api/jobs/{job['id']}/hold")
    assert (status, view["held"], view["state"]) == (200, True, "pending")
    _, queue = await alice.get("api/queue")
    assert queue_ids(queue) == [] and [e["id"] for e in queue["held"]] == [job["id"]]
    await alice.delete(f"api/jobs/{blockers[0]['id']}")
    await wait_job(alice, blockers[0]["id"], "cancelled")
    for _ in range(5):  # several polls with 8 H100s free
        await asyncio.sleep(0.1)
        assert (await alice.get(f"api/jobs/{job['id']}"))[1]["state"] == "pending"
    _, cluster = await alice.get("api/cluster")
    assert cluster["allocated_gpus"] == 8
    status, view = await admin.post(f"api/jobs/{job['id']}/release")
    assert (status, view["held"]) == (200, False)
    await wait_job(alice, job["id"], "running")
    status, error = await admin.post(f"api/jobs/{job['id']}/hold")  # running: cannot be held
    assert (status, error["field"]) == (409, "id") and error["error"]
    status, error = await admin.post("api/jobs/j-999999/hold")
    assert (status, error["field"]) == (404, "id")


async def test_priority_reorders_the_queue(service_factory):
    service = await service_factory()
    alice, bob, admin = (service.client(u) for u in ("alice", "bob", "admin"))
    await fill_h100(alice)
    first = await submit(alice, h100())
    second = await submit(bob, h100())
    assert queue_ids((await alice.get("api/queue"))[1]) == [first["id"], second["id"]]
    status, view = await admin.put(f"api/jobs/{second['id']}/priority", {"priority": 10})
    assert (status, view["priority"], view["position"]) == (200, 10, 0)
    assert queue_ids((await alice.get("api/queue"))[1]) == [second["id"], first["id"]]
    assert (await alice.get(f"api/jobs/{first['id']}"))[1]["position"] == 1
    for bad in ({"priority": "high"}, {"priority": 1.5}, {"priority": True}, {}):
        status, error = await admin.put(f"api/jobs/{second['id']}/priority", bad)
        assert (status, error["field"]) == (400, "priority"), bad
    status, error = await admin.put(f"api/jobs/{second['id']}/priority", {"priority": 2**70})
    assert (status, error["field"]) == (400, "priority")
    assert queue_ids((await alice.get("api/queue"))[1]) == [second["id"], first["id"]]


async def test_raising_a_queue_limit_lets_a_blocked_job_start(service_factory):
    service = await service_factory()
    alice, admin = service.client("alice"), service.client("admin")
    await submit(alice, {"gpus": 2, "queue": "small", "command": SLEEP})
    blocked = await submit(alice, {"gpus": 2, "queue": "small", "command": SLEEP})
    assert blocked["state"] == "pending"
    assert blocked["reason"]["detail"] == "queue-limit", blocked["reason"]
    raised = copy.deepcopy(QUEUES)
    raised["queues"]["small"]["limit"] = 4
    status, quotas = await admin.put("api/quotas", raised)
    assert status == 200, quotas
    assert quotas["document"] == raised
    assert {q["path"]: q["limit"] for q in quotas["queues"]}["small"] == 4
    await wait_job(alice, blocked["id"], "running")
    assert (await alice.get("api/quotas"))[1] == (await admin.get("api/quotas"))[1]


async def test_quotas_give_each_queue_its_running_and_waiting_gpus_held_jobs_apart(
    service_factory,
):
    service = await service_factory()
    alice, admin = service.client("alice"), service.client("admin")
    await submit(alice, {"gpus": 2, "queue": "small", "command": SLEEP})
    waiting = [await submit(alice, {"gpus": n, "queue": "small", "command": SLEEP}) for n in (1, 2)]
    assert [job["state"] for job in waiting] == ["pending", "pending"]

    async def figures():
        _, quotas = await alice.get("api/quotas")
        return {q["path"]: (q["running"], q["claimed"], q["pending"]) for q in quotas["queues"]}

    shown = await figures()
    assert shown["small"] == (2, 0, 3) and shown["team"] == (0, 0, 0)
    assert shown["root"] == (2, 0, 3)  # a parent's figures are its queues' sums
    # in use, and what of it is above the guarantee (small guarantees 0; the root, the cluster)
    _, quotas = await alice.get("api/quotas")
    held = {q["path"]: (q["in_use"], q["borrowed"]) for q in quotas["queues"]}
    assert held["small"] == (2, 2) and held["team"] == (0, 0) and held["root"] == (2, 0)
    status, _ = await admin.post(f"api/jobs/{waiting[1]['id']}/hold")
    assert status == 200
    assert (await figures())["small"] == (2, 0, 1)  # a held job does not wait in the queue
    await alice.delete(f"api/jobs/{waiting[0]['id']}")
    assert (await figures())["small"] == (2, 0, 0)
    _, cancelled = await alice.get(f"api/jobs/{waiting[0]['id']}")
    assert (cancelled["state"], cancelled["message"]) == ("cancelled", "cancelled by alice")


async def test_a_queue_cpu_limit_set_at_run_time_holds_cpu_only_jobs(service_factory):
    service = await service_factory()
    alice, admin = service.client("alice"), service.client("admin")
    limited = copy.deepcopy(QUEUES)
    limited["queues"]["small"]["cpus"] = {"limit": 3}
    status, quotas = await admin.put("api/quotas", limited)
    assert status == 200, quotas
    small = {q["path"]: q for q in quotas["queues"]}["small"]
    assert (small["cpu_limit"], small["cpus_running"], small["memory_limit"]) == (3, 0, None)
    body = {"gpus": 0, "cpus": 2, "queue": "small", "command": SLEEP}
    first, second = await submit(alice, body), await submit(alice, body)
    assert first["state"] == "running" and second["state"] == "pending"
    assert second["reason"]["detail"] == "queue-cpu-limit", second["reason"]
    assert "queue small is at its limit of 3 CPUs (2 in use" in second["reason"]["message"]
    status, error = await alice.post("api/jobs", {**body, "cpus": 4})
    assert (status, error["field"]) == (400, "cpus"), error
    _, quotas = await admin.get("api/quotas")
    assert {q["path"]: q for q in quotas["queues"]}["small"]["cpus_running"] == 2
    status, error = await admin.put(
        "api/quotas", {**limited, "queues": {**limited["queues"], "small": {"cpus": 3}}}
    )
    assert (status, error["field"]) == (400, "cpus"), error


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d["queues"]["small"].update(limit=-3), "limit"),
        (lambda d: d["queues"]["small"].update(guaranteed=3), "limit"),
        (lambda d: d["queues"].update(extra={"guaranteed": 0}), "queues"),
        (lambda d: d.update(colour="red"), "colour"),
        (lambda d: d["user_limits"]["dave"].update(pending_jobs=1.5), "pending_jobs"),
        (lambda d: d.update(default_queue="nope"), "default_queue"),
        (lambda d: d.pop("queues"), None),
        (lambda d: d["queues"]["small"].update(limit=10**400), "limit"),
    ],
)
async def test_an_invalid_quota_document_is_refused(service_factory, edit, field):
    service = await service_factory()
    admin = service.client("admin")
    _, before = await admin.get("api/quotas")
    document = copy.deepcopy(QUEUES)
    edit(document)
    status, error = await admin.put("api/quotas", document)
    assert (status, error["field"]) == (400, field), error
    assert (await admin.get("api/quotas"))[1] == before
    status, error = await admin.put("api/quotas", raw=b"[]")
    assert status == 400
    assert (await admin.get("api/quotas"))[1] == before


async def test_a_maintenance_window_keeps_long_jobs_off_the_node(service_factory):
    service = await service_factory()
    alice, admin = service.client("alice"), service.client("admin")
    start = time.time() + 3600
    status, body = await admin.put("api/nodes/gpu1/maintenance", {"start": start})
    assert (status, body) == (200, {"node": "gpu1", "maintenance": start})
    _, cluster = await alice.get("api/cluster")
    assert {n["name"]: n["maintenance"] for n in cluster["nodes"]}["gpu1"] == start
    long = await submit(alice, h100(walltime="2h"))
    assert long["allocation"][0]["node"] == "gpu2"
    longer = await submit(alice, h100(walltime="2h"))
    assert longer["state"] == "pending"  # gpu1 is free, but not for 2 h
    short = await submit(alice, h100(walltime="10m"))
    assert short["allocation"][0]["node"] == "gpu1"
    for bad in (
        {"start": "tomorrow"},
        {"start": -5},
        {},
        {"start": 1e300},
        {"start": 10**400},
        {"start": True},
    ):
        status, error = await admin.put("api/nodes/gpu1/maintenance", bad)
        assert (status, error["field"]) == (400, "start"), bad
    status, body = await admin.delete("api/nodes/gpu1/maintenance")
    assert (status, body) == (200, {"node": "gpu1", "maintenance": None})
    iso = "2099-01-01T00:00:00Z"
    status, body = await admin.put("api/nodes/l40s1/maintenance", {"start": iso})
    assert (status, body["maintenance"]) == (200, 4070908800.0)


# -- records ----------------------------------------------------------------------------------
async def test_events_admins_see_all_users_their_own(service_factory):
    service = await service_factory()
    alice, bob, admin = (service.client(u) for u in ("alice", "bob", "admin"))
    mine = await submit(alice, {**JOB, "held": True})
    theirs = await submit(bob, {**JOB, "held": True})
    await admin.post(f"api/jobs/{mine['id']}/release")
    await admin.post("api/nodes/l40s2/drain")
    await wait_job(alice, mine["id"], "completed")

    _, everything = await admin.get("api/events")
    kinds = {(e["kind"], e["job_id"]) for e in everything["events"]}
    assert {("submitted", mine["id"]), ("submitted", theirs["id"])} <= kinds
    assert {("released", mine["id"]), ("completed", mine["id"]), ("node-drain", None)} <= kinds
    ids = [e["id"] for e in everything["events"]]
    assert ids == sorted(ids, reverse=True)  # newest first

    _, submitted = await admin.get("api/events", params={"kind": "submitted"})
    assert {e["job_id"] for e in submitted["events"]} == {mine["id"], theirs["id"]}
    _, one = await admin.get("api/events", params={"job_id": mine["id"]})
    assert [e["kind"] for e in one["events"]][::-1][:2] == ["submitted", "released"]
    assert {e["job_id"] for e in one["events"]} == {mine["id"]}
    _, page = await admin.get("api/events", params={"limit": 2, "before": ids[0]})
    assert [e["id"] for e in page["events"]] == ids[1:3]

    for client, job in ((alice, mine), (bob, theirs)):
        _, seen = await client.get("api/events", params={"user": "admin"})
        assert seen["events"] and {e["user"] for e in seen["events"]} == {job["user"]}
        assert {e["job_id"] for e in seen["events"]} == {job["id"]}
    _, released = await alice.get("api/events", params={"kind": "released"})
    assert [e["actor"] for e in released["events"]] == ["admin"]
    for bad in ({"since": "yesterday"}, {"limit": "nan"}, {"before": "x"}):
        status, error = await admin.get("api/events", params=bad)
        assert (status, error["field"]) == (400, next(iter(bad))), bad


async def test_usage_counts_gpu_hours_and_cost(service_factory):
    service = await service_factory(gpu_hour_prices={"H100": 2.5})
    alice, bob = service.client("alice"), service.client("bob")
    job = await submit(alice, {"gpus": 2, "gpu_model": "H100", "command": "sleep 2"})
    done = await wait_job(alice, job["id"], "completed")
    ran = done["end_time"] - done["start_time"]
    assert ran >= 2
    expected = 2 * ran / 3600

    async def usage(client, by):
        status, body = await client.get("api/usage", params={"by": by})
        assert status == 200 and body["by"] == by, body
        return {row["key"]: row for row in body["usage"]}

    for by, key in (("queue", "team"), ("user", "alice"), ("gpu_model", "H100")):
        rows = await usage(alice, by)
        assert list(rows) == [key]
        assert rows[key]["gpu_hours"] == pytest.approx(expected, rel=0.05)
    rows = await usage(alice, "gpu_model")
    assert rows["H100"]["cost"] == pytest.approx(rows["H100"]["gpu_hours"] * 2.5)
    assert await usage(bob, "user") == {}  # not alice's usage
    assert list(await usage(service.client("admin"), "user")) == ["alice"]
    status, error = await alice.get("api/usage", params={"by": "colour"})
    assert (status, error["field"]) == (400, "by")
    status, error = await alice.get("api/usage", params={"since": 10, "until": 5})
    assert (status, error["field"]) == (400, "since")
    _, before = await alice.get("api/usage", params={"until": done["start_time"] - 1})
    assert before["usage"] == []


async def test_metrics(service_factory):
    service = await service_factory()
    alice = service.client("alice")
    await submit(alice, h100())
    await submit(alice, {"gpus": 24, "command": "true"})
    status, error = await service.client(None).get("metrics")
    assert status == 401, error
    status, text = await alice.get("metrics")
    assert status == 200
    for name in ("gpusched_queue_length", "gpusched_allocated_gpus", "gpusched_wait_seconds"):
        assert name in text
    assert 'gpusched_queue_length{tier="2"} 1.0' in text
    assert 'gpusched_allocated_gpus{queue="team",tier="2"} 8.0' in text
    assert 'gpusched_wait_seconds_count{tier="2"} 1.0' in text

    open_service = await service_factory(authenticate_metrics=False)
    status, text = await open_service.client(None).get("metrics")
    assert status == 200 and "gpusched_queue_length" in text
    status, _ = await open_service.client(None).get("api/queue")
    assert status == 401


async def test_requests_without_a_valid_token_are_refused(service_factory):
    service = await service_factory()
    for token in (None, "not-a-token-at-all-00000", TOKENS["alice"] + "x"):
        for method, path in (("GET", "api/queue"), ("GET", "api/jobs"), ("POST", "api/jobs")):
            body = JOB if method == "POST" else None
            status, error = await service.client(None).request(method, path, body, token=token)
            assert status == 401, (token, method, path, error)


# Jobs as their Unix users (AccountPolicy, the working directory, the files): see
# tests/test_security_accounts.py.


# -- the OpenAPI document ---------------------------------------------------------------------
_GROUP = re.compile(r"\(\?P<(\w+)>([^()]*)\)")
_PARAM = {"job_id": "id"}


def served_operations() -> set[tuple[str, str]]:
    """(path, method) of every operation ``routes.ROUTES`` serves: alternations of literal words
    become one path each; other groups become ``{param}``."""
    operations = set()
    for pattern, handler in service_routes.ROUTES:
        methods = {
            m
            for m in ("get", "post", "put", "delete", "patch")
            if getattr(handler, m) is not getattr(web.RequestHandler, m)
        }
        paths = ["/" + pattern]
        while any(_GROUP.search(p) for p in paths):
            expanded = []
            for path in paths:
                match = _GROUP.search(path)
                name, body = match.groups()
                if re.fullmatch(r"[\w.-]+(\|[\w.-]+)*", body):
                    options = body.split("|")
                else:
                    options = ["{" + _PARAM.get(name, name) + "}"]
                expanded += [path[: match.start()] + o + path[match.end() :] for o in options]
            paths = expanded
        operations |= {(path, method) for path in paths for method in methods}
    return operations


def test_openapi_describes_exactly_the_served_routes():
    served = served_operations()
    assert ("/api/jobs/{id}/release", "post") in served
    described = {(path, method) for path, ops in openapi.PATHS.items() for method in ops}
    assert served == described, (
        f"served, not described: {sorted(served - described)}; "
        f"described, not served: {sorted(described - served)}"
    )
    for path, operations in openapi.PATHS.items():
        for method, operation in operations.items():
            declared = {p["name"] for p in operation["parameters"] if p["in"] == "path"}
            assert declared == set(re.findall(r"\{(\w+)\}", path)), (path, method)


async def test_openapi_json_is_served_without_a_token(service_factory):
    service = await service_factory()
    status, document = await service.client(None).get("api/openapi.json")
    assert status == 200
    assert document["paths"] == openapi.PATHS
    assert document["openapi"].startswith("3.")


async def test_many_jobs_that_cannot_be_launched_fail_one_after_another(service_factory):
    """Each failed launch frees the GPUs for the next job in line, which fails too: hundreds in
    a row must not overflow the stack (nor leave jobs half-started)."""
    service = await service_factory()
    alice = service.client("alice")
    blocker = await submit(service.client("bob"), {"gpus": 2, "queue": "small", "command": SLEEP})
    # alice's log directory cannot be made (a file is in the way): each launch fails at once
    Path(service.live.log_dir, "alice").write_text("in the way\n")
    who = Identity("alice")
    body = {"gpus": 2, "queue": "small", "command": "true"}
    doomed = [service.live.submit(who, parse_job_request(dict(body))).id for _ in range(400)]
    assert (await alice.get(f"api/jobs/{doomed[0]}"))[1]["state"] == "pending"
    status, _ = await service.client("bob").delete(f"api/jobs/{blocker['id']}")
    assert status == 200
    await wait_job(service.client("bob"), blocker["id"], "cancelled")

    async def all_failed():
        _, listed = await alice.get("api/jobs", params={"state": "failed"})
        return len(listed["jobs"]) == len(doomed)

    await wait_until(all_failed, 30)
    view = (await alice.get(f"api/jobs/{doomed[-1]}"))[1]
    assert "launch failed" in view["message"], view
    Path(service.live.log_dir, "alice").unlink()
    assert (await submit(alice, {"gpus": 24, "command": "true"}))["state"] == "running"


async def test_cancelling_a_job_that_is_preempting(service_factory):
    """A pending job that has pre-empted others (its claim waits for them to leave) can be
    cancelled; the victims were already signalled and end; the next pass does not fail."""
    queues = {"queues": {"qa": {"guaranteed": 12, "users": ["alice"]}, "qb": {"users": ["bob"]}}}
    service = await service_factory(queues=queues)
    alice, bob = service.client("alice"), service.client("bob")
    # victims that sit out the grace period (tier 3: 1 min), so the claim is still waiting
    # when the DELETE comes, however slow the machine
    stubborn = "trap '' TERM; echo ready; sleep 60"
    victims = []
    for model, gpus in (("H100", 8), ("H100", 8), ("L40S", 4), ("L40S", 4)):
        body = {"gpus": gpus, "gpu_model": model, "tier": 3, "command": stubborn}
        victims.append(await submit(bob, body))
        assert victims[-1]["state"] == "running"
    for victim in victims:  # their trap is set (a signal before it would end them at once)
        await wait_log(bob, victim["id"], "ready")
    job = await submit(alice, h100())
    assert job["state"] == "pending"
    assert job["reason"]["detail"] == "preempting", job["reason"]
    status, view = await alice.delete(f"api/jobs/{job['id']}")
    assert (status, view["state"]) == (200, "cancelled"), view
    assert (await alice.get("api/queue"))[0] == 200
    later = await submit(alice, {"gpus": 1, "gpu_model": "L40S", "tier": 1, "command": "true"})
    assert later["state"] in ("pending", "running", "completed")


async def test_a_preempted_job_says_which_job_preempted_it(service_factory):
    """Its message names the job it made way for, then how its processes ended; not only
    "killed by SIGTERM", which reads like a crash."""
    queues = {"queues": {"qa": {"users": ["alice"]}, "qb": {"users": ["bob"]}}}
    service = await service_factory(queues=queues)
    alice, bob = service.client("alice"), service.client("bob")
    victims = [await submit(bob, h100(tier=3, command=POLITE)) for _ in range(2)]
    assert [v["state"] for v in victims] == ["running", "running"], victims
    for victim in victims:
        await wait_log(bob, victim["id"], "ready")
    stubborn = "trap '' TERM; echo ready; sleep 60"
    cancelled = await submit(bob, {"gpus": 4, "gpu_model": "L40S", "command": stubborn})
    await wait_log(bob, cancelled["id"], "ready")
    assert (await bob.delete(f"api/jobs/{cancelled['id']}"))[0] == 200
    job = await submit(alice, h100(tier=2))
    assert job["reason"]["detail"] == "preempting", job["reason"]

    async def requeued():
        views = [(await bob.get(f"api/jobs/{v['id']}"))[1] for v in victims]
        return next((v for v in views if v["state"] == "pending"), None)

    victim = await wait_until(requeued, 15)
    assert victim["message"] == f"pre-empted for {job['id']} (exit code 0)", victim
    assert (await wait_job(alice, job["id"], "running"))["state"] == "running"
    # a job that ignores the signal is killed after the grace period: both are said
    ended = await wait_job(bob, cancelled["id"], "cancelled", timeout=30)
    assert ended["message"].startswith("cancelled by bob ("), ended
    assert "SIGKILL" in ended["message"], ended


def test_engine_schedules_after_a_preempting_job_is_cancelled_and_forgotten():
    nodes = helpers.cluster(("n1", 8, "leaf"))
    tree = helpers.queues({"qa": {"guaranteed": 8}, "qb": {"guaranteed": 0}}, nodes)
    engine = Scheduler(nodes, tree)
    engine.submit(helpers.job("victim", 8, tier=3, queue="qb"), 0)
    engine.schedule(0)
    engine.submit(helpers.job("claimer", 8, tier=2, queue="qa", t=1), 1)
    engine.schedule(1)
    assert engine.jobs["claimer"].reason.detail == "preempting"
    engine.cancel("claimer", 2)
    engine.forget("claimer")
    engine.schedule(2)


async def test_an_undeclared_method_is_a_405_with_allow_and_an_unknown_route_a_json_404(
    service_factory,
):
    """What api/openapi.json promises for them (Schemathesis' unsupported_method and
    content_type_conformance checks): a 405 lists the path's methods in Allow; a path no route
    serves is a JSON 404 like the others, not tornado's HTML page."""
    service = await service_factory()
    alice = service.client("alice")
    auth = {"Authorization": f"token {alice.token}"}
    fetch = AsyncHTTPClient().fetch
    for path, allowed in (("api/jobs", "GET, POST"), ("api/jobs/j-1", "GET, DELETE")):
        response = await fetch(
            alice.base_url + path, method="PATCH", body=b"{}", headers=auth, raise_error=False
        )
        assert (response.code, response.headers.get("Allow")) == (405, allowed), path
        assert json.loads(response.body)["error"]
    # a method tornado refuses before the request is read to its end (QUERY): tornado closes
    # the connection after the answer, and the answer must say so, or the hub's proxy (which
    # keeps connections open) sends the next request into it and answers that one 503
    url = urlparse(alice.base_url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    writer.write(f"QUERY {url.path}api/jobs HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    answer = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).decode().lower()
    writer.close()
    assert answer.startswith("http/1.1 405") and "\r\nallow: get, post\r\n" in answer, answer
    assert "\r\nconnection: close\r\n" in answer, answer
    for path in ("api/nope", "api/jobs/x-1", "api/nodes//drain"):
        response = await fetch(alice.base_url + path, headers=auth, raise_error=False)
        assert response.code == 404, path
        assert response.headers["Content-Type"] == "application/json", path
        assert json.loads(response.body)["field"] is None


async def test_whole_numbers_are_whole_as_json_schema_counts_them(service_factory):
    """api/openapi.json says 'integer', and in JSON Schema 2.0 is one: the server agrees."""
    service = await service_factory()
    alice = service.client("alice")
    job = await submit(alice, {"gpus": 2.0, "tier": 3.0, "command": "true", "held": True})
    assert (job["gpus"], job["tier"]) == (2, 3)
    assert isinstance(job["gpus"], int)
    status, error = await alice.post("api/jobs", {"gpus": 2.5, "command": "true"})
    assert (status, error["field"]) == (400, "gpus")
    status, view = await service.client("admin").put(
        f"api/jobs/{job['id']}/priority", {"priority": 5.0}
    )
    assert (status, view["priority"]) == (200, 5)
