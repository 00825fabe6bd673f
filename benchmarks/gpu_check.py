"""Real-GPU check of the telemetry: is a kernel's GPU use attributed to that kernel?

Starts two real Jupyter kernels (jupyter_client, ipykernel) on one GPU: one runs a CUDA matmul
loop (PyTorch), the other imports torch, puts a small tensor on the GPU (so it holds a CUDA context
and appears in NVML's process list) and then idles. Samples the NVML backend every INTERVAL
seconds and sums the per-process utilization of each kernel's process tree (psutil), as the
monitor does. Passes when the busy kernel averages > 50% and the idle one stays at 0%.

Prints what it saw as JSON; exits 0 (pass) or 1. Run it through ``benchmarks/gpu_check.sh``,
which checks the machine first. ``--backend simulated`` runs the same plumbing with
``simulate_load`` instead of CUDA, on a machine without GPU (a dry run of this script, not a
check of anything real).

The reaper half of the check (only the idle kernel is culled) comes with the reaper: the output
says TODO there, it does not pretend.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DEADLINE_S = 270  # the whole check, kernels' start and stop included; the .sh allows 290

BUSY_CUDA = """
import time, torch
a = torch.randn(8192, 8192, device="cuda")
b = torch.randn(8192, 8192, device="cuda")
torch.cuda.synchronize()
print("busy-ready", flush=True)
start = time.time()
while time.time() - start < {seconds}:
    for _ in range(8):
        c = a @ b
    torch.cuda.synchronize()
"""
IDLE_CUDA = """
import torch
x = torch.ones(1024, 1024, device="cuda")
torch.cuda.synchronize()
print("idle-ready", flush=True)
"""
BUSY_SIMULATED = """
from jupyter_gpusched.gpu import simulate_load
simulate_load(util=95, memory_gb=2, seconds={seconds})
print("busy-ready", flush=True)
"""
IDLE_SIMULATED = """
from jupyter_gpusched.gpu import simulate_load
simulate_load(util=0, memory_gb=1, seconds=None)
print("idle-ready", flush=True)
"""


def kernel_tree(pid: int) -> set[int]:
    import psutil

    try:
        process = psutil.Process(pid)
        return {pid} | {child.pid for child in process.children(recursive=True)}
    except psutil.Error:
        return {pid}


def kernel_pid(manager) -> int:
    provisioner = manager.provisioner
    pid = getattr(provisioner, "pid", None)
    if pid is None and getattr(provisioner, "process", None) is not None:
        pid = provisioner.process.pid
    if pid is None:
        raise RuntimeError("cannot find the kernel's process id (not a local kernel?)")
    return int(pid)


def wait_for_output(client, text: str, timeout: float) -> None:
    """Read the kernel's iopub until ``text`` is printed; an error in the cell fails."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            message = client.get_iopub_msg(timeout=max(0.1, end - time.monotonic()))
        except queue.Empty:
            break
        kind, content = message["msg_type"], message["content"]
        if kind == "stream" and text in content.get("text", ""):
            return
        if kind == "error":
            trace = "\n".join(content.get("traceback", []))[-2000:]
            raise RuntimeError(f"the kernel cell failed: {content.get('ename')}: {trace}")
    raise TimeoutError(f"the kernel did not print {text!r} within {timeout:.0f} s")


def start_kernel(env: dict):
    from jupyter_client import KernelManager

    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(env=env)
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=60)
    return manager, client


