"""Real-GPU check of the telemetry and the idle reaper: is a kernel's GPU use attributed to that
kernel, and does the reaper cull only the idle one?

Starts two real Jupyter kernels (jupyter_client, ipykernel) on one GPU: one runs a CUDA matmul
loop (PyTorch), the other imports torch, puts a small tensor on the GPU (so it holds a CUDA context
and appears in NVML's process list) and then idles. Samples the NVML backend every INTERVAL
seconds.

* Attribution: sums the per-process utilization of each kernel's process tree (psutil). Passes
  when the busy kernel averages > 50% and the idle one stays at 0%.
* Reaper: the same samples go through the notebook server's own monitor
  (``serverext/monitor.py``'s ``GPUMonitor``, which maps GPU processes to kernels) and each kernel
  is treated as its own session of the reaper (``service/reaper.py``: ``Session``, ``busy``,
  ``decide``, settings checked by ``validate``) with a short timeout (``--reaper-timeout`` 20 s,
  ``--warning-lead`` 10 s), one decision per sample as the service's poll would. Passes when the
  idle kernel's session gets a Warn and then a Cull, the busy one neither; the culled kernel is
  then shut down (a polite shutdown request, as jupyter-server does when the hub stops a server)
  and must leave the GPU's process list, while the busy kernel must still run and stay busy.
  Each kernel's report to the reaper holds only that kernel's utilization, not the device's: both
  kernels share one GPU here, whose utilization is the busy kernel's. (The service decides per
  notebook server, whose GPUs are its own.)
* Node agent (``gpu_check_agent.py``): ``jupyter-gpusched node-agent --backend nvml`` on a free
  port, scraped at each step of the attribution half; its ``DCGM_FI_DEV_GPU_UTIL`` and
  ``DCGM_FI_DEV_FB_USED`` of the GPU must match this script's own NVML reads (means within 15
  points, memory within 256 MiB), with DCGM exporter's labels, and it must stop on SIGTERM.
* Backend: the default backend (``auto``) must be NVML on this machine (no fallback to simulated
  GPUs), every sample and the monitor's snapshots must name the backend used, and each report is
  checked by the reaper's own rule (``untrusted_reason``) as a real cluster's service applies it
  (with ``--simulated``: as the simulated cluster's service does): a report it would not act on
  is a failure.

Prints what it saw as JSON; exits 0 (pass) or 1. Run it through ``benchmarks/gpu_check.sh``,
which checks the machine first. ``--simulated`` (or ``--backend simulated``) runs the same
plumbing with the simulated backend and ``simulate_load`` instead of CUDA, on a machine without
GPU (a dry run of this script, not a check of anything real).
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
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpu_check_agent import AgentCheck  # noqa: E402 (after the path)

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
from jupyter_gpusched.backends.gpu import simulate_load
simulate_load(util=95, memory_gb=2, seconds={seconds})
print("busy-ready", flush=True)
"""
IDLE_SIMULATED = """
from jupyter_gpusched.backends.gpu import simulate_load
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
    from jupyter_gpusched.backends.gpu import get_telemetry

    started = time.monotonic()
    result: dict = {
        "check": "gpu telemetry attribution and idle reaper",
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
    directory = None
    if simulated:
        directory = tempfile.mkdtemp(prefix="gpu_check-sim-")
        env["GPUSCHED_SIM_GPU_DIR"] = os.environ["GPUSCHED_SIM_GPU_DIR"] = directory
        env["GPUSCHED_NODE"] = os.environ["GPUSCHED_NODE"] = "gpu-check"
        env["GPUSCHED_GPU_BACKEND"] = os.environ["GPUSCHED_GPU_BACKEND"] = "simulated"
    telemetry = get_telemetry(args.backend, **({"gpus": args.gpu + 1} if simulated else {}))
    backend_failures = []
    if not simulated:  # what the monitor and the service get by default: NVML, never simulated
        default = get_telemetry("auto")
        result["auto_backend"] = default.backend
        if default.backend != "nvml":
            backend_failures.append(f"get_telemetry('auto') gave {default.backend!r}, not nvml")
    made_by = {sample.backend for sample in telemetry.sample()}
    result["sample_backends"] = sorted(made_by)
    if made_by != {args.backend}:
        backend_failures.append(f"samples name {sorted(made_by)}, not {args.backend!r}")
    devices = telemetry.devices()
    result["devices"] = [
        {"index": d.index, "model": d.model, "memory_total_gb": round(d.memory_total_gb, 1)}
        for d in devices
    ]
    if args.gpu not in {d.index for d in devices}:
        raise RuntimeError(f"GPU {args.gpu} not found; NVML sees {[d.index for d in devices]}")

    kernels = {}
    rows: list[dict] = []
    reaper = agent = None
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

        # the node agent on the same GPUs, compared with this script's reads (gpu_check_agent.py)
        agent_env = dict(env, GPUSCHED_SIM_GPUS=str(args.gpu + 1)) if simulated else env
        agent = AgentCheck(args.backend, args.gpu, agent_env, "gpu-check" if simulated else None)
        time.sleep(args.warmup)
        telemetry.sample()  # per-process utilization is "since the previous sample"
        reaper = ReaperCheck(args, kernels, telemetry.backend)
        began = time.monotonic()
        while True:
            time.sleep(args.interval)
            samples = telemetry.sample()  # one NVML read per interval, for both halves
            now = time.time()
            elapsed = time.monotonic() - began
            row = sample_kernels(samples, args.gpu, pids)
            if elapsed <= args.sample_seconds + args.interval / 2 and reaper.culled_at is None:
                rows.append(row)  # the attribution half: both kernels still there
                agent.step(samples)  # the busy kernel's load runs: the agent must see it
            reaper.step(samples, row, now)
            if reaper.done(now) and elapsed >= args.sample_seconds:
                break
        result["samples"] = rows
    finally:
        agent_exit = agent.stop() if agent is not None else None
        for name, (manager, client) in kernels.items():
            if reaper is not None and name in reaper.shut_down:
                continue
            try:
                client.stop_channels()
                manager.shutdown_kernel(now=True)
            except Exception as exc:  # report it, and stop the other kernel too
                result.setdefault("shutdown_errors", []).append(repr(exc))
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
    attribution = verdict(rows, args)
    result["summary"] = attribution["summary"]
    result["attribution"] = {"ok": attribution["ok"], "failures": attribution["failures"]}
    result["reaper"] = reaper.verdict()
    result["node_agent"] = agent.verdict(agent_exit)
    result["ok"] = (
        attribution["ok"]
        and result["reaper"]["ok"]
        and result["node_agent"]["ok"]
        and not backend_failures
    )
    result["failures"] = (
        attribution["failures"]
        + [f"reaper: {f}" for f in result["reaper"]["failures"]]
        + [f"node agent: {f}" for f in result["node_agent"]["failures"]]
        + [f"backend: {f}" for f in backend_failures]
    )
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    return result


class _Replay:
    """A telemetry that hands the monitor the samples this script already took (NVML's
    per-process utilization is "since the previous read": one read per interval, shared)."""

    def __init__(self, backend: str):
        self.samples: list = []
        self.backend = backend  # the monitor names it in its snapshots and reports

    def sample(self):
        return self.samples


class _KernelManager:
    """What ``GPUMonitor`` reads of a jupyter-server's kernel manager: the kernel ids, and each
    kernel's provisioner (its pid)."""

    def __init__(self, kernels: dict):
        self.managers = {name: manager for name, (manager, _) in kernels.items()}

    def list_kernel_ids(self):
        return list(self.managers)

    def get_kernel(self, kernel_id):
        return self.managers[kernel_id]


