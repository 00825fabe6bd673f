"""The old names of modules that moved when the package was laid out by where code runs
(issue 17) and that have no compatibility file of their own: ``import`` of an old name gives the
module at its new path, the very same object.

The old packages ``jupyter_gpusched.gpu`` and ``jupyter_gpusched.serverext`` are one-line modules
that hand over their new package; a submodule's old name (``jupyter_gpusched.gpu.nvml``) would
then be looked up in the new package's folder and load the file a second time, as a second module
with its own classes. The finder below answers those names first, with the module already there.
The other old names here (``jupyter_gpusched.accounts``, ...) have no file left, so the finder is
only asked after the ordinary ones found nothing; answering them first changes nothing.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

#: old module name -> new one (the moved modules without a compatibility file)
MOVED = {
    "jupyter_gpusched.gpu.discover": "jupyter_gpusched.backends.gpu.discover",
    "jupyter_gpusched.gpu.nvml": "jupyter_gpusched.backends.gpu.nvml",
    "jupyter_gpusched.gpu.simulated": "jupyter_gpusched.backends.gpu.simulated",
    "jupyter_gpusched.gpu.telemetry": "jupyter_gpusched.backends.gpu.telemetry",
    "jupyter_gpusched.node_agent": "jupyter_gpusched.backends.gpu.node_agent",
    "jupyter_gpusched.accounts": "jupyter_gpusched.backends.accounts",
    "jupyter_gpusched.process_tree": "jupyter_gpusched.backends.process_tree",
    "jupyter_gpusched.service.runner": "jupyter_gpusched.backends.local.runner",
    "jupyter_gpusched.slurm_commands": "jupyter_gpusched.backends.slurm.commands",
    "jupyter_gpusched.slurm_inventory": "jupyter_gpusched.backends.slurm.inventory",
    "jupyter_gpusched.spawner_queue": "jupyter_gpusched.hub.spawner_queue",
    "jupyter_gpusched.singleuser_command": "jupyter_gpusched.hub.singleuser_command",
    "jupyter_gpusched.payloads": "jupyter_gpusched.notebook.payloads",
    "jupyter_gpusched.serverext.monitor": "jupyter_gpusched.notebook.serverext.monitor",
    "jupyter_gpusched.serverext.notices": "jupyter_gpusched.notebook.serverext.notices",
    "jupyter_gpusched.serverext.proxy": "jupyter_gpusched.notebook.serverext.proxy",
    "jupyter_gpusched.service.reaper_cli": "jupyter_gpusched.cli.reaper",
}


class OldNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the names in :data:`MOVED`; loading one puts the new module in ``sys.modules``
    under the old name, which the import system then hands out."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        return None  # a blank module, replaced in exec_module

    def exec_module(self, module):
        sys.modules[module.__name__] = importlib.import_module(MOVED[module.__name__])


def install() -> None:
    """Puts the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, OldNames) for finder in sys.meta_path):
        sys.meta_path.insert(0, OldNames())
