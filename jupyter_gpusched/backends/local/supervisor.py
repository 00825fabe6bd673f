"""The part of a locally launched job that is not its user's: it says when the job ended.

:class:`~jupyter_gpusched.backends.local.launcher.LocalLauncher` starts this module
(``python -m jupyter_gpusched.backends.local.supervisor``) as the service's own user, root
where jobs run as their users, as the leader of the job's process group. It

1. reads what to start from ``--spec-fd``, a file the launcher wrote and opened, unnamed (the
   runner's command line, its environment, the account's uid, gid and groups): nothing of the
   job is on this process's command line or in its environment;
2. starts the runner (:mod:`.runner`) as the job's user, in the same process group, and waits
   for it to end (the runner enters the working directory and runs the job as before);
3. writes the exit record to ``--exit-fd`` and SIGKILLs what is left of the group, itself
   included.

Why not the user's: whatever runs as the job's user can be changed by the job. Its environment
(``LD_PRELOAD``), its Python's site directories (a ``usercustomize.py``), its memory (a debugger
of the same uid) and its life (``kill``) are the user's. When the runner wrote the record as
the user, a job could write "completed" itself, or kill its runner, and go on running on GPUs
the scheduler had given to the next job. This process has a clean environment, and the job's
user can neither signal, trace nor change it.

What the runner reports (an exit code, a signal, a message) is the user's to say: it is how
their job ended, read from a pipe, bounded and checked. *When* the job ended is this process's
to say: when the runner is gone, and then nothing of its group is left running.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from .runner import ignore_polite_signals, record_and_end

MAX_REPORT = 4096  # bytes of the runner's report read
MAX_MESSAGE = 1000  # characters of its message kept


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
    status = runner.wait()
    try:
        data = os.read(read_end, MAX_REPORT)
    except BlockingIOError:  # nothing written, and a process of the job keeps it open
        data = b""
    return report(data, status)


def main(argv: list[str] | None = None) -> int:
    ignore_polite_signals()
    args = parse_args(argv)
    os.set_inheritable(args.exit_fd, False)
    with os.fdopen(args.spec_fd, encoding="utf-8") as file:
        spec = json.load(file)
    record_and_end(args.exit_fd, {"run": spec["run"], **supervise(spec)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
