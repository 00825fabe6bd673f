"""The web page at the service's root (``/services/gpusched/``, the hub's Services link), and
``GET api/history``, the time series its charts draw.

The page is one tornado template (``web/page.html``) with a hand-written style sheet and
scripts (``web/static/``: ``draw.js`` the DOM, SVG and charts, ``page.js`` the sections and the
refresh loop, ``admin.js`` the admins' sections, sent to admins only), shipped in the wheel, no
build step, nothing from a CDN. The server renders
who the caller is; the script fetches the same JSON APIs every client reads (``api/me``,
``api/jobs``, ``api/queue``, ``api/cluster``, ``api/history``, ``api/reaper``; admins also
``api/usage``, ``api/events`` and, once, ``api/quotas``) with the browser's cookie every
:data:`REFRESH_SECONDS`, and draws them (inline SVG): what the page shows is what the API says,
others' names hidden as the API hides them; a job array is the one row ``api/queue``'s
``arrays`` names, as the command line lists it. The estimate is worded as core/wording.py words
it (``draw.js`` follows its rules; the browser test checks both on the same cases). Its forms
and buttons (the estimate, cancelling a job array, and for admins drain / resume and the reaper
settings) send the page's XSRF token (``X-XSRFToken``), without which the API refuses a change
by cookie (``Auth.cookie_write_allowed``).

A browser without a session is sent through ``<prefix>login`` (the hub's OAuth) and back. In
standalone mode (a token file, no hub) open the page with ``?token=<token>``: the script sends
it as its Authorization header.
"""

from __future__ import annotations

import os

from tornado import web

from .api_handler import APIError, APIHandler, api
from .history import MAX_HISTORY_SPAN, visible

WEB_DIR = os.path.join(os.path.dirname(__file__), "web")
STATIC_DIR = os.path.join(WEB_DIR, "static")
REFRESH_SECONDS = 5  # how often the page fetches the APIs again
MAX_HISTORY_READ = 50_000  # rows read for one answer, before thinning (history.py)
# the page's own script and styles only: no inline script, nothing from elsewhere
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'self'; form-action 'self'"
)


class PageHandler(web.RequestHandler):
    """``GET <prefix>``: the page, for the caller the hub's cookie (or a ``?token=``) names."""

    async def get(self):
        auth, prefix = self.settings["gpusched_auth"], self.settings["gpusched_prefix"]
        try:
            identity = await auth.identify(self)
        except APIError as exc:  # identified, but without access to the service
            raise web.HTTPError(exc.status_code, exc.message) from None
        if identity is None:
            login = auth.login_url(prefix)
            if login is None:
                raise web.HTTPError(401, "open this page with ?token=<your API token>")
            self.redirect(login)
            return
        self.set_header("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        self.set_header("Cache-Control", "no-store")
        self.render(
            "page.html",
            identity=identity,
            prefix=prefix,
            xsrf=_text(self.xsrf_token),
            refresh=REFRESH_SECONDS,
            asset=lambda name: f"{prefix}static/{name}?v={_version(name)}",
        )

    def write_error(self, status_code, **kwargs):
        exc = kwargs.get("exc_info", (None, None))[1]
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(f"{status_code}: {getattr(exc, 'log_message', None) or self._reason}\n")


def _version(name: str) -> str:
    """The file's content hash: its URL changes with the file, so a browser may keep it (the
    static handler says so for a versioned URL) and never runs an old script after an upgrade."""
    return web.StaticFileHandler.get_version({"static_path": STATIC_DIR}, name)


def _text(token) -> str:
    return token.decode() if isinstance(token, bytes) else str(token)


class HistoryHandler(APIHandler):
    """``GET api/history?since=&until=``: the service's history (service/history.py) over a
    period of at most 31 days (default: the last 24 hours, until now), oldest first, thinned to
    at most 2,000 rows; per-queue figures only for the caller's queues unless an admin."""

    @api
    def get(self):
        since, until = self.period(86400.0)
        if until - since > MAX_HISTORY_SPAN:
            raise APIError(
                400, f"a period of at most {MAX_HISTORY_SPAN / 86400:.0f} days, please", "since"
            )
        rows = self.live.store.history(since, until, MAX_HISTORY_READ)
        self.send(visible(self.live, rows, self.identity, since, until))


def page_routes(prefix: str) -> list:
    """The page and its files, below ``prefix`` (not API routes: ``routes.ROUTES`` are)."""
    return [
        (prefix, PageHandler),
        (prefix + r"static/(.*)", web.StaticFileHandler, {"path": STATIC_DIR}),
    ]
