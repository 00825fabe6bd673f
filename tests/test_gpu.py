"""GPU telemetry (jupyter_gpusched.backends.gpu): the simulated backend across real processes, the
NVML adapter against a fake ``pynvml`` module (unit tests only: no GPU here), ``nodes: discover``
and rogue processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import psutil
import pytest

from jupyter_gpusched.backends.gpu import (
    Device,
    DeviceSample,
    GPUProcess,
    SimulatedTelemetry,
    TelemetryUnavailable,
    get_telemetry,
    simulate_load,
    stop_load,
)
from jupyter_gpusched.backends.gpu import nvml as nvml_backend
from jupyter_gpusched.backends.gpu.discover import (
    ROGUE_NO_JOB,
    ROGUE_OUTSIDE_ALLOCATION,
    expand_discover,
    job_of_process,
    node_entry,
    nvlink_domains,
    nvlink_spec,
    rogue_processes,
)
from jupyter_gpusched.backends.gpu.simulated_loads import simulated_uuid
from jupyter_gpusched.core import Cluster, ConfigError
from jupyter_gpusched.files import read_yaml

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_CLUSTER = ROOT / "examples" / "cluster.yaml"
GiB = 1 << 30


@pytest.fixture
def sim_dir(tmp_path, monkeypatch):
    directory = tmp_path / "sim-gpus"
    monkeypatch.setenv("GPUSCHED_SIM_GPU_DIR", str(directory))
    monkeypatch.setenv("GPUSCHED_NODE", "n1")
    monkeypatch.delenv("GPUSCHED_SIM_CLUSTER", raising=False)
    monkeypatch.delenv("GPUSCHED_GPU_BACKEND", raising=False)
    return directory


@pytest.fixture
def holders():
    """Cheap live processes to attribute simulated load to (``simulate_load(pid=...)``)."""
    started = []

    def start():
        process = subprocess.Popen(["sleep", "60"])
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
        process.wait()


def by_index(samples):
    return {sample.device.index: sample for sample in samples}


def procs(sample):
    return {p.pid: (p.utilization_percent, p.memory_used_gb) for p in sample.processes}


def start_loader(sim_dir, cuda_visible, util, memory_gb, seconds, node="n1"):
    """A separate Python process that calls simulate_load, says 'ready', and waits for stdin."""
    code = textwrap.dedent(
        f"""
        import sys
        from jupyter_gpusched.backends.gpu import simulate_load
        simulate_load(util={util}, memory_gb={memory_gb}, seconds={seconds})
        print("ready", flush=True)
        sys.stdin.readline()
        """
    )
    env = dict(os.environ, GPUSCHED_SIM_GPU_DIR=str(sim_dir), GPUSCHED_NODE=node)
    env["CUDA_VISIBLE_DEVICES"] = cuda_visible
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    process = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    return process


def wait_ready(process):
    line = process.stdout.readline()
    assert line.strip() == "ready", f"loader failed (rc={process.poll()})"


def finish(process):
    process.stdin.write("\n")
    process.stdin.flush()
    process.wait(timeout=10)


# -- the simulated backend, across processes ---------------------------------------------------


def test_load_from_another_process_is_seen_on_its_gpus_until_it_exits(sim_dir):
    telemetry = SimulatedTelemetry(node="n1", gpus=4, model="T4", memory_gb=16)
    loader = start_loader(sim_dir, "1,2", util=70, memory_gb=3, seconds=60)
    try:
        wait_ready(loader)
        samples = by_index(telemetry.sample())
        assert procs(samples[1]) == {loader.pid: (70.0, 3.0)}
        assert procs(samples[2]) == {loader.pid: (70.0, 3.0)}
        assert samples[0].processes == [] and samples[3].processes == []
        assert samples[1].utilization_percent == 70.0 and samples[1].memory_used_gb == 3.0
        assert samples[0].utilization_percent == 0.0 and samples[0].memory_used_gb == 0.0
        assert samples[1].device.model == "T4" and samples[1].device.memory_total_gb == 16.0
    finally:
        finish(loader)
    samples = by_index(telemetry.sample())
    assert all(sample.processes == [] for sample in samples.values())
    assert samples[1].utilization_percent == 0.0
    assert list(sim_dir.glob("load--*")) == []  # the dead process's files are gone


def test_load_ends_when_its_time_passes_while_the_process_lives(sim_dir):
    telemetry = SimulatedTelemetry(node="n1", gpus=2)
    loader = start_loader(sim_dir, "0", util=50, memory_gb=1, seconds=2)
    try:
        wait_ready(loader)
        assert procs(by_index(telemetry.sample())[0]) == {loader.pid: (50.0, 1.0)}
        time.sleep(2.1)
        assert loader.poll() is None
        assert by_index(telemetry.sample())[0].processes == []
    finally:
        finish(loader)


def test_utilization_is_attributed_per_process(sim_dir, holders):
    telemetry = SimulatedTelemetry(node="n1", gpus=4)
    a, b, c = holders(), holders(), holders()
    simulate_load(util=60, memory_gb=2, gpus=[0], pid=a.pid)
    simulate_load(util=30, memory_gb=5, gpus=[1], pid=b.pid)
    # the same GPU: each process keeps its own share; the device sums them
    simulate_load(util=20, memory_gb=1, gpus=[2], pid=a.pid)
    simulate_load(util=50, memory_gb=6, gpus=[2], pid=b.pid)
    # oversubscribed: time slices, scaled to 100% in all
    simulate_load(util=80, memory_gb=1, gpus=[3], pid=b.pid)
    simulate_load(util=80, memory_gb=1, gpus=[3], pid=c.pid)
    samples = by_index(telemetry.sample())
    assert procs(samples[0]) == {a.pid: (60.0, 2.0)}
    assert procs(samples[1]) == {b.pid: (30.0, 5.0)}
    assert procs(samples[2]) == {a.pid: (20.0, 1.0), b.pid: (50.0, 6.0)}
    assert samples[2].utilization_percent == 70.0 and samples[2].memory_used_gb == 7.0
    assert procs(samples[3]) == {b.pid: (50.0, 1.0), c.pid: (50.0, 1.0)}
    assert samples[3].utilization_percent == 100.0
    # a new call replaces the process's load on those GPUs; stop_load ends it
    simulate_load(util=0, memory_gb=9, gpus=[2], pid=a.pid)
    assert procs(by_index(telemetry.sample())[2])[a.pid] == (0.0, 9.0)
    assert stop_load(pid=b.pid) == 3
    samples = by_index(telemetry.sample())
    assert procs(samples[2]) == {a.pid: (0.0, 9.0)}
    assert procs(samples[3]) == {c.pid: (80.0, 1.0)}


def test_two_kernels_loading_different_and_the_same_gpus(sim_dir):
    telemetry = SimulatedTelemetry(node="n1", gpus=2)
    first = start_loader(sim_dir, "0", util=90, memory_gb=4, seconds=60)
    second = start_loader(sim_dir, "0,1", util=5, memory_gb=2, seconds=60)
    try:
        wait_ready(first)
        wait_ready(second)
        samples = by_index(telemetry.sample())
        assert procs(samples[0]) == {first.pid: (90.0, 4.0), second.pid: (5.0, 2.0)}
        assert procs(samples[1]) == {second.pid: (5.0, 2.0)}
        assert samples[0].utilization_percent == 95.0
    finally:
        finish(first)
        finish(second)


def test_nodes_sharing_one_host_are_kept_apart(sim_dir, holders):
    holder = holders()
    simulate_load(util=40, gpus=[0], pid=holder.pid, node="n2")
    assert by_index(SimulatedTelemetry(node="n1", gpus=1).sample())[0].processes == []
    assert procs(by_index(SimulatedTelemetry(node="n2", gpus=1).sample())[0]) == {
        holder.pid: (40.0, 4.0)
    }


@pytest.mark.skipif(os.geteuid() != 0, reason="processes of two users need root")
def test_no_user_fakes_a_load_of_another_users_process():
    """In a hub's load folder (sticky, writable by all: its users' kernels write their loads),
    bob's load for alice's process is not believed; alice's own and root's are. Nor can bob
    remove alice's load, or take over a folder made first by someone else."""
    import pwd
    import shutil
    import tempfile

    from hub_harness import _create_demo_users

    from jupyter_gpusched.backends.gpu.simulated_loads import make_load_dir
    from jupyter_gpusched.hub.singleuser_command import singleuser_command

    _create_demo_users()
    alice, bob = pwd.getpwnam("alice"), pwd.getpwnam("bob")
    cmd, env = singleuser_command()  # a Python both can run, with this checkout importable
    python = cmd[0] if len(cmd) == 2 else sys.executable
    public = Path(tempfile.mkdtemp(prefix="gpusched-loads-"))  # not pytest's tmp: 0700 dirs
    public.chmod(0o755)
    started = []
    try:
        loads = make_load_dir(public / "sim-gpus")
        assert loads.stat().st_mode & 0o7777 == 0o1777 and loads.stat().st_uid == 0

        def as_user(account, code, wait=True):
            run = subprocess.run if wait else subprocess.Popen
            ids = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
            return run([python, "-c", code], env={"PATH": os.defpath, **env}, cwd="/", **ids)

        def load(account, gpu, pid):
            code = (
                "from jupyter_gpusched.backends.gpu import simulate_load; "
                f"simulate_load(util=50, memory_gb=1, gpus=[{gpu}], pid={pid}, node='n1', "
                f"state_dir={str(loads)!r})"
            )
            assert as_user(account, code).returncode == 0

        started += [as_user(alice, "import time; time.sleep(60)", wait=False) for _ in "ab"]
        started.append(as_user(bob, "import time; time.sleep(60)", wait=False))
        kernel, other, bobs = started
        deadline = time.monotonic() + 10
        while not all(psutil.Process(p.pid).uids().real != 0 for p in started):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        load(bob, 0, kernel.pid)  # faked: keeps alice's kernel "busy", or gets it killed
        load(alice, 1, kernel.pid)  # her own
        load(bob, 2, bobs.pid)  # his own
        simulate_load(util=50, memory_gb=1, gpus=[3], pid=other.pid, node="n1", state_dir=loads)
        samples = by_index(SimulatedTelemetry(node="n1", gpus=4, state_dir=loads).sample())
        assert samples[0].processes == [] and samples[0].utilization_percent == 0.0
        assert procs(samples[1]) == {kernel.pid: (50.0, 1.0)}
        assert procs(samples[2]) == {bobs.pid: (50.0, 1.0)}
        assert procs(samples[3]) == {other.pid: (50.0, 1.0)}  # root may write anyone's

        code = f"from jupyter_gpusched.backends.gpu import stop_load; stop_load(pid={kernel.pid}, "
        code += f"node='n1', state_dir={str(loads)!r})"
        assert as_user(bob, code).returncode == 0
        assert procs(by_index(SimulatedTelemetry(node="n1", gpus=4, state_dir=loads).sample())[1])

        squatted = public / "squatted"
        squatted.mkdir()
        os.chown(squatted, bob.pw_uid, bob.pw_gid)
        with pytest.raises(RuntimeError, match="is not a directory of this user"):
            make_load_dir(squatted)
    finally:
        for process in started:
            process.kill()
            process.wait()
        shutil.rmtree(public, ignore_errors=True)


