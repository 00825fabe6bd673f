"""Who stops which notebook server: gpusched's idle reaper vs jupyterhub-idle-culler vs
jupyter-server's kernel culling, on real hubs, in five scenarios.

For each tool one real JupyterHub (configurable-http-proxy, the scheduler service on SQLite,
GPUSchedSpawner, real single-user servers and kernels on the simulated GPU backend, one node of
4 H100): ``tests/test_spawner.py``'s ``HubRunner`` with this benchmark's profiles, cluster,
queue and policy files (all of it, and the cells the scenarios run, in
``benchmarks/culling_scenarios.py``). Every tool gets the same ``--timeout`` (default 30 s):

* ``gpusched``: the project's reaper, ``timeout_tier_2`` and the profile's ``idle_timeout`` =
  timeout, ``warning_lead`` a third of it; the servers' GPU monitor at its default interval;
* ``idle-culler``: ``jupyterhub-idle-culler`` (PyPI, the ``test`` extra) as a hub-managed service,
  ``--timeout``, ``--cull-every`` (``--cull-every``, default 5 s), ``--remove-named-servers=False``;
  the reaper off (``reaper: {enabled: false}``);
* ``kernel-culling``: jupyter-server's ``MappingKernelManager.cull_idle_timeout`` = timeout,
  ``cull_interval`` = cull-every, ``cull_connected=True`` (the strictest); the reaper off. It
  culls kernels, not servers: reported is when the kernel went and whether its GPU memory did.

The other two tools run alone by default: their servers without gpusched's server extension,
whose GPU monitor would mark GPU-busy servers and kernels active for them
(``--others-with-monitor`` keeps it). All three hubs report activity quickly enough for a 30 s
timeout (idle-culler's README asks for it): the hub reads the proxy's activity and the servers
post theirs every ``ACTIVITY_S``.

The scenarios, each one user's server (1 GPU; the CPU-only one none), all of a tool at once:

* ``gpu-busy-no-http`` (alice): a cell keeps its GPU at 95% for the whole run
  (``simulate_load`` in a loop); nothing talks HTTP to the server after the cell starts;
* ``gpu-memory-tab-open`` (bob): a kernel holds 20 GB of GPU memory at 0% and a real Chromium tab
  (Playwright, ``/usr/bin/chromium``) stays open on JupyterLab;
* ``fully-idle`` (carol): the server started, no kernel, no tab;
* ``cpu-only-idle`` (dave, created like the demo users): a ``gpus: 0`` profile's server, idle;
  where the spawner refuses such profiles, the result says so (``stopped: null`` and a note);
* ``gpu-background-thread`` (admin): a cell starts GPU load (95%) in a thread and returns at
  once: idle to jupyter-server, busy on the GPU.

Recorded per (tool, scenario), in seconds after the scenario started (the idle ones: their
server ready; the others: their load seen on the GPU, the tab opened after it): ``stopped`` (the
server gone from the hub, or null), ``kernel_culled`` (the kernel's process gone while its
server ran), ``gpu_memory_gb_after_kernel`` (what the server's GPUs held just after that),
``warned`` (the service's ``reaper-warning`` event: the idle notice it posts to the server's Lab
notices API; the observer reads the service, never the user's server, so that it adds no
activity), ``wrong`` (stopped, or its kernel culled, while the scenario kept the GPU busy).
Observed ``--observe`` seconds (default 4 x timeout) per scenario, polled every ``--poll``
seconds. Prints one JSON document on stdout and a table on stderr; every hub, proxy, server and
browser is stopped at the end, Ctrl-C and SIGTERM included. Exit code 2 if a hub cannot be run
here (no configurable-http-proxy, not root), 1 if a process of it was left (then killed), 0
otherwise: a benchmark, no pass or fail.

    sudo .venv/bin/python benchmarks/bench_culling.py [--tool gpusched] [--timeout 30]
        [--observe 120] [--others-with-monitor]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from culling_scenarios import (
    ACTIVITY_S,
    BUSY_CELL,
    CLUSTER,
    EXTRA_USER,
    FIRST_PORT,
    HELD_MEMORY_GB,
    MEMORY_CELL,
    NODE,
    QUEUES,
    REAPER_FIELDS,
    REAPER_TIMES,
    SCENARIOS,
    STATE_PARENT,
    THREAD_CELL,
    TOOLS,
    cpu_profile_refusal,
    hub_config,
    policy_text,
    table,
    verdict,
)


# -- one tool's hub --------------------------------------------------------------------------------
def make_runner(tool: str, args, with_cpu: bool, port: int):
    """A ``HubRunner`` for ``tool``: state under STATE_PARENT, ports from ``port``."""
    import hub_harness
    import test_spawner as ts

    STATE_PARENT.mkdir(mode=0o755, exist_ok=True)
    STATE_PARENT.chmod(0o755)  # the users' kernels reach the simulated GPUs' folder below it
    old, tempfile.tempdir = tempfile.tempdir, str(STATE_PARENT)  # HubRunner's mkdtemp
    try:
        runner = ts.HubRunner()
    finally:
        tempfile.tempdir = old
    for name, text in (
        ("cluster", CLUSTER),
        ("queues", QUEUES),
        ("policy", policy_text(tool, args.timeout)),
    ):
        hub_harness.readable_file(runner.state_dir, f"test-{name}.yaml", text)
    runner.env.update(
        GPUSCHED_GPU_BACKEND="simulated",
        GPUSCHED_SIM_CLUSTER=runner.env["GPUSCHED_CLUSTER_FILE"],
        GPUSCHED_HUB_PORT=str(port),
        GPUSCHED_HUB_API_PORT=str(port + 1),
        GPUSCHED_PROXY_API_PORT=str(port + 2),
        GPUSCHED_SERVICE_PORT=str(port + 3),
    )
    config = runner.config.read_text()
    extra = hub_config(tool, args.timeout, args.cull_every, with_cpu, args.others_with_monitor)
    runner.config.write_text(config.replace(ts.EXTRA_CONFIG, "\n" + extra))
    return runner


class Scenario:
    """One scenario's server as the observer sees it."""

    def __init__(self, tool: str, name: str):
        self.tool, self.name = tool, name
        self.user, self.profile, self.gpu_work = SCENARIOS[name]
        self.ready: float | None = None  # epoch: the hub says the server is ready
        self.began: float | None = None  # epoch: server ready and its work running
        self.job_id: str | None = None
        self.gpus: list[int] = []
        self.kernel_pid: int | None = None
        self.stopped = self.kernel_culled = self.warned = None
        self.memory_after_kernel: float | None = None
        self.note: str | None = None
        self.reaper_view: dict | None = None  # api/reaper's session at the end, if still running

    def since(self, when: float) -> float:
        return round(when - self.began, 1)

    def result(self) -> dict:
        row = {
            "tool": self.tool,
            "scenario": self.name,
            "user": self.user,
            "stopped": self.stopped,
            "kernel_culled": self.kernel_culled,
            "gpu_memory_gb_after_kernel": self.memory_after_kernel,
            "warned": self.warned,
            "wrong": verdict(self.name, self.stopped, self.kernel_culled)
            if self.began is not None
            else None,
        }
        if self.note:
            row["note"] = self.note
        if self.reaper_view and self.tool == "gpusched":
            row["reaper_session_at_end"] = self.reaper_view
        return row


