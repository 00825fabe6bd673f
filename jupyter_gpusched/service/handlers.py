"""The REST API for users: the cluster, the queue, and their own jobs.

Every handler is an :class:`APIHandler`: the caller is identified before the method runs (401
otherwise), errors are JSON ``{"error": message, "field": name}``, and a user only ever sees
their own jobs in full (others' are anonymised, and another user's job id is a 404 like an
unknown one). Admin routes are in :mod:`.admin_handlers`.

Bodies are streamed (``stream_request_body``) and never kept beyond ``max_body_bytes``
(``GPUSchedService``, 1 MB): a larger body is refused with 413 and is not parsed. Up to
:data:`DRAIN_FACTOR` times the limit it is read and dropped as it arrives, so that the 413 (and
the 401 or 403 of a caller who may not send it) reaches the client even through the hub's proxy,
which answers 503 when the service closes a connection it is still writing to; a body announced
larger than that is refused at once, before any of it is read, and the connection closed.
The caller is identified after the body, before the method (:meth:`APIHandler.identify_caller`,
run by a wrapper every HTTP method of a subclass gets).
"""

from __future__ import annotations

import json
import math
import os
import re
from functools import wraps

from tornado import web

from ..core.errors import ConfigError
from ..core.jobs import JobState
from .records import placement_view, public_job, reason_dict, utilization_view
from .requests import (
    MAX_BODY_BYTES,
    MAX_LIST_LIMIT,
    MAX_LOG_BYTES,
    MAX_WHOLE,
    RequestError,
    parse_body,
    parse_job_request,
)
from .server_stops import MAX_REASON

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")  # Unicode's control characters (Cc)

MAX_MESSAGE = 1000  # characters of an error message, whatever raised it (a last safety net)
DRAIN_FACTOR = 64  # bodies up to this many times max_body_bytes are read (and dropped) for a 413
HTTP_METHODS = ("get", "head", "post", "put", "patch", "delete")


def _checking_caller(method):
    """``method`` after :meth:`APIHandler.before_method`."""

    @wraps(method)
    async def checked(self, *args, **kwargs):
        await self.before_method()
        result = method(self, *args, **kwargs)
        if hasattr(result, "__await__"):
            result = await result
        return result

    checked._checks_caller = True
    return checked


class APIError(web.HTTPError):
    def __init__(self, status: int, message: str, field: str | None = None):
        super().__init__(status, message)
        self.message, self.field = message, field


def api(method):
    """Turn bad input (RequestError, ConfigError) into a 4xx with the field."""

    @wraps(method)
    async def wrapper(self, *args, **kwargs):
        try:
            result = method(self, *args, **kwargs)
            if hasattr(result, "__await__"):
                result = await result
            return result
        except RequestError as exc:
            raise APIError(exc.status, exc.message, exc.field) from None
        except ConfigError as exc:
            raise APIError(400, str(exc), exc.field) from None

    return wrapper