def test_cuda_visible_devices_and_arguments(sim_dir, holders, monkeypatch):
    holder = holders()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"{simulated_uuid('n1', 3)},1")
    load = simulate_load(util=10, pid=holder.pid)
    assert load.gpus == [3, 1] and load.node == "n1" and "pid" in repr(load)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(RuntimeError, match="CUDA_VISIBLE_DEVICES is empty"):
        simulate_load(pid=holder.pid)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert simulate_load(pid=holder.pid, seconds=None).gpus == [0]  # unset: GPU 0, like CUDA
    assert simulate_load(pid=holder.pid, gpus="2,x,3").gpus == [2]  # CUDA stops at a bad entry
    for bad in ({"util": 150}, {"memory_gb": -1}, {"seconds": 0}, {"gpus": [-1]}):
        with pytest.raises(ValueError):
            simulate_load(pid=holder.pid, **bad)
    with pytest.raises(psutil.NoSuchProcess):
        simulate_load(pid=2**22 + 12345)


def test_a_reused_pid_does_not_inherit_a_load(sim_dir, holders):
    holder = holders()
    simulate_load(util=50, gpus=[0], pid=holder.pid)
    [path] = sim_dir.glob("load--*")
    record = json.loads(path.read_text())
    record["create_time"] -= 100  # the same PID, but an earlier process's load
    path.write_text(json.dumps(record))
    assert SimulatedTelemetry(node="n1", gpus=1).sample()[0].processes == []
    assert not path.exists()


