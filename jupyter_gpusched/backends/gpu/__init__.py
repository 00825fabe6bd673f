"""GPU telemetry: devices and, per device, the processes using them (see ``docs/gpu.md``).

``get_telemetry()`` gives the NVML backend, else an error saying what is missing (the simulated one
only when chosen: ``GPUSCHED_GPU_BACKEND=simulated``); ``simulate_load()`` puts simulated load on
GPUs from any process, a notebook kernel included::

    from jupyter_gpusched.backends.gpu import simulate_load
    simulate_load(util=80, memory_gb=4, seconds=60)

Importing this package is cheap: ``pynvml`` is imported only when the NVML backend starts.
"""

from .backend import get_telemetry
from .simulated import SimulatedTelemetry
from .simulated_loads import SimulatedLoad, simulate_load, stop_load
from .telemetry import (
    BACKENDS,
    Device,
    DeviceSample,
    GPUProcess,
    Telemetry,
    TelemetryUnavailable,
)

__all__ = [
    "BACKENDS",
    "Device",
    "DeviceSample",
    "GPUProcess",
    "SimulatedLoad",
    "SimulatedTelemetry",
    "Telemetry",
    "TelemetryUnavailable",
    "get_telemetry",
    "simulate_load",
    "stop_load",
]