@web.stream_request_body
class APIHandler(web.RequestHandler):
    """Base: bounds the body, identifies the caller, speaks JSON."""

    identity = None
    authenticated = True  # False: a public route (the OpenAPI document)
    _chunks: list[bytes] | None = None
    _received = 0

    def __init_subclass__(cls, **kwargs):
        """Every HTTP method a handler defines runs :meth:`before_method` first: no route can
        forget to identify its caller."""
        super().__init_subclass__(**kwargs)
        for name in HTTP_METHODS:
            method = cls.__dict__.get(name)
            if method is not None and not getattr(method, "_checks_caller", False):
                setattr(cls, name, _checking_caller(method))

    @property
    def live(self):
        return self.settings["gpusched_live"]

    def check_xsrf_cookie(self):
        """Writes must be token-authenticated (checked in identify_caller): a cross-site form
        can send a user's cookie but cannot set an Authorization header, so no XSRF cookie is
        needed."""

    # -- the body ------------------------------------------------------------------------------
    @property
    def max_body_bytes(self) -> int:
        return self.settings.get("gpusched_max_body_bytes", MAX_BODY_BYTES)

    def _too_large(self) -> APIError:
        return APIError(
            413,
            f"the request body is larger than {self.max_body_bytes} bytes, the most this "
            "service reads (GPUSchedService.max_body_bytes)",
        )

    def prepare(self):
        """Before the body: only its announced size (nothing else may answer before the body
        is read, see the module's docstring)."""
        self._chunks, self._received = [], 0
        # tornado's own limit (HTTPServer max_body_size) would answer a bare 400 and close;
        # data_received counts instead and the method answers a JSON 413
        self.request.connection.set_max_body_size(2**62)
        declared = self.request.headers.get("Content-Length")
        try:
            length = int(declared) if declared is not None else 0
        except ValueError:
            length = 0  # tornado refuses it before any handler runs
        if length > DRAIN_FACTOR * self.max_body_bytes:
            raise self._too_large()  # refused unread; the connection is closed

    def data_received(self, chunk: bytes) -> None:
        if self._finished:
            return
        self._received += len(chunk)
        if self._received <= self.max_body_bytes:
            self._chunks.append(chunk)
        elif self._received > DRAIN_FACTOR * self.max_body_bytes:  # chunked, and endless
            self._chunks = None
            self.send_error(413, exc_info=(APIError, self._too_large(), None))
        else:
            self._chunks = None  # dropped: read on only to answer

    # -- the caller ----------------------------------------------------------------------------
    async def before_method(self) -> None:
        """After the body, before the method: 413 for a body over the limit, else identify
        the caller (401, 403)."""
        if self._chunks is None and self._received:
            raise self._too_large()
        if self.authenticated:
            await self.identify_caller()

    async def identify_caller(self) -> None:
        self.identity = await self.settings["gpusched_auth"].identify(self)
        if self.identity is None:
            raise APIError(401, "not authenticated: send 'Authorization: token <hub API token>'")
        if self.request.method not in ("GET", "HEAD") and (
            "Authorization" not in self.request.headers
            # the hub may have identified the caller by cookie after a bad header token
            or not getattr(self, "_token_authenticated", False)
        ):
            raise APIError(403, "changes need a token in the Authorization header")

    @property
    def admin(self) -> bool:
        return self.identity.admin

    def require_admin(self) -> None:
        if not self.admin:
            raise APIError(403, f"{self.identity.name} is not an admin of the scheduler")

    def body(self) -> dict:
        return parse_body(b"".join(self._chunks or ()))

    def send(self, data, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data, default=str))

    def write_error(self, status_code, **kwargs):
        exc = kwargs.get("exc_info", (None, None))[1]
        message = getattr(exc, "message", None) or self._reason
        if len(message) > MAX_MESSAGE:
            message = message[: MAX_MESSAGE - 3] + "..."
        field = getattr(exc, "field", None)
        if status_code == 405:  # RFC 9110: a 405 lists the methods the path has
            self.set_header("Allow", ", ".join(allowed_methods(type(self))))
        if not getattr(self.request.connection, "_read_finished", True):
            # refused before its body was read: tornado closes the connection after this
            # answer, and says so only if told now; otherwise the hub's proxy, which keeps
            # connections open, sends the next request (anybody's) into the closed one: a 503
            self.set_header("Connection", "close")
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": message, "field": field}))

    def number(self, name: str, default=None):
        value = self.get_argument(name, None)
        if value is None:
            return default
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise APIError(400, f"'{name}' must be a number", name)
        return number

    def whole(self, name: str, default: int, minimum: int = 0, maximum: int = MAX_WHOLE) -> int:
        """A whole-number query argument from ``minimum`` to ``maximum`` (default: what a
        database integer holds); 400 naming it otherwise, never silently cut."""
        value = self.number(name)
        if value is None:
            return default
        if value != int(value) or not minimum <= value <= maximum:
            raise APIError(
                400, f"'{name}' must be a whole number from {minimum} to {maximum}", name
            )
        return int(value)

    def job_row(self, job_id: str) -> dict:
        """The job, if the caller may see it in full (404 otherwise: other users' job ids are
        not confirmed to exist)."""
        row = self.live.row(job_id)
        if row is None or (row["user"] != self.identity.name and not self.admin):
            raise APIError(404, f"no job {job_id} of yours", "id")
        return row

    def view(self, row: dict) -> dict:
        mine = row["user"] == self.identity.name
        view = public_job(
            row, mine=mine, full=mine or self.admin, position=self.live.engine.position(row["id"])
        )
        placement = self.live.engine.state.allocations.get(row["id"])
        if placement is not None and row["state"] == "running":
            view["allocation"] = placement_view(placement, self.live.cluster)
        if row["state"] == "running":
            view["utilization"] = latest_utilization(self.live, row["id"])
            view["stopping"] = self.live.stopping(row["id"])  # signalled, not yet gone
        return view


