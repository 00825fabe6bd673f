"""The service's web application: its routes, the handler of each, and its request log.

Apart from app.py (the traits, reading the files, building the parts) because this is what a
request meets: the table of ``api/...`` routes below the service's prefix and the settings
every handler reads (``gpusched_live``, ``gpusched_auth`` ...).
"""

from __future__ import annotations

import logging
import os

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from tornado import web

from . import admin_handlers as admin
from . import handlers as user
from .api_handler import APIHandler
from .page import WEB_DIR, HistoryHandler, page_routes
from .reaper_handlers import ReaperHandler, UsageSamplesHandler

_JOB = r"(?P<job_id>j-[0-9]+)"
_NODE = r"(?P<name>[^/]+)"
_ARRAY = r"(?P<array_id>a-[0-9]+)"


class MetricsHandler(APIHandler):
    @property
    def authenticated(self) -> bool:
        return self.settings["gpusched_authenticate_metrics"]

    def get(self):
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(self.settings["gpusched_metrics"].registry))


ROUTES = [
    (r"api/me", user.MeHandler),
    (r"api/cluster", user.ClusterHandler),
    (r"api/queue", user.QueueHandler),
    (r"api/jobs", user.JobsHandler),
    (r"api/estimate", user.EstimateHandler),
    (rf"api/jobs/{_JOB}", user.JobHandler),
    (rf"api/jobs/{_JOB}/log", user.JobLogHandler),
    (rf"api/arrays/{_ARRAY}", user.ArrayHandler),
    (rf"api/jobs/{_JOB}/(?P<action>hold|release)", admin.HoldHandler),
    (rf"api/jobs/{_JOB}/priority", admin.PriorityHandler),
    (r"api/quotas", admin.QuotasHandler),
    (rf"api/nodes/{_NODE}/(?P<action>drain|resume)", admin.NodeHandler),
    (rf"api/nodes/{_NODE}/maintenance", admin.MaintenanceHandler),
    (r"api/events", admin.EventsHandler),
    (r"api/usage", admin.UsageHandler),
    (r"api/export", admin.ExportHandler),
    (r"api/reaper", ReaperHandler),
    (r"api/usage-samples", UsageSamplesHandler),
    (r"api/rogue-processes", admin.RogueProcessesHandler),
    (r"api/history", HistoryHandler),
    (r"api/openapi.json", admin.OpenAPIHandler),
    (r"metrics", MetricsHandler),
]


def web_app(
    prefix: str,
    auth,
    live,
    metrics,
    *,
    prices: dict,
    authenticate_metrics: bool,
    max_body_bytes: int,
) -> web.Application:
    """The routes below ``prefix`` (which ends with /), and those ``auth`` needs."""
    routes = [(prefix + pattern, handler) for pattern, handler in ROUTES]
    routes += auth.handlers(prefix) + page_routes(prefix)  # the web page at the prefix itself
    return web.Application(
        routes,
        gpusched_live=live,
        gpusched_auth=auth,
        gpusched_metrics=metrics,
        gpusched_prices=prices,
        gpusched_prefix=prefix,
        gpusched_authenticate_metrics=authenticate_metrics,
        gpusched_max_body_bytes=max_body_bytes,
        template_path=WEB_DIR,
        default_handler_class=user.NotFoundHandler,
        cookie_secret=os.urandom(32),
        log_function=_log_request,
    )


def _log_request(handler):
    status = handler.get_status()
    level = logging.DEBUG if status < 400 else logging.INFO if status < 500 else logging.ERROR
    logging.getLogger("jupyter_gpusched.service").log(
        level,
        "%d %s %s %.1f ms",
        status,
        handler.request.method,
        handler.request.uri,
        1000 * handler.request.request_time(),
    )
