"""A production JupyterHub with the GPU scheduler: a commented reference, not run by the tests.

Copy it to /etc/jupyterhub/jupyterhub_config.py and change what is marked CHANGE. It differs
from the demo (``jupyterhub_config.py``) in what a shared, long-running hub needs:

* real users: an authenticator that checks passwords or an identity provider, hub admins and
  groups from there; single-user servers run as the users' own OS accounts (LocalProcessSpawner's
  way: the hub runs as root, or use sudospawner / a container or Slurm backend);
* PostgreSQL for the hub's database and for the scheduler's (several readers, backups);
* the real cluster: on a single GPU host ``nodes: discover`` in the cluster file reads this
  machine's GPUs, models, memory and NVLink domains from NVML (a list entry
  ``{discover: true, leaf: ..., labels: ...}`` completes what was discovered; see docs/files.md
  and docs/gpu.md); for several nodes the file lists them as they are (``nvidia-smi topo -m``
  on each shows the NVLink groups);
* TLS at the hub's public address, or at a reverse proxy in front of it;
* a policy file with the tiers' grace periods and the reaper's idle timeouts.
"""

import sys

from jupyter_gpusched.hub.profiles import pass_idle_timeouts_to_service
from jupyter_gpusched.hub.stop_notice import TEMPLATE_DIR as HUB_TEMPLATES
from jupyter_gpusched.hub.stop_notice import stopped_servers

c = get_config()  # noqa: F821 (defined by traitlets when it loads this file)

ETC = "/etc/gpusched"  # CHANGE: where cluster.yaml, queues.yaml and policy.yaml live
# /etc/gpusched/cluster.yaml on one GPU host, from NVML:
#     nodes: discover
SERVICE = "gpusched"
ACCESS_SCOPE = f"access:services!service={SERVICE}"
ADMIN_SCOPE = "custom:gpusched:admin"

# -- the hub ------------------------------------------------------------------------------------
c.JupyterHub.bind_url = "https://hub.example.org"  # CHANGE: the public address
# TLS: the hub (its proxy) terminates it with these files, or leave them out and terminate TLS
# at a reverse proxy (nginx, Traefik) that forwards to bind_url over http.
c.JupyterHub.ssl_cert = "/etc/jupyterhub/tls/fullchain.pem"
c.JupyterHub.ssl_key = "/etc/jupyterhub/tls/privkey.pem"
c.JupyterHub.hub_ip = "127.0.0.1"  # the hub's own API, behind the proxy
c.JupyterHub.db_url = "postgresql+psycopg://jupyterhub@db.example.org/jupyterhub"  # CHANGE
c.JupyterHub.cookie_secret_file = "/srv/jupyterhub/jupyterhub_cookie_secret"

# -- who may log in: real users ----------------------------------------------------------------
# PAM checks the host's passwords (the users must exist as OS accounts anyway: their servers run
# as them). With an identity provider use an OAuthenticator (GenericOAuthenticator, ...) and
# manage_groups so that its groups become hub groups (profiles and queues use them).
c.JupyterHub.authenticator_class = "pam"
c.Authenticator.allow_all = False
c.Authenticator.allowed_users = set()  # CHANGE, or allowed_groups / an OAuthenticator setting
c.Authenticator.admin_users = {"gpuadmin"}  # CHANGE
c.PAMAuthenticator.allowed_groups = {"gpu-users"}  # CHANGE: OS groups whose members may log in

