"""The old path of :mod:`jupyter_gpusched.notebook.client`: the very same module object
(monkeypatching and isinstance see one module). Notebooks import it:
``from jupyter_gpusched import client``."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("jupyter_gpusched.notebook.client")
