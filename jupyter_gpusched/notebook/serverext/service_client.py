"""The server extension's one client of the scheduler service: the Lab's proxy
(:mod:`.proxy`) and the GPU monitor's reports (:mod:`.monitor`) both go through it, as the
server's user (the URL and token of :class:`~jupyter_gpusched.notebook.environment.JobEnvironment`
unless given). Asynchronous, on the server's event loop; the kernel's client
(:mod:`jupyter_gpusched.notebook.client`) is the blocking one a notebook cell calls."""

from __future__ import annotations

import json

from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from ..environment import JobEnvironment

REQUEST_TIMEOUT = 10.0


class ServiceClient:
    """Requests to the scheduler service as this server's user."""

    def __init__(self, url: str | None = None, token: str | None = None):
        if url is None or token is None:
            env = JobEnvironment.read()
            url = env.service_url if url is None else url
            token = env.token if token is None else token
        self.url = url.rstrip("/") + "/" if url else ""
        self.token = token

    @property
    def configured(self) -> bool:
        return bool(self.url)

    async def fetch(
        self, method: str, path: str, body: bytes | None = None, timeout: float = REQUEST_TIMEOUT
    ):
        """``(status, content type, body bytes)``; 502 when the service does not answer."""
        request = HTTPRequest(
            self.url + path,
            method=method,
            headers={"Authorization": f"token {self.token}", "Accept": "application/json"},
            body=body,
            request_timeout=timeout,
            allow_nonstandard_methods=True,
        )
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except OSError as exc:
            return (
                502,
                "application/json",
                error_body(f"the scheduler service is unreachable: {exc}"),
            )
        if response.code == 599:
            return 502, "application/json", error_body(f"the scheduler service: {response.error}")
        kind = response.headers.get("Content-Type", "application/json")
        return response.code, kind, response.body or b""

    async def json(self, path: str):
        """The JSON body of a GET, or None when it failed."""
        status, _, body = await self.fetch("GET", path)
        if status != 200:
            return None
        try:
            return json.loads(body)
        except ValueError:
            return None


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()
