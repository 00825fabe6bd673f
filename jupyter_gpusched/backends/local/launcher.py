"""The local launch backend: :class:`LocalLauncher` runs jobs on this host. The interface it
implements, :class:`~jupyter_gpusched.backends.interface.Launcher`, with its handles, is in
:mod:`jupyter_gpusched.backends.interface`; how a job ended, read back, in :mod:`.exits`.

How it runs them:

* Each job runs under :mod:`jupyter_gpusched.backends.local.supervisor`, started as the
  service's own user (root, where jobs run as their users) to lead a process group of its own,
  so ``signal`` and ``stop`` reach every process of the job. The supervisor starts
  :mod:`jupyter_gpusched.backends.local.runner` in that group as the job's user (the runner
  runs the command or notebook) and, once the runner is gone, writes how the job ended to an
  *exit record* (``<log_dir>/<job_id>.exit``) through a file descriptor the launcher opened;
  ``poll`` reads that record, which works even when the job is no longer the service's child
  (after a restart). The job's user can neither write the record nor kill the supervisor, so a
  job cannot say it ended while it runs on. If the supervisor vanished without a record, the
  outcome is ``"killed"`` when the launcher had sent SIGKILL, ``"lost"`` otherwise (what is
  left of its group is then killed). A job ends with its main process: the supervisor then
  SIGKILLs what is left of it (every descendant: those that left its group too, since it
  adopts the job's orphans), and ``stop`` returns only once the group is empty (or
  ``kill_wait`` has passed), so its GPUs are free.
* stdout and stderr go to ``<log_dir>/<job_id>.log``, appended to (a requeued job's runs follow
  one another), each run starting with a header line. A notebook job's executed copy is saved
  as ``<log_dir>/<job_id>.out.ipynb``.
* **Environment.** The service's environment is *not* passed on: a job gets only the variables
  named in :attr:`LocalLauncher.env_keep` (PATH and LANG by default), HOME, USER and LOGNAME of
  the account it runs as, ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (so that CUDA numbers GPUs as
  nvidia-smi does), the user-supplied ``spec.env`` (GPUSCHED_* included), and last
  ``CUDA_VISIBLE_DEVICES`` from ``spec.gpus`` (``""``: no GPU), which ``spec.env`` cannot
  override, and ``GPUSCHED_PYTHON``: the interpreter chosen for the job's account (below), which
  the notebook client's and ``%%gpujob``'s commands run.
* **Accounts.** When the service runs as root, a job runs as the Unix account named like the
  hub user who submitted it, as JupyterHub's LocalProcessSpawner does, but only an account that
  :class:`~jupyter_gpusched.backends.accounts.AccountPolicy` allows (``c.AccountPolicy.min_uid``,
  ``denied_users``): never root, a system account or an unknown user. :meth:`Launcher.job_account`
  is asked at submit (a refusal is a 403, nothing stored) and again at launch (a
  :class:`LaunchError`: the account may have changed meanwhile). When the service is not root,
  or :attr:`LocalLauncher.run_as_submitting_user` is False, jobs run as the service's own user;
  the deny list still refuses the hub users named in it. Either way the interpreter
  (:attr:`LocalLauncher.python`) with this package must be usable by that account. This is the
  one rule for a job's Python: :meth:`LocalLauncher._interpreter` (this interpreter if the account
  can import this package with it, else a system ``python3`` with this environment on
  ``PYTHONPATH``); it runs the runner and is what ``$GPUSCHED_PYTHON`` names in the job.
* **Working directory.** The runner starts in ``/`` and enters the working directory itself,
  with the job's uid, gids and groups (``Popen(cwd=...)`` would enter it as root, before the
  privileges are dropped): a directory the user cannot enter fails the job with a message saying
  so, before anything of it runs. At submit, :meth:`LocalLauncher.cwd_problem` tries the same as
  the user (``cd`` in a shell run with their ids), so a directory they cannot enter is a 400.
  The default is the account's home directory (``/`` where it has none).
* **Files.** The log directory is the launcher's, 0700: the user gets only the file descriptors
  of the files it creates there (the log as stdout and stderr, the executed notebook as
  ``--output-fd``), never a path they could open, and reads the log through the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import pwd
import re
import signal as _signal
import socket
import subprocess
import sys
import time
import uuid

import psutil
from traitlets import Bool, Float, List, Unicode

from ..accounts import (
    JOB_PYTHON_ENV,
    SYSTEM_PYTHONS,
    AccountRefused,
    cwd_problem_for,
    environment_pythonpath,
    notebook_problem_for,
    run_as_ids,
)

# The interface, also importable from here (the service and Slurm's launcher import it so)
from ..interface import Exit, Launcher, LaunchError, LaunchSpec
from .exits import exit_from_record, group_alive, signal_name, signal_number
from .supervisor import kill_descendants, spec_file, supervisor_command, supervisor_environment

#: A handle's create_time and the process's may differ by this much and still be the same process.
CREATE_TIME_TOLERANCE = 1e-2
#: Seconds a working directory that passed the check at submit is taken as passed (same user).
CWD_CHECK_TTL = 10.0


def _open(path: str, flags: int, owner: pwd.struct_passwd | None) -> int:
    """Open ``path`` (never through a symlink) and give it to ``owner``."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    if owner is not None:
        os.fchown(fd, owner.pw_uid, owner.pw_gid)
    return fd


