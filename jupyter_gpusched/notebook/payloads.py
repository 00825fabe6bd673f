"""What a ``client.submit(function=...)`` job or a ``%%gpujob`` cell leaves for the job to run.

Both write their payload under ``<cwd>/.gpusched/`` (the job's working directory, which the job's
user can enter: see :func:`jupyter_gpusched.notebook.client.Client.submit`) and submit a command
that runs it with ``"$GPUSCHED_PYTHON"``: the interpreter the launcher chose for the job's account
(``accounts.JOB_PYTHON_ENV``), never the kernel's ``sys.executable``, which the job's account
may not be able to run (a kernel of a Python under ``/root``) and which would bypass the
launcher's rule. Each payload function returns ``(command, result path or None, what to remove
if the submission fails)``.

* a **function**: ``fn-<stamp>/call.pkl`` (the function and its arguments, pickled by value with
  cloudpickle, so lambdas and functions defined in the notebook work), ``path.json`` (the
  kernel's ``sys.path``, so modules it imported from its directories are found), ``run.py``
  (calls it and pickles the outcome to ``result.pkl``, read by ``Job.result()``);
* a **cell**: ``cell-<stamp>.py``, the cell's text, run as ``__main__`` with the working
  directory first on ``sys.path``.

The folder is the user's own: made 0700, and its files 0600, whatever the umask (a cell's text
and a function's arguments are nobody else's to read). One that is a link, another user's, or
one that others may write to is refused (a PermissionError, so the client falls back to the
home directory): in a shared ``/tmp`` another user could make ``.gpusched`` first and replace
what the job runs, which runs as its user.

Each new payload first removes those of the folder not changed for :data:`KEEP_DAYS` days (a
function's folder changes when its result is written), so that a notebook that submits jobs
every day does not fill its folder for good: a function's result is read within a month.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shlex
import shutil
import stat
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from ..backends.accounts import JOB_PYTHON_ENV

PAYLOAD_DIR = ".gpusched"  # under the working directory: function payloads, cells, results
KEEP_DAYS = 30  # a payload not changed for this long is removed when the next one is made
#: The job's Python, as its shell command names it: expanded in the job, set by the launcher.
JOB_PYTHON = f'"${JOB_PYTHON_ENV}"'


class PayloadError(ValueError):
    """The payload cannot be made (not callable, not picklable); ``field``: the client's
    argument at fault."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.message, self.field = message, field


_RUNNER = '''\
"""Runs a function submitted with jupyter_gpusched.notebook.client.submit(function=...)."""
import json, os, pickle, sys, traceback

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.getcwd())
with open(os.path.join(here, "path.json")) as f:
    sys.path.extend(p for p in json.load(f) if p not in sys.path)
try:
    import cloudpickle as dumper
except ImportError:
    dumper = pickle


def save(outcome):
    tmp = os.path.join(here, "result.pkl.tmp")
    with open(tmp, "wb") as f:
        try:
            dumper.dump(outcome, f)
        except Exception as exc:  # a value or exception that cannot be pickled
            f.seek(0)
            f.truncate()
            pickle.dump({"ok": False, "type": type(exc).__name__, "exception": None,
                         "message": "the result could not be pickled: %s" % exc,
                         "traceback": traceback.format_exc()}, f)
    os.replace(tmp, os.path.join(here, "result.pkl"))


try:
    with open(os.path.join(here, "call.pkl"), "rb") as f:
        function, args, kwargs = pickle.load(f)
    value = function(*args, **kwargs)
except BaseException as exc:
    text = traceback.format_exc()
    sys.stderr.write(text)
    try:
        raised = dumper.dumps(exc)
    except Exception:
        raised = None
    save({"ok": False, "type": type(exc).__name__, "message": str(exc), "exception": raised,
          "traceback": text})
    sys.exit(1)
save({"ok": True, "value": value})
'''

_RUN_CELL = (
    "import runpy, sys; sys.path.insert(0, ''); sys.argv = [{path!r}]; "
    "runpy.run_path({path!r}, run_name='__main__')"
)


def _stamp() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"