def allowed_methods(handler_class) -> list[str]:
    """The methods a handler class implements (tornado answers 405 for the others)."""
    return [
        method
        for method in ("GET", "POST", "PUT", "DELETE", "PATCH")
        if getattr(handler_class, method.lower()) is not getattr(web.RequestHandler, method.lower())
    ]


class NotFoundHandler(web.RequestHandler):
    """Any path no route matches: a JSON 404 like the API's others (tornado's is an HTML page)."""

    def prepare(self):
        raise APIError(404, f"no such route: {self.request.path[:200]}")

    def check_xsrf_cookie(self):
        """Nothing to protect: every request is answered 404."""

    write_error = APIHandler.write_error


def latest_utilization(live, job_id: str) -> dict | None:
    """The GPU utilization a running notebook server last reported to the idle reaper (its
    GPU monitor's sample; :func:`.records.utilization_view`), or None: a batch job, or a server
    that has not reported since it (or the service) started."""
    reaper = live.reaper
    latest = reaper.latest_sample(job_id) if reaper is not None else None
    return utilization_view(*latest) if latest is not None else None


class MeHandler(APIHandler):
    """``GET api/me``: who the service takes the caller to be (``name``, ``admin``,
    ``groups``): the JupyterLab panel shows the admin-only parts (reaper settings) from it;
    ``queues``: the leaf queues the caller may submit to, with the GPUs in use there, the
    guarantee and the limit, ``default`` marking the one a job without a queue goes to (the
    spawn form lists them)."""

    @api
    def get(self):
        who = self.identity
        tree = self.live.engine.tree
        default = tree.default_for(who.name, who.groups)
        queues = [
            {
                "path": queue.label(),
                "in_use": queue.running + queue.claimed,
                "guaranteed": queue.guaranteed,
                "limit": None if queue.limit == float("inf") else queue.limit,
                "default": queue is default,
            }
            for queue in sorted(tree.queues_for(who.name, who.groups), key=lambda q: q.path)
        ]
        self.send(
            {"name": who.name, "admin": who.admin, "groups": sorted(who.groups), "queues": queues}
        )


class ClusterHandler(APIHandler):
    @api
    def get(self):
        live, me = self.live, self.identity.name
        engine = live.engine
        state = engine.state
        nodes = []
        for node in live.cluster.nodes:
            gpus = [{"index": i, "jobs": []} for i in range(node.gpus)]
            for holding in engine.holdings(node.index):  # reserved: freed for a pre-emptor
                job_id, part = holding.job_id, holding.part
                job = engine.jobs.get(job_id)
                if job is None:
                    continue
                visible = self.admin or job.user == me
                for i in range(node.gpus):
                    if part.mask >> i & 1:
                        holder = {"job": job_id if visible else None, "fraction": part.fraction}
                        holder["user"] = job.user if visible else None
                        holder["tier"] = job.tier
                        holder["reserved"] = holding.reserved
                        gpus[i]["jobs"].append(holder)
            nodes.append(
                {
                    "name": node.name,
                    "gpu_model": node.gpu_model,
                    "gpus": node.gpus,
                    "free": state.free[node.index],
                    "state": state.node_state[node.index],
                    "maintenance": engine.maintenance.get(node.index),
                    "leaf": node.leaf,
                    "spine": node.spine,
                    "labels": node.labels,
                    "gpu_list": gpus,
                }
            )
        total = live.cluster.total_gpus
        busy = sum(job.amount for job in engine.running.values())
        self.send({"total_gpus": total, "allocated_gpus": busy, "nodes": nodes})


