"""The GPU telemetry interface: which GPUs a machine has, and which processes use them, how much.

Two backends implement it: :class:`~jupyter_gpusched.backends.gpu.nvml.NVMLTelemetry` (real NVIDIA
GPUs, through ``nvidia-ml-py``) and
:class:`~jupyter_gpusched.backends.gpu.simulated.SimulatedTelemetry` (the GPUs of a cluster file's
node, loaded by :func:`~jupyter_gpusched.backends.gpu.simulated.simulate_load`). Consumers (the
monitor in the notebook server, the service's rogue-process check, ``nodes: discover``) only see the
dataclasses below and cannot tell the backends apart.

No silent fallback: ``auto`` (the default) means NVML, and where NVML cannot be used
:func:`~.backend.get_telemetry` raises :class:`TelemetryUnavailable` saying what is missing and how
to choose the simulated GPUs instead. Every :class:`DeviceSample` names the backend that made it,
so that the service can refuse to act on simulated numbers from a machine with real GPUs.

Units: memory in GiB (2**30 bytes) and called ``gb`` like everywhere in the project; utilization in
percent (0-100) of the GPU's streaming multiprocessors over the last sampling period. ``None`` means
"unknown" (not supported by the GPU or driver, or not permitted), never zero.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

BACKENDS = ("auto", "nvml", "simulated")
BACKEND_ENV = "GPUSCHED_GPU_BACKEND"  # default backend of get_telemetry(): auto, nvml, simulated
#: How to make telemetry work, appended to the reason NVML cannot be used.
NVML_HELP = (
    "GPU telemetry 'auto' means NVML: install nvidia-ml-py and make the NVIDIA driver's "
    "libnvidia-ml.so.1 loadable (a container needs the driver's libraries mounted), or choose "
    f"the simulated GPUs explicitly for a demo or a test: {BACKEND_ENV}=simulated (or "
    "c.GPUMonitor.gpu_backend / c.GPUSchedService.gpu_backend = 'simulated')"
)
GIB = float(1 << 30)


@dataclass(frozen=True)
class Device:
    """One GPU. ``index`` is the machine's GPU index (NVML order = PCI bus order, the one
    ``CUDA_VISIBLE_DEVICES`` uses with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``); ``nvlink_peers`` are the
    indices of the GPUs it reaches over NVLink (directly or through NVSwitches)."""

    index: int
    uuid: str
    model: str
    memory_total_gb: float
    nvlink_peers: tuple[int, ...] = ()
    pci_bus_id: str = ""


@dataclass(frozen=True)
class GPUProcess:
    """A process holding a context on a GPU. ``utilization_percent``: its share of the GPU's SM
    time over the last sampling period (None: the driver cannot tell; then the device's own
    utilization is an upper bound). ``memory_used_gb``: None when the driver does not say."""

    pid: int
    device_index: int
    utilization_percent: float | None
    memory_used_gb: float | None


@dataclass
class DeviceSample:
    """One device at one moment. ``notes`` say what could not be read (e.g. the process list
    without the permission for it), so that an empty ``processes`` is not taken for an idle GPU
    when it only means "not visible". ``backend``: which backend made it (``Telemetry.backend``),
    so that a consumer can tell real measurements from simulated ones."""

    device: Device
    utilization_percent: float | None
    memory_used_gb: float | None
    processes: list[GPUProcess] = field(default_factory=list)
    notes: tuple[str, ...] = ()
    backend: str = "unknown"  # the backend that made it: "nvml" or "simulated"

    @property
    def processes_known(self) -> bool:
        """False when the process list could not be read."""
        return not any(note.startswith("processes:") for note in self.notes)


class TelemetryUnavailable(RuntimeError):
    """A backend cannot run on this machine (no NVIDIA driver, no ``nvidia-ml-py``, no GPU)."""


class Telemetry:
    """The interface. ``node`` is the name of the machine in the cluster file (the short host
    name for NVML; the simulated node's name for the simulated backend)."""

    backend = "none"
    node: str = ""

    def devices(self) -> list[Device]:
        """The GPUs, by index. Static: read once."""
        raise NotImplementedError

    def sample(self) -> list[DeviceSample]:
        """Every device now, with the processes using it. Per-process utilization covers the time
        since the previous ``sample()`` of this object (the first call: the driver's buffer)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the backend holds (nothing for most)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def short_hostname() -> str:
    return socket.gethostname().split(".")[0]


def configured_backend() -> str:
    """The backend chosen for this process: ``$GPUSCHED_GPU_BACKEND``, else ``auto``."""
    return os.environ.get(BACKEND_ENV, "").strip() or "auto"
