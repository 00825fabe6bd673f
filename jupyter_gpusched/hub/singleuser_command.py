"""The command that starts this environment's single-user server as another user's account.

A root hub starts each notebook server as the user's own Unix account (``GPUSchedSpawner``, the
way of JupyterHub's LocalProcessSpawner). The server's interpreter must then be one the user can
run. A virtual environment made from an interpreter under ``/root`` (pyenv, a root-only Python
build) is not: ``/root`` is 0700, though the environment's packages are readable by everyone
when the checkout is. :func:`singleuser_command` then starts the server with the system
``python3`` of the same version, with this environment's packages first on ``PYTHONPATH`` and
Jupyter's paths pointing into the environment (its JupyterLab, labextensions, server config),
as the job launcher does for batch jobs (``LocalLauncher.python``). Kernels inherit that
environment: jupyter_client starts ``python`` kernels with the server's interpreter.

Either way the server's ``PATH`` starts with a folder of this environment's commands, so that a
terminal of the server (and a kernel's ``!``) runs ``jupyter gpusched queue`` with no set-up:
the environment's ``bin`` when its interpreter is usable, else :data:`SERVER_BIN`, whose
``jupyter`` and ``jupyter-gpusched`` run the system ``python3`` chosen here
(``GPUSCHED_SERVER_PYTHON``).

A terminal of the server keeps that ``PATH`` only if its shell does not set one anew: under a
hub, jupyter_server_terminals starts ``$SHELL -l``, a login shell, whose ``/etc/profile`` (on
Debian) replaces ``PATH``. :data:`TERMINAL_ARGS` makes the server's terminals run the user's
shell as an interactive shell that is not a login one (bash still reads ``~/.bashrc``), which is
how a kernel's ``!`` runs commands too.

``hub_config/jupyterhub_config.py`` sets ``c.Spawner.cmd`` (followed by :data:`TERMINAL_ARGS`) and
adds to ``c.Spawner.environment`` from it.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys

from ..backends.accounts import SYSTEM_PYTHONS, environment_pythonpath

#: ``jupyter`` and ``jupyter-gpusched`` for servers on a system Python (sh scripts).
SERVER_BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "server_bin")

#: The server's terminals: ``$SHELL -i`` (``/bin/sh`` without one), not a login shell.
TERMINAL_ARGS = [
    "--ServerApp.terminado_settings="
    'shell_command=["/bin/sh", "-c", "exec \\"${SHELL:-/bin/sh}\\" -i"]'
]


def usable_by_others(path: str) -> bool:
    """Can an account that neither owns ``path`` nor is in its group reach it, read it and (an
    executable file) run it? Every directory above it must be searchable by others."""
    path = os.path.realpath(path)
    try:
        mode = os.stat(path).st_mode
        if not mode & stat.S_IROTH or (mode & stat.S_IXUSR and not mode & stat.S_IXOTH):
            return False
        parent = os.path.dirname(path)
        while True:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
            if parent == os.path.dirname(parent):
                return True
            parent = os.path.dirname(parent)
    except OSError:
        return False


def _same_version(python: str) -> bool:
    code = "import sys; print(*sys.version_info[:2])"
    try:
        done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and done.stdout.split() == [str(v) for v in sys.version_info[:2]]


def singleuser_command() -> tuple[list[str], dict[str, str]]:
    """``(cmd, environment)`` for ``c.Spawner.cmd`` and ``c.Spawner.environment``: this
    environment's ``jupyterhub-singleuser`` itself when every user can run its interpreter, else
    run by a system ``python3`` of the same version with the environment it needs."""
    bin_dir = os.path.dirname(sys.executable)
    script = os.path.join(bin_dir, "jupyterhub-singleuser")
    path = os.environ.get("PATH") or os.defpath
    if usable_by_others(sys.executable) and usable_by_others(os.__file__):
        return [script], {"PATH": os.pathsep.join([bin_dir, path])}
    for python in SYSTEM_PYTHONS:
        if usable_by_others(python) and _same_version(python):
            break
    else:  # nothing better: the hub logs the permission error when a server starts
        return [script], {}
    jupyter = os.path.join(sys.prefix, "share", "jupyter")
    environment = {
        "PATH": os.pathsep.join([SERVER_BIN, path]),
        "GPUSCHED_SERVER_PYTHON": python,
        "PYTHONPATH": environment_pythonpath(),
        "JUPYTER_PATH": jupyter,
        "JUPYTER_CONFIG_PATH": os.path.join(sys.prefix, "etc", "jupyter"),
        "JUPYTERLAB_DIR": os.path.join(jupyter, "lab"),
    }
    return [python, script], environment
