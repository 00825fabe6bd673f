"""The server extension enabled under every name it has had (the wheel's config file and the
spawner's flag say ``jupyter_gpusched.notebook.serverext``; older configs say
``jupyter_gpusched.serverext`` or ``jupyter_gpusched``) in one real jupyter-server: it is set up
once, with one GPU monitor and one set of routes."""

from __future__ import annotations

import pytest
from pytest_jupyter.jupyter_server import *  # noqa: F403 (the fixtures, for this module only)

NAMES = ("jupyter_gpusched.notebook.serverext", "jupyter_gpusched.serverext", "jupyter_gpusched")


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": dict.fromkeys(NAMES, True)}}


def routes(web_app, suffix: str) -> list[str]:
    """The patterns of ``web_app``'s handlers that end with ``suffix`` (tornado keeps one
    router per host pattern, each with its rules)."""
    found = []
    for host_rule in web_app.default_router.rules:
        for rule in getattr(host_rule.target, "rules", []):
            pattern = getattr(rule.matcher, "regex", None)
            if pattern is not None and pattern.pattern.rstrip("$").endswith(suffix):
                found.append(pattern.pattern)
    return found


def test_three_names_load_the_extension_once(jp_serverapp):
    manager = jp_serverapp.extension_manager
    for name in NAMES:  # each name is a package jupyter-server loaded...
        assert manager.extensions[name].enabled, name
    # ...and the extension set itself up once: one route each, one monitor
    assert len(routes(jp_serverapp.web_app, "gpusched/api/kernels")) == 1
    assert len(routes(jp_serverapp.web_app, "gpusched/api/notices")) == 1
    assert jp_serverapp.web_app.settings["jupyter_gpusched_loaded"] is True