def pickled_call(function: Callable, args: tuple, kwargs: dict) -> bytes:
    """The call, pickled (by value where cloudpickle is installed); :class:`PayloadError`."""
    if not callable(function):
        raise PayloadError("function= must be callable", "function")
    try:
        import cloudpickle as dumper
    except ImportError:  # a dependency; an installation without it pickles by reference only
        dumper = None
        qualname = getattr(function, "__qualname__", "")
        module = getattr(function, "__module__", None)
        if module in (None, "__main__") or "<locals>" in qualname or "<lambda>" in qualname:
            raise PayloadError(
                f"{qualname or function!r} is defined in the notebook ({module or 'no module'}) "
                "and cannot be pickled by reference: install cloudpickle (pip install "
                "cloudpickle), or move the function into a module importable from the working "
                "directory",
                "function",
            ) from None
    try:
        return (dumper or pickle).dumps((function, tuple(args), dict(kwargs)))
    except Exception as exc:
        raise PayloadError(
            f"the function or its arguments cannot be pickled: {exc}", "function"
        ) from None


def function_payload(call: bytes, cwd: str) -> tuple[str, str, Path]:
    """Write a pickled call (:func:`pickled_call`) to ``<cwd>/.gpusched/fn-<stamp>/``; OSError
    when it cannot be written there."""
    folder = private_folder(cwd)
    prune(folder)
    directory = folder / f"fn-{_stamp()}"
    try:
        directory.mkdir(mode=0o700)
        _write_new(directory / "call.pkl", call)
        paths = [p for p in sys.path if p and os.path.isdir(p)]
        _write_new(directory / "path.json", json.dumps(paths).encode())
        runner = directory / "run.py"
        _write_new(runner, _RUNNER.encode())
    except OSError:
        remove(directory)
        raise
    command = f"{JOB_PYTHON} -u {shlex.quote(str(runner))}"
    return command, str(directory / "result.pkl"), directory


def cell_payload(cell: str, cwd: str) -> tuple[str, None, Path]:
    """Write a cell's text to ``<cwd>/.gpusched/cell-<stamp>.py``; OSError when it cannot."""
    folder = private_folder(cwd)
    prune(folder)
    path = folder / f"cell-{_stamp()}.py"
    _write_new(path, cell.encode())
    command = f"{JOB_PYTHON} -u -c " + shlex.quote(_RUN_CELL.format(path=str(path)))
    return command, None, path


def private_folder(cwd: str) -> Path:
    """``<cwd>/.gpusched``, made 0700 where missing (and made 0700 where it is ours but others
    may read it); a PermissionError saying why where it is a link, is not this user's, or
    others may write to it (see the module docstring)."""
    folder = Path(cwd) / PAYLOAD_DIR
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise PermissionError(
            f"{folder} is not a folder of yours that only you may write to, so a job's code "
            "left there could be replaced by another user: remove it, or submit from another "
            "folder"
        )
    if info.st_mode & 0o077:
        os.chmod(folder, 0o700)  # one made before payloads were private
    return folder


def _write_new(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file at ``path``, readable by this user only (never through a
    link, never over a file that is there)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "wb") as file:
        file.write(data)


def prune(directory: Path, now: float | None = None) -> None:
    """Remove the payloads (``cell-*.py``, ``fn-*/``) of ``directory`` not changed for
    :data:`KEEP_DAYS` days; whatever cannot be read or removed is left."""
    cutoff = (time.time() if now is None else now) - KEEP_DAYS * 86_400
    try:
        entries = list(directory.iterdir())
    except OSError:  # no folder yet, or not ours to read
        return
    for entry in entries:
        if not (entry.name.startswith("fn-") or entry.name.startswith("cell-")):
            continue
        try:
            if entry.lstat().st_mtime < cutoff:
                remove(entry)
        except OSError:
            continue


def remove(path: Path | None) -> None:
    """Remove a payload (a file or a function's directory; a link itself, not what it names)."""
    if path is None:
        return
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def result_path_from_command(command: str | None) -> str | None:
    """A function job found again (``client.jobs()``): its result file, from its command."""
    if not command or f"/{PAYLOAD_DIR}/fn-" not in command:
        return None
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if len(words) == 3 and words[2].endswith("/run.py"):
        return str(Path(words[2]).with_name("result.pkl"))
    return None
