"""The idle reaper's figure: from a server's idle timeout to its GPUs free (target: at most two
sampling intervals).

One real JupyterHub (configurable-http-proxy, the scheduler service on SQLite, GPUSchedSpawner),
real single-user servers with real kernels on the simulated GPU backend, the service sampling the
servers' GPUs (what the reaper decides on) every ``SAMPLE_INTERVAL`` (1 s), their GPU monitors
every ``MONITOR_INTERVAL`` (1 s), and the service polling (and so the reaper ticking) every
1 s: the harness of ``tests/test_reaper_hub.py`` (``ReaperHub`` and its helpers), with the same
clean-up as its fixture.

Each round: the reaper's timeout is off while alice's server starts; then a kernel of hers keeps
her GPU busy for ``--burst`` seconds (``simulate_load``, then the websocket is closed) and the
admin sets ``timeout_tier_2`` to ``--timeout`` at run time (``PUT api/reaper``). When the burst
ends the server is GPU-idle; the reaper warns it, then culls it. Measured:

* ``t_timeout``: the session's ``idle_since`` (``GET api/reaper``, as the admin) + the timeout,
  the instant the reaper's rule makes the server due (checked against the cull event's evidence);
* ``t_free``: when the scheduler job stops being ``running`` (``GET api/jobs/<id>`` every 50 ms),
  and when ``GET api/cluster`` no longer shows the job on any GPU.

Each latency is split with the service's own timestamps: ``tick_s`` (timeout -> the cull event:
the reaper ticks at each service poll), ``stop_s`` (cull event -> the job's end time: the hub
stops the server, its spawner releases the allocation) and ``observed_s`` (-> seen by this
script's 50 ms polling). Prints JSON: per-round latencies, median and max in seconds and in
sampling intervals, the target, pass/fail, and the settings. Exit code 0 within the target (every
round), 1 otherwise, 2 if the hub cannot be run here.

    python benchmarks/bench_reaper.py [--rounds 5] [--timeout 4] [--warning-lead 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import psutil
import requests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

TARGET_INTERVALS = 2.0
USER = "alice"
PROFILE = "t2-1"  # 1 GPU, tier 2 (tests/test_reaper_hub.py's profiles)
POLL_S = 0.05
ROUND_TIMEOUT_S = 60.0  # a cull that has not freed the GPUs by then is reported as a failure


class Poller:
    """The service's API through the proxy, one kept-alive connection, as the admin."""

    def __init__(self, hub, token: str):
        self.base = hub.service_url
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"token {token}"

    def get(self, path: str) -> dict:
        response = self.session.get(self.base + path, timeout=10, allow_redirects=False)
        response.raise_for_status()
        return response.json()

    def close(self) -> None:
        self.session.close()


def _on_gpus(cluster: dict, job_id: str) -> bool:
    return any(
        holder.get("job") == job_id
        for node in cluster["nodes"]
        for gpu in node["gpu_list"]
        for holder in gpu["jobs"]
    )


