"""What the scheduler adds to a notebook server's start: GPUSchedSpawner vs LocalProcessSpawner.

One real JupyterHub (configurable-http-proxy, the scheduler service on SQLite, the demo config
``hub_config/jupyterhub_config.py``, the demo cluster with free capacity): alice's servers are
started by GPUSchedSpawner (token, submission, allocation, state), carol's by a plain
LocalProcessSpawner set up the same way otherwise (same command, same user, same HOME). The
two alternate, start after stop, so that both see the same machine at the same time. A spawn is
timed from the REST API request (``POST /hub/api/users/<name>/server``) until the hub reports
the server ready.

By default the server is a stand-in (a few lines of Python answering HTTP) so that the numbers
show the hub and the spawner rather than the import time of jupyter-server, whose noise is
larger than the difference measured; ``--server singleuser`` uses jupyterhub-singleuser.
Prints JSON: both medians, the difference (target: at most 100 ms added), p90s.

    python benchmarks/bench_spawn.py [--spawns 20] [--server standin|singleuser]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

TARGET_MS = 100.0
GPUSCHED_USER, PLAIN_USER = "alice", "carol"

STANDIN = """\
# A stand-in single-user server: answers every GET with 200 at JUPYTERHUB_SERVICE_URL.
import http.server, os, urllib.parse
url = urllib.parse.urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")
    def log_message(self, *args):
        pass
try:
    http.server.HTTPServer((url.hostname, url.port), Handler).serve_forever()
except KeyboardInterrupt:
    pass
"""

EXTRA_CONFIG = """
# -- added by benchmarks/bench_spawn.py: carol's servers by a plain LocalProcessSpawner
import os
from jupyterhub.spawner import LocalProcessSpawner
from jupyter_gpusched.hub.spawner import GPUSchedSpawner

PLAIN_USERS = {plain!r}


HOME_TEMPLATE = c.GPUSchedSpawner.home_dir_template  # the demo's: STATE/home/<user>


class PlainSpawner(LocalProcessSpawner):
    # LocalProcessSpawner, running servers as the hub's user like the demo's GPUSchedSpawner
    def _home(self):
        return HOME_TEMPLATE.format(username=self.user.name)

    def make_preexec_fn(self, name):
        home = self._home()
        os.makedirs(home, mode=0o700, exist_ok=True)
        return lambda: os.chdir(home)

    def user_env(self, env):
        env.update(USER=self.user.name, HOME=self._home(), SHELL="/bin/bash")
        return env

    def get_args(self):
        args = list(super().get_args())
        if os.geteuid() == 0:
            args.append("--ServerApp.allow_root=True")
        return args


class BenchSpawner(GPUSchedSpawner):
    # JupyterHub has one spawner class: this one hands carol's servers to PlainSpawner.
    def __new__(cls, *args, **kwargs):
        user = kwargs.get("user")
        if user is not None and user.name in PLAIN_USERS:
            return PlainSpawner(*args, **kwargs)
        return super().__new__(cls, *args, **kwargs)


