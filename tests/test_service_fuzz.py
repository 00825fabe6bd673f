"""Hypothesis against the REST API, from its OpenAPI document (``service/openapi.py``).

An in-process service (``service_helpers``) with two users: alice has jobs in every state
(two tier-1 jobs hold every H100, so nothing bob does can pre-empt them or start her pending
one); bob sends random requests: any documented path and method, random job ids (alice's,
his own, made up), random query arguments, and bodies built from ``openapi.JOB_REQUEST``
(valid, or with one field of a wrong type or value, or an unknown key), random JSON, or bytes
that are not JSON. Then:

* the service never answers 5xx;
* a job request with one bad field gets 400 naming that field; a valid one is created (201),
  or refused with 400 when it could never run on this cluster under these quotas;
* nothing bob does changes alice's jobs (id, state, user, GPUs, command, ...: compared through
  the admin's view before and after each example);
* an admin sending random admin requests (quota documents, maintenance times, priorities,
  node names) gets no 5xx either, and the service keeps answering.

Commands are never generated: a job runs one of a few harmless ones, and a job that names a
notebook gets a working directory that does not exist (its launch fails before any Python
starts, so the fuzz does not spend seconds of CPU per notebook kernel).
"""

from __future__ import annotations

import asyncio
import atexit
import copy
import math
import re
import shutil
import tempfile
from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st
from service_helpers import start_service

from jupyter_gpusched.service import openapi
from jupyter_gpusched.service.requests import MAX_WHOLE

QUEUES = {
    "queues": {
        "qa": {"guaranteed": 16, "users": ["alice"]},
        "qb": {"guaranteed": 8, "users": ["bob"]},
        "shared": {"guaranteed": 0, "limit": 4, "users": ["alice", "bob"]},
    },
    "default_queue": "shared",
    "user_limits": {"default": {"pending_jobs": 100_000}},
}
NODES = ["gpu1", "gpu2", "l40s1", "l40s2"]
COMMANDS = ["true", "exit 3", "sleep 0.2", "echo hello", "printenv CUDA_VISIBLE_DEVICES"]
COMPARED = ("id", "state", "user", "gpus", "command", "queue", "tier", "held", "priority")


class Harness:
    """The service on an event loop of its own (Hypothesis tests are synchronous)."""

    def __init__(self, tmp_path):
        self.loop = asyncio.new_event_loop()
        self.service = self.run(start_service(tmp_path, queues=QUEUES, cancel_grace=0.5))
        self.alice, self.bob = self.service.client("alice"), self.service.client("bob")
        self.admin = self.service.client("admin")
        self.bob_ids: list[str] = []
        self.alice_ids = self.run(self._alice_jobs())
        self.requests = 0

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    async def _alice_jobs(self) -> list[str]:
        async def submit(body, state):
            status, job = await self.alice.post("api/jobs", body)
            assert status == 201 and job["state"] == state, job
            return job["id"]

        h100 = {"gpus": 8, "gpu_model": "H100", "queue": "qa", "command": "sleep 600"}
        ids = [await submit({**h100, "tier": 1}, "running") for _ in range(2)]
        ids.append(await submit({**h100, "tier": 2, "name": "waits"}, "pending"))
        ids.append(await submit({"gpus": 1, "command": "true", "held": True}, "pending"))
        status, _ = await self.alice.post("api/jobs", {"gpus": 99, "command": "true"})
        assert status == 400
        done = await submit({"gpus": 1, "queue": "qa", "command": "true"}, "running")
        ids.append(done)
        cancelled = await submit({**h100, "name": "cancelled"}, "pending")
        assert (await self.alice.delete(f"api/jobs/{cancelled}"))[0] == 200
        ids.append(cancelled)
        for _ in range(200):
            _, job = await self.alice.get(f"api/jobs/{done}")
            if job["state"] == "completed":
                break
            await asyncio.sleep(0.05)
        assert job["state"] == "completed", job
        return ids

    async def alice_snapshot(self) -> list[dict]:
        status, body = await self.admin.get("api/jobs", params={"user": "alice"})
        assert status == 200, body
        return [{key: job[key] for key in COMPARED} for job in body["jobs"]]

    async def call(self, client, method, path, body=None, raw=None, params=None):
        self.requests += 1
        status, data = await client.request(
            method, path, None if raw is not None else body, raw=raw, params=params
        )
        assert status < 500, (method, path, params, body, raw, status, data)
        if status == 201 and isinstance(data, dict) and data.get("user") == "bob":
            self.bob_ids.append(data["id"])
        return status, data

    async def quotas(self) -> dict:
        """GET api/quotas without what changes as jobs come and go (GPUs running)."""
        status, body = await self.call(self.admin, "GET", "api/quotas")
        assert status == 200, body
        for queue in body["queues"]:
            del queue["running"]
        return body

    def close(self):
        self.run(self.service.stop())
        self.loop.close()


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    harness = Harness(tmp_path_factory.mktemp("fuzz"))
    harness.baseline = harness.run(harness.alice_snapshot())
    yield harness
    harness.close()


