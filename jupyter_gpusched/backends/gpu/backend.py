"""Choosing this machine's GPU telemetry backend: :func:`get_telemetry`.

Apart from :mod:`.telemetry` (the interface both backends implement) so that the backends import
the interface and this module imports the backends, without a cycle.
"""

from __future__ import annotations

from .telemetry import (
    BACKEND_ENV,
    BACKENDS,
    NVML_HELP,
    Telemetry,
    TelemetryUnavailable,
    configured_backend,
)


def get_telemetry(backend: str | None = None, **options) -> Telemetry:
    """The telemetry of this machine.

    ``backend``: ``"nvml"`` or ``"auto"`` (the same: NVML, with ``auto`` passing only ``node`` to
    it), or ``"simulated"``, only when chosen. ``None`` reads ``$GPUSCHED_GPU_BACKEND`` (default
    ``auto``). Where NVML cannot be used, :class:`TelemetryUnavailable` says why (the missing
    ``nvidia-ml-py`` or ``libnvidia-ml.so.1``, no GPU) and how to choose the simulated backend:
    never a silent fallback to simulated GPUs, which would report busy real GPUs as idle.
    ``options`` go to the backend chosen: see :class:`~.nvml.NVMLTelemetry` and
    :class:`~.simulated.SimulatedTelemetry`.
    """
    if backend is None:
        backend = configured_backend()
    if backend not in BACKENDS:
        raise ValueError(
            f"unknown GPU backend {backend!r} ({BACKEND_ENV} or the gpu_backend setting); "
            f"expected one of {', '.join(BACKENDS)}"
        )
    if backend == "simulated":
        from .simulated import SimulatedTelemetry

        return SimulatedTelemetry(**options)
    from .nvml import NVMLTelemetry

    nvml_options = options if backend == "nvml" else {"node": options.get("node")}
    try:
        return NVMLTelemetry(**nvml_options)
    except TelemetryUnavailable as exc:
        raise type(exc)(f"no GPU telemetry: {exc}. {NVML_HELP}") from None
