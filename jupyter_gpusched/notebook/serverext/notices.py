"""Notices from the scheduler service to a notebook server's user (pre-emption warnings,
the reaper's warnings).

``POST <base_url>gpusched/api/notices`` with ``{"kind": "preemption", "message": str,
"deadline": epoch seconds or null}`` (other keys are kept as they are) logs the notice in the
server log and keeps it; ``GET`` returns ``{"start": str, "notices": [...]}``, oldest first, each
with the ``id``, ``start`` and ``received`` time the server gave it.

Ids count from 1 at each start of the server, so an id alone does not tell a new notice from
one already seen: ``start`` (random, new at each start of the server) says which start numbered
it. A client that remembers what it showed (the Lab extension, in the browser's localStorage)
keeps ``(start, id)``: a notice is new when its ``start`` differs or its ``id`` is higher.

One kind is also an order: ``{"kind": "shutdown-kernels", "kernel_ids": [...]}`` (the reaper's
``shutdown_kernels_first``) shuts down those of the listed kernels that run here, through the
server's kernel manager, as the user's own "shut down kernel" would; the answer lists them under
``shut_down``.

One kind is held: a ``reaper-cull`` notice (the reaper posts it just before the hub stops the
server) is answered once a ``GET`` has returned it, or after :data:`HOLD_SECONDS`, so that an open
JupyterLab shows why its server goes before the connection drops (the Lab asks every few seconds,
every second near a warning's deadline). Only while a Lab watches: the Lab's polls say so
(``GET notices?watching=1``); with none in the last :data:`WATCHING_SECONDS` (no page open, or
another reader such as a test) the answer comes at once and the cull is not delayed.

Callers authenticate as for any jupyter-server API: under JupyterHub, a token that may access
this server (the service's role needs ``access:servers``, see ``hub_config/``).
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import time
from collections import deque

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from . import ROUTE_PREFIX

MAX_NOTICES = 100  # kept per server; older ones are dropped
MAX_BODY = 64 * 1024
SETTINGS_KEY = "gpusched_notices"
SHUTDOWN_KERNELS = "shutdown-kernels"
REAPER_CULL = "reaper-cull"
# How long the answer to a reaper-cull notice waits for a browser to fetch it: longer than the
# Lab's slowest notice poll (5 s), shorter than the service's request timeout (10 s).
HOLD_SECONDS = 8.0
WATCHING_SECONDS = 30.0  # a GET this recent: a Lab page is open and polling


class NoticeBoard:
    """The notices a server received, newest last, at most :data:`MAX_NOTICES`; ``start``
    names this start of the server (see the module docstring)."""

    def __init__(self, log, clock=time.time):
        self.log = log
        self.clock = clock
        self.notices: deque[dict] = deque(maxlen=MAX_NOTICES)
        self.start = secrets.token_hex(8)
        self._next_id = 1
        self.delivered = 0  # the highest id a GET has returned
        self.last_fetch: float | None = None  # time.monotonic() of the last GET
        self._fetched = asyncio.Event()  # set at each GET (a new Event each time)

    def add(self, data: dict) -> dict:
        notice = {
            **parse_notice(data),
            "id": self._next_id,
            "start": self.start,  # after the body's keys: a caller cannot choose it
            "received": self.clock(),
        }
        self._next_id += 1
        self.notices.append(notice)
        deadline = notice.get("deadline")
        when = (
            time.strftime(" (deadline %Y-%m-%d %H:%M:%S UTC)", time.gmtime(deadline))
            if deadline is not None
            else ""
        )
        self.log.warning("gpusched %s notice%s: %s", notice["kind"], when, notice["message"])
        return notice

    def fetched(self) -> None:
        """A client (the Lab) was given every notice there is now."""
        if self.notices:
            self.delivered = max(self.delivered, self.notices[-1]["id"])
        self.last_fetch = time.monotonic()
        self._fetched.set()
        self._fetched = asyncio.Event()

    async def wait_fetched(self, notice_id: int, timeout: float | None = None) -> bool:
        """Until a GET has returned notice ``notice_id``; False after ``timeout`` seconds
        (default :data:`HOLD_SECONDS`), or at once when no client is watching."""
        if self.last_fetch is None or time.monotonic() - self.last_fetch > WATCHING_SECONDS:
            return False
        deadline = time.monotonic() + (HOLD_SECONDS if timeout is None else timeout)
        while self.delivered < notice_id:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self._fetched.wait(), left)
            except asyncio.TimeoutError:
                return False
        return True


def parse_notice(data) -> dict:
    """The notice in a request body; ValueError says what is wrong."""
    if not isinstance(data, dict):
        raise ValueError("the body must be a JSON object")
    kind, message = data.get("kind"), data.get("message")
    if not isinstance(kind, str) or not kind.strip() or len(kind) > 100:
        raise ValueError("'kind' must be a non-empty string (e.g. 'preemption')")
    if not isinstance(message, str) or not message.strip():
        raise ValueError("'message' must be a non-empty string")
    kernel_ids = data.get("kernel_ids")
    if kind == SHUTDOWN_KERNELS and (
        not isinstance(kernel_ids, list)
        or len(kernel_ids) > 100
        or not all(isinstance(k, str) for k in kernel_ids)
    ):
        raise ValueError("'kernel_ids' must be a list of kernel ids (at most 100)")
    deadline = data.get("deadline")
    if deadline is not None and (
        isinstance(deadline, bool)
        or not isinstance(deadline, (int, float))
        or not math.isfinite(deadline)
        or deadline < 0
    ):
        raise ValueError("'deadline' must be epoch seconds (a number) or null")
    return {**data, "kind": kind, "message": message, "deadline": deadline}


class NoticesHandler(APIHandler):
    @property
    def board(self) -> NoticeBoard:
        return self.settings[SETTINGS_KEY]

    @web.authenticated
    def get(self):
        self.finish(json.dumps({"start": self.board.start, "notices": list(self.board.notices)}))
        if self.get_argument("watching", "") == "1":  # a Lab page, showing what it gets
            self.board.fetched()

    @web.authenticated
    async def post(self):
        if len(self.request.body) > MAX_BODY:
            raise web.HTTPError(413, f"a notice is at most {MAX_BODY} bytes")
        try:
            data = json.loads(self.request.body or b"null")
            order = parse_notice(data)["kind"] == SHUTDOWN_KERNELS
            if order and not self.authorizer.is_authorized(
                self, self.current_user, "write", "kernels"
            ):  # the server's own rules for who may shut its kernels down
                raise web.HTTPError(403, "you may not shut down kernels on this server")
            notice = self.board.add(data)
        except ValueError as exc:  # includes JSONDecodeError
            raise web.HTTPError(400, str(exc)) from None
        if order:
            notice = {**notice, "shut_down": await self._shutdown(notice["kernel_ids"])}
        elif notice["kind"] == REAPER_CULL:  # the server stops next: let the Lab see it first
            notice = {**notice, "fetched": await self.board.wait_fetched(notice["id"])}
        self.set_status(201)
        self.finish(json.dumps(notice))

    async def _shutdown(self, kernel_ids: list[str]) -> list[str]:
        manager = self.kernel_manager
        done = []
        for kernel_id in kernel_ids:
            if kernel_id not in manager:
                continue  # gone already, or never here
            self.log.warning("gpusched: shutting down GPU-idle kernel %s (reaper)", kernel_id)
            try:
                await manager.shutdown_kernel(kernel_id)
            except Exception:  # one kernel's failure does not keep the others running
                self.log.exception("gpusched: shutting down kernel %s failed", kernel_id)
                continue
            done.append(kernel_id)
        return done


def setup_handlers(web_app, log) -> None:
    web_app.settings.setdefault(SETTINGS_KEY, NoticeBoard(log))
    base_url = web_app.settings.get("base_url", "/")
    route = url_path_join(base_url, ROUTE_PREFIX, "notices")
    web_app.add_handlers(".*$", [(route, NoticesHandler)])
