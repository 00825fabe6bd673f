"""Monitor overhead: CPU time of the notebook server's GPU monitor (serverext/monitor.py) per
sample with 10 kernels on the simulated backend, as a percentage of one core at 1 s sampling.

    python benchmarks/bench_monitor.py [--kernels 10] [--samples 200] [--interval 1]

The kernels are real processes (children of this one, each with a simulated load on one GPU),
known to the monitor by PID as a kernel manager reports them. Prints JSON; the target is <= 1%
of one core.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from jupyter_gpusched.backends.gpu import SimulatedTelemetry, simulate_load
from jupyter_gpusched.notebook.serverext.monitor import GPUMonitor

SLEEPER = "import time; time.sleep(3600)"


class _Provisioner:
    def __init__(self, pid):
        self.pid = pid


class _Kernel:
    def __init__(self, pid):
        self.provisioner = _Provisioner(pid)
        self.last_activity = None


class _KernelManager:
    def __init__(self, pids):
        self.kernels = {f"kernel-{i}": _Kernel(pid) for i, pid in enumerate(pids)}

    def list_kernel_ids(self):
        return list(self.kernels)

    def get_kernel(self, kernel_id):
        return self.kernels[kernel_id]


class _App:
    def __init__(self, pids):
        self.kernel_manager = _KernelManager(pids)
        self.web_app = type("W", (), {"settings": {}})()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=10)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()
    state = tempfile.mkdtemp(prefix="bench-monitor-")
    node = "bench-node"
    kernels = []
    try:
        for i in range(args.kernels):
            kernel = subprocess.Popen([sys.executable, "-c", SLEEPER])
            kernels.append(kernel)
            simulate_load(50, 2, 3600, gpus=[i % 8], node=node, pid=kernel.pid, state_dir=state)
        telemetry = SimulatedTelemetry(node=node, gpus=8, state_dir=state)
        monitor = GPUMonitor(
            serverapp=_App([k.pid for k in kernels]), telemetry=telemetry, interval=args.interval
        )
        monitor.sample()  # warm the parent cache
        process_start = time.process_time()
        wall_start = time.perf_counter()
        for _ in range(args.samples):
            snapshot = monitor.sample()
        cpu = time.process_time() - process_start
        wall = time.perf_counter() - wall_start
        attributed = sum(1 for k in snapshot["kernels"].values() if k["utilization"] > 0)
        per_sample = cpu / args.samples
        result = {
            "benchmark": "monitor_overhead",
            "backend": "simulated",
            "kernels": args.kernels,
            "samples": args.samples,
            "interval_s": args.interval,
            "cpu_ms_per_sample": round(per_sample * 1000, 3),
            "wall_ms_per_sample": round(wall / args.samples * 1000, 3),
            "cpu_percent_of_one_core": round(100 * per_sample / args.interval, 3),
            "target_percent": 1.0,
            "ok": 100 * per_sample / args.interval <= 1.0 and attributed == args.kernels,
            "kernels_attributed": attributed,
            "pid": os.getpid(),
        }
        print(json.dumps(result, indent=2))
        return 0 if result["ok"] else 1
    finally:
        for process in kernels:
            process.kill()
            process.wait()


if __name__ == "__main__":
    sys.exit(main())
