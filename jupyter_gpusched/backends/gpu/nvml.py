"""The NVML backend: real NVIDIA GPUs through ``pynvml`` (the ``nvidia-ml-py`` package).

What it reads, per device: the running compute and graphics processes with their memory
(``nvmlDeviceGetComputeRunningProcesses``, ``nvmlDeviceGetGraphicsRunningProcesses``), each
process's SM utilization since the previous sample (``nvmlDeviceGetProcessUtilization`` with the
last timestamp seen), the device's utilization and memory (``nvmlDeviceGetUtilizationRates``,
``nvmlDeviceGetMemoryInfo``); once, the NVLink peers (``nvmlDeviceGetNvLinkState`` and
``nvmlDeviceGetNvLinkRemotePciInfo`` mapped to the local GPUs' PCI bus ids, GPUs behind a shared
NVSwitch included, and ``nvmlDeviceGetP2PStatus(..., NVLINK)`` where the driver has it).

Tolerant: a query the GPU or driver does not support, or that this user may not make, gives
``None`` (or no peers, or a note in :attr:`DeviceSample.notes`) instead of an error. A machine
without the NVIDIA library (``NVMLError_LibraryNotFound``), without a loaded driver, or without
``nvidia-ml-py`` raises :class:`NVMLUnavailable`; ``get_telemetry()`` adds how to fix it (never a
fallback to the simulated backend).

PIDs are those of the PID namespace NVML runs in (the host's, for a driver on the host): inside a
container without the host's PID namespace they may not match ``os.getpid()``.
"""

from __future__ import annotations

import importlib
import logging
import threading

from .telemetry import (
    GIB,
    Device,
    DeviceSample,
    GPUProcess,
    Telemetry,
    TelemetryUnavailable,
    short_hostname,
)

log = logging.getLogger(__name__)

_init_lock = threading.Lock()
_initialized: list = []  # the pynvml modules nvmlInit succeeded on (once per process each)


class NVMLUnavailable(TelemetryUnavailable):
    """NVML cannot be used here; the message says why."""


