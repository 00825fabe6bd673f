"""The jupyter-server extension of jupyter_gpusched: what runs inside each notebook server that
:class:`jupyter_gpusched.hub.spawner.GPUSchedSpawner` starts.

Routes (under the server's base URL, authenticated like every jupyter-server API):

* ``POST /gpusched/api/notices``: the scheduler service tells the server something its user must
  know, e.g. ``{"kind": "preemption", "message": "...", "deadline": <epoch>}`` before it stops a
  pre-emptible (tier-3) server. The notice is logged in the server log and kept (the newest
  :data:`~.notices.MAX_NOTICES`).
* ``GET /gpusched/api/notices``: ``{"start": ..., "notices": [...]}``, oldest first (ids count
  from 1 at each server start, which ``start`` names).
* ``GET /gpusched/api/kernels``: the GPU monitor's per-kernel and per-server utilization, memory
  and last GPU use (:mod:`.monitor`, configured as ``GPUMonitor.interval`` etc.).

The wheel enables it in every jupyter server of the environment it is installed in
(``etc/jupyter/jupyter_server_config.d/jupyter_gpusched.json``, from ``jupyter-config/``), and the
spawner on the command line of the servers it starts
(``--ServerApp.jpserver_extensions=jupyter_gpusched.notebook.serverext=True``, the same name);
``jupyter server extension enable jupyter_gpusched.notebook.serverext`` where neither applies.
Enabled under an older name as well (``jupyter_gpusched.serverext``, ``jupyter_gpusched``), it
still loads once. Later issues add GPU monitoring routes under the same ``/gpusched/api/`` prefix.
"""

from __future__ import annotations

EXTENSION = "jupyter_gpusched.notebook.serverext"
ROUTE_PREFIX = "gpusched/api"  # under the server's base_url
LOADED_KEY = "jupyter_gpusched_loaded"  # in the web app's settings once the extension is set up


def _jupyter_server_extension_points():
    return [{"module": EXTENSION}]


def _load_jupyter_server_extension(serverapp):
    """Add the routes to the running server, once: a server that enables the extension under
    two names (the wheel's config file, the spawner's flag, a user's older
    ``jupyter_gpusched.serverext``) would otherwise run two monitors and two sets of routes."""
    if serverapp.web_app.settings.get(LOADED_KEY):
        return
    serverapp.web_app.settings[LOADED_KEY] = True
    from .notices import setup_handlers

    setup_handlers(serverapp.web_app, serverapp.log)
    from .monitor import setup_monitor

    setup_monitor(serverapp)
    from .proxy import setup_proxy  # the JupyterLab extension's view of the service

    setup_proxy(serverapp.web_app)
    serverapp.log.info("jupyter_gpusched server extension loaded: /%s/", ROUTE_PREFIX)


# The name older jupyter-server and notebook versions look for.
load_jupyter_server_extension = _load_jupyter_server_extension