def test_gpus_from_the_cluster_file(sim_dir):
    telemetry = SimulatedTelemetry(node="dgx02", cluster=str(EXAMPLE_CLUSTER))
    devices = telemetry.devices()
    assert len(devices) == 8 and {d.model for d in devices} == {"A100-80GB"}
    assert devices[1].nvlink_peers == (0, 2, 3) and devices[5].nvlink_peers == (4, 6, 7)
    assert (
        devices[0].uuid
        != SimulatedTelemetry(node="dgx01", cluster=str(EXAMPLE_CLUSTER)).devices()[0].uuid
    )
    l40s = SimulatedTelemetry(node="l40s01", cluster=read_yaml(EXAMPLE_CLUSTER)).devices()
    assert [d.nvlink_peers for d in l40s] == [(), (), (), ()]
    with pytest.raises(ValueError, match="no node named 'nowhere'"):
        SimulatedTelemetry(node="nowhere", cluster=str(EXAMPLE_CLUSTER))


def test_get_telemetry_backends(sim_dir, monkeypatch):
    monkeypatch.setenv("GPUSCHED_GPU_BACKEND", "simulated")
    monkeypatch.setenv("GPUSCHED_SIM_GPUS", "3")
    telemetry = get_telemetry()
    assert telemetry.backend == "simulated" and telemetry.node == "n1"
    assert len(telemetry.devices()) == 3
    with pytest.raises(ValueError, match="unknown GPU backend"):
        get_telemetry("cuda")