def load_pynvml():
    """The ``pynvml`` module, or :class:`NVMLUnavailable` when ``nvidia-ml-py`` is missing."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise NVMLUnavailable(f"nvidia-ml-py (module pynvml) is not installed: {exc}") from None


def _text(value) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def normalize_bus_id(bus_id) -> str:
    """``00000000:17:00.0``, ``0000:17:00.0`` and ``17:00.0`` all become ``00000000:17:00.0``
    (NVML writes domains with 4 or 8 digits depending on the call)."""
    text = _text(bus_id).strip().lower()
    try:
        rest, function = text.rsplit(".", 1)
        parts = rest.split(":")
        domain = int(parts[-3], 16) if len(parts) >= 3 else 0
        bus, device = int(parts[-2], 16), int(parts[-1], 16)
        return f"{domain:08x}:{bus:02x}:{device:02x}.{int(function, 16):x}"
    except (ValueError, IndexError):
        return text


def _bus_id_of(pci_info) -> str:
    return normalize_bus_id(getattr(pci_info, "busId", "") or getattr(pci_info, "busIdLegacy", ""))


class NVMLTelemetry(Telemetry):
    """The GPUs of this machine as NVML sees them.

    ``pynvml``: the module to use (tests pass a fake one; default: ``import pynvml``).
    ``node``: the machine's name in the cluster file (default: the short host name).
    """

    backend = "nvml"

    def __init__(self, *, node: str | None = None, pynvml=None):
        self._nvml = pynvml if pynvml is not None else load_pynvml()
        self.node = node or short_hostname()
        self._init()
        try:
            count = int(self._nvml.nvmlDeviceGetCount())
        except self._nvml.NVMLError as exc:
            raise NVMLUnavailable(f"NVML cannot count the GPUs: {exc}") from None
        self._handles: dict[int, object] = {}
        for index in range(count):
            try:
                self._handles[index] = self._nvml.nvmlDeviceGetHandleByIndex(index)
            except self._nvml.NVMLError as exc:  # e.g. a GPU this container may not see
                log.warning("NVML: GPU %d skipped: %s", index, exc)
        if not self._handles:
            raise NVMLUnavailable(f"NVML sees no usable GPU ({count} reported)")
        self._devices: list[Device] | None = None
        self._last_seen: dict[int, int] = {}  # device index -> last process-sample timestamp (µs)

    # -- errors ------------------------------------------------------------------------------

    def _is(self, exc: BaseException, *names: str) -> bool:
        """Whether ``exc`` is one of ``pynvml.NVMLError_<name>``."""
        classes = tuple(
            cls
            for cls in (getattr(self._nvml, f"NVMLError_{name}", None) for name in names)
            if isinstance(cls, type)
        )
        return bool(classes) and isinstance(exc, classes)

    def _init(self) -> None:
        with _init_lock:
            if any(module is self._nvml for module in _initialized):
                return
            try:
                self._nvml.nvmlInit()
            except self._nvml.NVMLError as exc:
                if self._is(exc, "LibraryNotFound"):
                    reason = "the NVIDIA driver's NVML library (libnvidia-ml.so.1) is not found"
                elif self._is(exc, "DriverNotLoaded"):
                    reason = "the NVIDIA driver is not loaded"
                elif self._is(exc, "NoPermission"):
                    reason = "no permission to use NVML"
                else:
                    reason = f"nvmlInit failed: {exc}"
                raise NVMLUnavailable(reason) from None
            _initialized.append(self._nvml)

    def _try(self, call, *args, default=None):
        """``call(*args)``, or ``default`` when NVML says the query is unsupported, not permitted
        or finds nothing (any other NVML error too, logged: telemetry must not crash a server)."""
        try:
            return call(*args)
        except self._nvml.NVMLError as exc:
            if not self._is(exc, "NotSupported", "NoPermission", "NotFound", "InvalidArgument"):
                log.debug("NVML: %s%s failed: %s", getattr(call, "__name__", call), args, exc)
            return default

    # -- devices -----------------------------------------------------------------------------

    def devices(self) -> list[Device]:
        if self._devices is None:
            self._devices = self._read_devices()
        return list(self._devices)

    def _read_devices(self) -> list[Device]:
        nvml = self._nvml
        info: dict[int, dict] = {}
        for index, handle in self._handles.items():
            memory = self._try(nvml.nvmlDeviceGetMemoryInfo, handle)
            pci = self._try(nvml.nvmlDeviceGetPciInfo, handle)
            info[index] = {
                "uuid": _text(self._try(nvml.nvmlDeviceGetUUID, handle, default="")),
                "model": _text(self._try(nvml.nvmlDeviceGetName, handle, default="unknown")),
                "memory_total_gb": (memory.total / GIB) if memory is not None else 0.0,
                "pci_bus_id": _bus_id_of(pci) if pci is not None else "",
            }
        peers = self._nvlink_peers({i: d["pci_bus_id"] for i, d in info.items()})
        return [
            Device(index=index, nvlink_peers=tuple(sorted(peers.get(index, ()))), **fields)
            for index, fields in sorted(info.items())
        ]

    def _nvlink_peers(self, bus_ids: dict[int, str]) -> dict[int, set[int]]:
        """GPU index -> GPUs reached over NVLink: remote ends that are local GPUs, GPUs sharing a
        remote end that is no local GPU (an NVSwitch), and pairs whose NVLink P2P status is OK."""
        nvml = self._nvml
        by_bus = {bus: index for index, bus in bus_ids.items() if bus}
        peers: dict[int, set[int]] = {index: set() for index in bus_ids}
        switch_users: dict[str, set[int]] = {}
        max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))
        for index, handle in self._handles.items():
            for link in range(max_links):
                try:
                    active = nvml.nvmlDeviceGetNvLinkState(handle, link)
                except nvml.NVMLError as exc:
                    if self._is(exc, "NotSupported") and link == 0:
                        break  # no NVLink on this GPU
                    continue  # a link number past this GPU's links, or not permitted
                if active != getattr(nvml, "NVML_FEATURE_ENABLED", 1):
                    continue
                remote = self._try(nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
                if remote is None:
                    continue
                bus = _bus_id_of(remote)
                if bus in by_bus:
                    if by_bus[bus] != index:
                        peers[index].add(by_bus[bus])
                        peers[by_bus[bus]].add(index)
                elif bus and self._remote_is_switch(handle, link):
                    switch_users.setdefault(bus, set()).add(index)
        for users in switch_users.values():
            for index in users:
                peers[index] |= users - {index}
        p2p = getattr(nvml, "nvmlDeviceGetP2PStatus", None)
        nvlink_caps = getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", None)
        ok = getattr(nvml, "NVML_P2P_STATUS_OK", 0)
        if p2p is not None and nvlink_caps is not None:
            indices = sorted(self._handles)
            for n, a in enumerate(indices):
                for b in indices[n + 1 :]:
                    if b in peers[a]:
                        continue
                    status = self._try(p2p, self._handles[a], self._handles[b], nvlink_caps)
                    if status is not None and status == ok:
                        peers[a].add(b)
                        peers[b].add(a)
        return peers

    def _remote_is_switch(self, handle, link) -> bool:
        """Whether the far end of a link that is no local GPU is an NVSwitch (not, e.g., a CPU's
        NVLink port); assumed when the driver cannot say."""
        call = getattr(self._nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", None)
        switch = getattr(self._nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", None)
        if call is None or switch is None:
            return True
        kind = self._try(call, handle, link)
        return kind is None or kind == switch

    # -- samples -----------------------------------------------------------------------------

    def sample(self) -> list[DeviceSample]:
        return [self._sample_device(device) for device in self.devices()]

    def _sample_device(self, device: Device) -> DeviceSample:
        nvml = self._nvml
        handle = self._handles[device.index]
        notes: list[str] = []
        rates = self._try(nvml.nvmlDeviceGetUtilizationRates, handle)
        device_util = float(rates.gpu) if rates is not None else None
        memory = self._try(nvml.nvmlDeviceGetMemoryInfo, handle)
        device_memory = memory.used / GIB if memory is not None else None

        memory_of: dict[int, float | None] = {}
        readable = 0
        for name in (
            "nvmlDeviceGetComputeRunningProcesses",
            "nvmlDeviceGetGraphicsRunningProcesses",
        ):
            call = getattr(nvml, name, None)
            if call is None:
                continue
            try:
                listed = call(handle)
            except nvml.NVMLError as exc:
                if not self._is(exc, "NotSupported"):
                    notes.append(f"processes: {name} failed: {exc}")
                continue
            readable += 1
            for proc in listed or ():
                used = getattr(proc, "usedGpuMemory", None)
                gb = used / GIB if isinstance(used, int) and used >= 0 else None
                pid = int(proc.pid)
                if pid in memory_of and memory_of[pid] is not None:
                    gb = max(memory_of[pid], gb or 0.0)  # listed as compute and graphics
                memory_of[pid] = gb
        if not readable and not notes:
            notes.append("processes: not supported")

        util_of = self._process_utilization(device.index, handle, notes) if memory_of else {}
        processes = []
        for pid, gb in sorted(memory_of.items()):
            if device_util == 0.0:
                util = 0.0  # nothing runs on an idle device, whatever the per-process query says
            elif util_of is None:
                util = None
            else:
                util = util_of.get(pid, 0.0)
            processes.append(GPUProcess(pid, device.index, util, gb))
        return DeviceSample(
            device, device_util, device_memory, processes, tuple(notes), backend=self.backend
        )

    def _process_utilization(self, index, handle, notes) -> dict[int, float] | None:
        """pid -> mean SM utilization of its samples since the last call (processes without a
        sample: idle); None when the driver cannot tell."""
        nvml = self._nvml
        since = self._last_seen.get(index, 0)
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, since)
        except nvml.NVMLError as exc:
            if not self._is(exc, "NotSupported", "NotFound", "NoPermission"):
                notes.append(f"utilization: nvmlDeviceGetProcessUtilization failed: {exc}")
            return None
        sums: dict[int, list[float]] = {}
        newest = since
        for entry in samples or ():
            stamp = int(getattr(entry, "timeStamp", 0) or 0)
            if stamp and stamp <= since:
                continue
            newest = max(newest, stamp)
            sm = float(getattr(entry, "smUtil", 0) or 0)
            if sm > 100:  # NVML's "not available" marker (unsigned -1)
                continue
            total = sums.setdefault(int(entry.pid), [0.0, 0])
            total[0] += sm
            total[1] += 1
        self._last_seen[index] = newest
        return {pid: total / count for pid, (total, count) in sums.items()}
