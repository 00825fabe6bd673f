"""``jupyter-gpusched serve``: the scheduler service as a traitlets Application.

Run by JupyterHub as a managed service (see ``hub_config/jupyterhub_config.py``), it reads where
to listen and how to authenticate from the ``JUPYTERHUB_*`` environment the hub sets. Standalone,
give it ``--GPUSchedService.token_file`` and ``--GPUSchedService.bind_url``.

Policy settings live in the policy file (the schema ``replay --config`` reads); the traits here
only say where the files are and how the service runs.

The state is the service's alone (docs/security.md): at start the directory of a SQLite database
and ``log_dir`` are made 0700 where they are the service's (a log line says so when it changes a
mode), and the database file 0600 (``store.py``). Which accounts jobs run as is
``c.AccountPolicy`` (``jupyter_gpusched/backends/accounts.py``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import sys
from urllib.parse import urlparse

from tornado import web
from tornado.ioloop import PeriodicCallback
from traitlets import Bool, Dict, Float, Integer, Type, Unicode, default
from traitlets.config import Application

from ..backends.accounts import AccountPolicy
from ..backends.gpu.telemetry import BACKENDS, short_hostname
from ..backends.interface import Launcher
from ..backends.local.launcher import LocalLauncher
from ..core.errors import ConfigError
from ..core.quotas import QueueTree
from ..core.scheduler import Scheduler
from ..core.settings import PolicySettings
from ..files import load_cluster, load_policy, read_yaml
from . import gpu_sources
from .auth import HubAuthenticated, TokenFileAuth
from .exit_stop import stop_everything
from .expected_starts import ExpectedStarts, ExpectedStartSettings
from .gpu_sampling import GPUSampler, LocalSource, local_telemetries
from .gpu_sources import GPUSourceSettings
from .history import History, HistorySettings
from .hub_activity import HubActivity
from .hubclient import HubClient
from .live import LiveScheduler
from .metrics import Metrics
from .notebook_settings import NotebookServerSettings
from .profile_claims import profile_shapes
from .reaper import Reaper, trusted_backends, with_profile_idle_timeouts
from .recovery import recover
from .requests import MAX_BODY_BYTES, RequestError
from .rogue import RogueWatch
from .routes import web_app
from .store import Store, sqlite_file
from .utilization_record import UtilizationRecorder


# the settings of notebook servers: notebook_settings.py; of GPU sources: gpu_sources.py; of
# the history: history.py
class GPUSchedService(
    NotebookServerSettings, GPUSourceSettings, HistorySettings, ExpectedStartSettings, Application
):
    name = "jupyter-gpusched-serve"
    description = "The GPU scheduler service: queue, engine, launcher and REST API."
    # Configurables the service creates: listed so that --help-all shows them and config and
    # command line (--AccountPolicy.min_uid=...) reach them.
    classes = [AccountPolicy, LocalLauncher]  # noqa: RUF012 (traitlets reads the class attribute)

    config_file = Unicode(
        "", help="A Python config file (c.GPUSchedService.* = ...) to load at start."
    ).tag(config=True)
    cluster_file = Unicode(
        "cluster.yaml", help="The cluster file (nodes, GPUs, switches): see docs/files.md."
    ).tag(config=True)
    queue_file = Unicode(
        "", help="The queue (quota) file; empty: one queue guaranteeing the whole cluster."
    ).tag(config=True)
    policy_file = Unicode(
        "",
        help="The policy file (tiers, grace periods, fair share, backfill, reaper timeouts): "
        "the same schema `replay --config` reads. Empty: the documented defaults.",
    ).tag(config=True)
    policy = Unicode(
        "gpusched", help="The scheduling policy: gpusched, fifo, priority or slurm."
    ).tag(config=True)
    db_url = Unicode(
        "sqlite:///gpusched.sqlite",
        help="Where jobs, allocations, usage, settings and the audit log are kept "
        "(SQLAlchemy URL; postgresql+psycopg://... for PostgreSQL).",
    ).tag(config=True)
    launcher_class = Type(
        LocalLauncher,
        klass=Launcher,
        help="What runs batch jobs: LocalLauncher (this host, CUDA_VISIBLE_DEVICES) or a "
        "backend for many nodes.",
    ).tag(config=True)
    log_dir = Unicode(
        "gpusched-logs", help="Where job output goes: <log_dir>/<user>/<job id>.log."
    ).tag(config=True)
    bind_url = Unicode(
        help="Where to listen, e.g. http://127.0.0.1:8765/services/gpusched/. Default: "
        "$JUPYTERHUB_SERVICE_URL when run by the hub, else http://127.0.0.1:8765/."
    ).tag(config=True)
    token_file = Unicode(
        "",
        help="Standalone mode: a YAML file of API tokens (see jupyter_gpusched.service.auth). "
        "Empty: authenticate through JupyterHub.",
    ).tag(config=True)
    poll_interval = Float(
        1.0,
        help="Seconds between checks for exited processes and engine timers (pre-emption "
        "minimum run times, backfill passes, maintenance windows).",
    ).tag(config=True)
    default_tier = Integer(2, help="The tier of jobs that name none (1, 2 or 3).").tag(config=True)
    cancel_grace = Float(
        10.0, help="Seconds between the polite signal and SIGKILL when a job is cancelled."
    ).tag(config=True)
    gpu_hour_prices = Dict(
        {},
        help="Showback: price of one GPU-hour per GPU model, e.g. {'H100': 2.5}; api/usage "
        "?by=gpu_model then reports a cost.",
    ).tag(config=True)
    proxy_url = Unicode(
        help="The hub's public URL (its proxy), through which the service posts pre-emption "
        "notices to notebook servers. Default: $JUPYTERHUB_PUBLIC_URL, else "
        "http://127.0.0.1:8000.",
    ).tag(config=True)
    cancel_jobs_at_exit = Bool(
        False,
        help="""At SIGINT or SIGTERM, end everything the service runs before it exits: cancel
        pending jobs, ask the hub to stop every notebook server (its job ends cancelled once
        the server is gone) and cancel every batch job, each with exit_reason; a log line for
        each (service/exit_stop.py). For demos (make demo sets it, through
        GPUSCHED_DEMO_STOP_ALL=1). Off: running jobs and servers keep running and the next
        start re-adopts them.""",
    ).tag(config=True)
    exit_reason = Unicode(
        "the scheduler service stopped",
        help="With cancel_jobs_at_exit: why the jobs were cancelled, in their messages.",
    ).tag(config=True)
    exit_stop_timeout = Float(
        20.0,
        min=1.0,
        help="""With cancel_jobs_at_exit: the most seconds the service waits for its jobs and
        servers to end before it exits anyway (listing what it leaves). JupyterHub sends
        SIGTERM to a managed service 30 s after its SIGINT (interrupt_timeout): keep this
        well within it.""",
    ).tag(config=True)
    slurm_node_interval = Float(
        10.0,
        help="With the Slurm launcher: seconds between reads of Slurm's node states (DRAIN "
        "and DOWN in Slurm drain or down the node here).",
    ).tag(config=True)
    authenticate_metrics = Bool(
        True, help="Require a token for /metrics (turn off for an unauthenticated scraper)."
    ).tag(config=True)
    max_body_bytes = Integer(
        MAX_BODY_BYTES,
        min=1024,
        help="""The largest request body the service reads, in bytes. A larger one is refused
        with 413 before it is read (by its Content-Length, or as its chunks arrive), so that no
        request can make the service buffer, parse or store more than this: the largest real
        body, a queue document, is a few kilobytes.""",
    ).tag(config=True)

    aliases = {  # noqa: RUF012 (traitlets reads it as a class attribute)
        "config": "GPUSchedService.config_file",
        "cluster": "GPUSchedService.cluster_file",
        "queues": "GPUSchedService.queue_file",
        "policy-file": "GPUSchedService.policy_file",
        "db": "GPUSchedService.db_url",
        "bind-url": "GPUSchedService.bind_url",
        "token-file": "GPUSchedService.token_file",
        "log-dir": "GPUSchedService.log_dir",
    }

    @default("proxy_url")
    def _proxy_url_default(self):
        return os.environ.get("JUPYTERHUB_PUBLIC_URL") or "http://127.0.0.1:8000"

    @default("bind_url")
    def _bind_url_default(self):
        return os.environ.get("JUPYTERHUB_SERVICE_URL") or "http://127.0.0.1:8765/"

    def initialize(self, argv=None):
        super().initialize(argv)
        if self.config_file:
            self.load_config_file(self.config_file)
            self.update_config(self.cli_config)
        self.live = self.build()

    def build(self) -> LiveScheduler:
        """Read the files (ConfigError names file, line and field), open the database,
        rebuild the queue from it, and return the live scheduler."""
        # everything that reads a file comes first, so that a bad one stops the start (exit
        # code 2) before the database is opened or a port is taken
        self.auth = (
            TokenFileAuth(parent=self, token_file=self.token_file)
            if self.token_file
            else HubAuthenticated(parent=self)
        )
        if self.gpu_backend not in BACKENDS:
            raise ConfigError(
                f"{self.gpu_backend!r} is not a GPU backend; expected one of {', '.join(BACKENDS)}",
                field="GPUSchedService.gpu_backend (or $GPUSCHED_GPU_BACKEND)",
            )
        cluster = load_cluster(self.cluster_file)
        document = read_yaml(self.queue_file) if self.queue_file else None
        tree = (
            QueueTree.from_dict(document, cluster.total_gpus, self.queue_file)
            if document is not None
            else None
        )
        settings = load_policy(self.policy_file) if self.policy_file else PolicySettings()
        try:  # checked here, before anything is opened: exit code 2 naming the profile
            with_profile_idle_timeouts({}, self.profile_idle_timeouts)
            profile_shapes(self.profile_shapes)
        except RequestError as exc:
            raise ConfigError(exc.message, source="GPUSchedService", field=exc.field) from None
        engine = Scheduler(cluster, tree, settings, self.policy)
        launcher = self.launcher_class(parent=self)
        if os.geteuid() == 0 and not launcher.run_as_submitting_user:
            self.log.warning(
                "jobs run as root: the service is root and run_as_submitting_user is False "
                "(docs/security.md)"
            )
        database = sqlite_file(self.db_url)
        if database is not None:
            self._private_dir(os.path.dirname(database), 0o700, "the database's directory")
        self._private_dir(os.path.abspath(self.log_dir), launcher.log_dir_mode, "the job logs")
        self.store = Store(self.db_url)
        self.metrics = Metrics()
        hub = HubClient.from_environment(self.proxy_url)
        slurm = launcher.reports_node_states  # a Slurm launcher: follow Slurm's nodes
        live = LiveScheduler(
            engine,
            self.store,
            launcher,
            log_dir=os.path.abspath(self.log_dir),
            default_tier=self.default_tier,
            cancel_grace=self.cancel_grace,
            metrics=self.metrics,
            hub=hub,
            server_stop_wait=self.notebook_stop_wait,
            quota_document=_plain(document),
            # where the service sees notebook servers' processes (service/server_stops.py)
            local_nodes=() if slurm else self._local_nodes(cluster),
        )
        self.metrics.live = live
        telemetries = self._telemetries(slurm, cluster)  # one each, for the two that sample
        sources = [LocalSource(telemetries), *gpu_sources.configured_sources(self, cluster)]
        backends = trusted_backends(self.gpu_backend)
        sampler = GPUSampler(live, sources, self.gpu_sample_interval, backends)
        # The second step, here only: each of these is given the live scheduler it reads
        live.attach(
            reaper=Reaper(
                live,
                _plain(settings.reaper),
                self.metrics,
                self.gpu_backend,
                profile_idle_timeouts=self.profile_idle_timeouts,
                sampler=sampler,
                profile_shapes=self.profile_shapes,
                recorder=UtilizationRecorder(self.store.engine, self.utilization_retention_days),
            ),
            hub_activity=None if hub is None else HubActivity(live, self.hub_activity_interval),
            node_sync=self._node_sync(live) if slurm else None,
            rogue_watch=self._rogue_watch(live, telemetries),
            history=History(live, self.history_interval, self.history_retention_days),
            expected_starts=ExpectedStarts(
                live, self.expected_start_interval, self.expected_start_max_ends
            ),
        )
        counts = recover(live)
        self.log.info("recovered from the database: %s", counts)
        return live

    def _private_dir(self, path: str, mode: int, what: str) -> None:
        """Create ``path`` with ``mode``, or give it that mode where it is ours (with a log line).
        A directory of another owner, or a shared one (sticky, like /tmp), is left alone, with a
        warning if it is more open: the service would not take it from its owner."""
        os.makedirs(path, mode=mode, exist_ok=True)
        info = os.stat(path)
        current = stat.S_IMODE(info.st_mode)
        if (current & 0o077) == (mode & 0o077):
            return
        if info.st_uid != os.geteuid() or current & stat.S_ISVTX:
            if not current & 0o077 & ~mode:  # closer than asked: not ours to open up
                return
            self.log.warning(
                "%s, %s, is open to others (%o) and not the service's own: give the service a "
                "directory of its own (docs/security.md)",
                what,
                path,
                current,
            )
            return
        os.chmod(path, mode)
        self.log.warning("%s, %s: mode set to %o (it was %o)", what, path, mode, current)

    def _local_nodes(self, cluster) -> list[str]:
        """local_gpu_nodes, or the node named like this host."""
        if self.local_gpu_nodes is not None:
            return list(self.local_gpu_nodes)
        host = short_hostname()
        return [host] if any(node.name == host for node in cluster.nodes) else []

    def _node_sync(self, live):
        from ..backends.slurm.inventory import SlurmNodeSync

        return SlurmNodeSync(live, interval=self.slurm_node_interval)

    def _telemetries(self, slurm: bool, cluster) -> dict:
        """Node name -> the service's telemetry of it, for local_gpu_nodes (none with Slurm:
        the GPU indices of Slurm jobs are Slurm's, not the engine's)."""
        if slurm:
            if self.local_gpu_nodes:
                self.log.warning(
                    "not sampling local GPUs (rogue processes, the reaper's samples): the GPU "
                    "indices of Slurm jobs are Slurm's, not the engine's"
                )
            return {}
        return local_telemetries(self._local_nodes(cluster), self.gpu_backend, cluster)

    def _rogue_watch(self, live, telemetries: dict) -> RogueWatch | None:
        if not telemetries:
            return None
        self.log.info("checking the GPUs of %s for rogue processes", ", ".join(telemetries))
        return RogueWatch(
            live,
            telemetries,
            self.rogue_check_interval,
            self.rogue_kill_grace,
            self.metrics,
            ignore=self.rogue_ignore_processes,
        )

    def make_app(self) -> web.Application:
        prefix = urlparse(self.bind_url).path or "/"
        prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", prefix)
        if not prefix.endswith("/"):
            prefix += "/"
        return web_app(
            prefix,
            self.auth,
            self.live,
            self.metrics,
            prices=dict(self.gpu_hour_prices),
            authenticate_metrics=self.authenticate_metrics,
            max_body_bytes=self.max_body_bytes,
        )

    async def serve(self) -> None:
        url = urlparse(self.bind_url)
        app = self.make_app()
        # the API handlers count their bodies themselves (a JSON 413); this bounds the others
        server = app.listen(
            url.port or 80, address=url.hostname or "127.0.0.1", max_body_size=self.max_body_bytes
        )
        poller = PeriodicCallback(self.live.poll, self.poll_interval * 1000)
        poller.start()
        self.log.info("jupyter-gpusched serving on %s", self.bind_url)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        if self.cancel_jobs_at_exit:  # while the API still answers: spawners release here
            await stop_everything(self.live, self.exit_reason, self.exit_stop_timeout)
        poller.stop()
        self.live.close()
        server.stop()
        self.store.close()
        if not self.cancel_jobs_at_exit:
            self.log.info("stopped; running jobs keep running and are re-attached at next start")

    def start(self):
        asyncio.run(self.serve())


def _plain(value):
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def main(argv=None) -> int:
    """Entry point of ``jupyter-gpusched serve``; exit code 2 for a bad file."""
    try:
        app = GPUSchedService.instance()
        app.initialize(argv)
    except ConfigError as exc:
        print(f"jupyter-gpusched serve: error: {exc}", file=sys.stderr)
        return 2
    app.start()
    return 0