# -- job requests from the schema ---------------------------------------------------------------
PROPERTIES = openapi.JOB_REQUEST["properties"]
texts = st.text(max_size=20)
names = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=30)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([10**400, -(10**400), 2**63])  # beyond float and 64-bit integers
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=6,
)
env_names = st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,10}\Z").filter(
    lambda n: not n.startswith(("GPUSCHED_", "CUDA_VISIBLE_DEVICES"))
)
strings = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20)


# the notebooks valid requests name (a file the service's user may read: checked at submit)
NOTEBOOKS = Path(tempfile.mkdtemp(prefix="gpusched-fuzz-notebooks-"))
atexit.register(shutil.rmtree, NOTEBOOKS, ignore_errors=True)
for _name in ("x.ipynb", "n.ipynb"):
    (NOTEBOOKS / _name).write_text("{}")


@st.composite
def valid_jobs(draw) -> dict:
    """A job request that passes every check, with the optional fields drawn at random."""
    gpus = draw(st.integers(1, 30))
    body: dict = {"gpus": gpus}

    def maybe(key, strategy):
        if draw(st.booleans()):
            body[key] = draw(strategy)

    kind = draw(st.sampled_from([None, "batch", "notebook"]))
    if kind is not None:
        body["kind"] = kind
    if kind == "notebook":
        maybe("server_name", strings)
    if kind != "notebook":
        if draw(st.integers(0, 4)):
            body["command"] = draw(st.sampled_from(COMMANDS))
            maybe("cwd", st.sampled_from(["/", "/tmp"]))
        else:  # a notebook that is no notebook: the job fails at once (a missing one is a 400)
            body["notebook"] = draw(st.sampled_from([str(NOTEBOOKS / "x.ipynb"), "n.ipynb"]))
            body["cwd"] = str(NOTEBOOKS)
    maybe("name", names.filter(lambda s: s.strip()))
    if gpus == 1:
        maybe("gpu_fraction", st.floats(0.01, 1.0))
    divisors = [d for d in range(1, gpus + 1) if gpus % d == 0]
    maybe("gpus_per_node", st.sampled_from(divisors))
    maybe("tier", st.sampled_from(PROPERTIES["tier"]["enum"]))
    maybe("queue", st.sampled_from(["qb", "shared", "/qb/"]))
    maybe("gpu_model", st.sampled_from(["H100", "L40S", "H100|L40S", ["L40S"], ["A100", "H100"]]))
    maybe(
        "walltime",
        st.floats(0.5, 1e6) | st.integers(1, 10**6) | st.sampled_from(["30m", "2h", "1h30m"]),
    )
    maybe("cpus", st.floats(0, 1e4) | st.integers(0, 100))
    maybe("memory_gb", st.floats(0, 1e4))
    maybe("labels", st.dictionaries(strings, strings, max_size=2))
    maybe("env", st.dictionaries(env_names, strings, max_size=3))
    maybe("held", st.booleans())
    return body


def _not(strategy, ok):
    return strategy.filter(lambda v: not ok(v))


def _is_whole(minimum, maximum=MAX_WHOLE):
    """A whole number in range; as in JSON Schema, 2.0 is one."""

    def whole(v):
        integral = isinstance(v, int) or (isinstance(v, float) and v.is_integer())
        return integral and not isinstance(v, bool) and minimum <= v <= maximum

    return whole


