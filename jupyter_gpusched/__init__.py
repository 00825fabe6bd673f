"""jupyter_gpusched: GPU scheduling for JupyterHub.

The scheduling engine lives in :mod:`jupyter_gpusched.core` (pure, deterministic, no I/O);
:mod:`jupyter_gpusched.sim` replays traces through it; the command line is
:mod:`jupyter_gpusched.cli`.
"""

__version__ = "0.1.0"


def load_ipython_extension(ipython):
    """``%load_ext jupyter_gpusched``: the ``%%gpujob`` and ``%gpusched`` magics."""
    from .notebook.magics import GPUSchedMagics

    ipython.register_magics(GPUSchedMagics)