# -- NVML adapter: unit tests against a fake pynvml module (no GPU needed) --------------------


class FakeNVML:
    """A stand-in for ``pynvml``: GPUs as dicts; ``error`` values are raised by name."""

    def __init__(self, gpus, init_error=None):
        self.gpus = gpus
        self.init_error = init_error
        self.calls = []
        self.module = self._module()

    def _module(self):
        m = types.ModuleType("pynvml")

        class NVMLError(Exception):
            pass

        m.NVMLError = NVMLError
        for name in (
            "NotSupported",
            "NotFound",
            "NoPermission",
            "LibraryNotFound",
            "InvalidArgument",
            "DriverNotLoaded",
        ):
            setattr(m, f"NVMLError_{name}", type(f"NVMLError_{name}", (NVMLError,), {}))
        m.NVML_NVLINK_MAX_LINKS = 4
        m.NVML_FEATURE_ENABLED = 1
        m.NVML_NVLINK_DEVICE_TYPE_SWITCH = 2

        def value(gpu, key, *args):
            v = gpu[key]
            if isinstance(v, str) and v.startswith("error:"):
                raise getattr(m, f"NVMLError_{v[6:]}")()
            return v(*args) if callable(v) else v

        def init():
            self.calls.append(("init",))
            if self.init_error:
                raise getattr(m, f"NVMLError_{self.init_error}")()

        def handle(i):
            return self.gpus[i]

        def proc_list(key):
            return lambda h: [
                types.SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in value(h, key)
            ]

        def process_utilization(h, since):
            self.calls.append(("util", h["uuid"], since))
            return [
                types.SimpleNamespace(pid=pid, timeStamp=ts, smUtil=sm)
                for pid, ts, sm in value(h, "proc_util")
            ]

        def link_state(h, link):
            links = value(h, "links")
            if link not in links:
                raise m.NVMLError_InvalidArgument()
            return 1

        def remote(h, link):
            return types.SimpleNamespace(busId=value(h, "links")[link].encode())

        def remote_type(h, link):
            return 2 if value(h, "links")[link].startswith("0000:9") else 0

        m.nvmlInit = init
        m.nvmlDeviceGetCount = lambda: len(self.gpus)
        m.nvmlDeviceGetHandleByIndex = handle
        m.nvmlDeviceGetName = lambda h: value(h, "name")
        m.nvmlDeviceGetUUID = lambda h: value(h, "uuid")
        m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
            total=value(h, "total"), used=value(h, "used")
        )
        m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=value(h, "bus").encode())
        m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(
            gpu=value(h, "util"), memory=0
        )
        m.nvmlDeviceGetComputeRunningProcesses = proc_list("compute")
        m.nvmlDeviceGetGraphicsRunningProcesses = proc_list("graphics")
        m.nvmlDeviceGetProcessUtilization = process_utilization
        m.nvmlDeviceGetNvLinkState = link_state
        m.nvmlDeviceGetNvLinkRemotePciInfo = remote
        m.nvmlDeviceGetNvLinkRemoteDeviceType = remote_type
        return m


