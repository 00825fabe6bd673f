"""GPUSchedSpawner: profiles and the options form (no hub), then notebook servers under a real
JupyterHub (``hub_harness``: hub, configurable-http-proxy and the scheduler service) on a small
test cluster of 4 GPUs, started and stopped through the hub REST API.

The hub here is started by this module (with the harness's pieces) rather than by the harness's
fixture: the restart test stops the hub while servers keep running and starts it again on the
same state. Its config is ``hub_config/jupyterhub_config.py`` (profiles of the demo) plus a few
test profiles, a short queue poll and the test files below (``GPUSCHED_CLUSTER_FILE`` etc.).
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

import hub_harness
import psutil
import pytest
import requests
from traitlets import TraitError

from jupyter_gpusched.hub.spawner import (
    GPUSchedSpawnError,
    allowed_profiles,
    normalize_profiles,
    profile_options_from_form,
    render_options_form,
    select_profile,
    select_queue,
)

# -- profiles and the options form, without a hub -----------------------------------------------
PROFILES = normalize_profiles(
    [
        {"display_name": "1 GPU (tier 2)", "gpus": 1, "gpu_models": ["H100", "L40S"]},
        {
            "display_name": "4 GPUs (tier 2)",
            "slug": "gpu-4",
            "gpus": 4,
            "groups": ["research"],
            "default": True,
        },
        {
            "display_name": "2 GPUs opportunistic (tier 3)",
            "slug": "opportunistic",
            "tier": 3,
            "gpus": 2,
            "idle_timeout": "30m",
            "max_lifetime": "12h",
            "description": "May be <pre-empted>",
        },
    ]
)


def test_profiles_are_filled_in_and_filtered_by_group():
    first = PROFILES[0]
    assert first["slug"] == "1-gpu-tier-2" and first["tier"] == 2 and first["groups"] == []
    assert PROFILES[2]["idle_timeout"] == 1800 and PROFILES[2]["max_lifetime"] == 12 * 3600
    assert [p["slug"] for p in allowed_profiles(PROFILES, ["research"])] == [
        "1-gpu-tier-2",
        "gpu-4",
        "opportunistic",
    ]
    assert [p["slug"] for p in allowed_profiles(PROFILES, [])] == ["1-gpu-tier-2", "opportunistic"]


@pytest.mark.parametrize(
    ("profiles", "error"),
    [
        ([], "non-empty list"),
        ([{"gpus": 1}], "display_name is required"),
        ([{"display_name": "a", "gpus": -1}], "gpus must be a whole number >= 0"),
        ([{"display_name": "a", "gpus": 0}], "a profile with gpus 0 needs cpus or memory_gb"),
        ([{"display_name": "a", "gpus": 0, "cpus": 2, "gpu_models": ["H100"]}], "gpu_models"),
        ([{"display_name": "a", "gpus": 0, "cpus": -2}], "cpus must be a number > 0"),
        ([{"display_name": "a", "memory_gb": "4G"}], "memory_gb must be a number > 0"),
        ([{"display_name": "a", "tier": 4}], "tier must be 1, 2 or 3"),
        ([{"display_name": "a"}, {"display_name": "A"}], "used twice"),
        ([{"display_name": "a", "gpu": 2}], "unknown key(s) gpu"),
        ([{"display_name": "a", "max_lifetime": "soon"}], "max_lifetime"),
        ([{"display_name": "a", "slug": "Not A Slug"}], "slug"),
        ([{"display_name": "a", "groups": [1]}], "groups must be a list of names"),
        ([{"display_name": "a", "queue": "research//vision"}], "queue must be a queue path"),
        ([{"display_name": "a", "queue": ["ops"]}], "queue must be a queue path"),
        ([{"display_name": "a", "queue": "ops team"}], "got 'ops team'"),
    ],
)
def test_bad_profiles_are_refused_with_the_key(profiles, error):
    with pytest.raises(TraitError) as raised:
        normalize_profiles(profiles)
    assert error in str(raised.value)


def test_the_spawner_checks_its_profiles_when_configured():
    from jupyter_gpusched.hub.spawner import GPUSchedSpawner

    with pytest.raises(TraitError, match="tier must be"):
        GPUSchedSpawner(profiles=[{"display_name": "x", "tier": 0}])


def test_select_profile_default_choice_and_refusals():
    profile, models = select_profile(PROFILES, "alice", ["research"], {})
    assert profile["slug"] == "gpu-4" and models is None  # the default, for a member
    profile, models = select_profile(PROFILES, "carol", [], {})
    assert profile["slug"] == "1-gpu-tier-2" and models == ["H100", "L40S"]  # any of them
    profile, models = select_profile(
        PROFILES, "carol", [], {"profile": "1-gpu-tier-2", "gpu_model": "L40S"}
    )
    assert models == ["L40S"]
    # the options form's passthrough shape (lists of strings) works too
    profile, _ = select_profile(PROFILES, "carol", [], {"profile": ["opportunistic"]})
    assert profile["tier"] == 3

    with pytest.raises(GPUSchedSpawnError) as refused:
        select_profile(PROFILES, "carol", ["teaching"], {"profile": "gpu-4"})
    assert refused.value.status_code == 403
    assert "carol may not use the profile '4 GPUs (tier 2)'" in refused.value.message
    assert "members of research" in refused.value.message
    with pytest.raises(GPUSchedSpawnError, match="no profile 'huge'; yours: 1-gpu-tier-2"):
        select_profile(PROFILES, "carol", [], {"profile": "huge"})
    with pytest.raises(GPUSchedSpawnError, match="offers the GPU models H100, L40S, not 'A100'"):
        select_profile(PROFILES, "carol", [], {"profile": "1-gpu-tier-2", "gpu_model": "A100"})
    only_research = normalize_profiles([{"display_name": "x", "groups": ["research"]}])
    with pytest.raises(GPUSchedSpawnError, match="No GPU profile is available to carol"):
        select_profile(only_research, "carol", [], {})


def test_the_options_form_lists_only_the_users_profiles():
    form = render_options_form(allowed_profiles(PROFILES, []))
    assert 'value="1-gpu-tier-2" checked' in form  # no default among hers: the first
    assert "gpu-4" not in form and "4 GPUs" not in form
    assert 'name="gpu_model:1-gpu-tier-2"' in form and '<option value="L40S">' in form
    assert "May be &lt;pre-empted&gt;" in form  # escaped
    assert "tier 3 (pre-emptible)" in form and "stops after 30 min idle" in form
    assert "runs at most 12 h" in form
    member = render_options_form(allowed_profiles(PROFILES, ["research"]))
    assert 'value="gpu-4" checked' in member
    again = render_options_form(allowed_profiles(PROFILES, ["research"]), "opportunistic")
    assert 'value="opportunistic" checked' in again and 'value="gpu-4" checked' not in again
    assert "No GPU profile is available" in render_options_form([])


def test_a_profile_of_one_gpu_model_names_it_beside_its_gpus_before_the_estimate():
    # "on H100" came after the estimate, in a <small> of its own outside the label: the form
    # read "starts now          on H100"
    profiles = normalize_profiles([{"display_name": "2 H100", "gpus": 2, "gpu_models": ["H100"]}])
    form = render_options_form(profiles, estimates={"2-h100": "starts now"})
    facts, estimate = form.index("2 GPUs on H100, tier 2"), form.index("starts now")
    assert facts < estimate < form.index("</label>")
    assert "<small> on H100" not in form and "<select" not in form.split("</label>")[0]


def test_a_cpu_only_profile_says_so_in_the_form_and_asks_for_its_cpus_and_memory():
    from jupyter_gpusched.hub.spawner import GPUSchedSpawner

    profiles = [{"display_name": "CPU only", "slug": "cpu", "gpus": 0, "cpus": 2, "memory_gb": 4}]
    form = render_options_form(normalize_profiles(profiles))
    assert "CPU only (no GPU), 2 CPUs, 4 GB memory, tier 2" in form and "0 GPUs" not in form
    assert "GPUs or CPUs for your server" in form
    spawner = GPUSchedSpawner(user=FakeUser(), profiles=profiles)
    spawner.choose_profile({"profile": "cpu"})
    body = spawner.job_request()
    assert (body["gpus"], body["cpus"], body["memory_gb"]) == (0, 2, 4)
    assert "gpu_model" not in body


def test_options_from_form():
    form = {"profile": ["1-gpu-tier-2"], "gpu_model:1-gpu-tier-2": ["H100"], "gpu_model:x": ["A"]}
    assert profile_options_from_form(form) == {"profile": "1-gpu-tier-2", "gpu_model": "H100"}
    form["gpu_model:1-gpu-tier-2"] = ["any"]
    assert profile_options_from_form(form) == {"profile": "1-gpu-tier-2"}
    form["queue"] = ["research/nlp"]
    assert profile_options_from_form(form) == {"profile": "1-gpu-tier-2", "queue": "research/nlp"}
    assert profile_options_from_form({}) == {}


MY_QUEUES = [  # GET api/me's "queues"
    {"path": "research/nlp", "in_use": 0, "guaranteed": 3, "limit": 8, "default": False},
    {"path": "research/vision", "in_use": 4, "guaranteed": 3, "limit": 8, "default": True},
    {"path": "sandbox", "in_use": 1, "guaranteed": 0, "limit": None, "default": False},
]


def test_the_options_form_lists_the_users_queues_with_their_figures():
    form = render_options_form(allowed_profiles(PROFILES, ["research"]), None, MY_QUEUES)
    assert '<select class="form-control" name="queue"' in form
    assert (
        '<option value="research/vision" selected>research/vision: 4 GPUs in use (3 guaranteed, '
        "limit 8) (your default)</option>"
    ) in form
    assert "research/nlp: 0 GPUs in use (3 guaranteed, limit 8)</option>" in form
    assert "sandbox: 1 GPU in use (none guaranteed, no limit)</option>" in form
    again = render_options_form(PROFILES, None, MY_QUEUES, chosen_queue="research/nlp")
    assert '<option value="research/nlp" selected>' in again
    assert '<option value="research/vision" selected>' not in again
    down = render_options_form(PROFILES, None, "the GPU scheduler answered 503")
    assert "your default queue" in down and "answered 503" in down and "<select" in down
    assert 'name="queue"' not in down
    pinned = normalize_profiles([{"display_name": "ops", "queue": "ops"}])
    assert "in queue ops" in render_options_form(pinned, None, MY_QUEUES)


def test_a_profiles_queue_wins_over_a_choice_and_a_bad_choice_is_refused():
    free, pinned = normalize_profiles(
        [{"display_name": "free"}, {"display_name": "pinned", "queue": "research/vision"}]
    )
    assert select_queue(free, {}) is None  # the service's default: the user's team queue
    assert select_queue(free, {"queue": ["research/nlp"]}) == "research/nlp"
    assert select_queue(pinned, {"queue": "sandbox"}) == "research/vision"
    with pytest.raises(GPUSchedSpawnError, match="is not a queue path") as refused:
        select_queue(free, {"queue": "../etc"})
    assert refused.value.status_code == 400


def test_start_timeout_covers_the_queue_wait():
    from jupyter_gpusched.hub.spawner import GPUSchedSpawner

    spawner = GPUSchedSpawner(
        user=FakeUser(),
        start_timeout=60,
        max_queue_wait=600,
        profiles=[{"display_name": "a"}, {"display_name": "b", "max_queue_wait": "2h"}],
    )
    spawner.user_options = {"profile": "a"}
    spawner.run_pre_spawn_hook()
    assert spawner.start_timeout == 660
    spawner.user_options = {"profile": "b"}
    spawner.run_pre_spawn_hook()
    assert spawner.start_timeout == 7260  # the configured 60 s stays the launch's share


class FakeUser:
    name = "carol"
    groups = ()


LATE_SERVER = """
import http.server, sys, time
time.sleep(float(sys.argv[2]))  # a server's start-up (imports), before it listens
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(404 if self.path != "/user/carol/api" else 200)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Answer).serve_forever()
"""


async def test_start_returns_once_the_new_server_answers_or_its_process_ended():
    """JupyterHub's own wait for a started server backs off to seconds between tries: the
    spawner tries every 50 ms first, where the hub will (``<base_url>api``), and returns once
    it answers; a process that ends before it answers fails the start at once, saying so."""
    from types import SimpleNamespace

    from jupyter_gpusched.hub.spawner import GPUSchedSpawner

    spawner = GPUSchedSpawner(user=FakeUser())
    spawner.server = SimpleNamespace(base_url="/user/carol/")
    port = hub_harness.free_port()
    spawner.proc = subprocess.Popen([sys.executable, "-c", LATE_SERVER, str(port), "1"])
    try:
        await asyncio.wait_for(spawner.server_answering(("127.0.0.1", port), 60), 30)
        answer = requests.get(f"http://127.0.0.1:{port}/user/carol/api", timeout=5)
        assert answer.status_code == 200 and spawner.proc.poll() is None
    finally:
        spawner.proc.kill()
        spawner.proc.wait()
    # a server that exits first: the start fails at its end, not after http_timeout (60 s)
    spawner.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1); exit(3)"])
    with pytest.raises(GPUSchedSpawnError, match=r"stopped while starting \(exit status 3\)"):
        await asyncio.wait_for(spawner.server_answering(("127.0.0.1", port), 60), 30)


def test_server_args_enable_the_extension_and_leave_idleness_to_the_reaper():
    from jupyter_gpusched.hub.spawner import GPUSchedSpawner

    spawner = GPUSchedSpawner(
        user=FakeUser(),
        profiles=[{"display_name": "a", "idle_timeout": "1h"}, {"display_name": "b"}],
    )
    spawner.user_options = {"profile": "a"}
    spawner.run_pre_spawn_hook()
    args = spawner.get_args()
    assert "--ServerApp.jpserver_extensions=jupyter_gpusched.notebook.serverext=True" in args
    # the idle timeout is the reaper's (it warns first): no jupyter-server culling of its own
    assert not [a for a in args if "timeout" in a or "cull" in a]


def test_the_account_policy_decides_as_whom_a_server_runs(monkeypatch):
    """A hub user named like a system account gets no server (403, the policy's message);
    run_as_hub_user is refused while the hub is root, and means the hub's own account
    otherwise."""
    import pwd

    from traitlets.config import Config

    from jupyter_gpusched.hub.spawner import GPUSchedSpawner

    class User(FakeUser):
        def __init__(self, name):
            self.name = name

    someone = next(p for p in pwd.getpwall() if p.pw_uid >= 1000 and p.pw_name != "nobody")
    config = Config()
    config.AccountPolicy.denied_users = ["root", someone.pw_name]
    for name, says in (
        ("root", "work may not run as the account 'root'"),
        ("daemon", "(uid 1): it is a system account, below AccountPolicy.min_uid (1000)"),
        ("no-such-account", "user 'no-such-account' does not exist on this host"),
        (someone.pw_name, "denied accounts (AccountPolicy.denied_users)"),  # the hub's config
    ):
        spawner = GPUSchedSpawner(user=User(name), config=config)
        with pytest.raises(GPUSchedSpawnError) as refused:
            spawner.run_pre_spawn_hook()
        assert refused.value.status_code == 403
        assert refused.value.jupyterhub_message.startswith("Your server cannot start: ")
        assert says in refused.value.jupyterhub_message
    allowed = GPUSchedSpawner(user=User(someone.pw_name))
    assert allowed.server_account().pw_uid == someone.pw_uid

    laptop = GPUSchedSpawner(user=User("root"), run_as_hub_user=True)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert laptop.server_account() is None  # the hub's own account, whatever the user's name
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(GPUSchedSpawnError) as refused:
        laptop.server_account()
    assert "runs as root with GPUSchedSpawner.run_as_hub_user set" in str(refused.value)


def test_the_state_keeps_the_job_beside_the_pid():
    from jupyter_gpusched.hub.spawner import GPUSchedSpawner

    spawner = GPUSchedSpawner(user=FakeUser())
    spawner.pid, spawner.job_id = 4242, "j-000007"
    spawner.allocation = [{"node": "gpu1", "gpus": [2, 3], "gpu_fraction": 1.0}]
    spawner.job_tier, spawner.job_gpus, spawner.lifetime = 3.0, 2.0, 3600.0
    state = json.loads(json.dumps(spawner.get_state()))  # as the hub's database keeps it
    restored = GPUSchedSpawner(user=FakeUser())
    restored.load_state(state)
    assert (restored.pid, restored.job_id) == (4242, "j-000007")
    assert restored.allocation == spawner.allocation and restored.lifetime == 3600.0
    restored.clear_state()
    assert restored.get_state() == {} and restored.job_id == ""


async def test_a_reused_pid_is_never_taken_for_the_server():
    """After a hub restart the state's PID may name another process: with a different start
    time it is the server's end, and that process is neither signalled nor waited for."""
    import subprocess
    import sys

    from jupyter_gpusched.backends.process_tree import process_created
    from jupyter_gpusched.hub.spawner import GPUSchedSpawner

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        spawner = GPUSchedSpawner(user=FakeUser())
        spawner.pid, spawner.job_id = other.pid, "j-000007"
        spawner.pid_created = process_created(other.pid) - 100.0  # the server started earlier
        state = json.loads(json.dumps(spawner.get_state()))
        restored = GPUSchedSpawner(user=FakeUser())
        restored.load_state(state)
        assert restored.pid_created == spawner.pid_created
        assert await restored.poll_server() == 0  # gone, as far as the server goes
        assert restored.pid == 0 and restored.job_id == ""
        await restored.stop_server()  # nothing left to signal
        assert other.poll() is None  # the other process was left alone
        same = GPUSchedSpawner(user=FakeUser())
        same.pid, same.pid_created = other.pid, process_created(other.pid)
        assert await same.poll_server() is None  # the real server: still running
    finally:
        other.kill()
        other.wait()


def test_the_pending_message_gives_the_date_of_a_start_not_today():
    # (it said "about 17:41 UTC (in ~1440 min)" at 17:41 for a start a day later)
    from jupyter_gpusched.hub.spawner import GPUSchedSpawner

    spawner = GPUSchedSpawner(user=FakeUser(), profiles=[{"display_name": "4 GPUs", "gpus": 4}])
    spawner.choose_profile({})
    eta = time.time() + 86_400 + 60
    job = {"id": "j-1", "state": "pending", "position": 0, "reason": {"eta": eta}}
    message, _ = spawner._pending_message(job)
    day = time.strftime("%Y-%m-%d", time.gmtime(eta))
    assert f"expected start about 24 h (at {day} " in message, message


def test_the_pending_message_says_position_reason_and_eta():
    from jupyter_gpusched.hub.spawner import GPUSchedSpawner

    spawner = GPUSchedSpawner(user=FakeUser(), profiles=[{"display_name": "2 GPUs", "gpus": 2}])
    spawner.choose_profile({})
    eta = time.time() + 600
    reason = {"family": "capacity", "detail": "free", "message": "0 of 4 free", "eta": eta}
    job = {"id": "j-000009", "state": "pending", "position": 2, "reason": reason}
    message, details = spawner._pending_message(job)
    assert message.startswith("2 GPUs: position 3 in the GPU queue (2 ahead of you); ")
    assert "capacity: 0 of 4 free" in message
    assert "; expected start about 10 min (at " in message  # the spawn form's words
    assert details == {
        "job_id": "j-000009",
        "state": "pending",
        "position": 2,
        "reason": reason,
        "eta": eta,
    }


# -- under a real hub ----------------------------------------------------------------------------
TEST_CLUSTER = """\
nodes:
  - name: gpu1
    gpus: 4
    gpu_model: H100
    nvlink: [[0, 1], [2, 3]]
"""
# alice and bob have 2 guaranteed GPUs each; carol only borrows (sandbox).
TEST_QUEUES = """\
queues:
  a: {guaranteed: 2, limit: 4, users: [alice]}
  b: {guaranteed: 2, limit: 4, users: [bob]}
  sandbox: {guaranteed: 0, limit: 4, users: [carol, admin]}
"""
# Short grace for tier 3 and frequent deep passes (which is where pre-emption is decided).
TEST_POLICY = """\
tiers:
  3: {grace_period: 3s, minimum_run_time: 0}
backfill: {interval: 1s}
"""
EXTRA_CONFIG = """
# -- added by tests/test_spawner.py
c.GPUSchedSpawner.profiles = [
    *c.GPUSchedSpawner.profiles,
    {"display_name": "2 GPUs (tier 2)", "slug": "gpu-2", "gpus": 2},
    {"display_name": "1 GPU (tier 1)", "slug": "gpu-1-t1", "gpus": 1, "tier": 1},
    {"display_name": "1 GPU, impatient", "slug": "gpu-1-impatient", "max_queue_wait": 3},
]
c.GPUSchedSpawner.queue_poll_interval = 0.3
c.Spawner.http_timeout = 60
c.JupyterHub.last_activity_interval = 1  # the servers' activity, read from the proxy
"""
SERVER_TIMEOUT = 60.0
RELEASE_TIMEOUT = 5.0  # a stopped server's GPUs are released at once
RELEASED = {"completed", "cancelled"}  # how the service ends a stopped server's job


def _user_env(state_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTERHUB_", "JPY_"))}
    env.pop("CONFIGPROXY_AUTH_TOKEN", None)
    env.pop("GPUSCHED_DEMO_STOP_ALL", None)  # restarts keep servers (stop_keeping_servers)
    env.pop("GPUSCHED_SIM_GPU_DIR", None)  # make test exports the demo's: this hub has its own
    files = {}
    for name, text in (("cluster", TEST_CLUSTER), ("queues", TEST_QUEUES), ("policy", TEST_POLICY)):
        files[name] = str(hub_harness.readable_file(state_dir, f"test-{name}.yaml", text))
    env.update(
        hub_harness.port_settings(),
        GPUSCHED_STATE_DIR=str(state_dir),
        GPUSCHED_DEMO_PASSWORD=secrets.token_urlsafe(12),
        GPUSCHED_CLUSTER_FILE=files["cluster"],
        GPUSCHED_QUEUE_FILE=files["queues"],
        GPUSCHED_POLICY_FILE=files["policy"],
    )
    return env


class HubRunner:
    """A hub that can be stopped (leaving notebook servers running) and started again."""

    def __init__(self):
        self.state_dir = Path(tempfile.mkdtemp(prefix="gpusched-spawner-"))
        self.env = _user_env(self.state_dir)
        self.harness_token = secrets.token_hex(32)
        self.config = self.state_dir / "jupyterhub_config.py"
        generated = hub_harness.GENERATED_CONFIG.format(
            config=str(hub_harness.HUB_CONFIG),
            harness=hub_harness.HARNESS,
            token=self.harness_token,
        )
        self.config.write_text(generated + EXTRA_CONFIG)
        self.hub: hub_harness.Hub | None = None
        self.starts = 0

    def start(self) -> hub_harness.Hub:
        self.starts += 1
        log_path = self.state_dir / f"jupyterhub-{self.starts}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [*hub_harness._jupyterhub_command(), "-f", str(self.config)],
                cwd=self.state_dir,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{self.env['GPUSCHED_HUB_PORT']}"
        tokens = self.hub.tokens if self.hub else {}
        self.hub = hub_harness.Hub(
            url,
            self.state_dir,
            self.env["GPUSCHED_DEMO_PASSWORD"],
            self.harness_token,
            process,
            log_path,
            tokens,
        )
        hub_harness._wait_until_up(self.hub, time.monotonic() + hub_harness.START_TIMEOUT)
        return self.hub

    def stop_keeping_servers(self) -> None:
        """SIGTERM the hub (cleanup_servers is False: notebook servers stay); wait for the hub,
        the proxy and the service to end."""
        hub = self.hub
        watched = [
            p for p in hub_harness._descendants(hub.process.pid) if not _is_notebook_server(p)
        ]
        proxy = hub_harness._proxy_pid(self.state_dir)
        with contextlib.suppress(psutil.NoSuchProcess):
            if proxy:
                watched.append(psutil.Process(proxy))
        hub.process.send_signal(signal.SIGTERM)
        hub.process.wait(hub_harness.STOP_TIMEOUT)
        _, alive = psutil.wait_procs(watched, timeout=hub_harness.STOP_TIMEOUT)
        assert not alive, f"left after the hub stopped: {alive}"

    def shut_down(self, failed: bool, scan: bool = True) -> tuple[list, list[str]]:
        """Stop every server and the hub; with ``scan``, kill notebook servers of this hub that
        the hub forgot. Returns (servers that were still running, processes left behind);
        prints the hub's log when anything went wrong, else removes the state directory."""
        servers: list = []
        if self.hub and self.hub.process.poll() is None:
            with contextlib.suppress(Exception):
                servers = stop_every_server(self.hub)
        left = hub_harness._stop(self.hub) if self.hub else []
        for process in psutil.process_iter(["cmdline", "environ"]) if scan else ():
            with contextlib.suppress(psutil.Error):
                if _is_notebook_server(process) and str(self.state_dir) in json.dumps(
                    process.info["environ"] or {}
                ):
                    left.append(f"notebook server pid {process.pid}")
                    process.kill()
        if (left or failed or servers) and self.hub:
            print(f"--- {self.hub.log_path} (tail) ---\n{self.hub.log_tail(300)}", file=sys.stderr)
        elif not os.environ.get("GPUSCHED_KEEP_HUB_STATE"):
            hub_harness.remove_state(self.state_dir)
        return servers, left


@contextlib.contextmanager
def module_hub(make_runner, scan: bool = True, servers_left: bool = True):
    """A test module's hub: ``make_runner()`` (a :class:`HubRunner`) started as root's demo users
    exist, yielded, then shut down; fails when any process of it is left (and, with
    ``servers_left=False``, when a server still ran). Skips without the proxy."""
    if not hub_harness.CHP.exists():
        pytest.skip("node_modules/.bin/configurable-http-proxy is missing: run `make node_modules`")
    hub_harness._create_demo_users()
    runner = make_runner()
    failed = True
    try:
        runner.start()
        yield runner
        failed = False
    finally:
        servers, left = runner.shut_down(failed, scan=scan)
    assert servers_left or not servers, f"servers still running after the tests: {servers}"
    assert not left, "processes left after the hub stopped:\n" + "\n".join(left)


def _is_notebook_server(process: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return any("jupyterhub-singleuser" in part for part in process.cmdline())
    return False


@pytest.fixture(scope="module")
def test_hub():
    with module_hub(HubRunner, servers_left=False) as th:
        yield th


@pytest.fixture
def hub(test_hub):
    yield test_hub.hub
    stop_every_server(test_hub.hub)  # the next test starts on an empty cluster
    admin = test_hub.hub.token("admin")
    jobs = test_hub.hub.service("GET", "api/jobs?state=running&state=pending", admin).json()
    for job in jobs["jobs"]:  # batch jobs a test left
        test_hub.hub.service("DELETE", f"api/jobs/{job['id']}", admin)
    wait_free(test_hub.hub, 4, timeout=15)


# -- helpers -------------------------------------------------------------------------------------
def hub_api(hub, method, path, token, **kwargs):
    kwargs.setdefault("timeout", 30)
    headers = {"Authorization": f"token {token}"}
    return requests.request(method, hub.api_url + path, headers=headers, **kwargs)


def server_path(user, name=""):
    return f"users/{user}/servers/{name}" if name else f"users/{user}/server"


def user_model(hub, user):
    response = hub_api(hub, "GET", f"users/{user}", hub.token("admin"))
    assert response.status_code == 200, response.text
    return response.json()


def servers_of(hub, user) -> dict:
    return user_model(hub, user).get("servers") or {}


def start_server(hub, user, profile, name="", wait=True):
    """POST the start; with ``wait``, until the server is ready. Returns the response."""
    body = {"profile": profile} if profile else {}
    response = hub_api(hub, "POST", server_path(user, name), hub.token(user), json=body)
    if wait:
        assert response.status_code in (201, 202), response.text
        wait_ready(hub, user, name)
    return response


def start_in_background(hub, user, profile, name="") -> threading.Thread:
    """The POST in a thread (the hub answers it when the start ends, or after 10 s); its
    response lands in ``thread.answers``."""
    thread = threading.Thread(daemon=True)
    thread.answers = []
    thread.run = lambda: thread.answers.append(
        start_server(hub, user, profile, name=name, wait=False)
    )
    thread.start()
    return thread


def wait_ready(hub, user, name="", timeout=SERVER_TIMEOUT) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        server = servers_of(hub, user).get(name)
        if server and server["ready"]:
            return server
        assert server is not None, f"{user}'s server {name!r} failed:\n{hub.log_tail(80)}"
        assert time.monotonic() < deadline, f"{user}'s server {name!r} not ready: {server}"
        time.sleep(0.2)


def wait_pending(hub, user, name="", timeout=10.0) -> None:
    deadline = time.monotonic() + timeout
    while (servers_of(hub, user).get(name) or {}).get("pending") != "spawn":
        assert time.monotonic() < deadline, f"{user}'s server {name!r} is not starting"
        time.sleep(0.05)


def wait_gone(hub, user, name="", timeout=SERVER_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while name in servers_of(hub, user):
        assert time.monotonic() < deadline, f"{user}'s server {name!r} is still there"
        time.sleep(0.2)


def stop_server(hub, user, name=""):
    response = hub_api(hub, "DELETE", server_path(user, name), hub.token(user))
    assert response.status_code in (202, 204), response.text
    wait_gone(hub, user, name)


def stop_every_server(hub) -> list[str]:
    """Stop every user's servers; return those that were running."""
    running = []
    for user in hub_harness.DEMO_USERS:
        for name in list(servers_of(hub, user)):
            running.append(f"{user}/{name}")
            hub_api(hub, "DELETE", server_path(user, name), hub.token("admin"))
    for entry in running:
        user, name = entry.split("/", 1)
        wait_gone(hub, user, name)
    return running


def spawner_state(hub, user, name="") -> dict:
    return servers_of(hub, user)[name]["state"]  # admin:server_state (the admin's token)


def server_env(hub, user, name="") -> dict:
    pid = spawner_state(hub, user, name)["pid"]
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def service_job(hub, user, job_id) -> dict:
    response = hub.service("GET", f"api/jobs/{job_id}", hub.token(user))
    assert response.status_code == 200, response.text
    return response.json()


def wait_job(hub, user, job_id, states, timeout=30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        job = service_job(hub, user, job_id)
        if job["state"] in states:
            return job
        assert time.monotonic() < deadline, f"job {job_id} still {job['state']}"
        time.sleep(0.2)


def hold_gpus(hub, user, gpus) -> str:
    """A batch job of ``user`` that holds ``gpus`` GPUs (cheaper than a notebook server)."""
    body = {"command": "sleep 300", "gpus": gpus, "name": "filler", "walltime": "10m"}
    response = hub.service("POST", "api/jobs", hub.token(user), json=body)
    assert response.status_code == 201, response.text
    return wait_job(hub, user, response.json()["id"], {"running"})["id"]


def free_gpus(hub) -> int:
    response = hub.service("GET", "api/cluster", hub.token("admin"))
    assert response.status_code == 200, response.text
    return sum(node["free"] for node in response.json()["nodes"])


def wait_free(hub, gpus, timeout=RELEASE_TIMEOUT) -> None:
    """Until ``gpus`` GPUs are free (a stopped server's GPUs are released at once)."""
    deadline = time.monotonic() + timeout
    while (free := free_gpus(hub)) != gpus:
        assert time.monotonic() < deadline, f"{free} GPUs free, not {gpus}"
        time.sleep(0.1)


class Progress(threading.Thread):
    """Reads a spawn's progress event stream into ``events`` until it ends."""

    def __init__(self, hub, user, name=""):
        super().__init__(daemon=True)
        self.url = hub.api_url + server_path(user, name) + "/progress"
        self.headers = {"Authorization": f"token {hub.token(user)}"}
        self.events: list[dict] = []
        self.start()

    def run(self):
        with requests.get(self.url, headers=self.headers, stream=True, timeout=90) as response:
            for line in response.iter_lines(decode_unicode=True):
                if line and line.startswith("data:"):
                    self.events.append(json.loads(line[5:]))

    def wait_for(self, check, timeout=30.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            for event in list(self.events):
                if check(event):
                    return event
            assert time.monotonic() < deadline, f"no such event in {self.events}"
            time.sleep(0.1)


def visible(env) -> set[int]:
    return {int(i) for i in env["CUDA_VISIBLE_DEVICES"].split(",")}


# -- the tests -----------------------------------------------------------------------------------
def test_more_gpus_asked_than_exist_the_last_waits_then_starts(hub):
    start_server(hub, "alice", "gpu-2")
    start_server(hub, "bob", "gpu-2")
    response = start_server(hub, "carol", "gpu-1", wait=False)
    assert response.status_code == 202, response.text  # pending: queued
    progress = Progress(hub, "carol")
    waiting = progress.wait_for(lambda e: (e.get("gpusched") or {}).get("state") == "pending")
    details = waiting["gpusched"]
    assert details["position"] == 0 and details["reason"]["family"] == "capacity", waiting
    assert "position 1 in the GPU queue" in waiting["message"]
    assert details["reason"]["message"] in waiting["message"]

    env_a, env_b = server_env(hub, "alice"), server_env(hub, "bob")
    assert len(visible(env_a)) == 2 and len(visible(env_b)) == 2
    assert not visible(env_a) & visible(env_b)
    for user, env in (("alice", env_a), ("bob", env_b)):
        job = service_job(hub, user, env["GPUSCHED_JOB_ID"])
        assert job["state"] == "running" and job["kind"] == "notebook"
        assert set(job["allocation"][0]["gpus"]) == visible(env)
        assert env["GPUSCHED_TIER"] == "2" and env["GPUSCHED_GPUS"] == "2"

    stop_server(hub, "alice")  # her GPUs go to carol at once
    wait_job(hub, "alice", env_a["GPUSCHED_JOB_ID"], RELEASED, timeout=RELEASE_TIMEOUT)
    wait_ready(hub, "carol")
    progress.join(30)
    assert progress.events[-1].get("ready"), progress.events
    env_c = server_env(hub, "carol")
    assert len(visible(env_c)) == 1 and visible(env_c) <= visible(env_a)
    assert not visible(env_c) & visible(env_b)
    assert env_c["GPUSCHED_JOB_ID"] != env_a["GPUSCHED_JOB_ID"]


def test_a_cpu_only_profile_starts_through_the_scheduler_without_a_gpu(hub):
    start_server(hub, "alice", "cpu-only")
    env = server_env(hub, "alice")
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env["GPUSCHED_GPUS"] == "0"
    job = service_job(hub, "alice", env["GPUSCHED_JOB_ID"])
    assert (job["state"], job["kind"], job["gpus"]) == ("running", "notebook", 0), job
    assert (job["cpus"], job["memory_gb"]) == (2, 4)
    assert [part["gpus"] for part in job["allocation"]] == [[]]
    assert free_gpus(hub) == 4  # the GPU profiles still have every GPU
    start_server(hub, "bob", "gpu-2")
    assert len(visible(server_env(hub, "bob"))) == 2


async def test_the_hubs_activity_of_a_cpu_only_server_moves_when_it_is_used(hub):
    """HubActivity reads the hub's last_activity of each server, all pages, and maps it to the
    server's job: a request through the proxy to the server moves it (the hub reads the proxy's
    activity every second here). ``live`` holds the server's job as the service lists it."""
    from types import SimpleNamespace

    from jupyter_gpusched.core import Job
    from jupyter_gpusched.service.hub_activity import HubActivity
    from jupyter_gpusched.service.hubclient import HubClient
    from jupyter_gpusched.service.records import Extra

    start_server(hub, "alice", "cpu-only")
    start_server(hub, "bob", "cpu-only", name="second")
    jobs, extras = {}, {}
    for user, name in (("alice", ""), ("bob", "second")):
        job_id = server_env(hub, user, name)["GPUSCHED_JOB_ID"]
        view = service_job(hub, user, job_id)
        jobs[job_id] = Job(job_id, view["gpus"], 0.0, kind=view["kind"], user=view["user"])
        extras[job_id] = Extra(0, server_name=view["server_name"])
    scopes = ["list:users", "read:users:activity", "read:servers"]  # the service role's
    client = HubClient(hub.api_url, hub.token("admin", scopes), hub.url)
    live = SimpleNamespace(
        clock=time.time, hub=client, engine=SimpleNamespace(jobs=jobs), extras=extras
    )
    activity = HubActivity(live, interval=0.0)
    paged = await client.server_activity(page_size=1)  # every page read: the same servers
    whole = await client.server_activity()
    assert paged.keys() == whole.keys() and len(whole) == 2
    # (a server just started may report activity between the two reads: it only moves on)
    for server, text in whole.items():
        assert text is not None and paged[server] is not None, (paged, whole)
        read_first = datetime.fromisoformat(paged[server].replace("Z", "+00:00"))
        assert read_first <= datetime.fromisoformat(text.replace("Z", "+00:00")), (paged, whole)
    await activity.read()
    bob_job = next(j for j in jobs if jobs[j].user == "bob")
    before = activity.latest(bob_job)
    assert before is not None and abs(before - time.time()) < 120

    used = time.time()
    response = requests.get(
        hub.url + "/user/bob/second/api/status",
        headers={"Authorization": f"token {hub.token('bob')}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    deadline = time.monotonic() + 20
    while (latest := activity.latest(bob_job)) <= before:
        assert time.monotonic() < deadline, f"bob's last activity still {latest} (used {used})"
        await asyncio.sleep(0.3)
        await activity.read()
    assert latest >= used - 1
    assert "reading the servers' activity from the hub failed" not in hub.log_tail(2000)


def test_a_tier1_start_preempts_a_tier3_notebook(hub):
    start_server(hub, "carol", "gpu-2-opportunistic")
    hold_gpus(hub, "bob", 2)  # tier 2: not a victim
    carol_job = spawner_state(hub, "carol")["gpusched"]["job_id"]
    carol_server = servers_of(hub, "carol")[""]["url"]
    assert free_gpus(hub) == 0

    began = time.monotonic()
    post = start_in_background(hub, "alice", "gpu-1-t1")  # the POST waits up to 10 s
    # The service warns carol's server, waits the grace period (3 s), then stops it.
    notices_url = hub.url + carol_server + "gpusched/api/notices"
    carol = {"Authorization": f"token {hub.token('carol')}"}
    notices = []
    while not notices and "" in servers_of(hub, "carol"):
        with contextlib.suppress(requests.RequestException):
            response = requests.get(notices_url, headers=carol, timeout=10)
            if response.status_code == 200:
                notices = response.json()["notices"]
        assert time.monotonic() - began < 40, "carol's server was neither warned nor stopped"
        time.sleep(0.2)
    wait_gone(hub, "carol", timeout=40)
    assert time.monotonic() - began >= 2.5  # not before the grace period
    wait_ready(hub, "alice")
    post.join(30)
    assert service_job(hub, "carol", carol_job)["state"] == "preempted"
    alice = server_env(hub, "alice")
    assert alice["GPUSCHED_TIER"] == "1" and len(visible(alice)) == 1
    assert notices, "no pre-emption notice reached carol's server before it stopped"
    (notice,) = notices
    assert notice["kind"] == "preemption" and notice["message"], notice
    assert notice["deadline"] is None or notice["deadline"] >= notice["received"] - 1


def test_a_hub_restart_keeps_servers_and_allocations(test_hub, hub):
    start_server(hub, "alice", "gpu-1")
    start_server(hub, "bob", "gpu-1", name="second")  # a named server
    before = {
        ("alice", ""): spawner_state(hub, "alice"),
        ("bob", "second"): spawner_state(hub, "bob", "second"),
    }
    jobs = {key: state["gpusched"]["job_id"] for key, state in before.items()}
    allocations = {key: service_job(hub, key[0], j)["allocation"] for key, j in jobs.items()}

    test_hub.stop_keeping_servers()
    for state in before.values():
        assert psutil.pid_exists(state["pid"])
    hub = test_hub.start()

    for (user, name), state in before.items():
        server = wait_ready(hub, user, name)
        assert server["state"]["pid"] == state["pid"]
        assert server["state"]["gpusched"]["job_id"] == jobs[(user, name)]
        job = service_job(hub, user, jobs[(user, name)])
        assert job["state"] == "running" and job["allocation"] == allocations[(user, name)]
        response = requests.get(
            hub.url + server["url"] + "api/status",
            headers={"Authorization": f"token {hub.token(user)}"},
            timeout=10,
        )
        assert response.status_code == 200, response.text  # routed again through the proxy
    assert free_gpus(hub) == 2

    stop_server(hub, "bob", "second")
    wait_job(hub, "bob", jobs[("bob", "second")], RELEASED, timeout=RELEASE_TIMEOUT)
    assert (
        not psutil.pid_exists(before[("bob", "second")]["pid"])
        or psutil.Process(before[("bob", "second")]["pid"]).status() == psutil.STATUS_ZOMBIE
    )
    assert free_gpus(hub) == 3


def test_a_profile_not_allowed_for_the_users_groups_is_refused(hub):
    response = start_server(hub, "carol", "gpu-4", wait=False)
    assert response.status_code == 403, response.text
    message = response.json()["message"]
    assert "carol may not use the profile '4 GPUs (tier 2)'" in message
    assert "members of research" in message
    response = start_server(hub, "carol", "no-such-profile", wait=False)
    assert response.status_code == 400 and "no profile 'no-such-profile'" in response.text
    assert servers_of(hub, "carol") == {}
    assert hub.service("GET", "api/jobs", hub.token("carol")).json()["jobs"] == [] or all(
        job["state"] != "pending"
        for job in hub.service("GET", "api/jobs", hub.token("carol")).json()["jobs"]
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="servers run as their users only under a root hub")
def test_a_server_and_its_kernels_run_as_the_users_own_account(hub):
    import pwd

    alice = pwd.getpwnam("alice")
    start_server(hub, "alice", "gpu-1")
    server = psutil.Process(spawner_state(hub, "alice")["pid"])
    assert server.uids().real == server.uids().effective == alice.pw_uid != 0
    assert server.gids().real == alice.pw_gid and server.cwd() == alice.pw_dir
    env = server_env(hub, "alice")
    assert (env["HOME"], env["USER"]) == (alice.pw_dir, "alice")
    url = hub.url + "/user/alice/api/kernels"
    headers = {"Authorization": f"token {hub.token('alice')}"}
    response = requests.post(url, headers=headers, json={"name": "python3"}, timeout=30)
    assert response.status_code == 201, response.text
    deadline = time.monotonic() + 30
    while True:
        children = server.children(recursive=True)
        kernels = [p for p in children if "ipykernel_launcher" in " ".join(p.cmdline())]
        if kernels:
            break
        assert time.monotonic() < deadline, "no kernel process"
        time.sleep(0.2)
    assert {k.uids().effective for k in kernels} == {alice.pw_uid}


def test_a_hub_user_named_like_a_system_account_gets_no_server(hub):
    """A hub admin may create a hub user ``root``; its server is refused before the scheduler
    hears of it, on the REST API and on the spawn page, and it runs nothing as root."""
    admin = hub.token("admin")
    response = hub_api(hub, "POST", "users/root", admin)
    assert response.status_code in (201, 409), response.text
    try:
        response = start_server(hub, "root", "gpu-1", wait=False)
        assert response.status_code == 403, response.text
        message = response.json()["message"]
        assert message.startswith("Your server cannot start: work may not run as the account")
        assert "'root'" in message and "AccountPolicy.denied_users" in message

        session = requests.Session()  # the spawn page, as the hub admin starting root's server
        page = session.get(hub.url + "/hub/login", timeout=10)
        form = {"username": "admin", "password": hub.password}
        form["_xsrf"] = session.cookies.get("_xsrf")
        response = session.post(hub.url + "/hub/login", data=form, timeout=10)
        assert response.status_code == 200, response.text
        form = {"profile": "gpu-1", "_xsrf": session.cookies.get("_xsrf")}
        page = session.post(hub.url + "/hub/spawn/root", data=form, timeout=30)
        text = html.unescape(page.text)
        assert "Your server cannot start: work may not run as the account 'root'" in text

        assert not (servers_of(hub, "root").get("") or {}).get("ready")
        jobs = hub.service("GET", "api/jobs?user=root", admin)
        assert jobs.status_code == 200 and jobs.json()["jobs"] == [], jobs.text
        for process in psutil.process_iter(["uids", "environ"]):
            with contextlib.suppress(psutil.Error):
                environ = process.info["environ"] or {}
                assert environ.get("JUPYTERHUB_USER") != "root", process
    finally:
        hub_api(hub, "DELETE", "users/root", admin)


def test_max_queue_wait_and_cancel_remove_the_request_from_the_queue(hub):
    hold_gpus(hub, "alice", 4)  # the whole cluster
    # The hub answers the POST when the start ends or after 10 s (slow_spawn_timeout): here the
    # start fails after 3 s (the profile's max_queue_wait), so the POST answers with the error.
    post = start_in_background(hub, "carol", "gpu-1-impatient")
    wait_pending(hub, "carol")
    progress = Progress(hub, "carol")
    queued = progress.wait_for(lambda e: (e.get("gpusched") or {}).get("state") == "pending")
    job_id = queued["gpusched"]["job_id"]
    post.join(30)
    progress.join(30)
    (answer,) = post.answers
    assert answer.status_code == 503, answer.text
    for message in (answer.json()["message"], progress.events[-1]["message"]):
        assert "No GPUs for '1 GPU, impatient' within 3 s (the maximum queue wait)" in message
        assert "position 1 in the GPU queue" in message and "removed from the queue" in message
    assert progress.events[-1].get("failed"), progress.events
    assert service_job(hub, "carol", job_id)["state"] == "cancelled"
    wait_gone(hub, "carol")

    # Cancelling a queued start (the spawn page's cancel: DELETE on the pending server).
    response = start_server(hub, "bob", "gpu-1", wait=False)
    assert response.status_code == 202, response.text
    progress = Progress(hub, "bob")
    queued = progress.wait_for(lambda e: (e.get("gpusched") or {}).get("state") == "pending")
    stop_server(hub, "bob")
    assert service_job(hub, "bob", queued["gpusched"]["job_id"])["state"] == "cancelled"
    queue = hub.service("GET", "api/queue", hub.token("admin")).json()
    assert queue["pending"] == 0, queue


def test_a_servers_token_for_the_scheduler_is_an_admins_only_for_an_admin(hub):
    """The service takes admin rights from the token's scopes: an admin's server (its Lab
    panel edits the reaper settings) gets a token with the admin scope, a user's does not."""
    for user, admin in (("admin", True), ("bob", False)):
        start_server(hub, user, "gpu-1")
        token = server_env(hub, user)["GPUSCHED_SERVICE_TOKEN"]
        me = hub.service("GET", "api/me", token)
        assert me.status_code == 200, me.text
        assert (me.json()["name"], me.json()["admin"]) == (user, admin)
        stop_server(hub, user)
