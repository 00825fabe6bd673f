"""A ready JupyterHub config for the GPU scheduler: the demo hub of ``make demo`` and the hub
the tests start (``tests/hub_harness.py`` loads this file and adds to it).

    jupyterhub -f hub_config/jupyterhub_config.py

* The hub listens on http://127.0.0.1:8000 (``GPUSCHED_HUB_PORT``); its own API on 127.0.0.1:8081
  (``GPUSCHED_HUB_API_PORT``) and the proxy's API on 127.0.0.1:8001
  (``GPUSCHED_PROXY_API_PORT``). The proxy is configurable-http-proxy from ``./node_modules``
  (``make node_modules``; pinned in ``package.json``).
* State (the hub's SQLite database and cookie secret, the scheduler's database and job logs)
  lives in ``GPUSCHED_STATE_DIR`` (default ``./hub-state``): the scheduler's in ``STATE/gpusched``
  (0700, the service's alone), the hub's files 0600. STATE itself is 0700: the users' servers
  and jobs run in their own home directories and never enter it.
* Users alice, bob, carol and admin log in with any one shared password,
  ``GPUSCHED_DEMO_PASSWORD`` (default ``gpusched-demo``): DummyAuthenticator, for demos only.
  admin is a hub admin; alice and bob are in the group ``research``.
* The scheduler runs as the managed service ``gpusched`` at /services/gpusched/ (it listens on
  127.0.0.1:8765, ``GPUSCHED_SERVICE_PORT``) with ``hub_config/cluster.yaml`` and
  ``hub_config/queues.yaml``.
* Simulated GPUs (``GPUSCHED_GPU_BACKEND=simulated``): the loads kernels and jobs put on them
  are files in ``GPUSCHED_SIM_GPU_DIR``, by default ``STATE-sim-gpus`` beside the state directory:
  this hub's own, so that two demos on one host never see (or kill) each other's processes.
* The cluster, queue and policy files are ``hub_config/cluster.yaml``, ``hub_config/queues.yaml``
  and the documented policy defaults; ``GPUSCHED_CLUSTER_FILE``, ``GPUSCHED_QUEUE_FILE`` and
  ``GPUSCHED_POLICY_FILE`` choose others (the tests use a small cluster and short grace periods).
* Notebook servers: ``GPUSchedSpawner`` (``c.JupyterHub.spawner_class = "gpusched"``) with three
  profiles; every start asks the scheduler for GPUs and waits in its queue. A root hub (``make
  demo``) runs each server as the user's own Unix account, HOME their home directory; a hub user
  whose account is a system one (``root``, a uid below 1000: ``c.AccountPolicy``) gets no
  server. A hub that is not root runs them as its own user (``run_as_hub_user``), HOME in
  ``STATE/home/<user>``. Named servers are on; the hub leaves servers running when it stops
  (``cleanup_servers = False``) and finds them, with their allocations, when it starts again.
* ``GPUSCHED_DEMO_STOP_ALL=1`` (``make demo`` sets it): stopping the hub (Ctrl-C) stops what
  it started instead: the service cancels its pending and batch jobs and has the hub stop
  every notebook server, each with the reason "the demo stopped", one log line each
  (``GPUSchedService.cancel_jobs_at_exit``, service/exit_stop.py); ``cleanup_servers`` is on.
* Roles: every user may use the service (``access:services!service=gpusched`` added to the
  default ``user`` role); the custom scope ``custom:gpusched:admin`` (role ``gpusched-admin``,
  given to admin) makes a user an admin of the scheduler; the service itself may stop servers
  and post pre-emption notices to them (role ``gpusched-service``). See hub_config/README.md.
  ``hub_config/jupyterhub_config_production.py`` shows the settings of a production hub.

The hub runs the service as its own user. Run as root (``make demo``), the service runs each job
as the Unix user who submitted it, so alice, bob, carol and admin must exist on this host
(``scripts/demo-users.sh`` creates them).
"""

import os
import sys

from jupyter_gpusched.backends.gpu.simulated_loads import make_load_dir
from jupyter_gpusched.files import load_cluster
from jupyter_gpusched.hub.profiles import pass_idle_timeouts_to_service
from jupyter_gpusched.hub.singleuser_command import TERMINAL_ARGS, singleuser_command
from jupyter_gpusched.hub.stop_notice import TEMPLATE_DIR as HUB_TEMPLATES
from jupyter_gpusched.hub.stop_notice import stopped_servers