def gpu_memory(state_dir: Path, cluster_file: str, gpus: list[int]) -> tuple[float, float]:
    """(utilization, memory GB) of ``gpus`` of the simulated node, summed."""
    from jupyter_gpusched.backends.gpu.simulated import SimulatedTelemetry

    telemetry = SimulatedTelemetry(
        node=NODE, cluster=cluster_file, state_dir=f"{state_dir}-sim-gpus"
    )
    samples = [s for s in telemetry.sample() if s.device.index in gpus]
    return (
        sum(s.utilization_percent or 0 for s in samples),
        sum(s.memory_used_gb or 0 for s in samples),
    )


def start_servers(hub, ts, scenarios: list[Scenario]) -> None:
    """Start every scenario's server at once; note when each is ready (polled together); a
    refused or failed start becomes the scenario's note."""
    starts = {s.name: ts.start_in_background(hub, s.user, s.profile) for s in scenarios}
    waiting = list(scenarios)
    deadline = time.monotonic() + 180
    while waiting:
        for s in list(waiting):
            server = ts.servers_of(hub, s.user).get("")
            if server and server["ready"]:
                s.ready = time.time()
                env = ts.server_env(hub, s.user)
                s.job_id = env.get("GPUSCHED_JOB_ID")
                visible = env.get("CUDA_VISIBLE_DEVICES", "")
                s.gpus = [int(i) for i in visible.split(",") if i.strip().isdigit()]
                waiting.remove(s)
            elif (server is None and not starts[s.name].is_alive()) or time.monotonic() > deadline:
                answer = starts[s.name].answers
                text = f"{answer[0].status_code} {answer[0].text[:300]}" if answer else ""
                s.note = f"the server did not start: {text or 'see the hub log'}"
                waiting.remove(s)
        time.sleep(0.3)


