"""The part of a locally launched job that is not its user's: it says when the job ended.

:class:`~jupyter_gpusched.backends.local.launcher.LocalLauncher` starts this module
(``python -m jupyter_gpusched.backends.local.supervisor``) as the service's own user, root
where jobs run as their users, as the leader of the job's process group. It

1. reads what to start from ``--spec-fd``, a file the launcher wrote and opened, unnamed (the
   runner's command line, its environment, the account's uid, gid and groups): nothing of the
   job is on this process's command line or in its environment;
2. starts the runner (:mod:`.runner`) as the job's user, in the same process group, and waits
   for it to end (the runner enters the working directory and runs the job as before);
3. SIGKILLs what is left of the job, every process it is an ancestor of: it is the job's
   *child subreaper*, so a process that left the group (``setsid``, a daemon's double fork)
   is still its descendant; then it writes the exit record to ``--exit-fd`` and SIGKILLs its
   group, itself included.

Why not the user's: whatever runs as the job's user can be changed by the job. Its environment
(``LD_PRELOAD``), its Python's site directories (a ``usercustomize.py``), its memory (a debugger
of the same uid) and its life (``kill``) are the user's. When the runner wrote the record as
the user, a job could write "completed" itself, or kill its runner, and go on running on GPUs
the scheduler had given to the next job. This process has a clean environment, and the job's
user can neither signal, trace nor change it.

What the runner reports (an exit code, a signal, a message) is the user's to say: it is how
their job ended, read from a pipe, bounded and checked. *When* the job ended is this process's
to say: when the runner is gone and nothing of the job is left running.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time

import psutil

from .runner import ignore_polite_signals, record_and_end

PR_SET_CHILD_SUBREAPER = 36  # prctl(2)
MAX_REPORT = 4096  # bytes of the runner's report read
MAX_MESSAGE = 1000  # characters of its message kept


# -- the launcher's side: how a supervisor is started ---------------------------------------
def supervisor_command(exit_fd: int, spec_fd: int) -> list[str]:
    """The supervisor's command line: this interpreter, the service's (it runs as the service's
    user), and two descriptors, nothing of the job."""
    module = "jupyter_gpusched.backends.local.supervisor"
    return [sys.executable, "-m", module, f"--exit-fd={exit_fd}", f"--spec-fd={spec_fd}"]


def supervisor_environment() -> dict:
    """The supervisor's environment: none of the job's, and of the service's only what finds
    Python and this package."""
    env = {"PATH": os.defpath, "LANG": "C.UTF-8"}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def spec_file(what: dict) -> int:
    """A descriptor of a file with no name (no other process can open it) holding ``what``, as
    JSON, at its start: the supervisor's ``--spec-fd``."""
    with tempfile.TemporaryFile() as file:
        file.write(json.dumps(what).encode())
        file.flush()
        fd = os.dup(file.fileno())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


# -- the supervisor ----------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m jupyter_gpusched.backends.local.supervisor",
        description="Start a job's runner as its user; record when and how it ended "
        "(used by LocalLauncher).",
    )
    parser.add_argument("--exit-fd", type=int, required=True, help="where to write the record")
    parser.add_argument("--spec-fd", type=int, required=True, help="what to start (JSON)")
    return parser.parse_args(argv)


def report(data: bytes, status: int) -> dict:
    """How the job ended: the runner's report (``data``, one JSON object) where it is one,
    else its wait ``status``."""
    try:
        said = json.loads(data.decode("utf-8").splitlines()[0])
    except (ValueError, IndexError):
        said = None
    result: dict = {}
    if isinstance(said, dict):
        for key in ("code", "signal"):
            value = said.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 256:
                result = {key: value}
                break
        message = said.get("message")
        if result and isinstance(message, str) and message:
            result["message"] = message[:MAX_MESSAGE]
    if not result:
        result = {"signal": -status} if status < 0 else {"code": status}
    return result


def supervise(spec: dict) -> dict:
    """Start the runner ``spec`` describes, wait for it; how it ended (:func:`report`)."""
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)  # read once it is gone: the job may hold the other end
    fds = [write_end] + ([spec["output_fd"]] if spec.get("output_fd") is not None else [])
    try:
        runner = subprocess.Popen(
            [*spec["argv"], f"--exit-fd={write_end}"],
            stdin=subprocess.DEVNULL,
            cwd="/",  # the runner enters the job's directory as the user
            env=spec["env"],
            pass_fds=fds,
            **spec["ids"],  # the account's user, group and groups (accounts.run_as_ids)
        )
    except OSError as exc:
        return {"code": 1, "message": f"could not start the job's runner: {exc}"[:MAX_MESSAGE]}
    finally:
        os.close(write_end)
    status = runner.returncode = wait_for(runner.pid)
    try:
        data = os.read(read_end, MAX_REPORT)
    except BlockingIOError:  # nothing written, and a process of the job keeps it open
        data = b""
    end_descendants()
    return report(data, status)


def become_subreaper() -> bool:
    """Make this process the one the job's orphans are handed to (Linux's child subreaper), so
    that no process of the job leaves its tree: not one that moved to a session of its own
    (``setsid``, a daemon's double fork), which the group's signals no longer reach."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def wait_for(pid: int) -> int:
    """Wait for ``pid``, reaping the orphans handed to this process meanwhile; its end as
    ``Popen.returncode`` gives it (negative: killed by that signal)."""
    while True:
        done, status = os.waitpid(-1, 0)
        if done == pid:
            return os.waitstatus_to_exitcode(status)


def kill_descendants(process: psutil.Process, patience: float) -> None:
    """SIGKILL every live descendant of ``process`` (those that left its process group
    included, once it adopts the job's orphans) until none is left, or ``patience`` seconds
    have passed: one may fork as the others die. The supervisor's at the job's end, and the
    launcher's before it kills the supervisor's group (once the supervisor is gone, they would
    be init's, out of reach)."""
    deadline = time.monotonic() + patience
    while True:
        left = []
        for child in process.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if child.status() != psutil.STATUS_ZOMBIE:
                    left.append(child)
        if not left or time.monotonic() > deadline:
            return
        for child in left:
            with contextlib.suppress(psutil.Error):
                child.kill()
        time.sleep(0.01)


def end_descendants(patience: float = 10.0) -> None:
    """The job has ended: nothing of it may run on its GPUs. Kill what is left, then reap it
    (its zombies are this process's, an adopter's)."""
    kill_descendants(psutil.Process(), patience)
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main(argv: list[str] | None = None) -> int:
    ignore_polite_signals()
    become_subreaper()
    args = parse_args(argv)
    os.set_inheritable(args.exit_fd, False)
    with os.fdopen(args.spec_fd, encoding="utf-8") as file:
        spec = json.load(file)
    record_and_end(args.exit_fd, {"run": spec["run"], **supervise(spec)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