def _can_import_runner(account: pwd.struct_passwd, python: str, env: dict) -> bool:
    probe = [python, "-c", "import jupyter_gpusched.backends.local.runner"]
    try:
        done = subprocess.run(
            probe,
            cwd="/",
            env={"PATH": os.defpath, **env},
            capture_output=True,
            timeout=60,
            **run_as_ids(account),
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


class LocalLauncher(Launcher):
    """Runs jobs as processes on this host (see the module docstring)."""

    run_as_submitting_user = Bool(
        True,
        help="When the service runs as root, run each job as the hub user who submitted it "
        "(who must exist on this host). False: jobs run as the service's own user.",
    ).tag(config=True)

    env_keep = List(
        Unicode(),
        default_value=["PATH", "LANG"],
        help="Variables copied from the service's environment into every job's; the rest of "
        "the service's environment is not passed on.",
    ).tag(config=True)

    python = Unicode(
        "",
        help="Python interpreter that runs the job wrapper "
        "(jupyter_gpusched.backends.local.runner) and, for notebooks, nbclient; it must be usable "
        "by the users jobs run as. Empty: this "
        "interpreter if the job's user can run it, else the system python3 with this "
        "installation on PYTHONPATH (a pyenv or /root install is not readable by others).",
    ).tag(config=True)

    kill_wait = Float(
        5.0,
        help="Seconds stop() waits after SIGKILL for the job wrapper to vanish, and then for "
        "the rest of the job's process group.",
    ).tag(config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._interpreters: dict[int | None, tuple[str, dict]] = {}  # uid -> (python, env)
        self._cwd_ok: dict[tuple[int | None, str], float] = {}  # (uid, cwd) -> when it passed
        self._children: dict[int, tuple[subprocess.Popen, float]] = {}  # not reaped yet
        self._ended: dict[int, tuple[float, int]] = {}  # reaped: pid -> (create_time, status)
        self._forget: set[int] = set()  # exit already reported: reap, keep no status
        self._sent: dict[tuple[int, float], set[int]] = {}  # (pid, create_time) -> signals

    def _interpreter(self, account: pwd.struct_passwd | None) -> tuple[str, dict]:
        """The interpreter for jobs of ``account`` and the environment it needs (cached)."""
        if self.python:
            return self.python, {}
        key = account.pw_uid if account is not None else None
        if key not in self._interpreters:
            choice = (sys.executable, {})
            if account is not None and not _can_import_runner(account, sys.executable, {}):
                extra = {"PYTHONPATH": environment_pythonpath()}
                for candidate in SYSTEM_PYTHONS:
                    if os.path.exists(candidate) and _can_import_runner(account, candidate, extra):
                        choice = (candidate, extra)
                        break
                else:
                    self.log.warning(
                        "user %s can run no Python that imports jupyter_gpusched; set "
                        "c.LocalLauncher.python",
                        account.pw_name,
                    )
            self._interpreters[key] = choice
        return self._interpreters[key]

    # -- start --------------------------------------------------------------------------------

    def _account(self, user: str) -> pwd.struct_passwd | None:
        try:
            return self.job_account(user)
        except AccountRefused as exc:
            raise LaunchError(exc.message) from None

    def cwd_problem(self, account: pwd.struct_passwd | None, cwd: str) -> str | None:
        # A check as the user costs a process (~5 ms, on the IO loop). A success is remembered
        # for CWD_CHECK_TTL: a directory closed meanwhile still fails the job at launch, where
        # the runner enters it as the user, so a stale "yes" admits nothing.
        key = (account.pw_uid if account is not None else None, cwd)
        now = time.monotonic()
        if now - self._cwd_ok.get(key, -CWD_CHECK_TTL) < CWD_CHECK_TTL:
            return None
        problem = cwd_problem_for(account, cwd)
        if problem is None:
            if len(self._cwd_ok) >= 4096:
                self._cwd_ok.clear()
            self._cwd_ok[key] = now
        return problem

    def notebook_problem(
        self, account: pwd.struct_passwd | None, cwd: str | None, notebook: str
    ) -> str | None:
        # (not remembered: a notebook is written just before it is submitted, often)
        return notebook_problem_for(account, cwd or self._home(account), notebook)

    @staticmethod
    def _home(account: pwd.struct_passwd | None) -> str:
        """Where a job without a working directory runs: its account's home, else ``/``."""
        try:
            home = (account or pwd.getpwuid(os.geteuid())).pw_dir
        except KeyError:  # a uid without a passwd entry (some containers)
            home = os.environ.get("HOME", "/")
        return home if os.path.isdir(home) else "/"

    def _environment(self, spec: LaunchSpec, account: pwd.struct_passwd | None) -> dict:
        env = {name: os.environ[name] for name in self.env_keep if name in os.environ}
        env.setdefault("PATH", os.defpath)
        env.setdefault("LANG", "C.UTF-8")
        try:
            me = account or pwd.getpwuid(os.geteuid())
            env.update(HOME=me.pw_dir, USER=me.pw_name, LOGNAME=me.pw_name)
        except KeyError:  # a uid without a passwd entry (some containers)
            env["HOME"] = os.environ.get("HOME", "/")
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        env.update(spec.env)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(gpu) for gpu in spec.gpus)
        return env

    def start(self, spec: LaunchSpec) -> dict:
        self._reap()
        if (spec.command is None) == (spec.notebook is None):
            raise LaunchError(f"job {spec.job_id}: exactly one of command and notebook is needed")
        if not re.fullmatch(r"\w[\w.@+-]*", spec.job_id):
            raise LaunchError(f"job id {spec.job_id!r} cannot name a log file")
        account = self._account(spec.user)
        env = self._environment(spec, account)
        run_as = account.pw_name if account else env.get("USER", str(os.geteuid()))
        cwd = spec.cwd or self._home(account)
        base = os.path.join(os.path.abspath(spec.log_dir), spec.job_id)
        log, record = base + ".log", base + ".exit"
        output = base + ".out.ipynb" if spec.notebook is not None else None
        run = uuid.uuid4().hex
        log_fd = record_fd = output_fd = spec_fd = -1
        try:
            os.makedirs(spec.log_dir, mode=0o700, exist_ok=True)
            log_fd = _open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, account)
            record_fd = _open(record, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, None)
            python, extra_env = self._interpreter(account)
            env.update(extra_env)
            env[JOB_PYTHON_ENV] = python  # what the client's commands run (accounts.py)
            runner = [python, "-m", "jupyter_gpusched.backends.local.runner", f"--cwd={cwd}"]
            if spec.command is not None:
                runner.append(f"--command={spec.command}")
            else:
                # Opened here and passed on: the user writes it, in a directory they cannot.
                output_fd = _open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, account)
                runner += [f"--notebook={spec.notebook}", f"--output-fd={output_fd}"]
            what = {"run": run, "argv": runner, "env": env, "ids": run_as_ids(account)}
            what["output_fd"] = output_fd if output_fd >= 0 else None
            spec_fd = spec_file(what)
            stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            header = f"===== {stamp} job {spec.job_id} on {socket.gethostname()} as {run_as}"
            cvd = env["CUDA_VISIBLE_DEVICES"]
            os.write(log_fd, f"{header}: CUDA_VISIBLE_DEVICES={cvd!r}\n".encode())
            process = subprocess.Popen(
                supervisor_command(record_fd, spec_fd),
                stdin=subprocess.DEVNULL,
                stdout=log_fd,
                stderr=log_fd,
                cwd="/",
                env=supervisor_environment(),
                start_new_session=True,
                pass_fds=tuple(fd for fd in (record_fd, output_fd, spec_fd) if fd >= 0),
            )
        except OSError as exc:
            if log_fd >= 0:
                os.write(log_fd, f"===== could not start: {exc}\n".encode())
            raise LaunchError(f"could not start job {spec.job_id}: {exc}") from exc
        finally:
            for fd in (log_fd, record_fd, output_fd, spec_fd):
                if fd >= 0:
                    os.close(fd)
        create_time = psutil.Process(process.pid).create_time()  # a zombie still has one
        self._children[process.pid] = (process, create_time)
        self._ended.pop(process.pid, None)
        self._forget.discard(process.pid)
        self.log.info("Started job %s as %s: pid %d", spec.job_id, run_as, process.pid)
        return {
            "backend": "local",
            "host": socket.gethostname(),
            "pid": process.pid,
            "pgid": process.pid,
            "create_time": create_time,
            "run": run,
            "user": run_as,
            "log": log,
            "exit_record": record,
            "notebook_output": output,
        }

    # -- watching -----------------------------------------------------------------------------

    def _reap(self) -> None:
        """Collect every child of ours that has ended (no zombies), keeping its status."""
        for pid, (process, create_time) in list(self._children.items()):
            status = process.poll()  # waitpid(pid, WNOHANG)
            if status is not None:
                del self._children[pid]
                if pid in self._forget:
                    self._forget.discard(pid)
                else:
                    self._ended[pid] = (create_time, status)

    def _read_record(self, handle: dict) -> Exit | None:
        try:
            with open(handle["exit_record"], "rb") as file:
                record = json.loads(file.read())
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict) or record.get("run") != handle["run"]:
            return None  # empty (still running), or the record of another run of the job
        return exit_from_record(record)

    @staticmethod
    def _same(create_time: float, handle: dict) -> bool:
        return abs(create_time - handle["create_time"]) <= CREATE_TIME_TOLERANCE

    def poll(self, handle: dict) -> Exit | None:
        self._reap()
        pid = handle["pid"]
        ended = self._ended.get(pid)  # our child, reaped
        if ended is not None and not self._same(ended[0], handle):
            ended = None
        child = self._children.get(pid)  # our child, not reaped yet
        if child is not None and not self._same(child[1], handle):
            child = None
        exit = self._read_record(handle)  # the record wins, whatever has become of the pid
        if exit is None:
            if ended is None and (child is not None or self.alive(handle)):
                return None
            exit = self._read_record(handle)  # written just before the supervisor vanished?
        if ended is not None:
            del self._ended[pid]
        elif child is not None:
            self._forget.add(pid)  # the supervisor exits right after writing its record
        if exit is None and ended is not None and group_alive(handle["pgid"]):
            # our supervisor was killed, not its group: what is left of the job must not run on
            # GPUs that now go to another job (only ours: after a restart the group's id may
            # since have become another's)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(handle["pgid"], _signal.SIGKILL)
        return exit or self._without_record(handle, ended[1] if ended else None)

    def _without_record(self, handle: dict, status: int | None) -> Exit:
        """The supervisor is gone and wrote nothing; ``status`` is its wait status if ours."""
        pid = handle["pid"]
        sent = self._sent.get((pid, handle["create_time"]), set())
        if handle.get("sigkill_sent") or _signal.SIGKILL in sent:
            return Exit(None, "killed", "killed by SIGKILL")
        if status is not None and -status in sent:  # e.g. SIGTERM before it was ready
            return Exit(None, "killed", f"killed by {signal_name(-status)}")
        if status is None:
            return Exit(None, "lost", f"process {pid} vanished while the service was down")
        if status < 0:
            name = signal_name(-status)
            return Exit(None, "lost", f"process {pid} was killed by {name}, not by the launcher")
        return Exit(None, "failed", f"the job wrapper exited with {status} before the job ended")

    def alive(self, handle: dict) -> bool:
        try:
            process = psutil.Process(handle["pid"])
            same = self._same(process.create_time(), handle)
            return same and process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:  # ZombieProcess included
            return False

    def log_path(self, handle: dict) -> str:
        return handle["log"]

    # -- signals ------------------------------------------------------------------------------

    def signal(self, handle: dict, signame: str) -> None:
        signum = signal_number(signame)
        if not self.alive(handle):  # the group's id may belong to someone else by now
            return
        self._sent.setdefault((handle["pid"], handle["create_time"]), set()).add(signum)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(handle["pgid"], signum)

    def _kill_descendants(self, handle: dict) -> None:
        """Those of the job's processes that left its group, before the group (supervisor.py)."""
        with contextlib.suppress(psutil.Error):
            supervisor = psutil.Process(handle["pid"])
            if self._same(supervisor.create_time(), handle):
                kill_descendants(supervisor, patience=1.0)

    async def _wait(self, handle: dict, seconds: float) -> Exit | None:
        deadline = time.monotonic() + seconds
        while (exit := self.poll(handle)) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            await asyncio.sleep(min(0.1, left))
        return exit

    async def stop(self, handle: dict, signame: str, grace: float) -> Exit:
        exit = self.poll(handle)
        if exit is not None:
            return exit  # ended before: its group is not ours to wait for any more
        self.signal(handle, signame)
        exit = await self._wait(handle, grace)
        if exit is None:
            handle["sigkill_sent"] = True  # for whoever polls this handle later, too
            self._kill_descendants(handle)
            self.signal(handle, "SIGKILL")
            exit = await self._wait(handle, self.kill_wait)
        # The job's other processes die with the supervisor (it SIGKILLs them, or we did), but
        # not at once: return when they are gone, and their GPUs free.
        deadline = time.monotonic() + self.kill_wait
        while group_alive(handle["pgid"]) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        pid = handle["pid"]
        return exit or Exit(None, "killed", f"sent SIGKILL, but process {pid} is still there")
