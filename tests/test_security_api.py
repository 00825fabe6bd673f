"""Every request is bounded before it becomes work, and nobody learns of another user's jobs:
the body limit (413 before the body is read), the bounds of each field of POST api/jobs and of
the other bodies and query arguments (400 naming the field, quoting little of the input,
changing nothing), and 404 for another user's job wherever a job id is taken.

Against an in-process service with real job processes (``tests/service_helpers.py``).
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from service_helpers import TOKENS, services, wait_job, wait_until

from jupyter_gpusched.service import requests as bounds
from jupyter_gpusched.service.api_handler import DRAIN_FACTOR

JOB = {"gpus": 1, "command": "true"}
LONG = "Z" * 5000  # a marker: no error message may repeat more than QUOTE characters of it


@pytest.fixture
async def service_factory(tmp_path):
    async with services(tmp_path) as make:
        yield make


async def snapshot(service) -> list:
    """What a refused request must leave as it was: jobs, queue, events, quotas, reaper."""
    admin = service.client("admin")
    pages = ("api/jobs", "api/queue", "api/events", "api/quotas", "api/reaper")
    seen = [(await admin.get(path))[1] for path in pages]
    for session in seen[-1]["sessions"]:  # the reaper's own clock moves: only the reports
        assert session["last_report"] is None, session
    seen[-1].pop("sessions")
    return seen


# -- the body limit ----------------------------------------------------------------------------
async def raw_request(port: int, head: str, body_parts=(), read_first: bool = False):
    """Send ``head`` (and ``body_parts`` unless the answer comes first); return the status,
    the answer's body and how many body bytes were sent before it came."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head.encode())
    sent = 0
    try:
        answer = asyncio.ensure_future(reader.read(1 << 16))
        for part in body_parts:
            if answer.done():
                break
            writer.write(part)
            sent += len(part)
            try:
                await writer.drain()
            except ConnectionError:
                break
            await asyncio.sleep(0)
        data = await asyncio.wait_for(answer, 10)
        while b"\r\n\r\n" not in data:
            more = await asyncio.wait_for(reader.read(1 << 16), 10)
            if not more:
                break
            data += more
        status_line, _, rest = data.partition(b"\r\n")
        headers, _, body = rest.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in headers.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(body) < length:
            body += await asyncio.wait_for(reader.read(1 << 16), 10)
        return int(status_line.split()[1]), body.decode(), sent
    finally:
        writer.close()


def head(method: str, path: str, user: str, extra: str) -> str:
    token = TOKENS.get(user, "not-a-token-of-anybody")
    return (
        f"{method} /{path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: token {token}\r\n"
        f"Content-Type: application/json\r\n{extra}\r\n"
    )


async def test_a_body_over_the_limit_is_413_and_never_kept(service_factory):
    limit = 64 * 1024
    service = await service_factory(max_body_bytes=limit)
    before = await snapshot(service)
    drained = DRAIN_FACTOR * limit
    # Announced beyond what is drained: refused on the headers alone (none of it is sent).
    status, body, _ = await raw_request(
        service.port, head("POST", "api/jobs", "alice", f"Content-Length: {drained + 1}\r\n")
    )
    assert status == 413, body
    assert '"field": null' in body and "65536 bytes" in body and "max_body_bytes" in body
    # Chunked (no length announced): refused once the chunks add up to more than that.
    chunk = b"%x\r\n%s\r\n" % (8192, b" " * 8192)
    status, body, sent = await raw_request(
        service.port,
        head("POST", "api/jobs", "alice", "Transfer-Encoding: chunked\r\n"),
        [chunk] * 1280,  # 10 MB
    )
    assert status == 413, body
    assert sent < drained + (1 << 20), f"{sent} bytes were taken before the answer"
    # Within what is drained, the body is read to its end (and dropped) and then answered,
    # whoever sends it: a proxy in front passes the answer on.
    big = json.dumps({"gpus": 1, "command": "x" * (2 * limit)}).encode()
    for user in ("alice", "nobody"):
        extra = f"Content-Length: {len(big)}\r\n"
        status, body, _ = await raw_request(
            service.port, head("POST", "api/jobs", user, extra), [big]
        )
        assert status == 413, body
    for user in ("alice", "admin"):  # every route that takes a body, whoever asks
        for method, path in (
            ("POST", "api/jobs"),
            ("PUT", "api/quotas"),
            ("PUT", "api/reaper"),
            ("POST", "api/usage-samples"),
        ):
            big = {"command": "x" * (100 * 1024), "gpus": 1}
            status, error = await service.client(user).request(method, path, big)
            assert status == 413 and error["field"] is None, (method, path, error)
    # A body within the limit is read and judged as usual.
    status, error = await service.client("alice").post("api/jobs", {**JOB, "name": "x" * 201})
    assert (status, error["field"]) == (400, "name")
    assert await snapshot(service) == before
    assert (await service.client("bob").get("api/me"))[0] == 200


