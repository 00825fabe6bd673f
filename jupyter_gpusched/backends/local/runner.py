"""The wrapper every locally launched job runs under, as the job's user.

:class:`~jupyter_gpusched.backends.local.launcher.LocalLauncher` never starts a job's work
directly: it starts :mod:`.supervisor` (as the service's user) to lead a new process group, and
the supervisor starts ``python -m jupyter_gpusched.backends.local.runner`` in that group as the
job's user. This module then

0. enters the job's working directory (``--cwd``). The runner starts in ``/`` with the job's
   uid and groups already in place, so the directory is entered with the user's rights only
   (``Popen(cwd=...)`` would enter it as root, before the privileges are dropped). If it
   cannot, nothing of the job runs and its report says why
   (``{"code": 1, "message": "could not enter ..."}``);
1. runs the job: a shell command (``/bin/sh -c COMMAND``) or a notebook (executed with nbclient,
   the executed copy written to the file descriptor ``--output-fd``); both run in the job's
   process group, so a signal to the group reaches every process of the job, the notebook's
   kernel included;
2. waits for it, and ignores the polite signals itself (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1,
   SIGUSR2, SIGALRM). The launcher signals the whole group, so the job has already had the signal;
   the runner only has to live long enough to see how the job ended;
3. reports how it ended, one JSON object such as ``{"code": 3}`` or ``{"signal": 15}``, to the
   file descriptor ``--exit-fd`` (a pipe to the supervisor), and exits. The supervisor then
   SIGKILLs whatever is left of the job (background processes it left behind, those in a
   session of their own included: it adopts them) and writes the exit record the launcher
   reads. A job ends when its main process ends. (A process in a session of its own does not
   get the launcher's polite signals, only the end.)

Run on its own as the leader of its group (``--exit-fd`` a file), it does the supervisor's last
step itself.

Output (stdout and stderr of the runner, the job and the kernel) goes to whatever the launcher
gave as stdout, normally the job's log file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

#: Signals whose default action would end the runner before it could write the exit record.
POLITE_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")


def _note(text: str) -> None:
    """A line of the runner's own in the job's log."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"[gpusched-runner {stamp}] {text}", file=sys.stderr, flush=True)


def ignore_polite_signals() -> None:
    """Catch (rather than ``SIG_IGN``) the polite signals: a caught signal is reset to its default
    action in the job at ``exec``, an ignored one would be inherited and the job would never see
    it."""

    def noted(signum: int, _frame: object) -> None:
        # os.write, not print: the signal may have interrupted a print to the same stream.
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        name = signal.Signals(signum).name
        os.write(2, f"[gpusched-runner {stamp}] got {name}; waiting for the job to end\n".encode())

    for name in POLITE_SIGNALS:
        signal.signal(getattr(signal, name), noted)


def run_command(command: str) -> dict:
    """Run ``/bin/sh -c command`` in this process group; return ``{"code": n}`` or
    ``{"signal": n}``."""
    child = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL)
    returncode = child.wait()  # retried on EINTR (PEP 475)
    return {"signal": -returncode} if returncode < 0 else {"code": returncode}


def _keep_kernels_in_our_group() -> None:
    """jupyter_client starts each kernel in a session of its own (``start_new_session=True``).
    Undo that, so that the launcher's signals to the job's group reach the kernel (where the
    user's code runs) and a SIGKILL of the group leaves no kernel behind."""
    from jupyter_client import launcher

    if getattr(launcher.Popen, "_gpusched", False):
        return
    real_popen = launcher.Popen

    def popen(*args, **kwargs):
        kwargs.pop("start_new_session", None)
        return real_popen(*args, **kwargs)

    popen._gpusched = True  # type: ignore[attr-defined]
    launcher.Popen = popen


IOPUB_TIMEOUT = 60  # seconds (run_notebook)


