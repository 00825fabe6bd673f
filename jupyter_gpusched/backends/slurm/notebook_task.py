"""The Slurm task of a notebook job: execute its notebook on the node and save the executed copy.

A batch job's script runs it as ``python -m jupyter_gpusched.backends.slurm.launcher notebook IN
OUT`` (that command is kept, so jobs queued by an older service still run); apart from
:mod:`.launcher` because it runs on the compute node, in the job, not in the service.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile


def main(argv: list[str]) -> int:
    """``notebook IN OUT``: execute a notebook job's notebook (in a Slurm task) and save the
    executed copy; the exit status says how it went (a signal that ended the kernel ends this
    process too)."""
    from ..local.runner import run_notebook  # nbclient: needed only here, in the job

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
        signal.signal(result["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), result["signal"])
    return int(result.get("code", 1))