def _is_text(v):
    return v is None or (isinstance(v, str) and bool(v.strip()))


def _is_number(v):
    """A finite number >= 0 (or absent)."""
    if v is None:
        return True
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return 0 <= float(v) < math.inf
    except OverflowError:  # 10**400
        return False


wrong_numbers = (
    st.integers(-(10**20), -1)
    | st.floats(max_value=-1e-9, allow_infinity=False)
    | st.just(10**400)  # no float holds it
)
big = st.integers(MAX_WHOLE + 1, 10**30)
INVALID = {
    # (not 0: that asks for a CPU-only job, refused without CPUs or memory naming 'cpus')
    "gpus": _not(json_values | wrong_numbers | big, _is_whole(0)),
    "gpus_per_node": _not(json_values | wrong_numbers | big, _is_whole(1)).filter(
        lambda v: v is not None
    ),
    "tier": _not(json_values | st.integers(4, 10), lambda v: v is None or v in (1, 2, 3)),
    "kind": _not(json_values, lambda v: v in ("batch", "notebook")),
    "command": _not(json_values | st.just(" ") | st.just("a\x00b"), _is_text),
    "notebook": _not(json_values | st.just(""), _is_text),
    "name": _not(json_values, _is_text) | st.text(min_size=201, max_size=210),
    "queue": _not(json_values, _is_text) | st.sampled_from(["qa", "nope", "qb/x", "private"]),
    "gpu_fraction": _not(
        json_values | st.floats(1.0001, 10) | wrong_numbers, lambda v: False
    ).filter(lambda v: not (_is_number(v) and v is not None and 0 < v <= 1)),
    "gpu_model": st.sampled_from(["A100", "", " ", [], [""], ["A100"], 3, {"H100": 1}, True]),
    "walltime": st.sampled_from(["soon", "", "-1h", "5x", 0, -3, True, [1], {"h": 1}, 10**400]),
    "deadline": st.sampled_from(
        [
            "soon",
            "",
            "-1h",
            0,
            -3,
            True,
            [1],
            {"h": 1},
            10**400,
            "2020-01-01T00:00:00Z",
            "2030-01-01T00:00:00",
            "2026-13-01T00:00Z",
            "3y",
        ]
    ),
    "cpus": _not(json_values | wrong_numbers, _is_number),
    "memory_gb": _not(json_values | wrong_numbers, _is_number),
    "labels": _not(
        json_values,
        lambda v: (
            v is None or (isinstance(v, dict) and all(isinstance(x, str) for x in v.values()))
        ),
    ),
    "env": _not(
        json_values,
        lambda v: (
            v is None or (isinstance(v, dict) and all(isinstance(x, str) for x in v.values()))
        ),
    )
    | st.sampled_from([{"CUDA_VISIBLE_DEVICES": "0"}, {"GPUSCHED_X": "1"}, {"1A": "x"}]),
    "cwd": _not(json_values, lambda v: v is None or (isinstance(v, str) and v.startswith("/")))
    | st.sampled_from(["relative", "./x", "~/x"]),
    "held": _not(json_values, lambda v: isinstance(v, bool)),
    "server_name": _not(json_values, lambda v: v is None or isinstance(v, str))
    | st.just("x" * 256),
    "profile": _not(json_values, lambda v: v is None or (isinstance(v, str) and v.strip()))
    | st.just("x" * 201),
}
assert set(INVALID) == set(PROPERTIES), "every JOB_REQUEST property needs wrong values"


@st.composite
def job_requests(draw) -> tuple[dict, str | None]:
    """(body, the field a 400 must name; None when the body is valid)."""
    body = draw(valid_jobs())
    how = draw(st.sampled_from(["valid", "valid", "wrong", "wrong", "unknown"]))
    if how == "valid":
        return body, None
    if how == "unknown":
        key = draw(
            st.text(max_size=10).filter(lambda k: k not in PROPERTIES)
            | st.sampled_from(["user", "id", "state", "Gpus"])
        )
        body[key] = draw(json_values)
        return body, key
    key = draw(st.sampled_from(sorted(PROPERTIES)))
    body[key] = draw(INVALID[key])
    return body, key


