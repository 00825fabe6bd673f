"""What the user commands (``submit``, ``queue``, ``jobs``, ``cancel``, ``log``, ``estimate``,
``usage``, ``nodes``) share: the client they talk to the service with, their exit codes, their
``--json`` output and their tables.

The client is the kernel-side one (:class:`~jupyter_gpusched.notebook.client.Client`), so a
terminal and a notebook send the same requests. Its URL: ``--url``, else
``$GPUSCHED_SERVICE_URL`` (set in every single-user server the scheduler starts), else as
``reaper`` finds it (:func:`.connection.service_url`). Its token, from the environment only (a token
on a command line is visible to every user of the machine in ``ps``):
``$GPUSCHED_SERVICE_TOKEN``, else ``$JUPYTERHUB_API_TOKEN`` (both set in a single-user server).

Exit codes: :data:`OK` 0; :data:`FAILED` 1, the service could not be reached or failed (a 5xx);
:data:`BAD_INPUT` 2, a usage error or a request the service refused (a 4xx: 400 bad input, 401
no valid token, 403 not allowed, 404 no such job of yours, 409 already ended, 429 too many
pending), with the service's message on stderr.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime

from .. import __version__
from ..notebook.client import Client, GPUSchedError
from .connection import service_url

OK, FAILED, BAD_INPUT = 0, 1, 2
TABLE_WIDTH = 100  # a table's line fits this many columns (the longest column is cut with …)

EXIT_CODES = (
    "exit status: 0 ok; 1 the service could not be reached or failed (5xx); 2 bad input: a "
    "usage error, or a request the service refused (4xx), with its message"
)
ENVIRONMENT = (
    "The service: --url, else $GPUSCHED_SERVICE_URL (set inside a single-user server). The "
    "token: $GPUSCHED_SERVICE_TOKEN, else $JUPYTERHUB_API_TOKEN (both set inside a "
    "single-user server; elsewhere, a token from the hub's /hub/token page)."
)


class UsageError(Exception):
    """A command line that cannot be carried out as given (exit status 2)."""


def add_command(commands, name: str, summary: str, description: str, command):
    """A user command's parser: its help, the options every user command takes (``--url``,
    ``--json``), the environment and exit codes below; it runs ``command(args, client)``
    through :func:`run_command`."""
    parser = commands.add_parser(
        name, help=summary, description=description, epilog=f"{ENVIRONMENT} {EXIT_CODES}."
    )
    parser.add_argument("--url", default=None, help="the service's URL (see below)")
    parser.add_argument("--json", action="store_true", help="print the API's JSON instead")
    parser.set_defaults(run=lambda args: run_command(args, command))
    return parser


def client_for(args) -> Client:
    url = args.url or service_url()
    return Client(url)


def run_command(args, command) -> int:
    """``command(args, client)`` with the errors turned into messages and exit codes."""
    name = f"jupyter-gpusched {args.command}"
    try:
        return command(args, client_for(args))
    except UsageError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return BAD_INPUT
    except GPUSchedError as exc:
        if exc.status is None and exc.field in ("url", "token"):  # a set-up to fix
            print(f"{name}: error: no service {exc.field} given. {ENVIRONMENT}", file=sys.stderr)
            return BAD_INPUT
        print(f"{name}: error: {exc}", file=sys.stderr)
        if exc.status is None:  # unreachable
            return FAILED
        return BAD_INPUT if 400 <= exc.status < 500 else FAILED
    except KeyError as exc:  # the answer lacks a field the command reads: an older service
        print(
            f"{name}: error: the service's answer has no {exc.args[0]!r}: the service is older "
            f"than this command (jupyter_gpusched {__version__}); ask the hub's admin to "
            "upgrade it, or use --json",
            file=sys.stderr,
        )
        return FAILED
    except KeyboardInterrupt:
        return 130


def print_json(data) -> None:
    print(json.dumps(data, indent=2))


def table(headers: list[str], rows: list[list], width: int = TABLE_WIDTH) -> str:
    """``rows`` under ``headers``, left-aligned, two spaces apart, no line wider than ``width``:
    while it is too wide, the widest column loses characters, its cut cells ending in "…" (a
    cell never wraps)."""
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    gap = 2
    while sum(widths) + gap * (len(widths) - 1) > width:
        widest = max(range(len(widths)), key=lambda i: widths[i])
        if widths[widest] <= max(4, len(headers[widest])):
            break  # nothing left to cut: so many columns cannot fit
        widths[widest] -= 1
    lines = [headers, *cells]
    out = []
    for line in lines:
        parts = [_cut(text, w).ljust(w) for text, w in zip(line, widths, strict=True)]
        out.append((" " * gap).join(parts).rstrip())
    return "\n".join(out)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def when(epoch: float | None, now: float | None = None) -> str | None:
    """An epoch as local time: ``14:05`` today, ``12-03 14:05`` another day."""
    if epoch is None:
        return None
    moment = datetime.fromtimestamp(epoch)
    today = datetime.fromtimestamp(now).date() if now is not None else datetime.now().date()
    return moment.strftime("%H:%M" if moment.date() == today else "%m-%d %H:%M")


def gpus_text(view: dict) -> str:
    """A job's GPUs as a column shows them: ``2``, or ``0.5`` for a share of one."""
    fraction = view.get("gpu_fraction") or 1.0
    return f"{fraction:g}" if fraction < 1 else str(view.get("gpus"))
