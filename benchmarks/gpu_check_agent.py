"""The node agent's part of ``gpu_check.py``: does ``jupyter-gpusched node-agent`` serve what NVML
measures?

Starts ``jupyter-gpusched node-agent --backend B --bind 127.0.0.1:0 --interval 1`` (a free port,
read from its log), scrapes its ``/metrics`` at each step of the check while the CUDA load runs,
and compares the checked GPU's ``DCGM_FI_DEV_GPU_UTIL`` and ``DCGM_FI_DEV_FB_USED`` with the
device numbers of the script's own direct read of NVML at the same step. Passes when every scrape
answered with DCGM exporter's labels and ``backend`` = B, the agent's mean utilization is within
15 points of NVML's and above 50% (the busy kernel's matmul), and its memory within 256 MiB (or
5%) of NVML's in most steps; the agent must also stop cleanly on SIGTERM. The two reads are not at
the same instant (the agent samples every second on its own), hence means and tolerances.
"""

from __future__ import annotations

import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

DCGM_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "backend"}
UTIL_TOLERANCE = 15.0  # percentage points between the two means
MEMORY_TOLERANCE_MIB = 256.0


class AgentCheck:
    def __init__(self, backend: str, gpu: int, env: dict, node: str | None = None):
        self.backend = backend
        self.gpu = gpu
        self.rows: list[dict] = []
        self.failures: list[str] = []
        self.lines: list[str] = []
        command = [sys.executable, "-m", "jupyter_gpusched", "node-agent", "--backend", backend]
        command += ["--bind", "127.0.0.1:0", "--interval", "1"]
        command += ["--node", node] if node else []
        self.process = subprocess.Popen(
            command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        threading.Thread(target=self._read_log, daemon=True).start()
        self.url = self._wait_for_url(timeout=60)

    def _read_log(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line.rstrip())

    def _wait_for_url(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines:
                if "serving http://" in line:
                    return line.split("serving ", 1)[1].strip()
            if self.process.poll() is not None:
                raise RuntimeError(f"the node agent exited: {' | '.join(self.lines[-5:])}")
            time.sleep(0.1)
        raise RuntimeError(f"the node agent did not listen within {timeout:g} s")

    def scrape(self) -> dict:
        """{metric: (value, labels)} of the checked GPU's series."""
        with urllib.request.urlopen(self.url, timeout=5) as response:
            text = response.read().decode()
        found = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.labels.get("gpu") == str(self.gpu):
                    found[family.name] = (sample.value, sample.labels)
        return found

    def step(self, samples) -> None:
        """One scrape beside the script's own read of NVML (``samples``, taken just before)."""
        device = next((s for s in samples if s.device.index == self.gpu), None)
        row = {
            "nvml_util": None if device is None else device.utilization_percent,
            "nvml_fb_used_mib": None
            if device is None or device.memory_used_gb is None
            else round(device.memory_used_gb * 1024, 1),
        }
        try:
            found = self.scrape()
        except OSError as exc:
            row["error"] = str(exc)
            self.rows.append(row)
            return
        util, labels = found.get("DCGM_FI_DEV_GPU_UTIL", (None, {}))
        row["agent_util"] = util
        row["agent_fb_used_mib"] = found.get("DCGM_FI_DEV_FB_USED", (None, {}))[0]
        row["labels_ok"] = set(labels) >= DCGM_LABELS and labels.get("backend") == self.backend
        self.rows.append(row)

    def stop(self) -> int | None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return None

    def verdict(self, exit_code: int | None) -> dict:
        failures = []
        rows = self.rows
        if not rows:
            failures.append("no scrape of the node agent")
        errors = [r["error"] for r in rows if "error" in r]
        if errors:
            failures.append(f"{len(errors)} scrapes failed, first: {errors[0]}")
        good = [r for r in rows if "error" not in r]
        if any(not r["labels_ok"] for r in good):
            failures.append(f"series without DCGM exporter's labels or backend {self.backend!r}")
        pairs = [
            (r["agent_util"], r["nvml_util"])
            for r in good
            if r["agent_util"] is not None and r["nvml_util"] is not None
        ]
        summary: dict = {"url": self.url, "scrapes": len(rows), "exit_code": exit_code}
        if pairs:
            agent_mean = statistics.mean(a for a, _ in pairs)
            nvml_mean = statistics.mean(n for _, n in pairs)
            summary.update(agent_util_mean=round(agent_mean, 1), nvml_util_mean=round(nvml_mean, 1))
            if abs(agent_mean - nvml_mean) > UTIL_TOLERANCE:
                failures.append(
                    f"utilization: agent {agent_mean:.1f}% vs NVML {nvml_mean:.1f}% on average"
                )
            if agent_mean <= 50:
                failures.append(f"utilization {agent_mean:.1f}% under the CUDA load (want > 50%)")
        elif good:
            failures.append("no utilization from the agent or NVML")
        memory = [
            abs(r["agent_fb_used_mib"] - r["nvml_fb_used_mib"])
            <= max(MEMORY_TOLERANCE_MIB, 0.05 * r["nvml_fb_used_mib"])
            for r in good
            if r["agent_fb_used_mib"] is not None and r["nvml_fb_used_mib"] is not None
        ]
        summary["memory_steps_within_tolerance"] = f"{sum(memory)}/{len(memory)}"
        if not memory or sum(memory) < 0.8 * len(memory):
            failures.append(f"memory: {summary['memory_steps_within_tolerance']} steps agree")
        if exit_code != 0:
            failures.append(f"the agent's exit code on SIGTERM: {exit_code} (want 0)")
        summary["rows"] = rows
        return {"ok": not failures, "failures": failures, **summary}
