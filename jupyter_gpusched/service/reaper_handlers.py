"""The idle reaper's REST API: ``api/reaper`` (settings and sessions) and ``api/usage-samples``
(the GPU monitors' reports: kernel attribution only; service/reaper.py)."""

from __future__ import annotations

from ..core.reaper import timeout_for, untrusted_reason
from .api_handler import APIHandler, api
from .reaper import Reaper
from .requests import check_reaper_changes, check_usage_report


class ReaperHandler(APIHandler):
    """``GET api/reaper``: the settings in force, the policy file's defaults, the run-time
    overrides and (admins: every, users: their own) sessions. ``PUT``: change settings (admin),
    a partial object; ``null`` for a timeout turns it off."""

    @property
    def reaper(self) -> Reaper:
        return self.live.reaper

    @api
    def get(self):
        reaper = self.reaper
        settings = reaper.settings()
        sessions = [
            reaper.view(s, settings)
            for s in reaper.sessions.values()
            if self.admin or s.user == self.identity.name
        ]
        self.send(
            {
                "settings": settings,
                "defaults": reaper.defaults,
                "overrides": reaper.overrides(),
                "sessions": sessions,
            }
        )

    @api
    def put(self):
        self.require_admin()
        changes = self.body()
        check_reaper_changes(changes)
        self.reaper.update(changes, self.identity.name)
        self.get_sync()

    def get_sync(self):
        reaper = self.reaper
        self.send({"settings": reaper.settings(), "overrides": reaper.overrides()})


class UsageSamplesHandler(APIHandler):
    """``POST api/usage-samples``: a notebook server's GPU monitor reports (its user's token):
    which kernels hold GPU memory, never whether the server is idle (service/reaper.py)."""

    @api
    def post(self):
        report = self.body()
        check_usage_report(report)
        session = self.live.reaper.report(self.identity, report)
        settings = self.live.reaper.settings()
        self.send(
            {
                "job_id": session.job_id,
                "idle_since": session.idle_since,
                "warned": session.warned,
                "timeout": timeout_for(session, settings),
                # why this report is not acted on (None: it is): its monitor logs it
                "ignored": untrusted_reason(report, self.live.reaper.trusted_backends),
            }
        )
