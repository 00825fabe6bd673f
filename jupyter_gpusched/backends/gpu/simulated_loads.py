"""The load files of the simulated GPUs: how a process declares that it uses GPUs, and how
the backend reads those declarations back.

A process (a notebook kernel, a batch job, a test) declares that it uses GPUs with
:func:`simulate_load`; the load is a small JSON file in a directory shared by the processes of
one simulated cluster (``$GPUSCHED_SIM_GPU_DIR``; the demo hub gives each hub its own, beside its
state directory, made by :func:`make_load_dir`; default ``<tmp>/jupyter_gpusched-sim-gpus``),
writable by all users with the sticky bit like ``/tmp`` itself, since the demo's notebook
servers run as different users. A load counts only when its file's owner is root or the user
the loaded process runs as (:func:`may_load`): a user can write a load for their own processes,
never fake one for another user's (which would keep that kernel from being reaped, or get it
killed as rogue). A load ends when its ``seconds`` pass or its process exits (PID and creation
time are checked, so a reused PID does not inherit it).

Apart from :mod:`.simulated` (the :class:`~.simulated.SimulatedTelemetry` backend that turns the
loads into NVML-like samples) because this side runs in every process that loads a GPU, a kernel
included, and needs no cluster file; the backend only reads what is written here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

from .telemetry import short_hostname

STATE_DIR_ENV = "GPUSCHED_SIM_GPU_DIR"
NODE_ENV = "GPUSCHED_NODE"
MAX_GPUS = 64
_UUID_NAMESPACE = uuid.UUID("6f3c1f0e-9a35-4c59-9a0f-3d1c2b7e5a10")
CREATE_TIME_TOLERANCE = 0.01  # seconds
MAX_RECORD = 4096  # characters: a load file is about 250; a bigger one is not a load


def default_state_dir() -> Path:
    return Path(tempfile.gettempdir()) / "jupyter_gpusched-sim-gpus"


def resolve_state_dir(path=None) -> Path:
    """The directory of the loads: ``path``, else ``$GPUSCHED_SIM_GPU_DIR``, else the default."""
    if path is None:
        path = os.environ.get(STATE_DIR_ENV) or default_state_dir()
    return Path(path)


def _ensure_state_dir(path: Path) -> Path:
    try:
        path.mkdir(parents=True)
    except FileExistsError:
        return path
    with contextlib.suppress(OSError):  # any user's kernel may add loads; owners remove them
        path.chmod(0o1777)
    return path


def make_load_dir(path) -> Path:
    """Create the load directory of a hub or service (sticky, writable by all) and check that
    it is this process's own: a directory someone else made first (or a symlink) could let its
    owner delete or swap the loads of every user, so it is refused, not used."""
    path = Path(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
        raise RuntimeError(
            f"{path} is not a directory of this user (uid {os.geteuid()}): remove it, or set "
            f"{STATE_DIR_ENV} to another folder for the simulated GPUs"
        )
    path.chmod(0o1777)
    return path


def default_node() -> str:
    return os.environ.get(NODE_ENV) or short_hostname()


def simulated_uuid(node: str, index: int) -> str:
    """The UUID of a simulated GPU: stable for a node name and index, like a real GPU's."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node}/{index}')}"


def simulated_bus_id(index: int) -> str:
    return f"00000000:{0x10 + index:02x}:00.0"


def visible_gpus(node: str, value: str | None = None) -> list[int]:
    """The node's GPU indices a process may use, from ``CUDA_VISIBLE_DEVICES`` as CUDA reads it:
    indices or GPU UUIDs separated by commas, up to the first entry that is neither; unset: GPU 0
    (where a CUDA program that picks no device runs); empty: none."""
    if value is None:
        value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return [0]
    uuids = {simulated_uuid(node, i).lower(): i for i in range(MAX_GPUS)}
    gpus: list[int] = []
    for item in value.split(","):
        item = item.strip()
        if item.isdigit():
            index = int(item)
        elif item.lower() in uuids:
            index = uuids[item.lower()]
        else:
            break
        if index not in gpus:
            gpus.append(index)
    return gpus


def process_identity(pid: int) -> float:
    """The creation time of a live process (PID reuse check); raises if it does not exist."""
    process = psutil.Process(pid)
    if process.status() == psutil.STATUS_ZOMBIE:
        raise psutil.NoSuchProcess(pid)
    return process.create_time()


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "_"


def _load_file(directory: Path, node: str, pid: int, create_time: float, gpu: int) -> Path:
    stamp = round(create_time * 1000)
    return directory / f"load--{_safe(node)}--{pid}-{stamp}--gpu{gpu}.json"


@dataclass
class SimulatedLoad:
    """What :func:`simulate_load` registered. ``until``: epoch seconds, None = until the process
    exits. :meth:`stop` ends it early."""

    node: str
    pid: int
    gpus: list[int]
    util: float
    memory_gb: float
    until: float | None
    state_dir: Path

    def stop(self) -> None:
        stop_load(self.gpus, node=self.node, pid=self.pid, state_dir=self.state_dir)

    def __repr__(self) -> str:
        end = (
            "process exit"
            if self.until is None
            else time.strftime("%H:%M:%S", time.localtime(self.until))
        )
        return (
            f"<simulated GPU load: pid {self.pid} on {self.node} GPUs {self.gpus}, "
            f"{self.util:g}% and {self.memory_gb:g} GB each, until {end}>"
        )


