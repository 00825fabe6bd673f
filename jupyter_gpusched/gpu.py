"""The old path of :mod:`jupyter_gpusched.backends.gpu`: the very same module object
(monkeypatching and isinstance see one module). Notebooks import it:
``from jupyter_gpusched.gpu import simulate_load``; its submodules' old names
(``jupyter_gpusched.gpu.nvml``, ...) are :mod:`jupyter_gpusched._moved`'s."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("jupyter_gpusched.backends.gpu")