def run_notebook(path: str, output) -> dict:
    """Execute the notebook at ``path`` with nbclient and save the executed copy (also a partial
    one, after a failure) to ``output`` (a path or a file open for writing).

    Returns ``{"code": 0}`` when every cell ran, ``{"code": 1}`` when a cell raised or the
    kernel could not run, ``{"signal": n}`` when the kernel was ended by signal ``n`` while it
    ran a cell. The kernel is the one named in the notebook's metadata (``python3`` if none)
    and runs in the job's working directory.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    _keep_kernels_in_our_group()

    class Client(NotebookClient):
        kernel_process: subprocess.Popen | None = None

        async def async_start_new_kernel(self, **kwargs):
            await super().async_start_new_kernel(**kwargs)
            provisioner = getattr(self.km, "provisioner", None)
            self.kernel_process = getattr(provisioner, "process", None)
            if provisioner is not None and hasattr(provisioner, "pgid"):
                # The kernel's "group" is now the job's: shutting the kernel down must signal
                # the kernel only, not the runner.
                provisioner.pgid = None

    nb = nbformat.read(path, as_version=4)
    kernel_name = nb.metadata.get("kernelspec", {}).get("name") or "python3"
    client = Client(
        nb,
        kernel_name=kernel_name,
        resources={"metadata": {"path": os.getcwd()}},
        # how long a cell's output may trail its reply: nbclient's 4 s lost a failed cell's
        # traceback from the saved copy on a busy machine (it waits only until the kernel says
        # it is idle, so a longer bound costs nothing otherwise)
        iopub_timeout=IOPUB_TIMEOUT,
    )
    failure: list[BaseException] = []

    def execute() -> None:
        import asyncio

        try:
            asyncio.run(client.async_execute())
        except BaseException as exc:  # reported below, in the main thread
            failure.append(exc)

    # nbclient shuts the kernel down when *it* gets SIGTERM or SIGINT, but only where it can
    # install signal handlers, i.e. in the main thread. In a worker thread it cannot, so the
    # signal is left to the kernel, which received it with the rest of the group.
    worker = threading.Thread(target=execute, name="nbclient")
    worker.start()
    worker.join()
    nbformat.write(nb, output)
    if not failure:
        return {"code": 0}
    exc = failure[0]
    print("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)), file=sys.stderr)
    if isinstance(exc, CellExecutionError):
        # A cell raised. nbclient then shut the kernel down, and signalled it if it was slow to
        # go: that signal is not how the job ended.
        return {"code": 1}
    process = client.kernel_process
    returncode = process.poll() if process is not None else None
    if returncode is not None and returncode < 0:
        return {"signal": -returncode}
    return {"code": 1}


def _describe(result: dict) -> str:
    if "signal" in result:
        try:
            return f"killed by {signal.Signals(result['signal']).name}"
        except ValueError:
            return f"killed by signal {result['signal']}"
    return f"exit code {result['code']}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m jupyter_gpusched.backends.local.runner",
        description="Run one job, record how it ended (used by LocalLauncher).",
    )
    parser.add_argument("--exit-fd", type=int, required=True, help="where to write the record")
    parser.add_argument("--run", help="token copied into the exit record (run alone)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--command", help="shell command, run with /bin/sh -c")
    what.add_argument("--notebook", help="notebook to execute with nbclient")
    parser.add_argument("--output-fd", type=int, help="where to write the executed notebook")
    parser.add_argument("--cwd", help="the working directory, entered as the job's user")
    args = parser.parse_args(argv)
    if args.notebook is not None and args.output_fd is None:
        parser.error("--notebook needs --output-fd")
    return args


def enter(directory: str) -> str | None:
    """chdir to ``directory`` with this process's rights; None, or why it could not."""
    try:
        os.chdir(directory)
    except OSError as exc:
        return f"could not enter the working directory {directory}: {exc.strerror}"
    os.environ["PWD"] = os.getcwd()
    return None


def main(argv: list[str] | None = None) -> int:
    ignore_polite_signals()
    args = parse_args(argv)
    os.set_inheritable(args.exit_fd, False)  # the job must not get (and write) the record's fd
    if args.output_fd is not None:
        os.set_inheritable(args.output_fd, False)  # nor the kernel the executed copy's
    runtime_dir = None
    try:
        problem = enter(args.cwd) if args.cwd else None
        if problem is not None:
            _note(problem + "; the job did not run")
            result = {"code": 1, "message": problem}
        elif args.command is not None:
            result = run_command(args.command)
        else:
            if "JUPYTER_RUNTIME_DIR" not in os.environ:
                # Kernel connection files: private to this run, and no writable home needed.
                runtime_dir = tempfile.mkdtemp(prefix="gpusched-runtime-")
                os.environ["JUPYTER_RUNTIME_DIR"] = runtime_dir
            with open(args.output_fd, "w", encoding="utf-8") as output:
                result = run_notebook(args.notebook, output)
    except Exception:
        _note("the runner itself failed:\n" + traceback.format_exc())
        result = {"code": 1}
    finally:
        if runtime_dir is not None:
            shutil.rmtree(runtime_dir, ignore_errors=True)
    _note(f"job ended: {_describe(result)}")
    record_and_end(args.exit_fd, result if args.run is None else {"run": args.run, **result})
    return 0


def record_and_end(exit_fd: int, record: dict) -> None:
    """Write ``record`` to ``exit_fd``; then, as the leader of the job's process group, SIGKILL
    what is left of it (background processes the job left behind), this process included."""
    os.write(exit_fd, json.dumps(record).encode() + b"\n")
    os.close(exit_fd)
    sys.stdout.flush()
    sys.stderr.flush()
    if os.getpgid(0) == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