class ReaperCheck:
    """Each kernel as its own reaper session, decided on at each sample."""

    def __init__(self, args, kernels: dict, backend: str):
        from jupyter_gpusched.notebook.serverext.monitor import GPUMonitor
        from jupyter_gpusched.service.reaper import Session, trusted_backends, validate

        self.args = args
        self.kernels = kernels
        self.settings = validate(
            {"timeout_tier_2": args.reaper_timeout, "warning_lead": args.warning_lead}
        )
        self.replay = _Replay(backend)
        # a real cluster's service ("auto"); the simulated cluster's for the dry run
        self.trusted = trusted_backends("simulated" if backend == "simulated" else "auto")
        self.ignored: list[str] = []  # why reports were not acted on (must stay empty)
        self.kernel_manager = _KernelManager(kernels)
        self.monitor = GPUMonitor(
            serverapp=types.SimpleNamespace(kernel_manager=self.kernel_manager),
            telemetry=self.replay,
            interval=args.interval,
            report=False,
            mark_active=False,
        )
        self.t0 = time.time()
        self.sessions = {
            name: Session(
                job_id=f"kernel-{name}", user="gpu-check", gpus=1, tier=2, started=self.t0
            )
            for name in kernels
        }
        self.actions: dict[str, list[dict]] = {name: [] for name in kernels}
        self.timeline: list[dict] = []
        self.culled: set[str] = set()
        self.culled_at: float | None = None
        self.shut_down: dict[str, dict] = {}
        self.after: list[dict] = []  # samples after the cull
        self.deadline = self.t0 + args.reaper_timeout + max(5.0, 3 * args.interval)

    def rel(self, t: float) -> float:
        return round(t - self.t0, 2)

    def step(self, samples, row: dict, now: float) -> None:
        from jupyter_gpusched.core.reaper import Cull, Warn, decide, untrusted_reason
        from jupyter_gpusched.service.gpu_sampling import GPUReading
        from jupyter_gpusched.service.reaper_measure import take_readings

        self.replay.samples = samples
        snapshot = self.monitor.sample(now)  # the monitor's own process-to-kernel mapping
        entry: dict = {"t": self.rel(now)}
        for name, session in self.sessions.items():
            if name in self.culled:
                continue
            kernel = snapshot["kernels"].get(name) or {}
            # the report a server with only this kernel would send (Reaper.report's rules)
            report = {
                "job_id": session.job_id,
                "server": {
                    "utilization": kernel.get("utilization"),
                    "memory_gb": kernel.get("memory_gb"),
                },
                "kernels": {name: kernel},
                "devices": [],
                "backend": snapshot["backend"],
            }
            why = untrusted_reason(report, self.trusted)
            if why is not None:  # as Reaper.report: not a measurement, not acted on
                self.ignored.append(why)
                continue
            # the kernel's GPU as the service's sampler would read it (reaper_measure.py)
            reading = GPUReading(
                "local",
                0,
                kernel.get("utilization"),
                kernel.get("memory_gb"),
                snapshot["backend"],
                now,
            )
            threshold = self.settings["idle_threshold"]
            take_readings(session, [reading], 1, threshold, snapshot["backend"])
            entry[name] = {
                "util": kernel.get("utilization"),
                "idle_s": round(now - session.idle_since, 1),
            }
        candidates = [s for n, s in self.sessions.items() if n not in self.culled]
        for action in decide(candidates, self.settings, now):
            name = action.job_id.removeprefix("kernel-")
            session = self.sessions[name]
            if isinstance(action, Warn):
                session.warned = now  # as Reaper._warn
                record = {
                    "action": "warn",
                    "t": self.rel(now),
                    "deadline": self.rel(action.deadline),
                }
            else:
                assert isinstance(action, Cull)
                record = {"action": "cull", "t": self.rel(now), "reason": action.reason}
                self.culled.add(name)
                self.culled_at = now
            record["idle_s"] = round(now - action.idle_since, 1)
            self.actions[name].append(record)
            entry.setdefault("actions", []).append({"kernel": name, **record})
        for name in sorted(self.culled - set(self.shut_down)):
            self.shut_down[name] = self.shutdown(name)
        if self.culled_at is not None and now > self.culled_at:
            alive = {n: manager.is_alive() for n, (manager, _) in self.kernels.items()}
            self.after.append(
                {"t": self.rel(now), **{n: {**row[n], "alive": alive[n]} for n in self.kernels}}
            )
        self.timeline.append(entry)

    def shutdown(self, name: str) -> dict:
        """Shut the culled kernel down politely (a shutdown request, then a kill after the
        manager's wait), as jupyter-server does for each kernel when the hub stops the server."""
        manager, client = self.kernels[name]
        began = time.monotonic()
        info: dict = {}
        try:
            client.stop_channels()
            manager.shutdown_kernel(now=False)
        except Exception as exc:
            info["error"] = repr(exc)
        info["shutdown_s"] = round(time.monotonic() - began, 2)
        info["alive_after"] = manager.is_alive()
        del self.kernel_manager.managers[name]  # jupyter-server forgets it too
        return info

    def done(self, now: float) -> bool:
        if self.culled_at is not None:
            return now >= self.culled_at + self.args.after_cull
        return now >= self.deadline

    def verdict(self) -> dict:
        failures = []
        idle, busy_ = self.actions.get("idle", []), self.actions.get("busy", [])
        kinds = [a["action"] for a in idle]
        if "warn" not in kinds:
            failures.append("the idle kernel's session was never warned")
        if "cull" not in kinds:
            failures.append(
                f"the idle kernel was not culled within {self.deadline - self.t0:.0f} s "
                f"(timeout {self.args.reaper_timeout:g} s)"
            )
        elif "warn" in kinds and kinds.index("warn") > kinds.index("cull"):
            failures.append("the idle kernel was culled before it was warned")
        if kinds.count("warn") > 1 or kinds.count("cull") > 1:
            failures.append(f"the idle kernel got {kinds} (one warning, one cull expected)")
        if busy_:
            failures.append(f"the busy kernel's session got {[a['action'] for a in busy_]}")
        if self.ignored:
            failures.append(f"{len(self.ignored)} reports not acted on: {self.ignored[0]}")
        after = {"samples": len(self.after)}
        if self.culled_at is not None:
            shutdown = self.shut_down.get("idle", {})
            if shutdown.get("alive_after"):
                failures.append("the culled idle kernel is still alive after its shutdown")
            idle_listed = [s["idle"]["listed"] for s in self.after]
            busy_seen = [s["busy"] for s in self.after]
            busy_utils = [b["util"] for b in busy_seen if b["util"] is not None]
            after.update(
                idle_listed_in=f"{sum(idle_listed)}/{len(idle_listed)} samples",
                idle_left_gpu_after_s=next(
                    (
                        round(s["t"] - self.rel(self.culled_at), 2)
                        for s in self.after
                        if not s["idle"]["listed"]
                    ),
                    None,
                ),
                busy_alive_in=f"{sum(b['alive'] for b in busy_seen)}/{len(busy_seen)} samples",
                busy_listed_in=f"{sum(b['listed'] for b in busy_seen)}/{len(busy_seen)} samples",
                busy_util_mean=round(statistics.fmean(busy_utils), 1) if busy_utils else None,
            )
            if not self.after:
                failures.append("no sample after the cull")
            elif idle_listed[-1]:
                failures.append("the culled idle kernel still holds the GPU (in NVML's list)")
            if not all(b["alive"] for b in busy_seen):
                failures.append("the busy kernel died after the idle one was culled")
            if after["busy_util_mean"] is None or after["busy_util_mean"] <= 50:
                failures.append(
                    f"the busy kernel averaged {after['busy_util_mean']}% after the cull "
                    "(want > 50%: still running)"
                )
        return {
            "settings": {
                k: self.settings[k]
                for k in ("timeout_tier_2", "warning_lead", "idle_threshold", "stale_after")
            },
            "sessions": "one per kernel; each report holds only that kernel's utilization",
            "idle": {"actions": idle, "shutdown": self.shut_down.get("idle")},
            "busy": {"actions": busy_},
            "after_cull": after,
            "timeline": self.timeline,
            "ok": not failures,
            "failures": failures,
        }


def sample_kernels(samples, gpu: int, pids: dict[str, int]) -> dict:
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
    parser.add_argument(
        "--simulated",
        action="store_const",
        const="simulated",
        dest="backend",
        help="a dry run without GPU: the simulated backend and simulate_load (same as "
        "--backend simulated)",
    )
    parser.add_argument("--busy-seconds", type=float, default=90)
    parser.add_argument("--sample-seconds", type=float, default=20)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--reaper-timeout", type=float, default=20.0)
    parser.add_argument("--warning-lead", type=float, default=10.0)
    parser.add_argument(
        "--after-cull", type=float, default=5.0, help="seconds watched after the cull"
    )
    args = parser.parse_args(argv)
    if not 0 < args.warning_lead < args.reaper_timeout:
        parser.error("--warning-lead must be > 0 and below --reaper-timeout")
    sampling = max(args.sample_seconds, args.reaper_timeout + max(5.0, 3 * args.interval))
    if args.warmup + sampling + args.after_cull + 5 > args.busy_seconds:
        parser.error(
            "--busy-seconds must cover the warm-up, the sampling (up to the reaper's cull) and "
            "the time watched after the cull, plus 5 s"
        )
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
