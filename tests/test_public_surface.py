"""What users already write keeps working after the package was laid out by where code runs
(issue 17): every old module path is the new module itself, the top level's public names are the
new objects, and importing the package in a kernel imports neither JupyterHub nor the service."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

import jupyter_gpusched
from jupyter_gpusched._moved import MOVED

#: the old paths that have a compatibility file of their own -> the new module
OLD_FILES = {
    "jupyter_gpusched.spawner": "jupyter_gpusched.hub.spawner",
    "jupyter_gpusched.slurm_spawner": "jupyter_gpusched.hub.slurm_spawner",
    "jupyter_gpusched.profiles": "jupyter_gpusched.hub.profiles",
    "jupyter_gpusched.stop_notice": "jupyter_gpusched.hub.stop_notice",
    "jupyter_gpusched.client": "jupyter_gpusched.notebook.client",
    "jupyter_gpusched.widgets": "jupyter_gpusched.notebook.widgets",
    "jupyter_gpusched.magics": "jupyter_gpusched.notebook.magics",
    "jupyter_gpusched.serverext": "jupyter_gpusched.notebook.serverext",
    "jupyter_gpusched.gpu": "jupyter_gpusched.backends.gpu",
    "jupyter_gpusched.service.launcher": "jupyter_gpusched.backends.local.launcher",
    "jupyter_gpusched.service.slurm": "jupyter_gpusched.backends.slurm.launcher",
}
OLD_PATHS = {**OLD_FILES, **MOVED}


@pytest.mark.parametrize("old", sorted(OLD_PATHS))
def test_an_old_path_is_the_new_module(old):
    new = importlib.import_module(OLD_PATHS[old])
    assert importlib.import_module(old) is new
    assert sys.modules[old] is new
    parent, _, name = old.rpartition(".")
    assert getattr(importlib.import_module(parent), name) is new  # `from parent import name`


def test_what_readme_and_the_docs_import_is_the_new_object():
    from jupyter_gpusched.gpu.nvml import NVMLTelemetry

    from jupyter_gpusched import client
    from jupyter_gpusched.backends.gpu import nvml, simulated
    from jupyter_gpusched.backends.slurm import launcher
    from jupyter_gpusched.client import Client
    from jupyter_gpusched.gpu import simulate_load
    from jupyter_gpusched.hub import spawner
    from jupyter_gpusched.notebook import client as new_client
    from jupyter_gpusched.notebook import widgets
    from jupyter_gpusched.service.slurm import SlurmLauncher
    from jupyter_gpusched.spawner import GPUSchedSpawner
    from jupyter_gpusched.widgets import QueueWidget

    assert client is new_client and Client is new_client.Client
    assert simulate_load is simulated.simulate_load and NVMLTelemetry is nvml.NVMLTelemetry
    assert SlurmLauncher is launcher.SlurmLauncher
    assert GPUSchedSpawner is spawner.GPUSchedSpawner
    assert QueueWidget is widgets.QueueWidget
    assert issubclass(spawner.GPUSchedSpawner, GPUSchedSpawner)  # one class, not a copy


@pytest.mark.parametrize("name", sorted(jupyter_gpusched.PUBLIC))
def test_a_public_name_is_the_object_of_its_module(name):
    module = importlib.import_module(jupyter_gpusched.PUBLIC[name])
    assert getattr(jupyter_gpusched, name) is getattr(module, name)
    assert name in dir(jupyter_gpusched)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_thing"):
        jupyter_gpusched.no_such_thing  # noqa: B018


def _modules_after(code: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.splitlines()[-1])


def _heavy(modules: list[str]) -> list[str]:
    return [
        name
        for name in modules
        if name.split(".")[0] == "jupyterhub"
        or name in ("tornado.web", "sqlalchemy", "alembic")
        or name.startswith(("jupyter_gpusched.service", "jupyter_gpusched.hub"))
    ]


def test_importing_the_package_imports_neither_jupyterhub_nor_the_service():
    modules = _modules_after("import jupyter_gpusched")
    assert "jupyter_gpusched" in modules
    assert _heavy(modules) == []
    assert "jupyter_gpusched.notebook.client" not in modules  # imported on first use only


def test_a_kernels_imports_from_the_top_level_leave_jupyterhub_and_the_service_out():
    modules = _modules_after(
        "from jupyter_gpusched import Client, QueueWidget, simulate_load, client"
    )
    assert "jupyter_gpusched.notebook.widgets" in modules
    assert _heavy(modules) == []


def test_load_ext_and_both_server_extension_names_still_load():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell()
    shell.run_line_magic("load_ext", "jupyter_gpusched")
    assert "gpujob" in shell.magics_manager.magics["cell"]
    assert "gpusched" in shell.magics_manager.magics["line"]
    from jupyter_gpusched import serverext
    from jupyter_gpusched.notebook import serverext as new_serverext

    # jpserver_extensions = {"jupyter_gpusched": True} and {"jupyter_gpusched.serverext": True}
    for package in (jupyter_gpusched, serverext):
        (point,) = package._jupyter_server_extension_points()
        module = importlib.import_module(point["module"])
        assert module is new_serverext
        assert callable(module._load_jupyter_server_extension)


def test_the_spawner_entry_points_and_the_console_script_name_the_new_objects():
    from jupyter_gpusched.cli import main
    from jupyter_gpusched.hub.slurm_spawner import GPUSchedSlurmSpawner
    from jupyter_gpusched.hub.spawner import GPUSchedSpawner

    spawners = {ep.name: ep.load() for ep in entry_points(group="jupyterhub.spawners")}
    assert spawners["gpusched"] is GPUSchedSpawner
    assert spawners["gpusched-slurm"] is GPUSchedSlurmSpawner
    (script,) = entry_points(group="console_scripts", name="jupyter-gpusched")
    assert script.load() is main


def test_slurm_jobs_queued_before_the_move_still_run_the_old_command():
    """A notebook job's script, written by an older version, runs
    ``python -m jupyter_gpusched.service.slurm notebook IN OUT``: the old module still runs."""
    done = subprocess.run(
        [sys.executable, "-m", "jupyter_gpusched.service.slurm", "not-a-command"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "usage: python -m jupyter_gpusched.backends.slurm.launcher notebook IN OUT" in (
        done.stderr
    )
