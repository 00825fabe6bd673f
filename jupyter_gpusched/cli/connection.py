"""Where the operators' commands (``reaper``, ``export-trace``) find the service, and their one
request to it (the user commands talk through the notebook client: :mod:`.service`).

The service's URL: ``--url``, else ``$GPUSCHED_SERVICE_URL`` (what the client and the magics
use; the spawner sets it in every server), else ``$GPUSCHED_URL`` (its older name), else the
demo hub's proxy, ``http://127.0.0.1:$GPUSCHED_HUB_PORT/services/gpusched/`` (8000 without the
variable, as in ``make demo``). The token: ``$GPUSCHED_SERVICE_TOKEN``, else
``$JUPYTERHUB_API_TOKEN`` (both set in a single-user server, as for the user commands); never
an option, which every user of the machine would see in ``ps``.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:$GPUSCHED_HUB_PORT/services/gpusched/"


def service_token() -> str | None:
    """The token (see the module's docstring): inside a single-user server the server's token
    for the service, which carries an admin's scope for an admin's own server."""
    return os.environ.get("GPUSCHED_SERVICE_TOKEN") or os.environ.get("JUPYTERHUB_API_TOKEN")


def service_url(given: str | None = None) -> str:
    """The service's URL (see the module's docstring)."""
    if given:
        return given
    for name in ("GPUSCHED_SERVICE_URL", "GPUSCHED_URL"):
        if os.environ.get(name):
            return os.environ[name]
    port = os.environ.get("GPUSCHED_HUB_PORT") or "8000"
    return f"http://127.0.0.1:{port}/services/gpusched/"


def request(url: str, token: str | None, method: str = "GET", body=None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"token {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"{}")
        except ValueError:
            return exc.code, {"error": exc.reason}