def fake_gpu(i, **fields):
    gpu = {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": f"GPU-{i}",
        "bus": f"00000000:{0x17 + i:02X}:00.0",
        "total": 80 * GiB,
        "used": 0,
        "util": 0,
        "compute": [],
        "graphics": [],
        "proc_util": "error:NotFound",
        "links": "error:NotSupported",
    }
    gpu.update(fields)
    return gpu


def test_nvml_unit_devices_and_nvlink_peers():
    """Unit test of the NVML adapter (fake pynvml): GPUs 0-1 linked directly (remote bus ids in
    the other domain format), GPUs 2-3 through a shared NVSwitch, GPU 4 without NVLink."""
    gpus = [
        fake_gpu(0, links={0: "0000:18:00.0", 1: "0000:18:00.0"}),
        fake_gpu(1, links={0: "00000000:17:00.0"}),
        fake_gpu(2, links={0: "0000:90:00.0", 1: "0000:91:00.0"}),
        fake_gpu(3, links={0: "0000:91:00.0"}),
        fake_gpu(4, name=b"NVIDIA H100 80GB HBM3"),
    ]
    fake = FakeNVML(gpus)
    telemetry = nvml_backend.NVMLTelemetry(pynvml=fake.module, node="h1")
    devices = telemetry.devices()
    assert [d.nvlink_peers for d in devices] == [(1,), (0,), (3,), (2,), ()]
    assert devices[0].uuid == "GPU-0" and devices[4].model == "NVIDIA H100 80GB HBM3"
    assert devices[0].memory_total_gb == 80.0 and devices[0].pci_bus_id == "00000000:17:00.0"
    assert nvlink_domains(devices) == [[0, 1], [2, 3], [4]]
    entry = node_entry(telemetry, host=False)
    assert entry == {
        "name": "h1",
        "gpus": 5,
        "gpu_model": "H100 80GB HBM3",
        "gpu_memory_gb": 80.0,
        "nvlink": [[0, 1], [2, 3]],
    }
    node = Cluster.from_dict({"nodes": [entry]}).nodes[0]
    assert node.domains == (0b00011, 0b01100, 0b10000)
    NVMLTelemetry = nvml_backend.NVMLTelemetry
    NVMLTelemetry(pynvml=fake.module)
    assert fake.calls.count(("init",)) == 1  # nvmlInit once per process


