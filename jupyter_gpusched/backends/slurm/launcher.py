"""The Slurm launch backend: the service decides where a batch job runs, Slurm runs it there.

:class:`SlurmLauncher` carries out a placement of the engine (``LaunchSpec.nodes``: node names
and GPU counts) as one Slurm batch job, and adds no scheduling of its own:

* **Pinned.** ``sbatch --nodelist=<the engine's nodes>``, a GPU count per node, one task per
  node (a heterogeneous job when the counts differ); the job script and sbatch's options are
  built in :mod:`.batch` (which says how), the notebook task is :mod:`.notebook_task`.
* **Not requeued by Slurm** (``--no-requeue``): the engine requeues (after a pre-emption, or
  when a node goes down).
* **Named** ``gpusched-<job id>``; the name is checked whenever the job is looked up, so a
  Slurm job id reused after a reset of slurmctld's state is not taken for ours.
* **Output** appended to the job's log (``--output``, ``--open-mode=append``): the log
  directory must be on a file system the compute nodes share, at the same path.
* **Accounts.** When the service runs as root, ``sbatch`` runs as the submitting hub user (their
  uid, gid and groups; so munge vouches for them and the job is theirs in Slurm), if
  :class:`~jupyter_gpusched.backends.accounts.AccountPolicy` allows that account (checked at submit,
  a 403, and at launch, a :class:`LaunchError`: never root, a system account or an unknown
  user). Not root, or ``run_as_submitting_user = False``: jobs are the service user's (the
  deny list still refuses the hub names in it).
* **Working directory.** ``--chdir`` (default: the account's home directory on this host),
  entered again by the job script on the node, as the user (see :mod:`.batch`). The nodes may
  not share this host's file systems, so the service does not check the directory at submit.
* **Refusals.** When ``sbatch`` fails (a node Slurm does not know, more GPUs than the node has
  in Slurm, a partition the user may not use ...), :meth:`SlurmLauncher.start` raises
  :class:`SlurmRefused` (a :class:`LaunchError`) with Slurm's message. A job that Slurm
  accepts but keeps pending longer than ``pending_timeout`` (e.g. ``ReqNodeNotAvail``: a node
  Slurm reserved or drained) is cancelled and reported by :meth:`poll` as
  ``Exit(None, "refused", "Slurm did not start it ...: <reason>")``. Either way the service
  puts the job back to pending and retries it after a back-off (``core/retries.py``).

The handle: ``{"backend": "slurm", "cluster": ClusterName, "slurm_job_id": "123", "name":
"gpusched-j-000001", "job_id", "run", "user", "log", "nodes", "submitted"}``; it is all a
launcher needs after a restart of the service.

**State.** :meth:`poll` and :meth:`alive` read one ``squeue`` for every job the launcher
watches (:mod:`.squeue_watch`), and how a job that left it ended from ``scontrol show job``,
else ``sacct`` (:mod:`.ends`, which says how long Slurm keeps them). A job that is COMPLETING
still runs here: its GPUs are free for Slurm only when it has gone.

**Signals.** :meth:`signal` is ``scancel --signal=SIG JOBID``: the signal goes to every task of
the job's steps (the user's command on every node), not to the batch script, whose ``srun``
would turn a SIGTERM into a kill of the step (``--full`` would do just that, and the job's trap
would never run). :meth:`stop` sends the signal, waits the grace period, then ``scancel``s (Slurm
sends SIGCONT and SIGTERM, and SIGKILL after its ``KillWait``) and waits up to ``kill_wait``
for the job to be gone from the nodes.

Every Slurm command is run synchronously with ``command_timeout``; they take milliseconds
against a healthy slurmctld.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import pwd
import re
import subprocess
import sys
import time
import uuid

from traitlets import Bool, Float, Unicode

from ..accounts import AccountRefused
from ..interface import Exit, Launcher, LaunchError, LaunchSpec
from ..local.launcher import _open  # the log and record files, opened as the job's owner
from . import notebook_task
from .batch import batch_script, describe_nodes, sbatch_argv
from .commands import HOPELESS_REASONS, SlurmOptions, is_active, run_slurm
from .ends import sacct_end, scontrol_end
from .parse import node_states_of
from .squeue_watch import SqueueWatch

#: Seconds a NODE_FAIL end is held back for the node sync (see poll) at most.
NODE_FAIL_WAIT = 60.0
_NAME = re.compile(r"\w[\w.@+-]*")


class SlurmRefused(LaunchError):
    """Slurm would not take the job (``sbatch`` failed); ``message`` is Slurm's word for why.
    The placement was fine for the engine: the job should go back to pending, not fail."""

    requeue = True


class SlurmLauncher(Launcher, SlurmOptions):
    """Runs batch jobs as Slurm jobs on the nodes the engine chose (see the module docstring)."""

    reports_node_states = True  # sinfo: the service follows Slurm's node states

    run_as_submitting_user = Bool(
        True,
        help="When the service runs as root, submit each job as the hub user who submitted it "
        "(who must exist on this host and on the nodes). False: as the service's own user.",
    ).tag(config=True)

    python = Unicode(
        sys.executable,
        help="Python interpreter, on the nodes, with this package, nbclient and the kernels: "
        "runs notebook jobs, and is $GPUSCHED_PYTHON in every job (the notebook client's "
        "function= and %%gpujob jobs run it).",
    ).tag(config=True)

    state_cache = Float(
        0.5,
        help="Seconds a squeue answer is reused: the service polls every job each "
        "poll_interval, and one squeue serves them all.",
    ).tag(config=True)

    pending_timeout = Float(
        300.0,
        help="A job that Slurm keeps pending this long (seconds) after submission is "
        "cancelled and reported as lost, with Slurm's reason: the engine's placement is not "
        "being honoured (a Slurm reservation, a node Slurm drained, another scheduler's jobs).",
    ).tag(config=True)

    kill_wait = Float(
        60.0,
        help="Seconds stop() waits after scancel for Slurm to finish the job (Slurm's KillWait "
        "and epilog included) before it reports the job killed anyway.",
    ).tag(config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._squeue = SqueueWatch(self._run, lambda: self.state_cache)
        self._cluster: str | None = None
        self._cancelled: set[str] = set()  # ids we scancelled (to word their end)
        # id -> (node_reads, monotonic time) when first seen ended with NODE_FAIL
        self._node_fail: dict[str, tuple[int, float]] = {}
        self.node_reads = 0  # node_states() calls (see SlurmNodeSync)
        self.node_refresh_wanted = False

    # -- running Slurm's commands -------------------------------------------------------------
    def _run(self, argv: list[str], *, input: str | None = None, account=None, cwd=None):
        return run_slurm(
            argv,
            bin_dir=self.bin_dir,
            slurm_conf=self.slurm_conf,
            timeout=self.command_timeout,
            input=input,
            account=account,
            cwd=cwd,
        )

    def cluster_name(self) -> str | None:
        """Slurm's ClusterName (read once)."""
        if self._cluster is None:
            try:
                done = self._run(["scontrol", "show", "config"])
            except (OSError, subprocess.TimeoutExpired):
                return None
            match = re.search(r"^ClusterName\s*=\s*(\S+)", done.stdout, re.M)
            if done.returncode == 0 and match:
                self._cluster = match.group(1)
        return self._cluster

    # -- start --------------------------------------------------------------------------------
    def _account(self, user: str) -> pwd.struct_passwd | None:
        try:
            return self.job_account(user)
        except AccountRefused as exc:
            raise LaunchError(exc.message) from None

    #: The log directory's mode (see GPUSchedService): Slurm writes each log on the node, as the
    #: user, so its users must enter it (not list it) to reach their own directory in it.
    log_dir_mode = 0o711

    @staticmethod
    def _user_log_dir(path: str, account: pwd.struct_passwd | None) -> None:
        """``<log_dir>/<user>``: the user's alone (0700, theirs), for slurmd to write in as them."""
        os.makedirs(path, mode=0o700, exist_ok=True)
        if account is not None:
            os.chown(path, account.pw_uid, account.pw_gid)
        os.chmod(path, 0o700)

    def script(self, spec: LaunchSpec, nodes, run: str, cwd: str | None = None) -> str:
        return batch_script(spec, nodes, run, cwd, self.python)  # the job script: see .batch

    def sbatch_args(self, spec: LaunchSpec, nodes, log: str, cwd: str) -> list[str]:
        return sbatch_argv(spec, nodes, log, cwd, self)  # sbatch's options: see .batch

    def start(self, spec: LaunchSpec) -> dict:
        if (spec.command is None) == (spec.notebook is None):
            raise LaunchError(f"job {spec.job_id}: exactly one of command and notebook is needed")
        if not _NAME.fullmatch(spec.job_id):
            raise LaunchError(f"job id {spec.job_id!r} cannot name a log file")
        nodes = spec.nodes
        if not nodes:
            raise LaunchError(f"job {spec.job_id}: the Slurm launcher needs the placement's nodes")
        if len(nodes) > 1 and any(not gpus for _, gpus in nodes):  # (a CPU-only job: one node)
            raise LaunchError(f"job {spec.job_id}: a node of its placement has no GPU")
        account = self._account(spec.user)
        try:
            me = account or pwd.getpwuid(os.geteuid())
            home, run_as = me.pw_dir, me.pw_name
        except KeyError:
            home, run_as = "/", str(os.geteuid())
        cwd = spec.cwd or (home if os.path.isdir(home) else "/")
        base = os.path.join(os.path.abspath(spec.log_dir), spec.job_id)
        log = base + ".log"
        run = uuid.uuid4().hex
        script = self.script(spec, nodes, run, cwd)
        argv = self.sbatch_args(spec, nodes, log, cwd)
        stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        try:
            self._user_log_dir(spec.log_dir, account)
            fd = _open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, account)
            try:
                header = f"===== {stamp} job {spec.job_id} to Slurm: {describe_nodes(nodes)}"
                os.write(fd, f"{header}, as {run_as}\n".encode())
            finally:
                os.close(fd)
            done = self._run(argv, input=script, account=account, cwd="/")
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LaunchError(f"could not submit job {spec.job_id} to Slurm: {exc}") from exc
        if done.returncode != 0:
            why = " ".join((done.stderr or done.stdout).split()) or f"status {done.returncode}"
            _append(log, f"===== Slurm refused it: {why}\n")
            raise SlurmRefused(f"Slurm refused the placement ({describe_nodes(nodes)}): {why}")
        slurm_id = done.stdout.strip().split(";")[0]
        if not slurm_id.isdigit():
            raise LaunchError(f"sbatch answered {done.stdout.strip()!r}, not a job id")
        self._squeue.add(slurm_id)  # the next poll asks squeue again
        self.log.info(
            "Submitted job %s as %s to Slurm: job %s on %s",
            spec.job_id,
            run_as,
            slurm_id,
            describe_nodes(nodes),
        )
        return {
            "backend": "slurm",
            "cluster": self.cluster_name(),
            "slurm_job_id": slurm_id,
            "name": f"gpusched-{spec.job_id}",
            "job_id": spec.job_id,
            "run": run,
            "user": run_as,
            "log": log,
            "nodes": [[name, list(gpus)] for name, gpus in nodes],
            "submitted": time.time(),
        }

    # -- state --------------------------------------------------------------------------------
    def _state(self, handle: dict, force: bool = False) -> tuple[str, str] | None:
        """(Slurm state, reason) of the handle's job, or None when squeue does not know it."""
        return self._squeue.state(handle["slurm_job_id"], handle["name"], force)

    def _ended(self, handle: dict) -> Exit:
        """How a job that left squeue's active states ended (scontrol, then sacct)."""
        job = handle["slurm_job_id"]
        name = handle["name"]
        found = scontrol_end(self._run, job, name) or sacct_end(self._run, job, name)
        if found is None:
            return Exit(
                None,
                "lost",
                f"Slurm job {job} is gone and its end is unknown (no scontrol record after "
                f"MinJobAge, and no sacct)",
            )
        state, exit = found
        if state == "CANCELLED" and job in self._cancelled:
            exit = Exit(None, "killed", f"cancelled (Slurm job {job})")
        return exit

    def poll(self, handle: dict) -> Exit | None:
        cluster = handle.get("cluster")
        if cluster and self.cluster_name() and cluster != self.cluster_name():
            return Exit(None, "lost", f"submitted to Slurm cluster {cluster}, not this one")
        try:
            found = self._state(handle)
        except (OSError, subprocess.TimeoutExpired, LaunchError) as exc:
            self.log.warning(
                "cannot read the state of Slurm job %s: %s", handle["slurm_job_id"], exc
            )
            return None  # unknown: still running, as far as we can tell
        job = handle["slurm_job_id"]
        if found is not None and is_active(found[0]):
            if found[0] == "PENDING" and (
                found[1] in HOPELESS_REASONS
                or time.time() - handle["submitted"] > self.pending_timeout
            ):
                return self._give_up(handle, found[1])
            return None
        if found is not None and found[0] == "NODE_FAIL" and self.node_reads:
            # A node sync runs (SlurmNodeSync): let it read the node states first, so that it
            # downs the node and the engine requeues the job, instead of this failing it.
            reads, since = self._node_fail.setdefault(job, (self.node_reads, time.monotonic()))
            if self.node_reads <= reads and time.monotonic() - since < NODE_FAIL_WAIT:
                self.node_refresh_wanted = True
                return None
        try:
            exit = self._ended(handle)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.log.warning("cannot read how Slurm job %s ended: %s", job, exc)
            return None
        self._squeue.discard(job)
        self._node_fail.pop(job, None)
        self._cancelled.discard(job)
        return exit

    def _give_up(self, handle: dict, reason: str) -> Exit:
        job = handle["slurm_job_id"]
        self._scancel(job)
        self._squeue.discard(job)
        if reason in HOPELESS_REASONS:
            return Exit(None, "refused", f"Slurm will not start it: {reason}")
        waited = self.pending_timeout
        return Exit(None, "refused", f"Slurm did not start it within {waited:g} s: {reason}")

    def alive(self, handle: dict) -> bool:
        try:
            found = self._state(handle, force=True)
        except (OSError, subprocess.TimeoutExpired, LaunchError):
            return True  # Slurm cannot say: do not give the job up
        return found is not None and is_active(found[0])

    def log_path(self, handle: dict) -> str:
        return handle["log"]

    # -- signals ------------------------------------------------------------------------------
    def _scancel(self, job: str, *options: str) -> None:
        if not options:
            self._cancelled.add(job)
        try:
            done = self._run(["scancel", *options, job])
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.log.warning("scancel %s %s: %s", " ".join(options), job, exc)
            return
        if done.returncode != 0:
            self.log.warning("scancel %s %s: %s", " ".join(options), job, done.stderr.strip())

    def signal(self, handle: dict, signame: str) -> None:
        name = signame.upper().removeprefix("SIG")
        if name == "KILL":
            self._scancel(handle["slurm_job_id"])
            return
        found = self._state(handle, force=True)
        if found is None or not is_active(found[0]):
            return
        self._scancel(handle["slurm_job_id"], f"--signal={name}")

    async def _wait(self, handle: dict, seconds: float) -> Exit | None:
        deadline = time.monotonic() + seconds
        while True:
            self._squeue.stale()
            exit = self.poll(handle)
            if exit is not None:
                return exit
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            await asyncio.sleep(min(0.2, left))

    async def stop(self, handle: dict, signame: str, grace: float) -> Exit:
        exit = self.poll(handle)
        if exit is not None:
            return exit
        job = handle["slurm_job_id"]
        found = self._state(handle, force=True)
        if found is not None and found[0] != "PENDING" and grace > 0:
            self.signal(handle, signame)
            exit = await self._wait(handle, grace)
            if exit is not None:
                return exit
        self._scancel(job)
        exit = await self._wait(handle, self.kill_wait)
        return exit or Exit(None, "killed", f"scancel sent, but Slurm job {job} is still there")

    # -- nodes --------------------------------------------------------------------------------
    def node_states(self) -> dict[str, tuple[str | None, str]]:
        """Every Slurm node's state for the engine (``up``, ``drain``, ``down``, or None when
        unknown) and Slurm's reason: ``{"n1": ("drain", "disk full"), ...}``."""
        done = self._run(["scontrol", "show", "node", "--oneliner"])
        if done.returncode != 0:
            raise LaunchError(f"scontrol show node failed: {' '.join(done.stderr.split())}")
        states = node_states_of(done.stdout)
        self.node_reads += 1
        self.node_refresh_wanted = False
        return states


def _append(path: str, text: str) -> None:
    try:
        with open(path, "a") as file:
            file.write(text)
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(notebook_task.main(sys.argv[1:]))