def run_cell(hub, rh, s: Scenario, code: str, returns: bool) -> None:
    """Start a kernel on the scenario's server and run ``code`` there (over the kernel's
    websocket, then closed); ``returns``: wait for the cell's reply."""
    kernel = rh.start_kernel(hub, s.user)
    # in a thread of its own: Playwright's sync API runs an event loop in this one
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        if returns:
            reply = pool.submit(rh.execute, hub, s.user, kernel, code).result()
            if reply.get("status") != "ok":
                raise RuntimeError(f"the cell failed: {reply}")
        else:  # a cell that never returns: sent, then the websocket closed (no client left)
            with contextlib.suppress(TimeoutError):
                pool.submit(rh.execute, hub, s.user, kernel, code, timeout=5).result()
    pids = rh.kernel_processes(kernel)
    s.kernel_pid = pids[0] if pids else None


def wait_load(s: Scenario, runner, busy: bool) -> float:
    """Until the scenario's GPU shows its load (a benchmark of nothing otherwise); when."""
    deadline = time.monotonic() + 20
    cluster_file = runner.env["GPUSCHED_CLUSTER_FILE"]
    while True:
        util, memory = gpu_memory(runner.state_dir, cluster_file, s.gpus)
        loaded = util >= 90 if busy else memory >= HELD_MEMORY_GB
        if loaded:
            return time.time()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{s.name}: no load on GPUs {s.gpus} ({util}%, {memory} GB)")
        time.sleep(0.3)


class Tabs:
    """Chromium (Playwright, Debian's /usr/bin/chromium), started for the first tab."""

    def __init__(self):
        self.playwright = self.browser = None

    def open_lab(self, hub, user: str):
        """A logged-in page on the user's JupyterLab, left open."""
        from playwright.sync_api import sync_playwright
        from test_lab_browser import CHROMIUM, _log_in

        if self.browser is None:
            self.playwright = sync_playwright().start()
            self.browser = self.playwright.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"]
            )
        page = _log_in(self.browser, hub, user)
        page.goto(f"{hub.url}/user/{user}/lab")
        page.wait_for_selector(".jp-LabShell", timeout=90_000)
        return page

    def close(self) -> None:
        for part, end in ((self.browser, "close"), (self.playwright, "stop")):
            if part is not None:
                with contextlib.suppress(Exception):
                    getattr(part, end)()


def set_up(hub, rh, runner, s: Scenario, tabs: Tabs) -> None:
    """Put the scenario's work on its server. ``began``: when that work runs on the GPU (the
    tab opens after it), or for the idle scenarios when the server was ready."""
    if s.name == "gpu-busy-no-http":
        run_cell(hub, rh, s, BUSY_CELL, returns=False)
        s.began = wait_load(s, runner, busy=True)
    elif s.name == "gpu-background-thread":
        run_cell(hub, rh, s, THREAD_CELL, returns=True)
        s.began = wait_load(s, runner, busy=True)
    elif s.name == "gpu-memory-tab-open":
        run_cell(hub, rh, s, MEMORY_CELL, returns=True)
        began = wait_load(s, runner, busy=False)
        tabs.open_lab(hub, s.user)
        s.began = began  # watched from the tab open on, timed from the memory held
    else:
        s.began = s.ready


