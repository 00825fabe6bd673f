"""How one operation of the OpenAPI document is described (openapi.py builds the paths with
:func:`operation`): the security schemes every operation accepts, the statuses each answers
and why, and the error body of each. Apart from openapi.py, which lists the paths, so that the
modules describing a part of the API on their own (openapi_history.py) build their operations
the same way.
"""

from __future__ import annotations

from .openapi_responses import ref

JSON = "application/json"
TIME = {"type": "number", "description": "epoch seconds"}
SECURITY = [{"token": []}, {"bearer": []}, {"cookie": []}]
SECURITY_SCHEMES = {
    "token": {
        "type": "apiKey",
        "in": "header",
        "name": "Authorization",
        "description": "A JupyterHub API token as 'token <token>' (from /hub/token, or the "
        "hub's REST API); it must hold access:services!service=gpusched. Scheduler admins: "
        "also custom:gpusched:admin.",
    },
    "bearer": {"type": "http", "scheme": "bearer", "description": "The same token as Bearer."},
    "cookie": {
        "type": "apiKey",
        "in": "cookie",
        "name": "jupyterhub-services-gpusched",
        "description": "The hub's OAuth cookie of a browser session (<prefix>login starts "
        "one). Reads only (and estimateJob) need no more; every change needs a token in the "
        "Authorization header, or, from the service's web page, the page's XSRF token in the "
        "X-XSRFToken header.",
    },
}

WHY = {
    "400": "bad input: the field and what to fix",
    "401": "no valid hub token (or cookie)",
    "403": "not allowed: no access to this service, not an admin of the scheduler, or a "
    "change without a token in the Authorization header (or the web page's XSRF token)",
    "404": "no such job of yours (another user's job is answered like an unknown one), node "
    "or route",
    "405": "this method is not one of the path's (the Allow header lists them)",
    "409": "the job has already ended",
    "413": "the body is larger than GPUSchedService.max_body_bytes",
    "429": "too many pending jobs (the queue file's user_limits pending_jobs)",
    "503": "the job could not be stored; nothing was queued: retry",
}


def error_response(status: str) -> dict:
    response = {"description": WHY[status], "content": {JSON: {"schema": ref("Error")}}}
    if status == "405":
        response["headers"] = {
            "Allow": {"description": "the path's methods", "schema": {"type": "string"}}
        }
    return response


def operation(
    op_id: str,
    summary: str,
    ok,
    *,
    body=None,
    params=(),
    status=200,
    admin=False,
    errors=(),
    public=False,
    content_type=JSON,
    links=None,
):
    """One operation: ``ok`` is the success body's schema; ``errors`` the statuses beyond
    those every operation can answer (401, 403, 405; 400 with parameters or a body)."""
    statuses = set(errors) | {"401", "403", "405"}
    if params or body is not None:
        statuses.add("400")
    if any(where == "path" for _, where, _ in params):
        statuses.add("404")
    if body is not None:
        statuses.add("413")
    if public:
        statuses = {"405"}
    success = {"description": "OK", "content": {content_type: {"schema": ok}}}
    if links:
        success["links"] = links
    operation = {
        "operationId": op_id,
        "summary": summary + (" (admin)" if admin else ""),
        "security": [] if public else SECURITY,
        "parameters": [
            {"name": name, "in": where, "required": where == "path", "schema": schema}
            for name, where, schema in params
        ],
        "responses": {str(status): success, **{s: error_response(s) for s in sorted(statuses)}},
    }
    if body is not None:
        operation["requestBody"] = {"required": True, "content": {JSON: {"schema": body}}}
    return operation
