"""Launch backends: how the service carries out "run job J on these GPUs" on a host.

The service decides *where* a job runs; a :class:`Launcher` only starts it, watches it and stops
it. ``start`` returns a *handle*, a small JSON-serialisable dict that the service stores in its
database; every other method takes that handle, so a launcher created after a service restart
can pick up the jobs its predecessor started.

This module is that interface, the one every backend implements and the service drives
(:class:`Launcher`, what it is given, :class:`LaunchSpec`, what it answers, :class:`Exit` and
:class:`LaunchError`), apart from the backends themselves: the local one
(:mod:`jupyter_gpusched.backends.local.launcher`) and Slurm's
(:mod:`jupyter_gpusched.backends.slurm.launcher`).
"""

from __future__ import annotations

import pwd
from dataclasses import dataclass

from traitlets import Instance, default
from traitlets.config import LoggingConfigurable

from .accounts import AccountPolicy, submitting_account


class LaunchError(Exception):
    """A job could not be started; ``message`` says why, for the user. ``requeue`` is true
    when the backend refused the placement rather than the job (e.g. Slurm does not know the
    node): the service then puts the job back to pending and retries it after a back-off."""

    requeue = False

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


@dataclass
class LaunchSpec:
    """What to run, for whom, on which local GPUs, and where its log goes."""

    job_id: str
    user: str  # the hub user who submitted it
    command: str | None  # a shell command (run with /bin/sh -c), or
    notebook: str | None  # a notebook path (relative: to cwd), run by nbclient; one of the two
    gpus: list[int]  # local GPU indices -> CUDA_VISIBLE_DEVICES="0,3"; [] -> ""
    env: dict[str, str]  # user-supplied environment, plus GPUSCHED_* set by the service
    cwd: str | None  # working directory (None: the home directory of the user it runs as)
    log_dir: str  # where the log (and the executed notebook) go; created if missing
    # The whole placement, node by node: [(node name, its GPU indices), ...] in the engine's
    # order. Multi-node backends (Slurm) need it; LocalLauncher uses ``gpus`` (the first node).
    nodes: list[tuple[str, list[int]]] | None = None


@dataclass
class Exit:
    """How a job ended."""

    code: int | None  # exit status, None when unknown (also when ended by a signal)
    outcome: str  # "completed" | "failed" | "killed" | "lost" | "refused" (never started:
    # the backend would not run the placement; the engine requeues the job after a back-off)
    message: str  # one line for humans, e.g. "exit code 3", "killed by SIGKILL"


class Launcher(LoggingConfigurable):
    """The interface the service drives. Handles are plain dicts; see :class:`LocalLauncher`."""

    #: The log directory's mode (GPUSchedService sets it at start): the service's alone.
    log_dir_mode = 0o700

    # What a backend can do is declared here, and a backend that can more says so (the
    # service reads these; it never probes a launcher with hasattr):
    #: Jobs run as their hub user's account (a Bool trait where a backend can do it).
    run_as_submitting_user = False
    #: The backend knows the nodes' states (Slurm's), and the service follows them:
    #: :meth:`node_states` is implemented (service/slurm.py), ``node_refresh_wanted`` is set
    #: when a launch found them changed.
    reports_node_states = False
    node_refresh_wanted = False

    def node_states(self) -> dict[str, tuple[str | None, str]]:
        """``{node: (state or None, reason)}`` as the backend sees them (see
        :attr:`reports_node_states`)."""
        raise NotImplementedError(f"{type(self).__name__} does not report node states")

    account_policy = Instance(
        AccountPolicy,
        help="Which accounts jobs may run as (configured as c.AccountPolicy.*).",
    )

    @default("account_policy")
    def _account_policy_default(self):
        return AccountPolicy(parent=self)

    def job_account(self, user: str) -> pwd.struct_passwd | None:
        """The account jobs of hub user ``user`` run as (None: the service's own), or
        :class:`~jupyter_gpusched.backends.accounts.AccountRefused` saying why none may. Asked at
        submit and at every launch."""
        return submitting_account(user, self.run_as_submitting_user, self.account_policy)

    def cwd_problem(self, account: pwd.struct_passwd | None, cwd: str) -> str | None:
        """Why a job of ``account`` (None: the service's) could not enter ``cwd``, checked at
        submit; None when it can, or when this backend cannot tell here (Slurm: the node
        enters it, as the user)."""
        return None

    def notebook_problem(
        self, account: pwd.struct_passwd | None, cwd: str | None, notebook: str
    ) -> str | None:
        """Why a notebook job of ``account`` could not read ``notebook`` (relative: to ``cwd``,
        None: the job's default directory), checked at submit; None when it can, or when this
        backend cannot tell here."""
        return None

    def start(self, spec: LaunchSpec) -> dict:
        """Start the job; return its handle (JSON-serialisable). Raises :class:`LaunchError`."""
        raise NotImplementedError

    def poll(self, handle: dict) -> Exit | None:
        """How the job ended, or None while it runs. Never blocks."""
        raise NotImplementedError

    def signal(self, handle: dict, signame: str) -> None:
        """Send ``signame`` (e.g. ``"SIGTERM"``) to every process of the job."""
        raise NotImplementedError

    async def stop(self, handle: dict, signame: str, grace: float) -> Exit:
        """Send ``signame``, wait up to ``grace`` seconds, then SIGKILL; return how it ended."""
        raise NotImplementedError

    def alive(self, handle: dict) -> bool:
        """Is the job's work still running (checked by identity, not just by PID)?"""
        raise NotImplementedError

    def log_path(self, handle: dict) -> str:
        """The job's log file."""
        raise NotImplementedError
