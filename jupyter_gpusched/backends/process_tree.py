"""Waiting for a process tree to be gone: what a stopped notebook server leaves (its kernels run
in their own sessions, so they outlive a server that exits without shutting them down)."""

from __future__ import annotations

import asyncio
import contextlib
import time

import psutil


def descendants(pid: int) -> list[psutil.Process]:
    """The processes a server started (kernels, terminals and theirs), while it still runs."""
    if not pid:
        return []
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


async def wait_gone(processes: list[psutil.Process], timeout: float, log) -> None:
    """Wait until ``processes`` have exited; SIGKILL what is left after ``timeout``."""
    deadline = time.monotonic() + timeout
    alive = processes
    while alive:
        alive = [p for p in alive if _running(p)]
        if not alive or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    for process in alive:
        log.warning("killing process %s, left by a stopped server", process.pid)
        with contextlib.suppress(psutil.Error):
            process.kill()


def _running(process: psutil.Process) -> bool:
    try:  # is_running() also checks the start time: a reused PID is not the same process
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def process_created(pid: int) -> float | None:
    """When process ``pid`` started (psutil's create time), or None if there is none."""
    if not pid:
        return None
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None