def simulate_load(
    util: float = 80,
    memory_gb: float = 4,
    seconds: float | None = 60,
    gpus=None,
    *,
    node: str | None = None,
    pid: int | None = None,
    state_dir=None,
) -> SimulatedLoad:
    """Put simulated load on GPUs, from any process (a notebook kernel included), and return at
    once: the process appears on each GPU with ``util`` percent utilization and ``memory_gb`` GB
    for ``seconds`` (None: until it exits) or until it exits, whichever is first.

    ``gpus``: the node's GPU indices (or UUIDs, or a string like ``"0,3"``); default: those of
    ``CUDA_VISIBLE_DEVICES`` (GPU 0 when unset). Passing others simulates a process escaping its
    allocation. A new call replaces the calling process's earlier load on the same GPUs;
    ``util=0`` with some memory is an idle kernel that holds GPU memory. ``node``: default
    ``$GPUSCHED_NODE``, else the host name. ``pid``: default the calling process; a process of
    another user counts only when root writes the load (see the module docstring).
    """
    node = node or default_node()
    if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0 <= util <= 100:
        raise ValueError(f"util must be a percentage between 0 and 100, got {util!r}")
    if isinstance(memory_gb, bool) or not isinstance(memory_gb, (int, float)) or memory_gb < 0:
        raise ValueError(f"memory_gb must be a number >= 0, got {memory_gb!r}")
    if seconds is not None and (
        isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0
    ):
        raise ValueError(f"seconds must be a number > 0 or None, got {seconds!r}")
    indices = _gpu_list(node, gpus)
    if not indices:
        raise RuntimeError(
            "no GPU to load: CUDA_VISIBLE_DEVICES is empty (this process was given no GPU); "
            "pass gpus=[...] to load some anyway"
        )
    pid = os.getpid() if pid is None else int(pid)
    create_time = process_identity(pid)
    directory = _ensure_state_dir(resolve_state_dir(state_dir))
    now = time.time()
    until = None if seconds is None else now + float(seconds)
    for index in indices:
        record = {
            "version": 1,
            "node": node,
            "pid": pid,
            "create_time": create_time,
            "device": index,
            "utilization_percent": float(util),
            "memory_gb": float(memory_gb),
            "started": now,
            "until": until,
        }
        path = _load_file(directory, node, pid, create_time, index)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(record, out)
            os.chmod(tmp, 0o644)
            try:
                os.replace(tmp, path)
            except PermissionError:  # sticky directory: the name is taken by another user
                raise PermissionError(
                    f"cannot write the load {path}: another user owns a file of that name"
                ) from None
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return SimulatedLoad(node, pid, indices, float(util), float(memory_gb), until, directory)


def stop_load(gpus=None, *, node=None, pid=None, state_dir=None) -> int:
    """End a process's simulated load on ``gpus`` (default: all); returns how many GPUs it left."""
    node = node or default_node()
    pid = os.getpid() if pid is None else int(pid)
    directory = resolve_state_dir(state_dir)
    wanted = None if gpus is None else set(_gpu_list(node, gpus))
    removed = 0
    for path, record, _ in read_records(directory):
        if record.get("node") != node or record.get("pid") != pid:
            continue
        if wanted is not None and record.get("device") not in wanted:
            continue
        try:
            path.unlink()
            removed += 1
        except OSError:
            pass
    return removed


def _gpu_list(node: str, gpus) -> list[int]:
    if gpus is None:
        return visible_gpus(node)
    if isinstance(gpus, str):
        return visible_gpus(node, gpus)
    if isinstance(gpus, int) and not isinstance(gpus, bool):
        gpus = [gpus]
    result: list[int] = []
    for gpu in gpus:
        if isinstance(gpu, str):
            found = visible_gpus(node, gpu)
            if not found:
                raise ValueError(f"not a GPU index or UUID of node {node!r}: {gpu!r}")
            index = found[0]
        elif isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < MAX_GPUS:
            raise ValueError(f"not a GPU index: {gpu!r}")
        else:
            index = gpu
        if index not in result:
            result.append(index)
    return result


def read_records(directory: Path):
    """``(path, record, owner uid)`` of each load file (never followed through a symlink)."""
    try:
        paths = sorted(directory.glob("load--*.json"))
    except OSError:
        return
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue  # removed meanwhile, or a symlink
        try:
            with os.fdopen(fd) as file:
                found = os.fstat(file.fileno())
                if not stat.S_ISREG(found.st_mode):
                    continue
                record = json.loads(file.read(MAX_RECORD))
        except (OSError, ValueError):
            continue  # not ours to read, or not a load
        if isinstance(record, dict):
            yield path, record, found.st_uid


def may_load(owner: int, pid: int) -> bool:
    """Is the load file of ``owner`` believed for process ``pid``? Only when written by root or
    by the user the process runs as (real or effective uid)."""
    if owner == 0:
        return True
    try:
        uids = psutil.Process(pid).uids()
    except psutil.Error:
        return False
    return owner in (uids.real, uids.effective)
