"""Who is calling: through JupyterHub (tokens and OAuth cookies), or a token file.

Run as a hub-managed service, every request is identified by the hub
(:class:`jupyterhub.services.auth.HubOAuth`): an API token in the ``Authorization`` header, or
the OAuth cookie of a browser session (``<prefix>login`` starts one: it sends the browser to the
hub's OAuth page and back to ``<prefix>oauth_callback``). The caller must hold the service's
access scope (``access:services!service=<name>``); a valid token without it gets 403. They
administer the scheduler when the *token* holds the custom scope ``custom:gpusched:admin``
(grant it with a role, see ``hub_config/``): being a hub admin is not enough, so that a hub
admin's token down-scoped to the service's access scope cannot drain a node. The hub's answers
are cached for ``auth_cache_max_age`` seconds: a revoked token, or the token of a user deleted
from the hub, stops working within that time.

Standalone (tests, Binder, a laptop), :class:`TokenFileAuth` reads tokens from a YAML file::

    tokens:
      3f9c...: {user: alice, groups: [vision]}
      8a1e...: {user: admin, admin: true}
"""

from __future__ import annotations

import hmac
import os
import posixpath
import stat
from urllib.parse import quote, unquote, urlsplit

from tornado import web
from tornado.httputil import url_concat
from traitlets import Integer, Unicode
from traitlets.config import LoggingConfigurable

from ..core.errors import ConfigError
from ..files import read_yaml
from ..scopes import ADMIN_SCOPE
from .api_handler import APIError
from .identity import Identity


class Auth(LoggingConfigurable):
    """Identifies the caller of a request; None means not authenticated (401). A caller who is
    identified but may not use the service is refused with an :class:`APIError` (403)."""

    async def identify(self, handler) -> Identity | None:
        raise NotImplementedError

    def handlers(self, prefix: str) -> list:
        """Extra routes this method needs (the OAuth callback)."""
        return []

    def login_url(self, prefix: str) -> str | None:
        """Where a browser without a session is sent to log in and come back to the web page
        at ``prefix`` (None: this method has no browser login)."""
        return None

    def cookie_write_allowed(self, handler) -> bool:
        """Whether a change (POST, PUT, DELETE) that came with the browser's cookie rather than
        a header token may go ahead: only with the XSRF token of the service's web page."""
        return False


