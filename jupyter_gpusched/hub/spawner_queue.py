"""The scheduler service as GPUSchedSpawner talks to it: the user's tokens for the service,
submitting the notebook job, waiting in the queue (with progress events: position, reason,
ETA), giving the allocation back, and the options form's estimates. A mixin of
:class:`~jupyter_gpusched.hub.spawner.GPUSchedSpawner`, whose traits (``service_url``,
``service_name``, ``request_timeout``, ``estimate_timeout``, ``queue_poll_interval``) and
profile (``_profile``) it reads."""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import urlencode

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from ..core.wording import estimate_text
from .profiles import GPUSchedSpawnError, describe_duration


class ServiceUnavailable(Exception):
    """The scheduler service did not answer (not started yet, restarting, unreachable)."""


class SchedulerClient:
    """The service's side of GPUSchedSpawner (see the module docstring)."""

    # -- the service -------------------------------------------------------------------------
    def _base_url(self) -> str:
        url = self.service_url or self._discovered_url
        if not url:
            from jupyterhub import orm
            from jupyterhub.objects import Server

            service = orm.Service.find(self.user.db, self.service_name)
            if service is None or service.server is None:
                raise GPUSchedSpawnError(
                    f"The GPU scheduler service {self.service_name!r} is not configured in this "
                    "hub (JupyterHub.services with a url) and GPUSchedSpawner.service_url is "
                    "not set.",
                    reason="service",
                    status_code=500,
                )
            url = self._discovered_url = Server(orm_server=service.server).url
        return url if url.endswith("/") else url + "/"

    # Two tokens of the user for the service, each only its access scope, the user's groups
    # (which queues they may use) and, if the user holds it, the scheduler's admin scope:
    # * the server's (SERVER_TOKEN_NOTE), handed to the server at its start (its GPU monitor's
    #   reports, the Lab panel, the kernels' client): it lives exactly as long as that server,
    #   as JupyterHub's own token of the server does; a hub restart leaves it alone, because a
    #   server that outlives the restart still uses it (issue 16);
    # * the spawner's own (HUB_TOKEN_NOTE), for its requests (submit, poll, release): kept only
    #   in this hub process's memory, so a restarted hub makes a new one and deletes the old.
    SERVER_TOKEN_NOTE = "gpusched spawner: {user}/{name}"  # the note of the one token of older
    # versions: the servers they started, still running after an upgrade, keep theirs
    HUB_TOKEN_NOTE = "gpusched spawner (hub): {user}/{name}"

    def _note(self, template: str) -> str:
        return template.format(user=self.user.name, name=self.name)

    def _token(self) -> str:
        """The spawner's own token (see above): created in the hub's database, reused by later
        requests and starts, replaced after a hub restart or when it stops working (the user
        revoked it), deleted when the server is deleted."""
        if not self._service_token:
            self._revoke(self.HUB_TOKEN_NOTE)  # made by an earlier hub process: unused now
            self._service_token = self._new_token(self.HUB_TOKEN_NOTE)
        return self._service_token

    def _server_token(self) -> str:
        """The token handed to the server being started (see above); the one of an earlier
        start, if any is left, goes first: no server of this name runs while one starts."""
        if not self._started_token:
            self._revoke(self.SERVER_TOKEN_NOTE)
            self._started_token = self._new_token(self.SERVER_TOKEN_NOTE)
        return self._started_token

    def _new_token(self, template: str) -> str:
        orm_user = self.user.orm_user
        scopes = [f"access:services!service={self.service_name}", "read:users:groups!user"]
        from jupyterhub.scopes import get_scopes_for

        from ..scopes import ADMIN_SCOPE

        if ADMIN_SCOPE in get_scopes_for(orm_user):
            # the service takes admin rights from the token's scopes: an admin's own server
            # (its Lab panel's reaper settings) acts as an admin, as their browser session does
            scopes.append(ADMIN_SCOPE)
        token = orm_user.new_api_token(note=self._note(template), scopes=scopes)
        self.user.db.commit()
        return token

    def _revoke(self, template: str) -> None:
        """Delete the user's tokens with this note (found by note: after a hub restart only the
        database knows them)."""
        if self.user is None or getattr(self.user, "db", None) is None:
            return
        note = self._note(template)
        old = [t for t in self.user.orm_user.api_tokens if t.note == note]
        for token in old:
            self.user.db.delete(token)
        if old:
            self.user.db.commit()

    def _revoke_server_token(self) -> None:
        """The server is gone (stopped, exited, never started): so goes its token."""
        self._started_token = None
        self._revoke(self.SERVER_TOKEN_NOTE)

    def _drop_token(self) -> None:
        """Forget and delete the spawner's own token (it stopped working, or the server is
        deleted)."""
        token, self._service_token = self._service_token, None
        if not token or self.user is None or getattr(self.user, "db", None) is None:
            return
        from jupyterhub import orm

        found = orm.APIToken.find(self.user.db, token)
        if found is not None:
            self.user.db.delete(found)
            self.user.db.commit()

    async def api(
        self, method: str, path: str, body=None, timeout: float | None = None
    ) -> tuple[int, object]:
        """One request to the service as the user: ``(status, JSON body)``;
        ServiceUnavailable when it does not answer (within ``timeout``, default
        ``request_timeout``)."""
        reused = self._service_token is not None
        status, data = await self._request(method, path, body, timeout)
        if status == 401 and reused:  # the token was revoked or expired: a new one, once
            self._drop_token()
            status, data = await self._request(method, path, body, timeout)
        return status, data

    async def _request(self, method: str, path: str, body, timeout=None) -> tuple[int, object]:
        request = HTTPRequest(
            self._base_url() + path,
            method=method,
            headers={"Authorization": f"token {self._token()}", "Accept": "application/json"},
            body=json.dumps(body) if body is not None else None,
            request_timeout=self.request_timeout if timeout is None else timeout,
            allow_nonstandard_methods=True,
        )
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except OSError as exc:  # connection refused, reset, unreachable (not HTTP errors)
            raise ServiceUnavailable(str(exc)) from None
        except HTTPClientError as exc:  # a timeout (599): raised despite raise_error=False
            raise ServiceUnavailable(str(exc)) from None
        if response.code == 599 or response.code >= 502:
            raise ServiceUnavailable(str(response.error or response.code))
        try:
            data = json.loads(response.body or b"null")
        except ValueError:
            data = {"error": response.body[:200].decode(errors="replace")}
        return response.code, data

    def job_request(self) -> dict:
        return self.notebook_request(self._profile, self._gpu_models, self._queue)

    def notebook_request(self, profile: dict, gpu_models, queue: str | None) -> dict:
        """The body of the notebook job of a server of ``profile`` (``gpu_models``: the models
        it may have; ``queue``: None for the user's team queue): what a start submits, and
        what the options form asks an estimate for."""
        body = {
            "kind": "notebook",
            "gpus": profile["gpus"],
            "tier": profile["tier"],
            "name": f"notebook server {self.name}" if self.name else "notebook server",
            "server_name": self.name,
            "profile": profile["slug"],  # the reaper's timeout (the server's env is the user's)
        }
        if gpu_models:
            body["gpu_model"] = gpu_models
        for key in ("cpus", "memory_gb"):  # what the scheduler places a CPU-only server by
            if profile.get(key) is not None:
                body[key] = profile[key]
        if queue:  # the profile's queue or the user's choice (profiles.select_queue)
            body["queue"] = queue
        if profile["max_lifetime"]:
            body["walltime"] = profile["max_lifetime"]
        return body

    async def about_me(self) -> dict | str:
        """What the service says of the user (``GET api/me``) for the options form: ``queues``
        (path, GPUs in use, guaranteed, limit, default) and ``idle_timeouts`` (by profile, a
        new server's idle timeout now, the admin's changes included); a string saying why not
        when the service does not answer (the form then says so, and the start uses the
        default queue)."""
        try:
            status, data = await self.api("GET", "api/me")
        except (ServiceUnavailable, GPUSchedSpawnError) as exc:
            return f"the GPU scheduler is not reachable ({exc})"
        if status != 200 or not isinstance(data, dict) or "queues" not in data:
            return f"the GPU scheduler answered {status}"
        return data

    async def estimates(self, profiles: list[dict], queue: str | None) -> dict[str, str]:
        """When a server of each profile would start, in words ("starts now", "about 25 min",
        "waits: <reason>"), by slug, for the options form (``POST api/estimate``, in ``queue``
        unless the profile names its own). All asked at once, each within
        ``estimate_timeout``: a profile the service does not answer for in time (slow, down,
        refusing it) has no estimate, and the form is shown without it."""

        async def one(profile: dict) -> str | None:
            body = self.notebook_request(profile, profile["gpu_models"], profile["queue"] or queue)
            try:
                status, data = await self.api(
                    "POST", "api/estimate", body, timeout=self.estimate_timeout
                )
            except (ServiceUnavailable, GPUSchedSpawnError) as exc:
                self.log.debug("%s: no estimate for %s: %s", self._log_name, profile["slug"], exc)
                return None
            if status != 200 or not isinstance(data, dict) or "start_now" not in data:
                return None
            message = (data.get("reason") or {}).get("message")
            return estimate_text(data["start_now"], data["eta"], message, time.time(), False)

        answers = await asyncio.gather(*(one(p) for p in profiles))
        return {p["slug"]: text for p, text in zip(profiles, answers, strict=True) if text}

    async def release(self, job_id: str, why: str, server_gone: bool = True) -> None:
        """Give the allocation (or the queued request) back, saying why (the job's message).
        ``server_gone``: nothing of the server runs any more (the service checks where it can
        see the server's processes: service/server_stops.py). Never raises: a failure is logged
        (the service then ends the job itself when its walltime runs out)."""
        query = urlencode({"server_gone": "true" if server_gone else "false", "reason": why[:200]})
        try:
            status, data = await self.api("DELETE", f"api/jobs/{job_id}?{query}")
        except Exception as exc:
            self.log.warning(
                "%s: could not release job %s (%s): %s", self._log_name, job_id, why, exc
            )
            return
        if status == 200 or status in (404, 409):  # released / gone / already ended
            self.log.info("%s: released job %s (%s)", self._log_name, job_id, why)
        else:
            self.log.warning(
                "%s: releasing job %s (%s) failed: %s %s", self._log_name, job_id, why, status, data
            )

    # -- progress ------------------------------------------------------------------------------
    def _report(self, message: str, progress: int | None = None, **details) -> None:
        event = {"message": message}
        if progress is not None:
            event["progress"] = progress
        if details:
            event["gpusched"] = details
        if event == self._progress_event:
            return
        self._progress_event = event
        self._progress_serial += 1
        self._wake()

    def _wake(self) -> None:
        changed, self._progress_changed = self._progress_changed, asyncio.Event()
        changed.set()

    async def progress(self):
        """Every change of what start() knows: submitted, position, reason, ETA, placed."""
        seen = 0
        while True:
            if self._progress_serial != seen and self._progress_event:
                seen = self._progress_serial
                yield dict(self._progress_event)
                continue
            if self._progress_done:
                return
            await self._progress_changed.wait()

    def _pending_message(self, job: dict) -> tuple[str, dict]:
        profile = self._profile
        position, reason = job.get("position"), job.get("reason") or {}
        if position is not None:
            ahead = f"{position} ahead of you" if position else "next in line"
            parts = [
                f"{profile['display_name']}: position {position + 1} in the GPU queue ({ahead})"
            ]
        else:
            parts = [f"{profile['display_name']}: waiting for GPUs"]
        if job.get("held"):
            parts.append("held by an admin")
        if reason.get("message"):
            parts.append(f"{reason.get('family', 'waiting')}: {reason['message']}")
        eta = reason.get("eta")
        if eta:  # in the spawn form's words: "about 25 min (at 14:05 UTC)", the date if not today
            parts.append("expected start " + estimate_text(False, eta, None, time.time()))
        details = {
            "job_id": job.get("id"),
            "state": job.get("state"),
            "position": position,
            "reason": reason or None,
            "eta": eta,
        }
        return "; ".join(parts) + ".", details

    async def _submit(self) -> dict:
        try:
            status, data = await self.api("POST", "api/jobs", self.job_request())
        except ServiceUnavailable as exc:
            raise GPUSchedSpawnError(
                f"The GPU scheduler is not reachable ({exc}); try again in a minute.",
                reason="service",
                status_code=503,
            ) from None
        if status != 201:
            error = data.get("error") if isinstance(data, dict) else data
            raise GPUSchedSpawnError(
                f"The GPU scheduler refused the request: {error}",
                reason="refused",
                status_code=403 if status == 403 else 429 if status == 429 else 400,
            )
        if data["state"] == "rejected":
            reason = (data.get("reason") or {}).get("message") or "it can never run here"
            raise GPUSchedSpawnError(
                f"The GPU scheduler rejected the request: {reason}", reason="rejected"
            )
        self.log.info(
            "%s: scheduler job %s (%s), %s",
            self._log_name,
            data["id"],
            self._profile["slug"],
            data["state"],
        )
        return data

    async def _wait_for_allocation(self, job: dict) -> dict:
        wait = self._max_wait()
        deadline = time.monotonic() + wait
        while job["state"] == "pending":
            message, details = self._pending_message(job)
            self._report(message, 20, **details)
            left = deadline - time.monotonic()
            if left <= 0:
                await self.release(job["id"], "maximum queue wait reached")
                self.job_id = ""
                raise GPUSchedSpawnError(
                    f"No GPUs for {self._profile['display_name']!r} within "
                    f"{describe_duration(wait)} (the maximum queue wait): {message} "
                    "The request was removed from the queue; try again later or choose a "
                    "smaller profile.",
                    reason="queue-wait",
                    status_code=503,
                )
            await asyncio.sleep(min(self.queue_poll_interval, left))
            try:
                status, data = await self.api("GET", f"api/jobs/{job['id']}")
            except ServiceUnavailable as exc:
                self.log.warning("%s: scheduler unreachable while queued: %s", self._log_name, exc)
                continue
            if status != 200:
                raise GPUSchedSpawnError(
                    f"The GPU scheduler lost the request {job['id']}: {data}", reason="service"
                )
            job = data
        if job["state"] != "running":
            reason = (job.get("reason") or {}).get("message") or job.get("message") or ""
            raise GPUSchedSpawnError(
                f"The GPU scheduler ended the request ({job['state']})"
                + (f": {reason}" if reason else ""),
                reason=job["state"],
            )
        return job
