"""The old path of :mod:`jupyter_gpusched.notebook.widgets`: the very same module object
(monkeypatching and isinstance see one module). Notebooks import it:
``from jupyter_gpusched.widgets import QueueWidget``."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("jupyter_gpusched.notebook.widgets")
