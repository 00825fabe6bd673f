"""The Slurm launch backend: the service decides where a batch job runs, Slurm runs it there.

:class:`SlurmLauncher` carries out a placement of the engine (``LaunchSpec.nodes``: node names
and GPU counts) as one Slurm batch job, and adds no scheduling of its own:

* **Pinned.** ``sbatch --nodelist=<the engine's nodes> --nodes=<k> --ntasks-per-node=1
  --gres=gpu:<n>``; a gang whose nodes hold different GPU counts becomes a heterogeneous job
  (one component per node: ``-N1 -w n1 --gres=gpu:3 : -N1 -w n2 --gres=gpu:1``). The job
  script runs the command once per node with ``srun`` (one task per node), so each task sees
  the GPUs Slurm bound to it in ``CUDA_VISIBLE_DEVICES`` (Slurm, not the engine, picks *which*
  GPUs of a node: the count per node is the engine's, the indices are Slurm's; every task's
  line in the log says which it got). A notebook (``spec.notebook``) runs once, on the first
  node, with nbclient: ``python -m jupyter_gpusched.backends.slurm.launcher notebook IN OUT``.
* **Not requeued by Slurm** (``--no-requeue``): the engine requeues (after a pre-emption, or
  when a node goes down).
* **Named** ``gpusched-<job id>``; the name is checked whenever the job is looked up, so a
  Slurm job id reused after a reset of slurmctld's state is not taken for ours.
* **Output** appended to the job's log (``--output``, ``--open-mode=append``): the log
  directory must be on a file system the compute nodes share, at the same path.
* **Environment.** ``sbatch --export=NONE``: the job starts from the user's login environment on
  the node (as Slurm builds it), not the service's; the job script then sets
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and the spec's variables (the request's ``env`` and
  GPUSCHED_*), and runs ``srun --export=ALL``.
* **Accounts.** When the service runs as root, ``sbatch`` runs as the submitting hub user (their
  uid, gid and groups; so munge vouches for them and the job is theirs in Slurm), if
  :class:`~jupyter_gpusched.backends.accounts.AccountPolicy` allows that account (checked at submit,
  a 403, and at launch, a :class:`LaunchError`: never root, a system account or an unknown
  user). Not root, or ``run_as_submitting_user = False``: jobs are the service user's (the
  deny list still refuses the hub names in it).
* **Working directory.** ``--chdir`` (default: the account's home directory on this host), and
  the job script enters it again (``cd``) before ``srun``: both run on the node, as the user, so
  a directory the user cannot enter there fails the job with a line in its log instead of
  running it in Slurm's fallback ``/tmp``. The nodes may not share this host's file systems, so
  the service does not check the directory at submit.
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

**State.** :meth:`poll` and :meth:`alive` read ``squeue --states=all`` once for every job the
launcher is watching (cached for ``state_cache`` seconds, so one poll of the service costs
one ``squeue``), and, for a job that ended, its exit code from ``scontrol show job`` (which keeps
finished jobs for ``MinJobAge``, 300 s by default: set it above the service's longest expected
downtime, or run slurmdbd) and, when slurmctld has forgotten the job, from ``sacct`` (which needs
slurmdbd; without it the outcome is ``lost``). A job that is COMPLETING still runs here: its
GPUs are free for Slurm only when it has gone. Slurm's end states map to :class:`Exit`:

===================  =====================================================
COMPLETED            completed, exit code 0
FAILED               failed, exit code N (killed, when ended by a signal)
OUT_OF_MEMORY        failed ("out of memory")
CANCELLED            killed ("cancelled in Slurm")
TIMEOUT, DEADLINE    killed (Slurm's time limit)
PREEMPTED            killed (Slurm's own pre-emption: see docs/slurm.md)
NODE_FAIL, BOOT_FAIL lost (the node failed; see ``SlurmNodeSync``)
===================  =====================================================

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
import shlex
import subprocess
import sys
import time
import uuid

from traitlets import Bool, Float, Unicode

from ..accounts import JOB_PYTHON_ENV, AccountRefused
from ..local.launcher import Exit, Launcher, LaunchError, LaunchSpec, _open
from .commands import (
    SlurmCommandError,
    SlurmOptions,
    export_lines,
    is_active,
    read_squeue,
    run_slurm,
)
from .inventory import engine_state, parse_oneliner

#: Seconds a NODE_FAIL end is held back for the node sync (see poll) at most.
NODE_FAIL_WAIT = 60.0
#: Reasons for which Slurm will never start a pending job by itself.
HOPELESS_REASONS = {
    "BadConstraints",
    "InvalidAccount",
    "InvalidQOS",
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "DependencyNeverSatisfied",
}
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
        self._watched: set[str] = set()  # Slurm job ids whose state squeue is asked for
        self._states: dict[str, tuple[str, str, str]] = {}  # id -> (name, state, reason)
        self._read_at = -float("inf")
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

    def script(
        self, spec: LaunchSpec, nodes: list[tuple[str, list[int]]], run: str, cwd: str | None = None
    ) -> str:
        """The batch script: the working directory, environment, a header line, and srun."""
        lines = [
            "#!/bin/sh",
            f"# jupyter_gpusched job {spec.job_id} (launch {run}), on {_describe(nodes)}",
        ]
        if cwd is not None:  # as the user, on the node; Slurm's own --chdir falls back to /tmp
            where = shlex.quote(cwd)
            fail = f"echo '===== the job did not run: could not enter the directory' {where}"
            lines.append(f"cd -- {where} || {{ {fail}; exit 1; }}")
        lines.append("export CUDA_DEVICE_ORDER=PCI_BUS_ID")
        lines.append(f"export {JOB_PYTHON_ENV}={shlex.quote(self.python)}")
        try:
            lines += export_lines(spec.env)
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        lines.append(
            f'echo "===== $(date -u +%Y-%m-%dT%H:%M:%S+00:00) job {spec.job_id}: Slurm job '
            '$SLURM_JOB_ID on $SLURM_JOB_NODELIST as $(id -un)"'
        )
        srun = ["srun", "--export=ALL", "--kill-on-bad-exit=1"]
        uneven = len({len(gpus) for _, gpus in nodes}) > 1
        if spec.notebook is not None:
            srun += ["--het-group=0"] if uneven else []
            srun += ["--nodes=1", "--ntasks=1"]
            output = os.path.join(os.path.abspath(spec.log_dir), spec.job_id + ".out.ipynb")
            task = [self.python, "-m", "jupyter_gpusched.backends.slurm.launcher", "notebook"]
            task += [spec.notebook, output]
        else:
            if uneven:
                srun.append(f"--het-group=0-{len(nodes) - 1}")
            else:
                srun += [f"--nodes={len(nodes)}", "--ntasks-per-node=1"]
            header = 'echo "===== $SLURMD_NODENAME: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"'
            task = ["/bin/sh", "-c", header + '; exec /bin/sh -c "$1"', "sh", spec.command]
        lines.append("exec " + " ".join(shlex.quote(word) for word in srun + task))
        return "\n".join(lines) + "\n"

    def sbatch_args(self, spec: LaunchSpec, nodes, log: str, cwd: str) -> list[str]:
        """sbatch's options: common ones, then one component per node when the GPU counts
        differ (a heterogeneous job), else one for all."""
        common = [
            "sbatch",
            "--parsable",
            f"--job-name=gpusched-{spec.job_id}",
            f"--output={log}",
            "--open-mode=append",
            "--no-requeue",
            "--export=NONE",
            f"--chdir={cwd}",
        ]
        if self.account:
            common.append(f"--account={self.account}")
        common += list(self.extra_args)
        where = [f"--partition={self.partition}"] if self.partition else []
        counts = {len(gpus) for _, gpus in nodes}
        if len(counts) == 1:
            names = ",".join(name for name, _ in nodes)
            return (
                common
                + where
                + [
                    f"--nodes={len(nodes)}",
                    f"--nodelist={names}",
                    "--ntasks-per-node=1",
                    *gres(counts.pop()),
                ]
            )
        args = list(common)
        for i, (name, gpus) in enumerate(nodes):
            if i:
                args.append(":")
            args += [*where, "--nodes=1", f"--nodelist={name}", "--ntasks-per-node=1"]
            args += gres(len(gpus))
        return args

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
                header = f"===== {stamp} job {spec.job_id} to Slurm: {_describe(nodes)}"
                os.write(fd, f"{header}, as {run_as}\n".encode())
            finally:
                os.close(fd)
            done = self._run(argv, input=script, account=account, cwd="/")
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LaunchError(f"could not submit job {spec.job_id} to Slurm: {exc}") from exc
        if done.returncode != 0:
            why = " ".join((done.stderr or done.stdout).split()) or f"status {done.returncode}"
            _append(log, f"===== Slurm refused it: {why}\n")
            raise SlurmRefused(f"Slurm refused the placement ({_describe(nodes)}): {why}")
        slurm_id = done.stdout.strip().split(";")[0]
        if not slurm_id.isdigit():
            raise LaunchError(f"sbatch answered {done.stdout.strip()!r}, not a job id")
        self._watched.add(slurm_id)
        self._read_at = -float("inf")  # the next poll asks squeue again
        self.log.info(
            "Submitted job %s as %s to Slurm: job %s on %s",
            spec.job_id,
            run_as,
            slurm_id,
            _describe(nodes),
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
    def _refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._read_at < self.state_cache:
            return
        if not self._watched:
            self._states, self._read_at = {}, now
            return
        try:
            found = read_squeue(self._run, self._watched)
        except SlurmCommandError as exc:
            raise LaunchError(str(exc)) from None
        states = {job: (j.name, j.state, j.reason) for job, j in found.items()}
        self._states, self._read_at = states, now

    def _state(self, handle: dict, force: bool = False) -> tuple[str, str] | None:
        """(Slurm state, reason) of the handle's job, or None when squeue does not know it."""
        job = handle["slurm_job_id"]
        if job not in self._watched:
            self._watched.add(job)
            force = True
        self._refresh(force)
        found = self._states.get(job)
        if found is None or found[0] != handle["name"]:
            return None
        return found[1], found[2]

    def _scontrol_exit(self, handle: dict) -> tuple[str, Exit] | None:
        job = handle["slurm_job_id"]
        done = self._run(["scontrol", "show", "job", "--oneliner", job])
        if done.returncode != 0:
            return None
        records = [parse_oneliner(line) for line in done.stdout.splitlines() if line.strip()]
        records = [r for r in records if r.get("JobName") == handle["name"]]
        if not records or any(_active(r.get("JobState", "")) for r in records):
            return None
        return _worst([(r.get("JobState", ""), r.get("ExitCode", "0:0")) for r in records])

    def _sacct_exit(self, handle: dict) -> tuple[str, Exit] | None:
        job = handle["slurm_job_id"]
        try:
            fields = "--format=JobName,State,ExitCode"
            done = self._run(["sacct", "--noheader", "--parsable2", "-X", f"--jobs={job}", fields])
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode != 0:
            return None
        rows = [line.split("|") for line in done.stdout.splitlines() if line.count("|") == 2]
        rows = [(state.split()[0], code) for name, state, code in rows if name == handle["name"]]
        if not rows or any(_active(state) for state, _ in rows):
            return None
        return _worst(rows)

    def _ended(self, handle: dict) -> Exit:
        """How a job that left squeue's active states ended (scontrol, then sacct)."""
        job = handle["slurm_job_id"]
        found = self._scontrol_exit(handle) or self._sacct_exit(handle)
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
        if found is not None and _active(found[0]):
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
        self._watched.discard(job)
        self._node_fail.pop(job, None)
        self._cancelled.discard(job)
        return exit

    def _give_up(self, handle: dict, reason: str) -> Exit:
        job = handle["slurm_job_id"]
        self._scancel(job)
        self._watched.discard(job)
        if reason in HOPELESS_REASONS:
            return Exit(None, "refused", f"Slurm will not start it: {reason}")
        waited = self.pending_timeout
        return Exit(None, "refused", f"Slurm did not start it within {waited:g} s: {reason}")

    def alive(self, handle: dict) -> bool:
        try:
            found = self._state(handle, force=True)
        except (OSError, subprocess.TimeoutExpired, LaunchError):
            return True  # Slurm cannot say: do not give the job up
        return found is not None and _active(found[0])

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
        if found is None or not _active(found[0]):
            return
        self._scancel(handle["slurm_job_id"], f"--signal={name}")

    async def _wait(self, handle: dict, seconds: float) -> Exit | None:
        deadline = time.monotonic() + seconds
        while True:
            self._read_at = -float("inf")
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
        states = {}
        for line in done.stdout.splitlines():
            if not line.startswith("NodeName="):
                continue
            fields = parse_oneliner(line)
            reason = fields.get("Reason", "")
            states[fields["NodeName"]] = (engine_state(fields.get("State", "")), reason)
        self.node_reads += 1
        self.node_refresh_wanted = False
        return states


