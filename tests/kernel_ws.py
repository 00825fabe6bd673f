"""Run a cell in a kernel of a real server over its websocket (the Jupyter protocol's JSON form),
as JupyterLab does: the hub tests' one way to execute code in a user's kernel (and, with
:func:`terminal_output`, to type a line into a terminal of the server)."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid

from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.websocket import websocket_connect


async def run_cell(ws_url: str, token: str, code: str, timeout: float) -> tuple[dict, str]:
    """Run ``code``; (the execute_reply's content, everything the cell showed as text).

    The reply comes on the shell channel, the output on iopub: the two are not ordered with
    each other, so the cell is done when both the reply and iopub's ``idle`` for it came."""
    request = HTTPRequest(ws_url, headers={"Authorization": f"token {token}"})
    connection = await asyncio.wait_for(websocket_connect(request), timeout)
    msg_id, shown = uuid.uuid4().hex, []
    header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "test"}
    header.update(session=uuid.uuid4().hex, version="5.3")
    header["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    content = {"code": code, "silent": False, "store_history": False, "user_expressions": {}}
    content.update(allow_stdin=False, stop_on_error=True)
    message = {"header": header, "parent_header": {}, "metadata": {}, "content": content}
    message.update(channel="shell", buffers=[])
    reply, idle = None, False
    try:
        await connection.write_message(json.dumps(message))
        while reply is None or not idle:
            raw = await asyncio.wait_for(connection.read_message(), timeout)
            assert raw is not None, "the kernel websocket closed before the cell ended"
            answer = json.loads(raw)
            if answer["parent_header"].get("msg_id") != msg_id:
                continue
            kind = answer["header"]["msg_type"]
            if kind == "stream":
                shown.append(answer["content"]["text"])
            elif kind == "error":
                shown.append("\n".join(answer["content"]["traceback"]))
            elif kind == "status" and answer["content"].get("execution_state") == "idle":
                idle = True
            elif kind == "execute_reply":
                reply = answer["content"]
        return reply, "".join(shown)
    finally:
        connection.close()


async def terminal_output(server_url: str, token: str, line: str, until: str, timeout: float):
    """Type ``line`` into a new terminal of the server at ``server_url`` (``.../user/NAME/``),
    as a person in JupyterLab's Terminal does, and return what it showed once ``until`` (a
    regular expression) matched it; the terminal is closed after."""
    headers = {"Authorization": f"token {token}"}
    client = AsyncHTTPClient()
    made = await client.fetch(
        f"{server_url}api/terminals", method="POST", body="{}", headers=headers
    )
    name = json.loads(made.body)["name"]
    ws_url = f"{server_url.replace('http', 'ws', 1)}terminals/websocket/{name}"
    connection = await asyncio.wait_for(
        websocket_connect(HTTPRequest(ws_url, headers=headers)), timeout
    )
    shown, deadline = [], time.monotonic() + timeout
    try:
        await connection.write_message(json.dumps(["stdin", line + "\r"]))
        while not re.search(until, "".join(shown)):
            left = deadline - time.monotonic()
            assert left > 0, f"the terminal did not show {until!r}: {''.join(shown)!r}"
            raw = await asyncio.wait_for(connection.read_message(), left)
            assert raw is not None, f"the terminal closed: {''.join(shown)!r}"
            kind, *rest = json.loads(raw)
            if kind == "stdout":
                shown.append(rest[0])
        return "".join(shown)
    finally:
        connection.close()
        await client.fetch(
            f"{server_url}api/terminals/{name}",
            method="DELETE",
            headers=headers,
            raise_error=False,
        )
