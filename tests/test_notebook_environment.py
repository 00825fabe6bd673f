"""The notebook side reads what the spawner tells a server about its job in one place
(``notebook/environment.py``): the kernel's client and widgets, the server extension's
monitor, proxy and status all take ``JobEnvironment.read()``."""

from __future__ import annotations

import ast
from pathlib import Path

import jupyter_gpusched.notebook as notebook
from jupyter_gpusched.notebook.environment import JobEnvironment

SPAWNED = {  # what GPUSchedSpawner.get_env sets (hub/spawner.py), as a server sees it
    "GPUSCHED_SERVICE_URL": "http://127.0.0.1:8081/services/gpusched/",
    "GPUSCHED_SERVICE_TOKEN": "service-token",
    "JUPYTERHUB_API_TOKEN": "hub-token",
    "GPUSCHED_JOB_ID": "j-000042",
    "GPUSCHED_GPUS": "2",
    "GPUSCHED_NODE": "gpu-a",
    "GPUSCHED_PROFILE": "gpu-2",
    "JUPYTERHUB_BASE_URL": "/hub-prefix/",
    "JUPYTERHUB_USER": "alice",
    "CUDA_VISIBLE_DEVICES": "0,3",
}


def test_a_spawned_server_reads_its_job():
    env = JobEnvironment.read(SPAWNED)
    assert env == JobEnvironment(
        service_url=SPAWNED["GPUSCHED_SERVICE_URL"],
        token="service-token",  # the service's token first
        job_id="j-000042",
        gpus=2.0,
        node="gpu-a",
        profile="gpu-2",
        hub_base_url="/hub-prefix/",
        visible_devices="0,3",
        hub_user="alice",
    )
    fallback = JobEnvironment.read({**SPAWNED, "GPUSCHED_SERVICE_TOKEN": ""})
    assert fallback.token == "hub-token"  # a server given no service token: the hub's


def test_outside_a_scheduled_server_everything_is_empty():
    env = JobEnvironment.read({"GPUSCHED_GPUS": "two"})  # unreadable: unknown, not an error
    assert (env.service_url, env.token, env.job_id, env.node, env.hub_user) == ("",) * 5
    assert env.gpus is None and env.profile is None and env.visible_devices is None


def test_no_other_notebook_module_reads_the_environment():
    root = Path(notebook.__file__).parent
    readers = []
    for path in sorted(root.rglob("*.py")):
        if path.name == "environment.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            reads = isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv")
            if reads and isinstance(node.value, ast.Name) and node.value.id == "os":
                readers.append(f"{path.relative_to(root)}:{node.lineno}")
    assert readers == []