def set_up_or_say_why(hub, rh, runner, s: Scenario, tabs: Tabs) -> None:
    try:
        set_up(hub, rh, runner, s, tabs)
    except Exception as exc:  # the scenario could not run: its result says why
        s.note = f"set-up failed: {exc}"


class Observer(threading.Thread):
    """Polls the hub (the servers), the service (its warnings) and the kernels' processes,
    from the first server ready until each scenario has been watched ``observe`` seconds (or
    its server stopped). Reads the hub and the service only: never the users' servers."""

    def __init__(self, runner, scenarios: list[Scenario], args):
        super().__init__(daemon=True)
        self.runner, self.scenarios, self.args = runner, scenarios, args
        self.set_up = threading.Event()  # every scenario's work runs (or failed)
        self.error: BaseException | None = None

    def run(self):
        try:
            self._watch()
        except BaseException as exc:  # reported by run_tool
            self.error = exc

    def _watch(self):
        import test_spawner as ts

        hub, args = self.runner.hub, self.args
        admin = hub.token("admin")
        cluster_file = self.runner.env["GPUSCHED_CLUSTER_FILE"]
        kernels: dict[str, psutil.Process] = {}
        while True:
            began = time.monotonic()
            now = time.time()
            watched = [s for s in self.scenarios if s.began is not None]
            if self.set_up.is_set():
                end = max((s.began for s in watched), default=now) + args.observe
                if now > end or all(s.stopped is not None for s in watched):
                    break
            warnings = hub.service("GET", "api/events?kind=reaper-warning", admin).json()
            for s in watched:
                if s.warned is None:
                    times = [e["time"] for e in warnings["events"] if e.get("job_id") == s.job_id]
                    if times:
                        s.warned = s.since(min(times))
                if s.stopped is not None or now > s.began + args.observe:
                    continue
                server = ts.servers_of(hub, s.user).get("")
                if server is None or server.get("pending") == "stop":
                    s.stopped = s.since(now)
                    continue
                if s.kernel_pid and s.name not in kernels:
                    with contextlib.suppress(psutil.Error):
                        kernels[s.name] = psutil.Process(s.kernel_pid)
                kernel = kernels.get(s.name)
                if s.kernel_culled is None and kernel is not None and not _alive(kernel):
                    s.kernel_culled = s.since(now)
                    _, memory = gpu_memory(self.runner.state_dir, cluster_file, s.gpus)
                    s.memory_after_kernel = round(memory, 1)
            time.sleep(max(0.0, args.poll - (time.monotonic() - began)))
        # why the reaper left a server running: its view of each session (without samples)
        sessions = hub.service("GET", "api/reaper", admin).json()["sessions"]
        for s in self.scenarios:
            for session in sessions:
                if s.stopped is None and s.job_id and session.get("job_id") == s.job_id:
                    s.reaper_view = {
                        k: s.since(v) if k in REAPER_TIMES and v else v
                        for k, v in session.items()
                        if k in REAPER_FIELDS
                    }


