"""The base of every REST handler of the service: :class:`APIHandler` bounds the body,
identifies the caller, speaks JSON and shows a job as its caller may see it.

Apart from the routes (:mod:`.handlers` for users, :mod:`.admin_handlers`, and
:mod:`.reaper_handlers`) because it is what they all share: the rules every route keeps
without saying so. The caller is identified before the method runs (401 otherwise), errors are
JSON ``{"error": message, "field": name}``, and a user only ever sees their own jobs in full
(others' are anonymised, and another user's job id is a 404 like an unknown one:
:meth:`APIHandler.job_row`, :meth:`APIHandler.view`).

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
import re
from functools import wraps

from tornado import web

from ..core.errors import ConfigError
from ..core.reason_now import reason_now
from .expected_starts import with_expected_start
from .records import placement_view, planned_view, public_job, reason_dict, utilization_view
from .requests import MAX_BODY_BYTES, MAX_WHOLE, RequestError, parse_body

#: A number in a query argument, written as JSON writes one (float() also takes '1_000' and '１')
NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?")
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

    # a POST that changes nothing (api/estimate): a browser session's cookie may send it, as it
    # may a GET (a cross-site form could too, and learn nothing: it cannot read the answer)
    reads_only = False

    @property
    def live(self):
        return self.settings["gpusched_live"]

    def check_xsrf_cookie(self):
        """Not here, before the caller is known: identify_caller lets a change through with a
        header token (which a cross-site form cannot set), or with the browser's cookie only
        when it carries the web page's XSRF token (``Auth.cookie_write_allowed``)."""

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
        if self.request.method in ("GET", "HEAD") or self.reads_only:
            return
        by_token = "Authorization" in self.request.headers and getattr(
            self, "_token_authenticated", False
        )  # the hub may have identified the caller by cookie after a bad header token
        if not by_token and not self.settings["gpusched_auth"].cookie_write_allowed(self):
            raise APIError(
                403,
                "changes need a token in the Authorization header (or, from the service's web "
                "page, its XSRF token in X-XSRFToken)",
            )

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
            number = float(value) if NUMBER.fullmatch(value) else math.nan
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise APIError(400, f"'{name}' must be a number", name)
        return number

    def period(self, default_span: float) -> tuple[float, float]:
        """``since`` and ``until`` query arguments (epoch seconds): ``until`` at most now (a
        later one would count running jobs as running until then), ``since`` by default
        ``default_span`` seconds before it; 400 unless ``since`` is before ``until``."""
        now = self.live.clock()
        until = min(self.number("until", now), now)
        since = self.number("since", until - default_span)
        if since >= until:
            raise APIError(
                400, "'since' must be before 'until' (or now, if that is earlier)", "since"
            )
        return since, until

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
        view["reason"] = shown_reason(self.live, row["id"], view["reason"])
        job = self.live.engine.jobs.get(row["id"])
        if job is not None and (mine or self.admin) and row["state"] in ("pending", "running"):
            # how long the engine plans it to run: in the owner's full view, with the name
            # and command an estimate is matched by (other users' views leave those out)
            planned = planned_view(job, view["reason"] if row["state"] == "pending" else None)
            if planned is not None:
                view["planned_run_time"] = planned
        placement = self.live.engine.state.allocations.get(row["id"])
        if placement is not None and row["state"] == "running":
            view["allocation"] = placement_view(placement, self.live.cluster)
        if row["state"] == "running":
            view["utilization"] = latest_utilization(self.live, row["id"])
            view["stopping"] = self.live.stopping(row["id"])  # signalled, not yet gone
        return view


def shown_reason(live, job_id: str, reason: dict | None) -> dict | None:
    """A job's ``reason`` (its wire form) as the API shows it: for a pending job, with the GPUs
    free now (core/reason_now.py: GPUs freed since the last deep pass), and with its expected
    start where the reason has no time of its own (service/expected_starts.py)."""
    job = live.engine.jobs.get(job_id)
    if job is not None and job.reason is not None:
        current = reason_now(live.engine, job, live.clock())
        if current is not job.reason:
            reason = reason_dict(current)  # (names no user: GPU counts and a job id)
    return with_expected_start(live, reason, job_id)


def allowed_methods(handler_class) -> list[str]:
    """The methods a handler class implements (tornado answers 405 for the others)."""
    return [
        method
        for method in ("GET", "POST", "PUT", "DELETE", "PATCH")
        if getattr(handler_class, method.lower()) is not getattr(web.RequestHandler, method.lower())
    ]


def latest_utilization(live, job_id: str) -> dict | None:
    """The GPU utilization a running notebook server last reported to the idle reaper (its
    GPU monitor's sample; :func:`.records.utilization_view`), or None: a batch job, or a server
    that has not reported since it (or the service) started."""
    reaper = live.reaper
    latest = reaper.latest_sample(job_id) if reaper is not None else None
    return utilization_view(*latest) if latest is not None else None