class QueueHandler(APIHandler):
    @api
    def get(self):
        engine, me = self.live.engine, self.identity.name
        limit = self.whole("limit", 1000, maximum=MAX_LIST_LIMIT)
        out = []
        for position, job in enumerate(engine.pending_jobs(0)):
            if position >= limit:
                break
            out.append(self._entry(job, position, me))
        held = [job for job in engine.jobs.values() if job.held and job.state == JobState.PENDING]
        held = [self._entry(job, None, me) for job in held[:limit]]
        retrying = [self._entry(job, None, me) for job in engine.retrying_jobs()[:limit]]
        self.send(
            {
                "pending": len(engine.pending),
                "running": len(engine.running),
                "jobs": out,
                "held": held,
                "retrying": retrying,  # a refused launch's back-off: reason and ETA say when
            }
        )

    def _entry(self, job, position, me) -> dict:
        visible = self.admin or job.user == me
        extra = self.live.extras.get(job.id)
        # "alice already runs 8 GPUs" reads "its owner already runs 8 GPUs" to others
        reason = reason_dict(job.reason, hide_users=not visible and bool(job.user))
        return {
            "position": position,
            "id": job.id,
            "mine": job.user == me,
            "user": job.user if visible else None,
            "name": extra.name if visible and extra else None,
            "queue": job.queue,
            "tier": job.tier,
            "gpus": job.gpus,
            "gpu_fraction": job.gpu_fraction,
            "submit_time": job.submit_time,
            "reason": reason,
        }


class JobsHandler(APIHandler):
    @api
    async def post(self):
        request = parse_job_request(self.body())
        if request.kind == "notebook" and self.live.reaper is not None:
            self.live.reaper.check_profile(request, self.live.default_tier)
        job = self.live.submit(self.identity, request)
        try:
            await self.live.saved(job.id)
        except Exception as exc:
            raise APIError(503, f"the job could not be stored, please retry: {exc}") from None
        self.send(self.view(self.live.row(job.id)), status=201)

    @api
    def get(self):
        user = self.get_argument("user", None)
        if not self.admin:
            user = self.identity.name
        states = self.get_arguments("state") or None
        if states and not set(states) <= {s.value for s in JobState}:
            raise APIError(
                400, "unknown state; use " + ", ".join(s.value for s in JobState), "state"
            )
        limit = self.whole("limit", 500, maximum=MAX_LIST_LIMIT)
        offset = self.whole("offset", 0)
        rows = self.live.store.jobs(
            states=states, user=user, limit=limit, offset=offset, newest_first=True
        )
        live = self.live  # unfinished jobs from memory; the rest as read (no query per row)
        rows = [live.row(r["id"]) if r["id"] in live.extras else r for r in rows]
        self.send({"jobs": [self.view(r) for r in rows]})


class JobHandler(APIHandler):
    @api
    def get(self, job_id):
        self.send(self.view(self.job_row(job_id)))

    @api
    def delete(self, job_id):
        row = self.job_row(job_id)
        if row["state"] not in ("pending", "running"):
            raise APIError(409, f"job {job_id} has already ended ({row['state']})", "id")
        gone = self.get_argument("server_gone", "false")
        if gone not in ("true", "false"):
            raise APIError(400, "'server_gone' must be true or false", "server_gone")
        reason = self.get_argument("reason", None)
        # no control characters (what the schema's pattern says too: a log line stays one line)
        if reason is not None and (len(reason) > MAX_REASON or _CONTROL.search(reason)):
            raise APIError(
                400,
                f"'reason' must be text of at most {MAX_REASON} characters, no control characters",
                "reason",
            )
        self.live.cancel(job_id, self.identity.name, server_gone=gone == "true", reason=reason)
        self.send(self.view(self.live.row(job_id)))


class JobLogHandler(APIHandler):
    @api
    def get(self, job_id):
        row = self.job_row(job_id)
        path = self.live.log_path(row)
        tail = self.whole("bytes", 64 * 1024, maximum=MAX_LOG_BYTES)
        if not os.path.exists(path):
            raise APIError(404, f"job {job_id} has no log yet", "id")
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - tail))
            data = f.read()
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(data)