class HubAuthenticated(Auth):
    admin_scope = Unicode(
        ADMIN_SCOPE,
        help="The scope that makes the holder of a token (a hub user, a service) an admin of "
        "the scheduler: quotas, drains, holds, everybody's jobs. Only the token's scopes count: "
        "a hub admin without it (e.g. a token down-scoped to the service's access scope) is not "
        "an admin here. Grant it with a role (hub_config/jupyterhub_config.py: gpusched-admin).",
    ).tag(config=True)
    auth_cache_max_age = Integer(
        30,
        min=1,
        help="Seconds the service keeps the hub's answer about a token or an OAuth cookie "
        "(HubAuth.cache_max_age, 300 in JupyterHub). A token revoked in the hub, or the token of "
        "a user deleted there, works at most this long after; a shorter age asks the hub more "
        "often (one request per token and period).",
    ).tag(config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        from jupyterhub.services.auth import HubOAuth

        self.hub_auth = HubOAuth(parent=self, cache_max_age=self.auth_cache_max_age)

    async def identify(self, handler) -> Identity | None:
        model = await self.hub_auth.get_user(handler, sync=False)
        if not model:
            return None
        scopes = set(model.get("scopes") or ())
        access = self.hub_auth.access_scopes
        if access and not self.hub_auth.check_scopes(access, model):
            self.log.info("%s lacks the scopes %s", model.get("name"), sorted(access))
            needed = next((s for s in sorted(access) if "!service=" in s), min(access))
            raise APIError(
                403,
                f"{model.get('kind', 'user')} {model.get('name')} may not use this service: "
                f"that needs the scope {needed}",
            )
        admin = self.admin_scope in scopes  # the token's scopes; not the user's admin flag
        return Identity(model["name"], admin, frozenset(model.get("groups") or ()))

    def handlers(self, prefix: str) -> list:
        from jupyterhub.services.auth import HubOAuthCallbackHandler

        class CallbackHandler(HubOAuthCallbackHandler):
            """The hub's callback, with this service's HubOAuth (the one that made the state)
            rather than the HubOAuth singleton."""

            def initialize(self, hub_auth):
                self.hub_auth = hub_auth

        callback = self.hub_auth.oauth_redirect_uri or prefix + "oauth_callback"
        path = callback if callback.startswith("/") else "/" + callback.split("/", 3)[-1]
        shared = {"hub_auth": self.hub_auth}
        return [
            (path, CallbackHandler, shared),
            (prefix + "login", LoginHandler, {**shared, "prefix": prefix}),
        ]

    def login_url(self, prefix: str) -> str | None:
        return url_concat(prefix + "login", {"next": prefix})

    def cookie_write_allowed(self, handler) -> bool:
        """The hub's XSRF check (jupyterhub.services.auth.HubOAuth): the ``X-XSRFToken``
        header (or ``_xsrf`` argument) must be the token the web page was given, which is
        bound to this browser's OAuth session; a cross-site form cannot read it."""
        try:
            self.hub_auth.check_xsrf_cookie(handler)
        except web.HTTPError as exc:
            self.log.info("refused a change by cookie: %s", exc.log_message)
            return False
        return True


class LoginHandler(web.RequestHandler):
    """``GET <prefix>login?next=<path under prefix>``: log a browser in through the hub (OAuth),
    then go to ``next`` (default: ``<prefix>``, the web page, where the hub's Services menu
    points; the page sends a browser without a session here). The API itself answers 401
    rather than redirecting."""

    def initialize(self, hub_auth, prefix: str):
        self.hub_auth, self.prefix = hub_auth, prefix

    async def get(self):
        next_url = stay_under(self.get_argument("next", ""), self.prefix)
        if next_url is None:
            next_url = self.prefix  # the web page; never redirect off the service
        if await self.hub_auth.get_user(self, sync=False):
            self.redirect(next_url)
            return
        params, state = {}, {}
        if getattr(self.hub_auth, "pkce_enabled", False):  # PKCE, in recent JupyterHub
            verifier, challenge, method = self.hub_auth.generate_pkce_code_challenge()
            params.update(code_challenge=challenge, code_challenge_method=method)
            state["code_verifier"] = verifier
        params["state"] = self.hub_auth.set_state_cookie(self, next_url=next_url, **state)
        self.redirect(url_concat(self.hub_auth.login_url, params))


def stay_under(url: str, prefix: str) -> str | None:
    """``url`` as a path under ``prefix`` (which ends in ``/``) to redirect to, or None when it
    leaves the prefix: another host or scheme, a backslash, or dot segments, percent-encoded or
    not, that climb out (``/services/gpusched/../../hub/admin``, ``%2e%2e``). The answer is the
    normalised path (re-encoded) and the query, so the browser goes where this checked."""
    parts = urlsplit(url)
    if parts.scheme or parts.netloc:
        return None
    path = unquote(parts.path)
    if "\\" in path or "//" in path or not path.startswith("/"):
        return None
    normal = posixpath.normpath(path)
    if path.endswith("/") and not normal.endswith("/"):
        normal += "/"
    if not (normal.rstrip("/") + "/").startswith(prefix):
        return None
    query = quote(parts.query, safe="=&+,;:@/?%")  # no control character reaches Location
    return quote(normal) + (f"?{query}" if query else "")


class TokenFileAuth(Auth):
    token_file = Unicode(
        help="YAML file mapping API tokens to users (`tokens: {TOKEN: {user, admin, groups}}`), "
        "for running without a hub. Keep it readable only by the service user.",
    ).tag(config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.tokens = load_tokens(self.token_file)

    async def identify(self, handler) -> Identity | None:
        header = handler.request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        from_header = scheme.lower() in ("token", "bearer") and bool(token)
        if not from_header:
            token = handler.get_argument("token", "")
        if not token:
            return None
        for known, identity in self.tokens.items():
            if hmac.compare_digest(known.encode(), token.strip().encode()):
                # as JupyterHub's HubAuth marks it: writes need a header token
                handler._token_authenticated = from_header
                return identity
        return None


def load_tokens(path: str) -> dict[str, Identity]:
    data = read_yaml(path)
    if not isinstance(data, dict) or not isinstance(data.get("tokens"), dict):
        raise ConfigError("expected a mapping with a 'tokens' mapping", source=path)
    mode = os.stat(path).st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            "the token file is readable by other users; run chmod 600 on it", source=path
        )
    tokens = {}
    for token, spec in data["tokens"].items():
        if not isinstance(token, str) or len(token) < 16:
            raise ConfigError("tokens must be strings of at least 16 characters", source=path)
        if not isinstance(spec, dict) or not isinstance(spec.get("user"), str):
            raise ConfigError("each token needs a 'user'", source=path, field="user")
        groups = spec.get("groups") or []
        tokens[token] = Identity(spec["user"], bool(spec.get("admin")), frozenset(groups))
    return tokens