async def test_the_default_body_limit_is_one_megabyte(service_factory):
    service = await service_factory()
    assert service.app.max_body_bytes == bounds.MAX_BODY_BYTES == 1 << 20
    alice = service.client("alice")
    status, error = await alice.post("api/jobs", {**JOB, "env": {"A": "x" * (1 << 20)}})
    assert status == 413, error
    status, error = await alice.post("api/jobs", {**JOB, "env": {"A": "x" * 70_000}})
    assert (status, error["field"]) == (400, "env")


# -- the bounds of POST api/jobs -----------------------------------------------------------------
def env(count: int, size: int = 1) -> dict:
    return {f"V{i}": "x" * size for i in range(count)}


OVER_THE_BOUNDS = [
    ("name", {"name": LONG[: bounds.MAX_NAME + 1]}),
    ("command", {"command": "x" * (bounds.MAX_COMMAND + 1)}),
    ("cwd", {"cwd": "/" + "d" * bounds.MAX_PATH}),
    ("notebook", {"command": None, "notebook": "/" + "n" * bounds.MAX_PATH}),
    ("queue", {"queue": "q" * (bounds.MAX_QUEUE + 1)}),
    ("env", {"env": env(bounds.MAX_ENV_VARS + 1)}),
    ("env", {"env": {"N" * (bounds.MAX_ENV_NAME + 1): "1"}}),
    ("env", {"env": env(8, bounds.MAX_ENV_BYTES // 8)}),  # 8 names more than the total
    ("env", {"env": {LONG: "1"}}),
    ("env", {"env": {"NAME\n": "1"}}),  # a name may not end in a newline ($ matched it)
    ("labels", {"labels": {f"k{i}": "v" for i in range(bounds.MAX_LABELS + 1)}}),
    ("labels", {"labels": {"k" * (bounds.MAX_LABEL_KEY + 1): "v"}}),
    ("labels", {"labels": {"rack": LONG[: bounds.MAX_LABEL_VALUE + 1]}}),
    ("labels", {"labels": {"rack": LONG}}),
    ("gpu_model", {"gpu_model": ["H100"] * (bounds.MAX_GPU_MODELS + 1)}),
    ("gpu_model", {"gpu_model": "|".join(["H100"] * (bounds.MAX_GPU_MODELS + 1))}),
    ("gpu_model", {"gpu_model": "H" * (bounds.MAX_GPU_MODEL + 1)}),
    ("gpu_model", {"gpu_model": LONG}),
    ("gpu_fraction", {"gpu_fraction": 1e-9}),  # was a 500 that still created the job
    ("gpu_fraction", {"gpu_fraction": 2e-9}),  # was accepted and booked
    ("gpu_fraction", {"gpu_fraction": bounds.MIN_GPU_FRACTION / 2}),
    ("gpu_fraction", {"gpu_fraction": 1.5}),
    ("walltime", {"walltime": 1e308}),  # was accepted
    ("walltime", {"walltime": bounds.MAX_WALLTIME + 1}),
    ("walltime", {"walltime": "400d"}),
    ("walltime", {"walltime": "1" * (bounds.MAX_DURATION_TEXT + 1)}),
    ("walltime", {"walltime": LONG}),
    ("cpus", {"cpus": bounds.MAX_CPUS + 1}),
    ("memory_gb", {"memory_gb": bounds.MAX_MEMORY_GB * 2}),
    ("kind", {"kind": LONG}),
    ("gpus", {"gpus": LONG}),
    ("server_name", {"kind": "notebook", "command": None, "server_name": "s" * 256}),
]


async def test_each_field_of_a_job_has_a_bound_and_a_refusal_changes_nothing(service_factory):
    service = await service_factory()
    alice = service.client("alice")
    before = await snapshot(service)
    for field, change in OVER_THE_BOUNDS:
        body = {k: v for k, v in {**JOB, **change}.items() if v is not None}
        status, error = await alice.post("api/jobs", body)
        assert status == 400, (field, error)
        assert error["field"] == field, (field, error)
        message = error["error"]
        assert "Z" * (bounds.QUOTE + 1) not in message and len(message) < 400, (field, message)
    assert await snapshot(service) == before  # no job, no event, nothing stored
    assert (await alice.get("api/me"))[0] == 200


async def test_a_job_no_node_can_take_is_refused_quoting_little_of_its_labels(service_factory):
    """The refusal stores nothing (no job, no audit event); the answer does not repeat the
    labels."""
    service = await service_factory()
    alice, admin = service.client("alice"), service.client("admin")
    labels = {f"k{i}": "Z" * bounds.MAX_LABEL_VALUE for i in range(bounds.MAX_LABELS)}
    status, error = await alice.post("api/jobs", {**JOB, "labels": labels})
    assert (status, error["field"]) == (400, "labels"), error
    assert "can never run here" in error["error"] and len(error["error"]) < 200, error
    assert (await admin.get("api/events", params={"kind": "rejected"}))[1]["events"] == []
    assert (await alice.get("api/jobs"))[1]["jobs"] == []


async def test_requests_at_the_bounds_are_accepted(service_factory):
    service = await service_factory()
    alice = service.client("alice")
    body = {
        **JOB,
        "held": True,
        "name": "n" * bounds.MAX_NAME,
        "env": env(bounds.MAX_ENV_VARS, 100),
        "gpu_fraction": bounds.MIN_GPU_FRACTION,
        "walltime": bounds.MAX_WALLTIME,
        "gpu_model": ["H100", *(f"M{i}" for i in range(bounds.MAX_GPU_MODELS - 1))],
    }
    status, job = await alice.post("api/jobs", body)
    assert status == 201, job
    assert job["gpu_fraction"] == bounds.MIN_GPU_FRACTION and job["walltime"] == 365 * 86400


async def test_a_tiny_gpu_share_is_a_400_and_the_service_goes_on(service_factory):
    """gpu_fraction 1e-9 was a 500 that still created the job (min() of an empty sequence in
    the engine's placement), and every later request failed while it waited."""
    service = await service_factory()
    alice, bob = service.client("alice"), service.client("bob")
    status, error = await alice.post("api/jobs", {**JOB, "gpu_fraction": 1e-9})
    assert (status, error["field"]) == (400, "gpu_fraction"), error
    assert "0.01" in error["error"]
    assert (await alice.get("api/jobs"))[1]["jobs"] == []
    status, job = await bob.post("api/jobs", {**JOB, "gpu_fraction": 0.25})
    assert status == 201, job
    assert (await wait_job(bob, job["id"], "completed"))["gpu_fraction"] == 0.25


def test_an_error_quotes_little_of_the_input():
    assert bounds.quote("abc") == "'abc'"
    assert len(bounds.quote("x" * 10**6)) == bounds.QUOTE
    assert len(bounds.quote({"k": "v" * 10**5})) == bounds.QUOTE


# -- the other bodies ----------------------------------------------------------------------------
def nested(depth: int) -> dict:
    """A queue document whose queue tree is ``depth`` levels deep."""
    queue: dict = {"guaranteed": 0}
    for _ in range(depth - 1):
        queue = {"guaranteed": 0, "children": {"q": queue}}
    return {"queues": {"q": queue}}


async def test_the_other_bodies_have_bounds_too(service_factory):
    service = await service_factory()
    admin, alice = service.client("admin"), service.client("alice")
    status, job = await alice.post("api/jobs", {"gpus": 1, "kind": "notebook"})
    assert status == 201, job
    await wait_until(lambda: job["id"] in service.live.engine.running, what="running")
    before = await snapshot(service)
    many_queues = {"queues": {f"q{i}": {"guaranteed": 0} for i in range(6000)}}
    refused = [
        (admin, "PUT", "api/quotas", many_queues, None),
        (admin, "PUT", "api/quotas", nested(20), None),
        (admin, "PUT", "api/quotas", {"queues": {LONG: {"guaranteed": 0}}}, None),
        (admin, "PUT", "api/reaper", {"exempt_users": [f"u{i}" for i in range(1001)]}, None),
        (admin, "PUT", "api/reaper", {"exempt_users": [LONG]}, "exempt_users"),
        (
            admin,
            "PUT",
            "api/reaper",
            {"profile_timeouts": {f"p{i}": 60 for i in range(1001)}},
            None,
        ),
        (alice, "POST", "api/usage-samples", {"job_id": job["id"], "devices": [{}] * 65}, None),
        (
            alice,
            "POST",
            "api/usage-samples",
            {"job_id": job["id"], "kernels": {f"k{i}": {} for i in range(1001)}},
            None,
        ),
        (alice, "POST", "api/usage-samples", {"job_id": job["id"], "profile": LONG}, None),
        (alice, "POST", "api/usage-samples", {"job_id": job["id"], "server": [1]}, None),
    ]
    for client, method, path, body, field in refused:
        status, error = await client.request(method, path, body)
        assert status == 400, (path, str(body)[:80], error)
        if field is not None:
            assert error["field"] == field, error
        assert "Z" * (bounds.QUOTE + 1) not in error["error"], error
    assert await snapshot(service) == before
    # a deep but reasonable queue tree passes the bounds, on to the queue file's own checks
    status, error = await admin.put("api/quotas", nested(8))
    assert (status, error["field"]) == (400, "queues") and "restart" in error["error"], error


async def test_query_arguments_are_whole_and_in_range_never_silently_cut(service_factory):
    service = await service_factory()
    alice, admin = service.client("alice"), service.client("admin")
    job = await wait_job(alice, (await alice.post("api/jobs", JOB))[1]["id"], "completed")
    for path, params in (
        ("api/queue", {"limit": -5}),  # was silently an empty list
        ("api/queue", {"limit": 1.5}),
        ("api/jobs", {"limit": -1}),
        ("api/jobs", {"offset": 0.5}),
        ("api/events", {"limit": 0}),
        ("api/events", {"limit": bounds.MAX_EVENTS_LIMIT + 1}),
        ("api/events", {"before": 1.5}),
        (f"api/jobs/{job['id']}/log", {"bytes": -1}),
        (f"api/jobs/{job['id']}/log", {"bytes": bounds.MAX_LOG_BYTES + 1}),
    ):
        status, error = await admin.get(path, params=params)
        assert (status, error["field"]) == (400, next(iter(params))), (path, params, error)
    status, queue = await alice.get("api/queue", params={"limit": 0})
    assert status == 200 and queue["jobs"] == []


async def test_usage_ends_now_whatever_until_says(service_factory):
    """A 2 s job counted as 720 GPU-hours with ``until`` a year ahead."""
    service = await service_factory()
    alice = service.client("alice")
    status, job = await alice.post("api/jobs", {"gpus": 1, "command": "sleep 60"})
    assert status == 201, job
    await wait_job(alice, job["id"], "running")
    await asyncio.sleep(0.5)
    year_ahead = time.time() + 365 * 86400
    status, usage = await alice.get("api/usage", params={"by": "user", "until": year_ahead})
    assert status == 200, usage
    assert usage["until"] <= time.time()
    (row,) = usage["usage"]
    assert 0 < row["gpu_hours"] < 0.01, row  # a few seconds of one GPU
    status, error = await alice.get("api/usage", params={"since": year_ahead - 1})
    assert (status, error["field"]) == (400, "since")
    await alice.delete(f"api/jobs/{job['id']}")


# -- another user's job is a 404 -------------------------------------------------------------
async def test_another_users_job_is_a_404_everywhere_like_an_unknown_one(service_factory):
    service = await service_factory()
    alice, bob = service.client("alice"), service.client("bob")
    status, server = await alice.post("api/jobs", {"gpus": 1, "kind": "notebook"})
    assert status == 201, server
    job_id = server["id"]
    await wait_until(lambda: job_id in service.live.engine.running, what="running")
    unknown = "j-999999"
    for method, path, body in (
        ("GET", "api/jobs/{}", None),
        ("DELETE", "api/jobs/{}", None),
        ("GET", "api/jobs/{}/log", None),
        ("POST", "api/usage-samples", {"job_id": "{}", "devices": []}),  # was 403
    ):
        answers = []
        for job in (job_id, unknown):
            if body is None:
                answers.append(await bob.request(method, path.format(job)))
            else:
                answers.append(await bob.request(method, path, {**body, "job_id": job}))
        (status, theirs), (unknown_status, nobody) = answers
        assert status == unknown_status == 404, (path, theirs, nobody)
        assert theirs["error"].replace(job_id, unknown) == nobody["error"], (theirs, nobody)
    assert (await alice.post("api/usage-samples", {"job_id": job_id}))[0] == 200


async def test_a_cancel_reason_is_any_text_without_control_characters(service_factory):
    """``DELETE api/jobs/{id}?reason=``: what the schema says (no control characters), neither
    more nor less: a private-use character is text (Schemathesis found it refused)."""
    service = await service_factory()
    alice = service.client("alice")
    for reason, expected in (("two\nlines", 400), ("x" * 201, 400), ("\U000fbb72 ok é", 200)):
        status, job = await alice.post("api/jobs", {"command": "sleep 30", "gpus": 1})
        assert status == 201, job
        status, answer = await alice.delete(f"api/jobs/{job['id']}", params={"reason": reason})
        assert status == expected, (reason, answer)
        if expected == 400:
            assert answer["field"] == "reason"
            await alice.delete(f"api/jobs/{job['id']}")