c = get_config()  # noqa: F821 (defined by traitlets when it loads this file)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STATE = os.path.abspath(os.environ.get("GPUSCHED_STATE_DIR") or "hub-state")
HUB_PORT = int(os.environ.get("GPUSCHED_HUB_PORT") or 8000)
HUB_API_PORT = int(os.environ.get("GPUSCHED_HUB_API_PORT") or 8081)
PROXY_API_PORT = int(os.environ.get("GPUSCHED_PROXY_API_PORT") or 8001)
SERVICE_PORT = int(os.environ.get("GPUSCHED_SERVICE_PORT") or 8765)
PASSWORD = os.environ.get("GPUSCHED_DEMO_PASSWORD") or "gpusched-demo"
CLUSTER_FILE = os.environ.get("GPUSCHED_CLUSTER_FILE") or os.path.join(HERE, "cluster.yaml")
CLUSTER = load_cluster(CLUSTER_FILE)  # read once: its nodes and GPU models are used below
QUEUE_FILE = os.environ.get("GPUSCHED_QUEUE_FILE") or os.path.join(HERE, "queues.yaml")
POLICY_FILE = os.environ.get("GPUSCHED_POLICY_FILE") or ""  # empty: the documented defaults
# make demo: Ctrl-C ends the demo's notebook servers and batch jobs too (see below)
DEMO_STOP_ALL = os.environ.get("GPUSCHED_DEMO_STOP_ALL", "") not in ("", "0")

SERVICE = "gpusched"
ADMIN_SCOPE = "custom:gpusched:admin"
ACCESS_SCOPE = f"access:services!service={SERVICE}"
DEMO_USERS = ["alice", "bob", "carol", "admin"]

SERVICE_STATE = os.path.join(STATE, SERVICE)  # the scheduler's database and job logs

os.makedirs(STATE, exist_ok=True)
# The state is the hub's and the service's alone (docs/security.md): servers run in their
# users' own home directories, so no user needs to enter STATE. The service makes
# STATE/gpusched 0700 at start; the hub's database is created 0600 here (SQLite takes an empty
# file as a new database).
os.chmod(STATE, 0o700)
os.close(os.open(os.path.join(STATE, "jupyterhub.sqlite"), os.O_CREAT | os.O_WRONLY, 0o600))
os.chmod(os.path.join(STATE, "jupyterhub.sqlite"), 0o600)
# The simulated GPUs' loads (docs/gpu.md): beside the state directory, not in it (the users'
# kernels write loads here). Made by the hub even with real GPUs (a kernel on the simulated
# fallback must not make it, and own it), writable by all with the sticky bit; a load counts
# only for a process of the file's owner.
SIM_GPU_DIR = os.path.abspath(os.environ.get("GPUSCHED_SIM_GPU_DIR") or f"{STATE}-sim-gpus")
make_load_dir(SIM_GPU_DIR)

# -- the hub and the proxy ----------------------------------------------------------------------
c.JupyterHub.bind_url = f"http://127.0.0.1:{HUB_PORT}"
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = HUB_API_PORT
c.JupyterHub.db_url = f"sqlite:///{STATE}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = os.path.join(STATE, "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = os.path.join(STATE, "jupyterhub.pid")
c.ConfigurableHTTPProxy.command = [
    os.path.join(ROOT, "node_modules", ".bin", "configurable-http-proxy")
]
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{PROXY_API_PORT}"
c.ConfigurableHTTPProxy.pid_file = os.path.join(STATE, "jupyterhub-proxy.pid")

# -- who may log in ------------------------------------------------------------------------------
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = PASSWORD
c.Authenticator.allowed_users = set(DEMO_USERS)
c.Authenticator.admin_users = {"admin"}
c.JupyterHub.load_groups = {"research": {"users": ["alice", "bob"]}}

# After login users land on the hub's home page (its Services menu links to the scheduler; its
# "Start My Server" button leads to the profile form), not straight into a spawn.
c.JupyterHub.default_url = "/hub/home"
# The hub's pages, changed in two ways: "Stop Server" on a start waiting in the GPU queue leads
# back to the home page (spawn_pending.html); the home page (and its "Server
# not running" page) says when and why the idle reaper stopped a server of the user's
# (jupyter_gpusched/hub/stop_notice.py; templates that extend JupyterHub's own).
c.JupyterHub.template_paths = [HUB_TEMPLATES]  # jupyter_gpusched/hub/templates/
c.JupyterHub.template_vars = {"gpusched_stopped": stopped_servers}


# -- the scheduler service -----------------------------------------------------------------------
# Jobs run as their Unix users; the launcher finds an interpreter each user can run (this one,
# or the system python3 with this checkout on PYTHONPATH: see LocalLauncher.python).
# GPUSCHED_JOB_PYTHON chooses one explicitly.
launcher_args = []
if os.environ.get("GPUSCHED_JOB_PYTHON"):
    launcher_args.append(f"--LocalLauncher.python={os.environ['GPUSCHED_JOB_PYTHON']}")
