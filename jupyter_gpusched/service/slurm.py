"""Moved to :mod:`jupyter_gpusched.backends.slurm.launcher` (``SlurmLauncher``,
``c.GPUSchedService.launcher_class``); this old path keeps working and gives the very same module
object. Also still runnable as ``python -m jupyter_gpusched.service.slurm notebook IN OUT``: the
command Slurm jobs queued before the move run."""

import importlib
import runpy
import sys

if __name__ == "__main__":
    runpy.run_module("jupyter_gpusched.backends.slurm.launcher", run_name="__main__")
else:
    sys.modules[__name__] = importlib.import_module("jupyter_gpusched.backends.slurm.launcher")