@given(request=job_requests())
def test_job_requests_from_the_schema(harness, request):
    body, wrong = request
    h = harness

    async def example():
        status, view = await h.call(h.bob, "POST", "api/jobs", body)
        if wrong is None and status == 400:  # well-formed, but it could never run here
            assert view["error"].startswith("this job can never run here"), (body, view)
            rejected = ("gpus", "gpus_per_node", "cpus", "memory_gb", "labels", "tier", "queue")
            assert view["field"] in rejected, view
        elif wrong is None:  # valid
            assert status == 201, (body, view)
            assert view["user"] == "bob" and view["gpus"] == body["gpus"]
            assert view["command"] == body.get("command")
            assert view["state"] in ("pending", "running", "rejected", "failed", "completed")
            if view["state"] in ("pending", "running"):
                status, ended = await h.call(h.bob, "DELETE", f"api/jobs/{view['id']}")
                assert status in (200, 409), ended
        else:
            assert status in (400, 403), (body, view)
            assert view["field"] == wrong[:100], (body, view)
        assert await h.alice_snapshot() == h.baseline

    h.run(example())


# -- any request from bob ---------------------------------------------------------------------
METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH"]
QUERY_VALUES = st.sampled_from(["", "0", "-1", "1.5", "nan", "inf", "1e400", "10", "x", "%"]) | (
    texts
)


# Job ids are drawn as ("alice" | "bob", n) and resolved when the request is sent, so that the
# data Hypothesis draws does not depend on which jobs exist by then.
job_refs = st.tuples(st.sampled_from(["alice", "bob"]), st.integers(0, 30))
made_up = st.text(max_size=12).map(lambda s: quote(s, safe=""))
id_values = job_refs | st.sampled_from(["j-0", "j-999999999999999999999"]) | made_up
node_values = st.sampled_from([*NODES, "gpu9", "%2e%2e", "%ff", "a%2Fb"]) | made_up.filter(bool)


def resolve(parts, h: Harness) -> str:
    """The path from its parts: strings, and job references."""
    out = []
    for part in parts:
        if isinstance(part, tuple):
            ids = h.alice_ids if part[0] == "alice" else h.bob_ids[-20:] or ["j-1"]
            part = ids[part[1] % len(ids)]
        out.append(part)
    return "".join(out)


@st.composite
def anything(draw) -> tuple[str, list, dict | None, object, bytes | None]:
    """(method, path parts, query, JSON body, raw body)."""
    template = draw(st.sampled_from(sorted(openapi.PATHS)))
    parts = []
    for piece in re.split(r"(\{\w+\})", template.lstrip("/")):
        if piece == "{id}":
            parts.append(draw(id_values))
        elif piece == "{name}":
            parts.append(draw(node_values))
        else:
            parts.append(piece)
    if draw(st.integers(0, 9)) == 0:  # somewhere else
        parts = [draw(st.sampled_from(["api", "api/", "api/jobs/", "api/nodes/gpu1", "x"]))]
    operations = openapi.PATHS[template]
    method = draw(st.sampled_from(sorted(m.upper() for m in operations)) | st.sampled_from(METHODS))
    names = [
        p["name"] for op in operations.values() for p in op["parameters"] if p["in"] == "query"
    ]
    keys = st.sampled_from(names) if names else texts
    query = draw(st.none() | st.dictionaries(keys | texts, QUERY_VALUES, max_size=3))
    if query and "user" in query and draw(st.booleans()):
        query["user"] = "alice"
    body, raw = None, None
    kind = draw(st.sampled_from(["none", "job", "json", "raw"]))
    if kind == "job":
        body = draw(job_requests())[0]
    elif kind == "json":
        body = draw(json_values | st.fixed_dictionaries({"priority": json_values}))
    elif kind == "raw":
        raw = draw(st.binary(max_size=30) | st.sampled_from([b"{", b"[" * 5000, b"NaN"]))
    return method, parts, query, body, raw


