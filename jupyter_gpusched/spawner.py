"""The old path of :mod:`jupyter_gpusched.hub.spawner`: the very same module object
(monkeypatching and isinstance see one module). Users' config names it:
``c.JupyterHub.spawner_class = "jupyter_gpusched.spawner.GPUSchedSpawner"``."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("jupyter_gpusched.hub.spawner")
