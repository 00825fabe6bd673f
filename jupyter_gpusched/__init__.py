"""jupyter_gpusched: GPU scheduling for JupyterHub.

The package is laid out by where code runs: :mod:`jupyter_gpusched.core` is the scheduling
engine (pure, deterministic, no I/O); :mod:`~jupyter_gpusched.sim` replays traces through it;
:mod:`~jupyter_gpusched.service` is the scheduler service; :mod:`~jupyter_gpusched.backends`
what it drives (GPU telemetry, the local and Slurm launchers, accounts);
:mod:`~jupyter_gpusched.hub` runs in JupyterHub (the spawners); :mod:`~jupyter_gpusched.notebook`
in notebook servers and kernels (server extension, client, magics, widget); the command line is
:mod:`~jupyter_gpusched.cli`.

What notebooks and configs use is here, imported only when first asked for (so that importing
the package in a kernel imports neither JupyterHub nor the service)::

    from jupyter_gpusched import Client, QueueWidget, simulate_load, client
    c.JupyterHub.spawner_class = "gpusched"  # or jupyter_gpusched.GPUSchedSpawner

The modules' paths before that layout (``jupyter_gpusched.spawner``, ``.client``, ``.widgets``,
``.gpu``, ``.serverext``, ...) still work: each is the new module (see :mod:`._moved`).
"""

from importlib import import_module

from . import _moved

__version__ = "0.1.0"

_moved.install()

#: public name -> the module that defines it
PUBLIC = {
    "Client": "jupyter_gpusched.notebook.client",
    "GPUSchedError": "jupyter_gpusched.notebook.client",
    "Job": "jupyter_gpusched.notebook.client",
    "QueueWidget": "jupyter_gpusched.notebook.widgets",
    "simulate_load": "jupyter_gpusched.backends.gpu",
    "stop_load": "jupyter_gpusched.backends.gpu",
    "get_telemetry": "jupyter_gpusched.backends.gpu",
    "GPUSchedSpawner": "jupyter_gpusched.hub.spawner",
    "GPUSchedSlurmSpawner": "jupyter_gpusched.hub.slurm_spawner",
}

__all__ = ["__version__", *PUBLIC]


def __getattr__(name):
    """PEP 562: a public name's module is imported on first use."""
    if name not in PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *PUBLIC])


def load_ipython_extension(ipython):
    """``%load_ext jupyter_gpusched``: the ``%%gpujob`` and ``%gpusched`` magics."""
    from .notebook.magics import GPUSchedMagics

    ipython.register_magics(GPUSchedMagics)


def _jupyter_server_extension_points():
    """``jpserver_extensions = {"jupyter_gpusched": True}``: the server extension."""
    return [{"module": "jupyter_gpusched.notebook.serverext"}]