_active = is_active


def gres(gpus: int) -> list[str]:
    """sbatch's GPU request for ``gpus`` GPUs on a node: none for a CPU-only job."""
    return [f"--gres=gpu:{gpus}"] if gpus else []


def _describe(nodes) -> str:
    return ", ".join(f"{name}: {len(gpus)} GPU{'s' * (len(gpus) != 1)}" for name, gpus in nodes)


def _append(path: str, text: str) -> None:
    try:
        with open(path, "a") as file:
            file.write(text)
    except OSError:
        pass


def _exit_for(state: str, code_text: str) -> Exit:
    """Slurm's end state and ``ExitCode=code:signal`` -> Exit."""
    code, _, signum = code_text.partition(":")
    try:
        code_n, sig_n = int(code), int(signum or 0)
    except ValueError:
        code_n, sig_n = 0, 0
    state = state.split()[0] if state else ""
    if state == "COMPLETED":
        return Exit(0, "completed", "exit code 0")
    if state == "FAILED":
        if sig_n:
            return Exit(None, "killed", f"killed by {_signame(sig_n)}")
        return Exit(code_n, "failed", f"exit code {code_n}")
    if state == "OUT_OF_MEMORY":
        return Exit(code_n or None, "failed", "out of memory (Slurm: OUT_OF_MEMORY)")
    if state == "CANCELLED":
        return Exit(None, "killed", "cancelled in Slurm")
    if state in ("TIMEOUT", "DEADLINE"):
        return Exit(None, "killed", f"killed by Slurm at its time limit ({state})")
    if state == "PREEMPTED":
        return Exit(None, "killed", "pre-empted by Slurm's own scheduler")
    if state in ("NODE_FAIL", "BOOT_FAIL"):
        return Exit(None, "lost", f"a node of the job failed (Slurm: {state})")
    return Exit(None, "lost", f"Slurm says {state or 'nothing'}")