# The GPU telemetry's choice (docs/gpu.md), for the service, the servers' GPU monitor and the
# jobs (LocalLauncher passes on only the variables of its env_keep).
GPU_ENV = {
    **{
        name: os.environ[name]
        for name in ("GPUSCHED_GPU_BACKEND", "GPUSCHED_SIM_CLUSTER")
        if os.environ.get(name)
    },
    "GPUSCHED_SIM_GPU_DIR": SIM_GPU_DIR,
}
launcher_args += [f"--LocalLauncher.env_keep={name}" for name in ("PATH", "LANG", *GPU_ENV)]
service_env = {
    # The hub passes its own environment on to services only through `environment`.
    "PATH": os.environ.get("PATH", os.defpath),
    "LANG": os.environ.get("LANG", "C.UTF-8"),
    **GPU_ENV,
}
rogue_args = []
if os.environ.get("GPUSCHED_GPU_BACKEND") == "simulated":
    # Every simulated node lives on this machine: the service checks all of them for rogue GPU
    # processes (docs/service.md), in this hub's own load folder only. With real GPUs it checks
    # the node named like this host.
    rogue_args = [f"--GPUSchedService.local_gpu_nodes={node.name}" for node in CLUSTER.nodes]
# GPUSCHED_DEMO_STOP_ALL=1 (make demo): at the hub's stop the service, which the hub stops
# first, ends the servers (through the hub, still up) and the jobs, saying why
# (service/exit_stop.py).
stop_all_args = (
    [
        "--GPUSchedService.cancel_jobs_at_exit=True",
        "--GPUSchedService.exit_reason=the demo stopped (Ctrl-C on make demo)",
    ]
    if DEMO_STOP_ALL
    else []
)
c.JupyterHub.services = [
    {
        "name": SERVICE,
        "url": f"http://127.0.0.1:{SERVICE_PORT}",
        "command": [
            sys.executable,
            "-m",
            "jupyter_gpusched",
            "serve",
            f"--cluster={CLUSTER_FILE}",
            f"--queues={QUEUE_FILE}",
            *([f"--policy-file={POLICY_FILE}"] if POLICY_FILE else []),
            # pre-emption notices reach notebook servers through the proxy
            f"--GPUSchedService.proxy_url=http://127.0.0.1:{HUB_PORT}",
            f"--db=sqlite:///{SERVICE_STATE}/gpusched.sqlite",
            f"--log-dir={SERVICE_STATE}/logs",
            *launcher_args,
            *rogue_args,
            *stop_all_args,
        ],
        "cwd": STATE,
        "environment": service_env,
        "display": True,
        "info": {"description": "GPU scheduler: queue, jobs, quotas"},
        # Users reaching the service in a browser log in without a confirmation page; their
        # browser session may carry the admin scope (only users who hold it get it).
        "oauth_no_confirm": True,
        "oauth_client_allowed_scopes": [ADMIN_SCOPE],
    }
]

