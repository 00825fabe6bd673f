"""``jupyter-gpusched reaper show|set key=value ...``: the idle reaper's settings over the REST API.

The service's URL: ``--url``, else ``$GPUSCHED_SERVICE_URL`` (what the client and the magics
use; the spawner sets it in every server), else ``$GPUSCHED_URL`` (its older name), else the
demo hub's proxy, ``http://127.0.0.1:$GPUSCHED_HUB_PORT/services/gpusched/`` (8000 without the
variable, as in ``make demo``). The token: ``--token``, else ``$JUPYTERHUB_API_TOKEN``. ``set``
needs an admin of the scheduler.

Values: JSON where it parses (``300``, ``null``, ``true``, ``["a","b"]``), else text (``30m``);
``exempt_*`` also take ``a,b``; ``off`` turns a timeout off; ``profile_timeouts.SLUG=15m`` sets one
profile's timeout.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request

DEFAULT_URL = "http://127.0.0.1:$GPUSCHED_HUB_PORT/services/gpusched/"


def service_url(given: str | None = None) -> str:
    """The service's URL (see the module's docstring)."""
    if given:
        return given
    for name in ("GPUSCHED_SERVICE_URL", "GPUSCHED_URL"):
        if os.environ.get(name):
            return os.environ[name]
    port = os.environ.get("GPUSCHED_HUB_PORT") or "8000"
    return f"http://127.0.0.1:{port}/services/gpusched/"


LISTS = ("exempt_users", "exempt_groups", "exempt_profiles")


def add_parser(commands) -> None:
    reaper = commands.add_parser(
        "reaper",
        help="show or change the idle reaper's settings (through the service's REST API)",
        description="show: the settings in force and the sessions; set KEY=VALUE ...: change "
        "settings (admins), e.g. `set timeout_tier_2=20m warning_lead=5m exempt_users=alice`.",
    )
    reaper.add_argument("action", choices=["show", "set"])
    reaper.add_argument("pairs", nargs="*", metavar="KEY=VALUE")
    reaper.add_argument("--url", default=None, help=f"the service's URL (default {DEFAULT_URL})")
    reaper.add_argument("--token", default=None, help="API token (default $JUPYTERHUB_API_TOKEN)")
    reaper.set_defaults(run=run)


def parse_pairs(pairs: list[str]) -> dict:
    changes: dict = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {pair!r}")
        if text.strip().lower() == "off":
            value = None
        else:
            try:
                value = json.loads(text)
            except ValueError:
                value = text
        if key in LISTS and isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if key.startswith("profile_timeouts."):
            changes.setdefault("profile_timeouts", {})[key.split(".", 1)[1]] = value
        else:
            changes[key] = value
    return changes


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


def run(args) -> int:
    base = service_url(args.url)
    url = base.rstrip("/") + "/api/reaper"
    token = args.token or os.environ.get("JUPYTERHUB_API_TOKEN")
    try:
        if args.action == "set":
            if not args.pairs:
                print("jupyter-gpusched reaper set: nothing to set", file=sys.stderr)
                return 2
            status, data = request(url, token, "PUT", parse_pairs(args.pairs))
        else:
            status, data = request(url, token)
    except ValueError as exc:
        print(f"jupyter-gpusched reaper: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"jupyter-gpusched reaper: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    if status >= 400:
        field = f" ({data.get('field')})" if data.get("field") else ""
        print(f"jupyter-gpusched reaper: {status}: {data.get('error')}{field}", file=sys.stderr)
        return 2 if status == 400 else 1
    print(json.dumps(data, indent=2, sort_keys=True))
    return 0
