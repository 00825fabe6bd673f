"""The old path of :mod:`jupyter_gpusched.notebook.serverext`: the very same module object
(monkeypatching and isinstance see one module). Server configs enable it:
``jpserver_extensions = {"jupyter_gpusched.serverext": True}``; its submodules' old names are
:mod:`jupyter_gpusched._moved`'s."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("jupyter_gpusched.notebook.serverext")