# -- notebook servers: GPUSchedSpawner -----------------------------------------------------------
# Every start asks the scheduler service for GPUs (as the user), waits in its queue while the spawn
# page shows the position, the reason and the ETA, then starts jupyterhub-singleuser with
# CUDA_VISIBLE_DEVICES set to the allocated GPUs. See jupyter_gpusched/hub/spawner.py.
c.JupyterHub.spawner_class = "gpusched"
# The cluster's GPU models (hub_config/cluster.yaml: H100 and L40S; the demo's: H100 only): a
# profile offers only models that exist, so no start is refused for a model the cluster lacks.
CLUSTER_MODELS = CLUSTER.gpu_models
c.GPUSchedSpawner.profiles = [
    {
        "display_name": "1 GPU (tier 2)",
        "slug": "gpu-1",
        "description": "One GPU for interactive work",
        "tier": 2,
        "gpus": 1,
        "gpu_models": CLUSTER_MODELS,  # the user picks one, or takes any of them
        "idle_timeout": "1h",  # GPUs idle this long: warned, then stopped by the reaper
        "max_lifetime": "8h",  # the job's walltime: the server is stopped after it
        "default": True,
    },
    {
        "display_name": "4 GPUs (tier 2)",
        "slug": "gpu-4",
        "description": "Four NVLink-connected H100 for the research group",
        "tier": 2,
        "gpus": 4,
        "gpu_models": ["H100"],
        "groups": ["research"],  # only members of these hub groups see and may use it
        "idle_timeout": "30m",
        "max_lifetime": "4h",
    },
    {
        "display_name": "2 GPUs opportunistic (tier 3)",
        "slug": "gpu-2-opportunistic",
        "description": "Idle GPUs at no cost to your quota's guarantee; may be pre-empted "
        "(with a notice in the server, then stopped after the grace period)",
        "tier": 3,
        "gpus": 2,
        "idle_timeout": "30m",
        "max_lifetime": "12h",
    },
    {
        # No GPU: the scheduler places it by its CPUs and memory (queues may limit those), and
        # the reaper stops it after idle_timeout without activity the hub recorded (requests
        # through the proxy, kernel activity), as jupyterhub-idle-culler would.
        "display_name": "CPU only (no GPU)",
        "slug": "cpu-only",
        "description": "Two CPUs and 4 GB for notebooks that need no GPU",
        "tier": 2,
        "gpus": 0,
        "cpus": 2,
        "memory_gb": 4,
        "idle_timeout": "30m",
        "max_lifetime": "8h",
    },
]
# The hub reads each server's last activity from the proxy every minute (JupyterHub's default
# is 5 min): the reaper judges CPU-only servers by it (service/hub_activity.py).
c.JupyterHub.last_activity_interval = 60
# Queued starts wait at most this long; then the request leaves the queue with a message.
# JupyterHub's own start timeout is raised to this plus Spawner.start_timeout for each start.
c.GPUSchedSpawner.max_queue_wait = 30 * 60
# As root (make demo, the tests) every server runs as the user's own Unix account, HOME their
# home (scripts/demo-users.sh creates them); never as root: run_as_hub_user is refused for a
# root hub. A hub that is not root (a laptop) runs them as its own user, HOME in STATE/home.
c.GPUSchedSpawner.run_as_hub_user = os.geteuid() != 0
c.GPUSchedSpawner.home_dir_template = os.path.join(STATE, "home", "{username}")
# The single-user server of this virtual environment, whatever PATH the hub was started with,
# in a way its users can run (a system python3 when this one lives under /root: see
# jupyter_gpusched/hub/singleuser_command.py).
# Its terminals keep that PATH (`jupyter gpusched queue` in a terminal): the user's shell, not a
# login shell, whose /etc/profile would set PATH anew (singleuser_command.TERMINAL_ARGS; part of
# the command, so that a config setting c.Spawner.args keeps it).
SERVER_CMD, SERVER_ENV = singleuser_command()
c.Spawner.cmd = [*SERVER_CMD, *TERMINAL_ARGS]
c.Spawner.default_url = "/lab"  # JupyterLab, with the GPU panel (labextension/)
# The servers' GPU monitor chooses its telemetry from GPU_ENV (docs/gpu.md); the hub passes its
# own environment on to servers only through `environment`.
c.Spawner.environment = {**SERVER_ENV, **GPU_ENV}
c.JupyterHub.allow_named_servers = True  # several GPU servers per user, within their quota
c.JupyterHub.named_server_limit_per_user = 4
# A hub restart keeps running servers and their allocations (the default stops them all). The
# demo (GPUSCHED_DEMO_STOP_ALL=1) stops them: the service has by then (above); the hub stops any
# it could not.
c.JupyterHub.cleanup_servers = DEMO_STOP_ALL
# The profiles' idle_timeout is what the idle reaper applies to their servers: passed to the
# service here (GPUSchedService.profile_idle_timeouts). A config that changes the profiles
# later calls this again.
pass_idle_timeouts_to_service(c)

# -- scopes and roles ----------------------------------------------------------------------------
c.JupyterHub.custom_scopes = {
    ADMIN_SCOPE: {
        "description": "Administer the GPU scheduler: quotas, node drains and maintenance, "
        "holds and priorities, everybody's jobs.",
    },
}
c.JupyterHub.load_roles = [
    {
        # JupyterHub's default `user` role is ["self"]; keep it, and let users use the service.
        "name": "user",
        "description": "Standard user privileges, and the GPU scheduler",
        "scopes": ["self", ACCESS_SCOPE],
    },
    {
        "name": "gpusched-admin",
        "description": "Administer the GPU scheduler",
        "scopes": [ADMIN_SCOPE, ACCESS_SCOPE],
        "users": ["admin"],
    },
    {
        # The service stops pre-empted notebook servers through the hub API (servers), posts the
        # pre-emption notice to the server first (access:servers: single-user servers accept its
        # token), finds the server's URL (read:users), and reads the servers' last_activity for
        # reaping CPU-only servers (list:users; read:users:activity and read:servers are in
        # read:users and servers), as jupyterhub-idle-culler does.
        "name": "gpusched-service",
        "description": "The GPU scheduler service: pre-empts notebook servers",
        "scopes": ["servers", "access:servers", "read:users", "list:users"],
        "services": [SERVICE],
    },
]