c.JupyterHub.spawner_class = BenchSpawner
c.GPUSchedSpawner.profiles = [
    {{"display_name": "1 GPU (tier 2)", "slug": "gpu-1", "gpus": 1, "tier": 2}},
]
c.JupyterHub.log_level = "INFO"
{cmd}
"""


def _start_hub(state_dir, server: str):
    import hub_harness

    from jupyter_gpusched.hub.singleuser_command import singleuser_command

    token = secrets.token_hex(32)
    cmd = ""
    if server == "standin":
        # beside the state directory, which the hub config makes its own (0700)
        standin = str(hub_harness.readable_file(Path(state_dir), "standin.py", STANDIN))
        # a python3 the users may run (a root hub's venv python may sit in root's home)
        python = singleuser_command()[0][0]
        cmd = f"c.Spawner.cmd = [{python!r}, {standin!r}]"
    config = os.path.join(state_dir, "jupyterhub_config.py")
    with open(config, "w") as f:
        f.write(
            hub_harness.GENERATED_CONFIG.format(
                config=str(hub_harness.HUB_CONFIG), harness=hub_harness.HARNESS, token=token
            )
            + EXTRA_CONFIG.format(plain=[PLAIN_USER], cmd=cmd)
        )
    ports = hub_harness.port_settings()
    port = int(ports["GPUSCHED_HUB_PORT"])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTERHUB_", "JPY_"))}
    env.pop("CONFIGPROXY_AUTH_TOKEN", None)
    env.update(
        ports, GPUSCHED_STATE_DIR=state_dir, GPUSCHED_DEMO_PASSWORD=secrets.token_urlsafe(12)
    )
    log_path = os.path.join(state_dir, "jupyterhub.log")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [*hub_harness._jupyterhub_command(), "-f", config],
            cwd=state_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    hub = hub_harness.Hub(
        f"http://127.0.0.1:{port}", Path(state_dir), "", token, process, Path(log_path)
    )
    hub_harness._wait_until_up(hub, time.monotonic() + hub_harness.START_TIMEOUT)
    return hub


def _servers(hub, admin, user) -> dict:
    response = requests.get(
        hub.api_url + f"users/{user}", headers={"Authorization": f"token {admin}"}, timeout=30
    )
    response.raise_for_status()
    return response.json().get("servers") or {}


def _spawn(hub, admin, user, body) -> float:
    headers = {"Authorization": f"token {hub.token(user)}"}
    began = time.perf_counter()
    response = requests.post(
        hub.api_url + f"users/{user}/server", json=body, headers=headers, timeout=60
    )
    if response.status_code not in (201, 202):
        raise RuntimeError(f"spawn of {user}: {response.status_code} {response.text}")
    while response.status_code == 202:  # still starting after slow_spawn_timeout
        server = _servers(hub, admin, user).get("")
        if server is None:
            raise RuntimeError(f"{user}'s server failed:\n{hub.log_tail(40)}")
        if server["ready"]:
            break
        time.sleep(0.01)
    elapsed = time.perf_counter() - began
    response = requests.delete(hub.api_url + f"users/{user}/server", headers=headers, timeout=60)
    while "" in _servers(hub, admin, user):
        time.sleep(0.02)
    return elapsed


def _summary(samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {
        "median_ms": round(1000 * statistics.median(ordered), 1),
        "p90_ms": round(1000 * ordered[int(0.9 * (len(ordered) - 1))], 1),
        "min_ms": round(1000 * ordered[0], 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spawns", type=int, default=20, help="timed spawns per spawner")
    parser.add_argument("--warmup", type=int, default=2, help="untimed spawns per spawner first")
    parser.add_argument("--server", choices=["standin", "singleuser"], default="standin")
    args = parser.parse_args()

    import hub_harness

    if not hub_harness.CHP.exists():
        print("node_modules/.bin/configurable-http-proxy is missing: run `make node_modules`")
        return 2
    state_dir = tempfile.mkdtemp(prefix="gpusched-bench-spawn-")
    os.chmod(state_dir, 0o755)
    hub = _start_hub(state_dir, args.server)
    left = []
    try:
        admin = hub.token("admin")
        spawners = {
            "gpusched": (GPUSCHED_USER, {"profile": "gpu-1"}),
            "local": (PLAIN_USER, {}),
        }
        times = {name: [] for name in spawners}
        for round_ in range(args.warmup + args.spawns):
            order = list(spawners) if round_ % 2 == 0 else list(reversed(spawners))
            for name in order:
                user, body = spawners[name]
                elapsed = _spawn(hub, admin, user, body)
                if round_ >= args.warmup:
                    times[name].append(elapsed)
        gpusched, local = _summary(times["gpusched"]), _summary(times["local"])
        added = round(gpusched["median_ms"] - local["median_ms"], 1)
        result = {
            "benchmark": "spawn time, GPUSchedSpawner vs LocalProcessSpawner (same hub, same run)",
            "server": "stand-in HTTP server"
            if args.server == "standin"
            else "jupyterhub-singleuser",
            "spawns_each": args.spawns,
            "free_capacity": True,
            "gpusched": gpusched,
            "local_process": local,
            "added_median_ms": added,
            "target_added_ms": TARGET_MS,
            "within_target": added <= TARGET_MS,
        }
    finally:
        left = hub_harness._stop(hub)
        if not left:
            hub_harness.remove_state(Path(state_dir))
    print(json.dumps(result, indent=2))
    if left:
        print("left running:", left, file=sys.stderr)
    return 0 if result["within_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