_SEVERITY = {"completed": 0, "failed": 1, "killed": 2, "lost": 3}


def _worst(rows: list[tuple[str, str]]) -> tuple[str, Exit]:
    """The end of a (heterogeneous) job: its worst component's."""
    ends = [(state.split()[0] if state else "", _exit_for(state, code)) for state, code in rows]
    return max(ends, key=lambda end: _SEVERITY[end[1].outcome])


def _signame(number: int) -> str:
    import signal as _signal

    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _notebook_main(argv: list[str]) -> int:
    """``python -m jupyter_gpusched.backends.slurm.launcher notebook IN OUT``: execute a notebook
    job's notebook (in a Slurm task) and save the executed copy; the exit status says how it
    went."""
    import shutil
    import signal as _signal
    import tempfile

    from ..local.runner import run_notebook

    if len(argv) != 3 or argv[0] != "notebook":
        print(
            "usage: python -m jupyter_gpusched.backends.slurm.launcher notebook IN OUT",
            file=sys.stderr,
        )
        return 2
    runtime = None
    if "JUPYTER_RUNTIME_DIR" not in os.environ:  # kernel connection files: private to the run
        runtime = os.environ["JUPYTER_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="gpusched-rt-")
    try:
        result = run_notebook(argv[1], argv[2])
    finally:
        if runtime is not None:
            shutil.rmtree(runtime, ignore_errors=True)
    if "signal" in result:
        _signal.signal(result["signal"], _signal.SIG_DFL)
        os.kill(os.getpid(), result["signal"])
    return int(result.get("code", 1))


if __name__ == "__main__":
    sys.exit(_notebook_main(sys.argv[1:]))