def _gone(process) -> bool:
    """Exited (a zombie until its parent reaps it counts as exited)."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _since(later: float | None, earlier: float | None) -> float | None:
    return round(later - earlier, 3) if later is not None and earlier is not None else None


def _events(poller: Poller, kind: str, job_id: str) -> list[dict]:
    return poller.get(f"api/events?kind={kind}&job_id={job_id}")["events"]


def one_round(hub, rh, ts, poller: Poller, args) -> dict:
    rh.configure(hub, timeout_tier_2=None, warning_lead=args.warning_lead, exempt_users=[])
    ts.start_server(hub, USER, PROFILE)
    job_id = rh.job_id_of(hub, USER)
    rh.wait_reported(hub, USER)
    kernel = rh.start_kernel(hub, USER)
    burst_began = time.time()
    code = "from jupyter_gpusched.backends.gpu import simulate_load\n"
    code += f"simulate_load(util=90, seconds={args.burst:g})"
    reply = rh.execute(hub, USER, kernel, code)
    if reply.get("status") != "ok":
        raise RuntimeError(f"the kernel's burst failed: {reply}")
    deadline = time.monotonic() + 10
    while (rh.sessions(hub).get(USER) or {}).get("idle_since", 0) < burst_began:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no busy report from {USER}'s server: {rh.sessions(hub)}")
        time.sleep(0.1)
    settings = rh.configure(hub, timeout_tier_2=args.timeout)  # busy: not due yet
    server = psutil.Process(ts.spawner_state(hub, USER)["pid"])
    kernels = server.children(recursive=True)  # the ipykernel

    idle_since = None
    seen_warning = None
    t_job = t_cluster = t_server = t_kernel = None
    end = time.monotonic() + args.burst + args.timeout + ROUND_TIMEOUT_S
    while None in (t_job, t_cluster, t_server, t_kernel):
        began = time.monotonic()
        now = time.time()
        if idle_since is None or now < idle_since + args.timeout + POLL_S:
            session = rh.sessions(hub).get(USER)
            if session is not None and session["job_id"] == job_id:
                idle_since = session["idle_since"]
                seen_warning = session["warned"] or seen_warning
        if t_job is None and poller.get(f"api/jobs/{job_id}")["state"] != "running":
            t_job = time.time()
        if t_cluster is None and not _on_gpus(poller.get("api/cluster"), job_id):
            t_cluster = time.time()
        if t_server is None and _gone(server):
            t_server = time.time()
        if t_kernel is None and all(_gone(k) for k in kernels):
            t_kernel = time.time()
        if time.monotonic() > end:
            break
        time.sleep(max(0.0, POLL_S - (time.monotonic() - began)))

    ts.wait_gone(hub, USER, timeout=30)
    job = poller.get(f"api/jobs/{job_id}")
    culls = _events(poller, "reaper-cull", job_id)
    warnings = _events(poller, "reaper-warning", job_id)
    row: dict = {"job_id": job_id, "state": job["state"], "culls": len(culls)}
    if not culls or t_job is None or idle_since is None:
        row["error"] = f"not culled and freed within {ROUND_TIMEOUT_S:g} s of the timeout"
        return row
    cull = culls[0]
    t_timeout = idle_since + args.timeout
    evidence = cull["data"]
    row.update(
        latency_s=round(t_job - t_timeout, 3),
        cluster_free_s=round(t_cluster - t_timeout, 3) if t_cluster else None,
        breakdown={
            "tick_s": round(cull["time"] - t_timeout, 3),
            "stop_s": round(job["end_time"] - cull["time"], 3) if job["end_time"] else None,
            "observed_s": round(t_job - job["end_time"], 3) if job["end_time"] else None,
        },
        stop_detail={  # within stop_s; the process exits as seen by this script's polling
            "cull_to_server_exit_s": _since(t_server, cull["time"]),
            "server_exit_to_release_s": _since(job["end_time"], t_server),
            "kernel_exit_after_release_s": _since(t_kernel, job["end_time"]),
        },
        idle_since_matches_cull=abs(evidence["idle_since"] - idle_since) < 1e-6
        and evidence["timeout"] == args.timeout,
        warned=bool(warnings) or seen_warning is not None,
        warning_lead_s=round(t_timeout - warnings[0]["time"], 3) if warnings else None,
        job_message=job.get("message"),
        settings_in_force=settings["timeout_tier_2"],
    )
    return row


def summarize(rows: list[dict], interval: float) -> dict:
    done = [r for r in rows if "latency_s" in r]
    if not done:
        return {"rounds_measured": 0}
    latencies = [r["latency_s"] for r in done]
    cluster = [r["cluster_free_s"] for r in done if r["cluster_free_s"] is not None]
    parts = {
        key: round(statistics.median(r[group][key] for r in done), 3)
        for group, keys in (
            ("breakdown", ("tick_s", "stop_s", "observed_s")),
            (
                "stop_detail",
                (
                    "cull_to_server_exit_s",
                    "server_exit_to_release_s",
                    "kernel_exit_after_release_s",
                ),
            ),
        )
        for key in keys
        if all(r[group][key] is not None for r in done)
    }
    median, worst = statistics.median(latencies), max(latencies)
    return {
        "rounds_measured": len(done),
        "median_s": round(median, 3),
        "max_s": round(worst, 3),
        "median_intervals": round(median / interval, 2),
        "max_intervals": round(worst / interval, 2),
        "cluster_free_median_s": round(statistics.median(cluster), 3) if cluster else None,
        "cluster_free_max_s": round(max(cluster), 3) if cluster else None,
        "breakdown_median": parts,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=4.0, help="timeout_tier_2, seconds")
    parser.add_argument("--warning-lead", type=float, default=2.0)
    parser.add_argument("--burst", type=float, default=3.0, help="seconds of GPU use per round")
    args = parser.parse_args()
    if args.warning_lead >= args.timeout or args.rounds < 1:
        parser.error("need --rounds >= 1 and --warning-lead < --timeout")

    import hub_harness
    import test_reaper_hub as rh
    import test_spawner as ts

    if not hub_harness.CHP.exists():
        print("node_modules/.bin/configurable-http-proxy is missing: run `make node_modules`")
        return 2
    hub_harness._create_demo_users()
    runner = rh.ReaperHub()
    began = time.monotonic()
    rows: list[dict] = []
    result: dict = {}
    left: list[str] = []
    failed = True
    try:
        runner.start()
        hub = runner.hub
        poller = Poller(hub, hub.token("admin"))
        for number in range(1, args.rounds + 1):
            row = {"round": number, **one_round(hub, rh, ts, poller, args)}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
            ts.wait_free(hub, 4, timeout=15)
        in_force = poller.get("api/reaper")["settings"]
        poller.close()
        summary = summarize(rows, rh.MONITOR_INTERVAL)
        worst = summary.get("max_intervals")
        result = {
            "benchmark": "idle reaper: from the idle timeout to the GPUs free (real hub)",
            "settings": {
                "monitor_interval_s": rh.MONITOR_INTERVAL,
                "gpu_sample_interval_s": rh.SAMPLE_INTERVAL,
                "service_poll_s": rh.SERVICE_POLL,
                "timeout_tier_2_s": args.timeout,
                "warning_lead_s": args.warning_lead,
                "idle_threshold_percent": in_force["idle_threshold"],
                "stale_after_s": in_force["stale_after"],
                "gpu_burst_s": args.burst,
                "gpu_backend": "simulated",
                "measure_poll_s": POLL_S,
                "rounds": args.rounds,
            },
            "rounds": rows,
            **summary,
            "target_intervals": TARGET_INTERVALS,
            "target_s": TARGET_INTERVALS * rh.MONITOR_INTERVAL,
            "within_target": worst is not None
            and summary["rounds_measured"] == args.rounds
            and worst <= TARGET_INTERVALS,
            "median_within_target": summary.get("median_intervals", 1e9) <= TARGET_INTERVALS,
        }
        failed = False
    finally:
        _, left = runner.shut_down(failed)
    result["wall_s"] = round(time.monotonic() - began, 1)
    print(json.dumps(result, indent=2))
    if left:
        print("left running:", left, file=sys.stderr)
        return 1
    return 0 if result["within_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