def run(args) -> dict:
    from jupyter_gpusched.gpu import get_telemetry

    started = time.monotonic()
    result: dict = {
        "check": "gpu telemetry attribution",
        "backend": args.backend,
        "gpu": args.gpu,
        "busy_seconds": args.busy_seconds,
        "sample_seconds": args.sample_seconds,
        "interval_s": args.interval,
    }
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # CUDA's indices = NVML's
    env["CUDA_VISIBLE_DEVICES"] = str(args.gpu)
    simulated = args.backend == "simulated"
    if simulated:
        directory = tempfile.mkdtemp(prefix="gpu_check-sim-")
        env["GPUSCHED_SIM_GPU_DIR"] = os.environ["GPUSCHED_SIM_GPU_DIR"] = directory
        env["GPUSCHED_NODE"] = os.environ["GPUSCHED_NODE"] = "gpu-check"
    telemetry = get_telemetry(args.backend, **({"gpus": args.gpu + 1} if simulated else {}))
    devices = telemetry.devices()
    result["devices"] = [
        {"index": d.index, "model": d.model, "memory_total_gb": round(d.memory_total_gb, 1)}
        for d in devices
    ]
    if args.gpu not in {d.index for d in devices}:
        raise RuntimeError(f"GPU {args.gpu} not found; NVML sees {[d.index for d in devices]}")

    kernels = {}
    try:
        for name in ("busy", "idle"):
            kernels[name] = start_kernel(env)
        pids = {name: kernel_pid(manager) for name, (manager, _) in kernels.items()}
        result["kernel_pids"] = pids
        idle_client, busy_client = kernels["idle"][1], kernels["busy"][1]
        idle_client.execute(IDLE_SIMULATED if simulated else IDLE_CUDA)
        wait_for_output(idle_client, "idle-ready", 120)
        busy_code = BUSY_SIMULATED if simulated else BUSY_CUDA
        busy_client.execute(busy_code.format(seconds=args.busy_seconds))
        wait_for_output(busy_client, "busy-ready", 120)
        result["kernels_ready_s"] = round(time.monotonic() - started, 1)

        time.sleep(args.warmup)
        telemetry.sample()  # per-process utilization is "since the previous sample"
        rows = []
        end = time.monotonic() + args.sample_seconds
        while time.monotonic() < end:
            time.sleep(args.interval)
            rows.append(sample_kernels(telemetry, args.gpu, pids))
        result["samples"] = rows
    finally:
        for manager, client in kernels.values():
            try:
                client.stop_channels()
                manager.shutdown_kernel(now=True)
            except Exception as exc:  # report it, and stop the other kernel too
                result.setdefault("shutdown_errors", []).append(repr(exc))
    result.update(verdict(rows, args))
    result["reaper"] = {
        "status": "TODO",
        "note": "not checked yet: the reaper (cull only the GPU-idle kernel) comes with the "
        "reaper part of issue 6; no result is claimed here",
    }
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    if simulated:
        shutil.rmtree(directory, ignore_errors=True)
    return result


def sample_kernels(telemetry, gpu: int, pids: dict[str, int]) -> dict:
    samples = telemetry.sample()
    row: dict = {"t": round(time.time(), 2)}
    device = next(s for s in samples if s.device.index == gpu)
    row["device_util"] = device.utilization_percent
    row["device_memory_gb"] = (
        round(device.memory_used_gb, 2) if device.memory_used_gb is not None else None
    )
    row["processes"] = [
        {"pid": p.pid, "util": p.utilization_percent, "memory_gb": p.memory_used_gb}
        for p in device.processes
    ]
    if device.notes:
        row["notes"] = list(device.notes)
    for name, pid in pids.items():
        tree = kernel_tree(pid)
        mine = [p for s in samples for p in s.processes if p.pid in tree]
        utils = [p.utilization_percent for p in mine]
        row[name] = {
            "listed": bool(mine),
            "util": None if any(u is None for u in utils) else sum(utils, 0.0),
            "memory_gb": round(sum(p.memory_used_gb or 0.0 for p in mine), 2),
        }
    return row


def verdict(rows: list[dict], args) -> dict:
    failures = []
    summary = {}
    for name in ("busy", "idle"):
        seen = [row[name] for row in rows]
        utils = [s["util"] for s in seen if s["util"] is not None]
        summary[name] = {
            "listed_in": f"{sum(s['listed'] for s in seen)}/{len(seen)} samples",
            "util_mean": round(statistics.fmean(utils), 1) if utils else None,
            "util_max": max(utils) if utils else None,
            "util_unknown_samples": sum(s["util"] is None for s in seen),
        }
        if not any(s["listed"] for s in seen):
            failures.append(
                f"the {name} kernel's processes never appeared in NVML's process list "
                "(a PID namespace, e.g. a container without --pid=host?)"
            )
    busy, idle = summary["busy"], summary["idle"]
    if busy["util_mean"] is None:
        failures.append("no per-process utilization for the busy kernel (NotSupported?)")
    elif busy["util_mean"] <= 50:
        failures.append(f"busy kernel averaged {busy['util_mean']}% (want > 50%)")
    if idle["util_max"] is None:
        failures.append("no per-process utilization for the idle kernel")
    elif idle["util_max"] != 0:
        failures.append(f"idle kernel reached {idle['util_max']}% (want 0%)")
    return {"summary": summary, "ok": not failures, "failures": failures}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", type=int, default=0, help="GPU index (NVML/PCI order)")
    parser.add_argument("--backend", choices=("nvml", "simulated"), default="nvml")
    parser.add_argument("--busy-seconds", type=float, default=90)
    parser.add_argument("--sample-seconds", type=float, default=20)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    args = parser.parse_args(argv)
    if args.warmup + args.sample_seconds + 5 > args.busy_seconds:
        parser.error("--busy-seconds must cover the warm-up and the sampling, plus 5 s")
    if args.busy_seconds > DEADLINE_S - 60:
        parser.error(f"--busy-seconds at most {DEADLINE_S - 60} (the check's 5 minute budget)")
    try:
        result = run(args)
    except Exception as exc:  # every failure is reported as JSON
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "backend": args.backend}
    print(json.dumps(result, indent=2))
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