def test_nvml_unit_per_process_utilization_and_memory():
    """Unit test of the NVML adapter (fake pynvml): per-process SM utilization averaged over the
    samples since the last call, the last-seen timestamp passed back, compute and graphics lists
    merged, processes without a sample idle."""
    samples = [(100, 1000, 80), (100, 2000, 90), (200, 1500, 3)]
    gpu = fake_gpu(
        0,
        util=88,
        used=10 * GiB,
        compute=[(100, 6 * GiB), (200, 2 * GiB), (300, 1 * GiB)],
        graphics=[(100, 6 * GiB), (400, None)],
        proc_util=lambda: samples,
    )
    fake = FakeNVML([gpu])
    telemetry = nvml_backend.NVMLTelemetry(pynvml=fake.module)
    [sample] = telemetry.sample()
    assert sample.utilization_percent == 88.0 and sample.memory_used_gb == 10.0
    assert procs(sample) == {100: (85.0, 6.0), 200: (3.0, 2.0), 300: (0.0, 1.0), 400: (0.0, None)}
    assert sample.notes == () and sample.processes_known
    samples[:] = [(100, 2500, 70)]
    [sample] = telemetry.sample()
    assert procs(sample)[100] == (70.0, 6.0) and procs(sample)[200] == (0.0, 2.0)
    assert [call[2] for call in fake.calls if call[0] == "util"] == [0, 2000]


@pytest.mark.parametrize("error", ["NotSupported", "NotFound", "NoPermission"])
def test_nvml_unit_per_process_utilization_unknown_is_none(error):
    """Unit test of the NVML adapter (fake pynvml): a driver that cannot give per-process
    utilization -> None (not 0) on a busy GPU; on an idle GPU every process is at 0."""
    busy = fake_gpu(0, util=75, compute=[(10, GiB)], proc_util=f"error:{error}")
    idle = fake_gpu(1, util=0, compute=[(11, GiB)], proc_util=f"error:{error}")
    telemetry = nvml_backend.NVMLTelemetry(pynvml=FakeNVML([busy, idle]).module)
    samples = telemetry.sample()
    assert procs(samples[0]) == {10: (None, 1.0)}
    assert procs(samples[1]) == {11: (0.0, 1.0)}


def test_nvml_unit_missing_permissions():
    """Unit test of the NVML adapter (fake pynvml): no permission for the process list or the
    device's utilization -> a note and None, not a crash and not a false 'idle'."""
    gpu = fake_gpu(0, util="error:NotSupported", compute="error:NoPermission")
    gpu["graphics"] = "error:NotSupported"
    [sample] = nvml_backend.NVMLTelemetry(pynvml=FakeNVML([gpu]).module).sample()
    assert sample.processes == [] and not sample.processes_known
    assert sample.utilization_percent is None
    assert any("NoPermission" in note or "processes" in note for note in sample.notes)


def test_nvml_unit_library_not_found_is_an_error_never_simulated_gpus(sim_dir, monkeypatch):
    """Unit test of the NVML adapter (fake pynvml): NVMLError_LibraryNotFound, or no
    nvidia-ml-py, is an error for 'nvml', for 'auto' and for the default (no
    $GPUSCHED_GPU_BACKEND, the production case), naming what is missing and the setting that
    chooses the simulated GPUs instead: never 8 idle simulated GPUs in place of real ones."""
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML([], init_error="LibraryNotFound").module)
    for backend in ("nvml", "auto", None):
        with pytest.raises(TelemetryUnavailable, match="libnvidia-ml") as info:
            get_telemetry(backend)
        assert "GPUSCHED_GPU_BACKEND=simulated" in str(info.value)
        assert "gpu_backend" in str(info.value)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    for backend in ("nvml", "auto", None):
        with pytest.raises(TelemetryUnavailable, match="nvidia-ml-py") as info:
            get_telemetry(backend)
        assert "GPUSCHED_GPU_BACKEND=simulated" in str(info.value)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML([]).module)
    with pytest.raises(TelemetryUnavailable, match="no usable GPU"):
        get_telemetry("auto")
    # chosen explicitly, the simulated GPUs, whose samples say so
    monkeypatch.setenv("GPUSCHED_GPU_BACKEND", "simulated")
    telemetry = get_telemetry(gpus=2)
    assert telemetry.backend == "simulated"
    assert {sample.backend for sample in telemetry.sample()} == {"simulated"}
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML([fake_gpu(0)]).module)
    telemetry = get_telemetry("auto")
    assert telemetry.backend == "nvml"
    assert [sample.backend for sample in telemetry.sample()] == ["nvml"]


