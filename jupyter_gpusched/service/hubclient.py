"""What the service asks of JupyterHub: stop a user's notebook server, post a notice to it, read
a user's groups (``read:users``), and list the active servers' last activity (``list:users``).

A hub-managed service gets its API token and the hub's API URL in its environment
(``JUPYTERHUB_API_TOKEN``, ``JUPYTERHUB_API_URL``). Its role needs ``admin:servers`` (or
``servers``) to stop servers and ``access:servers`` to reach them; see ``hub_config/README.md``.
Notices go through the proxy (``proxy_url``) to the server extension's ``gpusched/api/notices``.
The proxy records each as activity of the server (the server itself does not: the request says
``no_track_activity``), so the client keeps when it posted them (``notice_posts``): the reaper's
reading of the hub's activity (hub_activity.py) must not take a warning for the user's use.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import deque
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

log = logging.getLogger("jupyter_gpusched.service")


class HubClient:
    def __init__(self, api_url: str, token: str, proxy_url: str):
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.proxy_url = proxy_url.rstrip("/")
        # (user, server name) -> [start, end] epoch seconds of the latest notice posts to it;
        # the end is infinite while the post is under way (the proxy may record it meanwhile)
        self.notice_posts: dict[tuple[str, str], deque[list[float]]] = {}

    @classmethod
    def from_environment(cls, proxy_url: str) -> HubClient | None:
        """The client for the hub that runs this service, or None when run standalone."""
        api_url, token = (
            os.environ.get("JUPYTERHUB_API_URL"),
            os.environ.get("JUPYTERHUB_API_TOKEN"),
        )
        if not api_url or not token:
            return None
        return cls(api_url, token, proxy_url)

    def server_path(self, user: str, server_name: str) -> str:
        path = f"/user/{quote(user, safe='')}/"
        return path + (f"{quote(server_name, safe='')}/" if server_name else "")

    async def stop_server(self, user: str, server_name: str) -> str:
        """Ask the hub to stop the server (the hub then calls its spawner's stop, which releases
        the job once the server is gone). Returns the hub's answer: ``"stopping"`` (202: the
        spawner's stop is under way), ``"not running"`` (204: nothing was running, or it had
        just exited; 400/404: no such server), or ``"failed"`` (logged)."""
        route = f"/users/{quote(user, safe='')}/"
        route += f"servers/{quote(server_name, safe='')}" if server_name else "server"
        request = HTTPRequest(
            self.api_url + route,
            method="DELETE",
            headers={"Authorization": f"token {self.token}"},
            allow_nonstandard_methods=True,
            request_timeout=10,
        )
        try:
            response = await AsyncHTTPClient().fetch(request)
        except HTTPClientError as exc:
            if exc.code in (400, 404):
                return "not running"
            log.warning(
                "stopping %s's server %r through the hub failed: %s", user, server_name, exc
            )
            return "failed"
        except OSError as exc:
            log.warning(
                "stopping %s's server %r through the hub failed: %s", user, server_name, exc
            )
            return "failed"
        return "stopping" if response.code == 202 else "not running"

    async def post_notice(self, user: str, server_name: str, notice: dict) -> bool:
        url = self.proxy_url + self.server_path(user, server_name)
        url += "gpusched/api/notices?no_track_activity=1"  # jupyter-server's own switch
        post = [time.time(), math.inf]  # in the record from its start: see notice_posts
        self.notice_posts.setdefault((user, server_name), deque(maxlen=8)).append(post)
        try:
            return await self._call("POST", url, notice)
        finally:
            post[1] = time.time()

    async def user_groups(self, user: str) -> frozenset[str] | None:
        """The hub groups of ``user``, or None when the hub cannot say."""
        request = HTTPRequest(
            f"{self.api_url}/users/{quote(user, safe='')}",
            headers={"Authorization": f"token {self.token}"},
            request_timeout=10,
        )
        try:
            response = await AsyncHTTPClient().fetch(request)
            groups = json.loads(response.body).get("groups")
        except (HTTPClientError, OSError, ValueError, AttributeError) as exc:
            log.warning("reading the groups of %s from the hub failed: %s", user, exc)
            return None
        if not isinstance(groups, list):
            return None
        return frozenset(g for g in groups if isinstance(g, str))

    async def server_activity(
        self, page_size: int = 200
    ) -> dict[tuple[str, str], str | None] | None:
        """``last_activity`` (the hub's ISO text) of every active server, by (user, server
        name), from ``GET users?state=active``, all pages of ``page_size`` users (JupyterHub 2+
        paginates when asked with its pagination media type, and caps a page at its
        ``api_page_max_limit``); None when the hub cannot say (logged)."""
        out: dict[tuple[str, str], str | None] = {}
        offset = 0
        while True:
            request = HTTPRequest(
                f"{self.api_url}/users?state=active&offset={offset}&limit={page_size}",
                headers={
                    "Authorization": f"token {self.token}",
                    "Accept": "application/jupyterhub-pagination+json",
                },
                request_timeout=10,
            )
            try:
                response = await AsyncHTTPClient().fetch(request)
                page = json.loads(response.body)
                users = page["items"] if isinstance(page, dict) else page
                for user in users:
                    for name, server in (user.get("servers") or {}).items():
                        out[(user["name"], name)] = server.get("last_activity")
            except (HTTPClientError, OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("reading the servers' activity from the hub failed: %s", exc)
                return None
            following = page.get("_pagination", {}).get("next") if isinstance(page, dict) else None
            if not following or not users:
                return out
            offset = following["offset"]

    async def _call(self, method: str, url: str, body: dict | None) -> bool:
        request = HTTPRequest(
            url,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            body=json.dumps(body) if body is not None else None,
            allow_nonstandard_methods=True,
            request_timeout=10,
        )
        try:
            await AsyncHTTPClient().fetch(request)
        except HTTPClientError as exc:
            if method == "DELETE" and exc.code in (400, 404):
                return True  # not running (any more)
            log.warning("%s %s failed: %s", method, url, exc)
            return False
        except OSError as exc:
            log.warning("%s %s failed: %s", method, url, exc)
            return False
        return True
