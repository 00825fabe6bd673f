"""The Slurm jobs the batch launcher watches, and their states from one ``squeue`` for all.

The service polls every running job each ``poll_interval``; asking ``squeue`` once per job
would cost one slurmctld RPC each. :class:`SqueueWatch` keeps the set of job ids to ask about
and one answer for all of them, reused for ``max_age()`` seconds (``SlurmLauncher.state_cache``).
Apart from :mod:`.launcher` because it is the launcher's one piece of cached state about Slurm,
with its own rule for when it is stale.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..interface import LaunchError
from .commands import SlurmCommandError, read_squeue


class SqueueWatch:
    """States of the watched jobs: ``run`` runs a Slurm command (``SlurmLauncher._run``),
    ``max_age()`` is how long an answer of squeue is reused, in seconds."""

    def __init__(self, run, max_age: Callable[[], float]):
        self._run = run
        self._max_age = max_age
        self.watched: set[str] = set()  # Slurm job ids whose state squeue is asked for
        self._states: dict[str, tuple[str, str, str]] = {}  # id -> (name, state, reason)
        self._read_at = -float("inf")

    def add(self, job: str) -> None:
        """Watch ``job`` (just submitted); the next read asks squeue again."""
        self.watched.add(job)
        self.stale()

    def discard(self, job: str) -> None:
        self.watched.discard(job)

    def stale(self) -> None:
        """Let the next read ask squeue, however recent its last answer."""
        self._read_at = -float("inf")

    def refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._read_at < self._max_age():
            return
        if not self.watched:
            self._states, self._read_at = {}, now
            return
        try:
            found = read_squeue(self._run, self.watched)
        except SlurmCommandError as exc:
            raise LaunchError(str(exc)) from None
        states = {job: (j.name, j.state, j.reason) for job, j in found.items()}
        self._states, self._read_at = states, now

    def state(self, job: str, name: str, force: bool = False) -> tuple[str, str] | None:
        """(Slurm state, reason) of Slurm job ``job``, or None when squeue does not know it or
        it is not named ``name`` (an id reused by Slurm is not ours)."""
        if job not in self.watched:
            self.watched.add(job)
            force = True
        self.refresh(force)
        found = self._states.get(job)
        if found is None or found[0] != name:
            return None
        return found[1], found[2]