def test_this_machine_without_nvml_has_no_telemetry_by_default(sim_dir):
    """This machine as it is (the real pynvml; no libnvidia-ml where there is no NVIDIA
    driver): with $GPUSCHED_GPU_BACKEND unset, NVML or a clear error, never simulated GPUs."""
    try:
        telemetry = get_telemetry()
    except TelemetryUnavailable as exc:
        assert "GPUSCHED_GPU_BACKEND=simulated" in str(exc)
        assert str(exc).startswith("no GPU telemetry: ")  # then NVML's reason
    else:  # a machine with an NVIDIA GPU
        assert telemetry.backend == "nvml"


# -- discover ---------------------------------------------------------------------------------


def device(index, peers=(), model="A100", memory=80.0):
    return Device(index, f"GPU-{index}", model, memory, tuple(peers), "")


class StaticTelemetry(SimulatedTelemetry):
    def __init__(self, devices, node="h1"):
        self._devices = devices
        self.node = node


def test_nvlink_domains_from_peers():
    # one-sided and chained peers still join one domain
    devices = [device(0, [1]), device(1), device(2, [1]), device(3), device(4, [5]), device(5)]
    assert nvlink_domains(devices) == [[0, 1, 2], [3], [4, 5]]
    assert nvlink_spec(devices) == [[0, 1, 2], [4, 5]]
    assert nvlink_spec([device(0), device(1)]) == "none"
    assert nvlink_spec([device(0, [1]), device(1, [0])]) == "all"
    assert nvlink_spec([device(0)]) == "none"
    assert nvlink_domains([device(0, [7])]) == [[0]]  # a peer this process cannot see


def test_node_entry_is_what_the_cluster_file_takes():
    telemetry = StaticTelemetry([device(i, [j for j in range(4) if j != i]) for i in range(4)])
    entry = node_entry(telemetry)
    assert entry["name"] == "h1" and entry["gpus"] == 4 and entry["nvlink"] == "all"
    assert entry["cpus"] >= 1 and entry["memory_gb"] > 0
    assert Cluster.from_dict({"nodes": [entry]}).nodes[0].domains == (0b1111,)
    with pytest.raises(ValueError, match="different models"):
        node_entry(StaticTelemetry([device(0), device(1, model="V100")]))
    with pytest.raises(ValueError, match="gaps"):
        node_entry(StaticTelemetry([device(0), device(2)]))