# -- the scheduler service --------------------------------------------------------------------
c.JupyterHub.services = [
    {
        "name": SERVICE,
        "url": "http://127.0.0.1:8765",
        "command": [
            sys.executable,
            "-m",
            "jupyter_gpusched",
            "serve",
            f"--cluster={ETC}/cluster.yaml",
            f"--queues={ETC}/queues.yaml",
            f"--policy-file={ETC}/policy.yaml",
            # PostgreSQL (psycopg 3): the schema is created and upgraded at start (Alembic).
            "--db=postgresql+psycopg://gpusched@db.example.org/gpusched",  # CHANGE
            "--log-dir=/var/log/gpusched/jobs",
            # pre-emption notices reach notebook servers through the public address
            "--GPUSchedService.proxy_url=https://hub.example.org",  # CHANGE
            # GPU samples of the nodes other than this one (docs/gpu.md): the site's Prometheus
            # that scrapes their DCGM exporters, or `jupyter-gpusched node-agent` on each node
            # "--GPUSchedService.gpu_metrics_url=http://prometheus.example.org:9090",
            # "--GPUSchedService.node_agents=gpu1=http://10.0.0.11:9400/metrics",
        ],
        # The hub passes no environment on to services except what is listed here. The
        # database password comes from ~/.pgpass or PGPASSWORD (never in this file).
        "environment": {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},
        "oauth_no_confirm": True,
        "oauth_client_allowed_scopes": [ADMIN_SCOPE],
    }
]

# -- notebook servers --------------------------------------------------------------------------
c.JupyterHub.spawner_class = "gpusched"
# The hub's pages with the scheduler's changes (jupyter_gpusched/hub/templates/): the home page
# says when and why the idle reaper stopped a server; Stop Server on a queued start leads home.
c.JupyterHub.template_paths = [HUB_TEMPLATES]
c.JupyterHub.template_vars = {"gpusched_stopped": stopped_servers}
c.GPUSchedSpawner.profiles = [  # CHANGE: your GPU models, groups and limits
    {
        "display_name": "1 GPU (tier 2)",
        "slug": "gpu-1",
        "gpus": 1,
        "tier": 2,
        "gpu_models": ["H100", "L40S"],
        "idle_timeout": "1h",
        "max_lifetime": "8h",
        "default": True,
    },
    {
        "display_name": "4 GPUs (tier 2)",
        "slug": "gpu-4",
        "gpus": 4,
        "tier": 2,
        "gpu_models": ["H100"],
        "groups": ["research"],
        "idle_timeout": "30m",
        "max_lifetime": "4h",
    },
    {
        "display_name": "2 GPUs opportunistic (tier 3)",
        "slug": "gpu-2-opportunistic",
        "gpus": 2,
        "tier": 3,
        "idle_timeout": "30m",
        "max_lifetime": "12h",
    },
]
c.GPUSchedSpawner.max_queue_wait = 30 * 60
# run_as_hub_user stays False: each server runs as its user's OS account (setuid from a root
# hub), in their home directory, with their PATH. Their environment needs jupyterhub-singleuser
# and jupyter_gpusched (for the server extension that shows pre-emption notices).
c.Spawner.cmd = ["jupyterhub-singleuser"]
c.Spawner.default_url = "/lab"
c.JupyterHub.allow_named_servers = True
c.JupyterHub.named_server_limit_per_user = 4
c.JupyterHub.cleanup_servers = False  # a hub restart keeps servers and their allocations
c.JupyterHub.cleanup_proxy = True

# -- scopes and roles --------------------------------------------------------------------------
c.JupyterHub.custom_scopes = {
    ADMIN_SCOPE: {
        "description": "Administer the GPU scheduler: quotas, node drains and maintenance, "
        "holds and priorities, everybody's jobs.",
    },
}
c.JupyterHub.load_roles = [
    {
        "name": "user",
        "description": "Standard user privileges, and the GPU scheduler",
        "scopes": ["self", ACCESS_SCOPE],
    },
    {
        "name": "gpusched-admin",
        "description": "Administer the GPU scheduler",
        "scopes": [ADMIN_SCOPE, ACCESS_SCOPE],
        "groups": ["gpu-admins"],  # CHANGE
    },
    {
        "name": "gpusched-service",
        "description": "The GPU scheduler service: pre-empts notebook servers",
        "scopes": ["servers", "access:servers", "read:users", "list:users"],
        "services": [SERVICE],
    },
]

# The profiles' idle_timeout is what the idle reaper applies to their servers (and what the
# spawn form promises): passed to the service, after the profiles and the services above.
pass_idle_timeouts_to_service(c)