def _alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def run_tool(tool: str, args, port: int, refusal: str | None, stopping: threading.Event):
    import hub_harness
    import test_reaper_hub as rh
    import test_spawner as ts

    scenarios = [Scenario(tool, name) for name in args.scenarios]
    runner = make_runner(tool, args, with_cpu=refusal is None, port=port)
    tabs = Tabs()
    failed = True
    try:
        runner.start()
        hub = runner.hub
        hub_harness.no_news(runner.state_dir, SCENARIOS["gpu-memory-tab-open"][0])
        startable = []
        for s in scenarios:
            if s.profile == "cpu" and refusal is not None:
                s.note = f"gpus: 0 profiles refused: {refusal}"
            else:
                startable.append(s)
        observer = Observer(runner, scenarios, args)
        observer.start()
        start_servers(hub, ts, startable)
        # all at once, so that no server idles through its timeout before its work runs; the
        # tab in this thread (Playwright's sync API stays in the thread that started it)
        ready = [s for s in startable if s.note is None]
        with concurrent.futures.ThreadPoolExecutor(len(ready) or 1) as pool:
            for s in ready:
                if s.name != "gpu-memory-tab-open":
                    pool.submit(set_up_or_say_why, hub, rh, runner, s, tabs)
            for s in ready:
                if s.name == "gpu-memory-tab-open":
                    set_up_or_say_why(hub, rh, runner, s, tabs)
        observer.set_up.set()
        while observer.is_alive() and not stopping.is_set():
            observer.join(1.0)
        if observer.error is not None:
            raise observer.error
        failed = False
    finally:
        tabs.close()
        if runner.hub is not None and runner.hub.process.poll() is None:
            with contextlib.suppress(Exception):  # the servers left: expected, not an error
                ts.stop_every_server(runner.hub)
                if ts.servers_of(runner.hub, EXTRA_USER):  # not among the harness's users
                    ts.stop_server(runner.hub, EXTRA_USER)
        _, left = runner.shut_down(failed)
    rows = [s.result() for s in scenarios]
    return rows, left


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tool", choices=TOOLS, action="append", help="default: all three")
    parser.add_argument("--scenario", choices=list(SCENARIOS), action="append", dest="scenarios")
    parser.add_argument("--timeout", type=float, default=30.0, help="every tool's, seconds")
    parser.add_argument("--cull-every", type=float, default=5.0, help="culler/kernel interval")
    parser.add_argument("--observe", type=float, help="seconds per scenario (4 x timeout)")
    parser.add_argument("--poll", type=float, default=1.0, help="observer's poll, seconds")
    parser.add_argument(
        "--others-with-monitor",
        action="store_true",
        help="idle-culler and kernel culling with gpusched's server extension in the servers "
        "(its GPU monitor marks GPU-busy servers and kernels active); default: the tools alone",
    )
    args = parser.parse_args()
    args.observe = args.observe or 4 * args.timeout
    args.scenarios = args.scenarios or list(SCENARIOS)
    tools = args.tool or list(TOOLS)

    import hub_harness

    if not hub_harness.CHP.exists() or os.geteuid() != 0:
        print("needs root (servers as the demo users) and node_modules (make node_modules)")
        return 2
    hub_harness._create_demo_users()
    hub_harness.subprocess.run(  # the fifth user, made the demo users' way
        ["bash", str(hub_harness.ROOT / "scripts" / "demo-users.sh"), EXTRA_USER], check=True
    )
    stopping = threading.Event()

    def interrupted(signum, frame):
        stopping.set()
        raise KeyboardInterrupt(f"signal {signum}")

    # also where SIGINT came ignored (a shell's background job): Ctrl-C stops the run, and the
    # hub and its services inherit the default action, not the ignoring (jupyterhub stops its
    # services with SIGINT; one ignoring it outlives the hub)
    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    refusal = cpu_profile_refusal()
    began = time.monotonic()
    rows: list[dict] = []
    left: list[str] = []
    try:
        for number, tool in enumerate(tools):
            tool_began = time.monotonic()
            tool_rows, tool_left = run_tool(tool, args, FIRST_PORT + 4 * number, refusal, stopping)
            rows += tool_rows
            left += tool_left
            print(f"{tool}: {time.monotonic() - tool_began:.0f} s", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted: hubs stopped", file=sys.stderr)
        return 130
    result = {
        "benchmark": "who stops which notebook server: gpusched vs idle-culler vs kernel culling",
        "settings": {
            "timeout_s": args.timeout,
            "gpusched_warning_lead_s": round(args.timeout / 3, 1),
            "cull_every_s": args.cull_every,
            "observe_s": args.observe,
            "poll_s": args.poll,
            "activity_interval_s": ACTIVITY_S,
            "others_with_gpusched_monitor": args.others_with_monitor,
            "gpu_backend": "simulated",
            "tab": "Chromium (Playwright) on JupyterLab",
            "gpus_0_profiles": "refused" if refusal else "accepted",
        },
        "results": rows,
        "wall_s": round(time.monotonic() - began, 1),
    }
    print(json.dumps(result, indent=2))
    print(table(rows), file=sys.stderr)
    if left:
        print("left running (killed):", left, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