def test_discovered_simulated_node_matches_the_cluster_file(sim_dir):
    original = Cluster.from_dict(read_yaml(EXAMPLE_CLUSTER)).node("dgx01")
    telemetry = SimulatedTelemetry(node="dgx01", cluster=str(EXAMPLE_CLUSTER))
    entry = node_entry(telemetry, host=False)
    assert entry["nvlink"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    rebuilt = Cluster.from_dict({"nodes": [entry]}).nodes[0]
    assert (rebuilt.gpus, rebuilt.gpu_model, rebuilt.gpu_memory_gb, rebuilt.domains) == (
        original.gpus,
        original.gpu_model,
        original.gpu_memory_gb,
        original.domains,
    )


def test_expand_discover_in_a_cluster_file(tmp_path, sim_dir, monkeypatch):
    telemetry = StaticTelemetry([device(0, [1]), device(1, [0])], node="here")
    path = tmp_path / "cluster.yaml"
    path.write_text("nodes: discover\n")
    data = read_yaml(path)
    cluster = Cluster.from_dict(expand_discover(data, telemetry), source=str(path))
    assert [(n.name, n.gpus, n.domains) for n in cluster.nodes] == [("here", 2, (0b11,))]
    assert data["nodes"] == "discover"  # the input is left as it was

    path.write_text(
        "nodes:\n"
        "  - {discover: true, leaf: leaf-2, labels: {zone: a}, state: drain}\n"
        "  - {name: other, gpus: 4}\n"
    )
    cluster = Cluster.from_dict(expand_discover(read_yaml(path), telemetry), source=str(path))
    here = cluster.node("here")
    assert (here.leaf, here.labels, here.state, here.gpus) == ("leaf-2", {"zone": "a"}, "drain", 2)
    assert cluster.node("other").gpus == 4

    # no NVML here: a clear error naming the file (no silent simulated GPUs in a real cluster)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML([], init_error="LibraryNotFound").module)
    with pytest.raises(ConfigError, match=r"discover.*libnvidia-ml") as info:
        expand_discover(read_yaml(path), source=str(path))
    assert info.value.source == str(path)
    monkeypatch.setenv("GPUSCHED_GPU_BACKEND", "simulated")  # the demo's choice
    assert expand_discover({"nodes": "discover"})["nodes"][0]["name"] == "n1"


# -- rogue processes --------------------------------------------------------------------------


def test_rogue_processes():
    dev = [device(i) for i in range(4)]

    def sample(index, *pids):
        return DeviceSample(dev[index], 50.0, 1.0, [GPUProcess(p, index, 25.0, 0.5) for p in pids])

    samples = [sample(0, 10, 20), sample(1, 10), sample(2, 10, 30, 40), sample(3, 50)]
    jobs = {10: "job-a", 20: None, 30: "job-gone", 40: "job-b", 50: "denied"}

    def pid_to_job(pid):
        if jobs[pid] == "denied":
            raise psutil.AccessDenied(pid)
        return jobs[pid]

    rogues = rogue_processes(samples, {"job-a": {0, 1}, "job-b": [2, 3]}, pid_to_job)
    found = [(r.pid, r.device_index, r.job_id, r.reason) for r in rogues]
    assert found == [
        (20, 0, None, ROGUE_NO_JOB),  # started outside the scheduler
        (10, 2, "job-a", ROGUE_OUTSIDE_ALLOCATION),  # escaped CUDA_VISIBLE_DEVICES
        (30, 2, "job-gone", ROGUE_NO_JOB),  # its job holds nothing here
    ]
    assert rogues[1].allowed == (0, 1) and "was given GPUs [0, 1]" in rogues[1].describe()
    assert "no job" in rogues[0].describe() and "holds no GPU" in rogues[2].describe()


def test_rogue_processes_end_to_end_with_the_simulated_backend(sim_dir, holders):
    """A job's process escaping its CUDA_VISIBLE_DEVICES, found through its environment."""
    script = "import os, subprocess; subprocess.run(['sleep', '30'], env={'PATH': os.defpath})"
    job = subprocess.Popen(
        [sys.executable, "-c", script], env=dict(os.environ, GPUSCHED_JOB_ID="j-7")
    )
    stranger = holders()
    try:
        child = None
        for _ in range(100):
            kids = psutil.Process(job.pid).children()
            if kids:
                child = kids[0].pid
                break
            time.sleep(0.05)
        assert child is not None
        assert job_of_process(child) == "j-7"  # from its parent: its own environment is empty
        simulate_load(util=90, gpus=[1], pid=child)  # allocated GPU 1
        simulate_load(util=90, gpus=[3], pid=child)  # escaped to GPU 3
        simulate_load(util=10, gpus=[0], pid=stranger.pid)
        samples = SimulatedTelemetry(node="n1", gpus=4).sample()

        def lookup(pid):
            return "j-7" if pid in (job.pid, child) else None

        rogues = rogue_processes(samples, {"j-7": {1}}, lookup)
        assert [(r.pid, r.device_index, r.reason) for r in rogues] == [
            (stranger.pid, 0, ROGUE_NO_JOB),
            (child, 3, ROGUE_OUTSIDE_ALLOCATION),
        ]
    finally:
        for p in psutil.Process(job.pid).children(recursive=True):
            p.kill()
        job.kill()
        job.wait()
