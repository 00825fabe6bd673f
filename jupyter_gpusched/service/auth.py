"""Who is calling: through JupyterHub (tokens and OAuth cookies), or a token file.

Run as a hub-managed service, every request is identified by the hub
(:class:`jupyterhub.services.auth.HubOAuth`): an API token in the ``Authorization`` header, or
the OAuth cookie of a browser session (``<prefix>login`` starts one: it sends the browser to the
hub's OAuth page and back to ``<prefix>oauth_callback``). The caller must hold the service's
access scope (``access:services!service=<name>``); a valid token without it gets 403. They
administer the scheduler when they hold the custom scope ``custom:gpusched:admin`` (grant it
with a role, see ``hub_config/``) or are hub admins.

Standalone (tests, Binder, a laptop), :class:`TokenFileAuth` reads tokens from a YAML file::

    tokens:
      3f9c...: {user: alice, groups: [vision]}
      8a1e...: {user: admin, admin: true}
"""

from __future__ import annotations

import hmac
import os
import stat

from tornado import web
from tornado.httputil import url_concat
from traitlets import Unicode
from traitlets.config import LoggingConfigurable

from ..core.errors import ConfigError
from ..files import read_yaml
from .handlers import APIError
from .live import Identity

ADMIN_SCOPE = "custom:gpusched:admin"


class Auth(LoggingConfigurable):
    """Identifies the caller of a request; None means not authenticated (401). A caller who is
    identified but may not use the service is refused with an :class:`APIError` (403)."""

    async def identify(self, handler) -> Identity | None:
        raise NotImplementedError

    def handlers(self, prefix: str) -> list:
        """Extra routes this method needs (the OAuth callback)."""
        return []


class HubAuthenticated(Auth):
    admin_scope = Unicode(
        ADMIN_SCOPE,
        help="The scope that makes a hub user (or service) an admin of the scheduler: quotas, "
        "drains, holds, everybody's jobs. Hub admins are admins too.",
    ).tag(config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        from jupyterhub.services.auth import HubOAuth

        self.hub_auth = HubOAuth(parent=self)

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
        admin = bool(model.get("admin")) or self.admin_scope in scopes
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
            (prefix, LoginHandler, {**shared, "prefix": prefix}),  # the hub's Services link
        ]


class LoginHandler(web.RequestHandler):
    """``GET <prefix>login?next=<path under prefix>``: log a browser in through the hub (OAuth),
    then go to ``next`` (default: ``<prefix>api/queue``). Also at ``<prefix>`` itself, where the
    hub's Services menu points. The API itself answers 401 rather than redirecting."""

    def initialize(self, hub_auth, prefix: str):
        self.hub_auth, self.prefix = hub_auth, prefix

    async def get(self):
        next_url = self.get_argument("next", "")
        if not next_url.startswith(self.prefix) or "//" in next_url or "\\" in next_url:
            next_url = self.prefix + "api/queue"  # never redirect off the service
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