@given(data=st.data())
def test_bobs_requests_never_fail_and_never_touch_alices_jobs(harness, data):
    h = harness
    requests = data.draw(st.lists(anything(), min_size=1, max_size=6))

    async def example():
        for method, parts, query, body, raw in requests:
            path = resolve(parts, h)
            status, reply = await h.call(h.bob, method, path, body, raw, query)
            if any(isinstance(part, tuple) and part[0] == "alice" for part in parts):
                assert status in (403, 404, 405), (method, path, status, reply)
            if path.startswith("api/") and isinstance(reply, dict) and "jobs" in reply:
                for job in reply["jobs"]:  # others' jobs: anonymised
                    if job.get("user") not in (None, "bob"):
                        raise AssertionError(f"bob sees {job} via {method} {path} {query}")
        assert await h.alice_snapshot() == h.baseline

    h.run(example())


# -- an admin's requests ----------------------------------------------------------------------
def _quota_documents():
    def edit(document, where, key, value):
        document = copy.deepcopy(document)
        target = document if where is None else document["queues"][where]
        target[key] = value
        return document

    spots = st.sampled_from([None, "qa", "qb", "shared"])
    keys = st.sampled_from(
        [
            "guaranteed",
            "limit",
            "weight",
            "users",
            "groups",
            "children",
            "queues",
            "default_queue",
            "user_limits",
            "fair_share_half_life",
            "colour",
        ]
    )
    edits = st.builds(lambda w, k, v: edit(QUEUES, w, k, v), spots, keys, json_values)
    user_limits = st.builds(
        lambda who, key, value: edit(QUEUES, None, "user_limits", {who: {key: value}}),
        st.sampled_from(["default", "bob"]),
        st.sampled_from(["gpus", "running_jobs", "pending_jobs", "jobs"]),
        json_values | st.sampled_from([1e300, 2**40]),
    )
    return st.just(QUEUES) | edits | user_limits | json_values


@st.composite
def admin_requests(draw) -> tuple[str, list, object]:
    node = st.sampled_from([*NODES, "gpu9"])
    kind = draw(st.integers(0, 6))
    if kind == 0:
        return "PUT", ["api/quotas"], draw(_quota_documents())
    if kind == 1:
        start = st.one_of(
            st.floats(allow_nan=False, allow_infinity=False),
            st.integers(),
            json_values,
            st.sampled_from(["2099-01-01T00:00:00Z", "2030-02-30", "9999-12-31T23:59:59-12:00"]),
        )
        return "PUT", [f"api/nodes/{draw(node)}/maintenance"], {"start": draw(start)}
    if kind == 2:
        return "DELETE", [f"api/nodes/{draw(node)}/maintenance"], None
    if kind == 3:
        action = draw(st.sampled_from(["drain", "resume"]))
        return "POST", [f"api/nodes/{draw(node)}/{action}"], None
    if kind == 4:
        action = draw(st.sampled_from(["hold", "release"]))
        return "POST", ["api/jobs/", draw(job_refs), f"/{action}"], None
    if kind == 5:
        value = draw(json_values | big | st.integers())
        return "PUT", ["api/jobs/", draw(job_refs), "/priority"], {"priority": value}
    return "DELETE", ["api/jobs/", ("bob", draw(st.integers(0, 9)))], None


@pytest.fixture(scope="module")
def admin_harness(tmp_path_factory):
    harness = Harness(tmp_path_factory.mktemp("fuzz-admin"))
    yield harness
    harness.close()


@given(data=st.data())
def test_admin_requests_never_fail(admin_harness, data):
    h = admin_harness
    requests = data.draw(st.lists(admin_requests(), min_size=1, max_size=5))

    async def example():
        for method, parts, body in requests:
            path = resolve(parts, h)
            quotas = method == "PUT" and path == "api/quotas"
            if quotas:
                before = await h.quotas()
            status, _ = await h.call(h.admin, method, path, body)
            if quotas and status == 400:
                assert await h.quotas() == before
        # bob's jobs for the admin to hold, release and reorder (they wait for an H100)
        body = {"gpus": 1, "gpu_model": "H100", "command": "true"}
        status, job = await h.call(h.bob, "POST", "api/jobs", body)
        assert status in (201, 403, 429), job  # an edit took bob out of his queues, or capped him
        for page in ("api/queue", "api/cluster", "api/quotas", "api/jobs"):
            assert (await h.call(h.admin, "GET", page))[0] == 200

    h.run(example())
