"""What the spawner tells a single-user server about its job: the one reading of the
``GPUSCHED_*`` environment on the notebook side (the kernel's client and widgets, the server
extension's monitor, proxy and status).

:class:`~jupyter_gpusched.hub.spawner.GPUSchedSpawner` sets these in the server's environment
(kernels inherit it): ``GPUSCHED_SERVICE_URL`` and ``GPUSCHED_SERVICE_TOKEN`` (the service and
a token of the user for it; ``JUPYTERHUB_API_TOKEN`` where no service token was given),
``GPUSCHED_JOB_ID``, ``GPUSCHED_GPUS``, ``GPUSCHED_NODE``, ``GPUSCHED_PROFILE`` and
``CUDA_VISIBLE_DEVICES`` (the notebook job the server is, its GPUs); JupyterHub sets
``JUPYTERHUB_BASE_URL`` and ``JUPYTERHUB_USER``. Outside such a server (a user's own
``jupyter lab``) all are empty. Read at each call, not at import: a kernel or a test may set
them later.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class JobEnvironment:
    service_url: str  # "" when no service was given
    token: str  # the user's token for the service ("" when none)
    job_id: str  # the notebook job this server is ("" outside one)
    gpus: float | None  # the GPUs it was given (None: unknown)
    node: str  # the first node it runs on ("" unknown)
    profile: str | None  # the profile it was started with
    hub_base_url: str  # the hub's base URL ("/" by default)
    visible_devices: str | None  # CUDA_VISIBLE_DEVICES: the GPUs given to it (None: all)
    hub_user: str = ""  # JUPYTERHUB_USER: whose server this is ("" outside a hub)

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> JobEnvironment:
        env = os.environ if environ is None else environ
        return cls(
            service_url=env.get("GPUSCHED_SERVICE_URL", ""),
            token=env.get("GPUSCHED_SERVICE_TOKEN") or env.get("JUPYTERHUB_API_TOKEN", ""),
            job_id=env.get("GPUSCHED_JOB_ID", ""),
            gpus=_number(env.get("GPUSCHED_GPUS")),
            node=env.get("GPUSCHED_NODE", ""),
            profile=env.get("GPUSCHED_PROFILE") or None,
            hub_base_url=env.get("JUPYTERHUB_BASE_URL", "/"),
            visible_devices=env.get("CUDA_VISIBLE_DEVICES"),
            hub_user=env.get("JUPYTERHUB_USER", ""),
        )


def _number(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None
