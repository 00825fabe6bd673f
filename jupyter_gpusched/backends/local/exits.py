"""How a local job ended, as the launcher tells it: the supervisor's exit record read back
(:func:`exit_from_record`; ``supervisor.py`` writes it), signal names and numbers and whether any
process of a job's process group still runs (:func:`group_alive`).

Apart from :mod:`.launcher` (starting, polling and stopping jobs): these are the small facts about
processes and records it reasons with, none of which needs the launcher's state.
"""

from __future__ import annotations

import contextlib
import os
import signal as _signal

import psutil

from ..interface import Exit


def signal_number(signame: str) -> int:
    name = signame.upper()
    try:
        return _signal.Signals[name if name.startswith("SIG") else "SIG" + name]
    except KeyError:
        raise ValueError(f"unknown signal {signame!r}") from None


def signal_name(number: int) -> str:
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def group_alive(pgid: int) -> bool:
    """Is any process of group ``pgid`` still running? (Zombies do not count.)"""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for process in psutil.process_iter():
        with contextlib.suppress(OSError, psutil.Error):
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                return True
    return False


def exit_from_record(record: dict) -> Exit:
    if record.get("signal") is not None:
        return Exit(None, "killed", f"killed by {signal_name(record['signal'])}")
    code = int(record["code"])
    message = str(record.get("message") or f"exit code {code}")  # the runner's, if it failed
    return Exit(code, "completed" if code == 0 else "failed", message)
