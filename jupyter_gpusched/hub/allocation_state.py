"""What the hub keeps of a server's allocation: :class:`AllocationState`, the job id, the GPUs
it runs on, its profile and lifetime, and why the last server stopped, beside
LocalProcessSpawner's process id, in the hub's database (``get_state``/``load_state``), so that
a hub restart keeps servers and allocations.

Apart from the spawner (:mod:`.spawner`, which fills these in as it starts, follows and stops a
server) because it is the record, not the conversation: one place says what is kept and under
which keys (``"gpusched"``; the stop notice's, :mod:`.stop_notice`).
"""

from __future__ import annotations

from traitlets import Dict, Float, List, Unicode

from .local_server import LocalServerProcess
from .stop_notice import STATE_KEY as STOP_STATE_KEY


class AllocationState(LocalServerProcess):
    """The allocation's record, kept in the hub's database (see the module's docstring)."""

    # What is known about the current allocation (kept in the hub's database by get_state).
    job_id = Unicode("")
    allocation = List()
    profile_slug = Unicode("")
    placed_at = Float(0.0)
    lifetime = Float(0.0)  # the profile's max_lifetime (0: none)
    job_tier = Float(0.0)
    job_gpus = Float(0.0)
    # why the last server stopped, when the reaper stopped it (stop_notice.py): kept until
    # the next start, for the hub's pages
    last_stop = Dict()

    def get_state(self):
        state = super().get_state()
        if self.last_stop:
            state[STOP_STATE_KEY] = dict(self.last_stop)
        if self.job_id:
            state["gpusched"] = {
                "job_id": self.job_id,
                "allocation": list(self.allocation),
                "profile": self.profile_slug,
                "tier": self.job_tier,
                "gpus": self.job_gpus,
                "placed_at": self.placed_at,
                "max_lifetime": self.lifetime,
                "pid_created": self.pid_created,  # the server process's start time
            }
        return state

    def load_state(self, state):
        super().load_state(state)
        self.last_stop = dict(state.get(STOP_STATE_KEY) or {})
        saved = state.get("gpusched") or {}
        if saved.get("job_id"):
            self.job_id = saved["job_id"]
            self.allocation = list(saved.get("allocation") or [])
            self.profile_slug = saved.get("profile") or ""
            self.job_tier = float(saved.get("tier") or 0)
            self.job_gpus = float(saved.get("gpus") or 0)
            self.placed_at = float(saved.get("placed_at") or 0)
            self.lifetime = float(saved.get("max_lifetime") or 0)
            self.pid_created = float(saved.get("pid_created") or 0)

    def _clear_allocation(self) -> None:
        """Forget the allocation (the server is gone: see the spawner's clear_state)."""
        self.job_id, self.allocation, self.profile_slug = "", [], ""
        self.placed_at = self.lifetime = self.job_tier = self.job_gpus = 0.0
        self.pid_created = 0.0

    def _save_state(self) -> None:
        """Write the state to the hub's database now (the hub itself does so only once start()
        has returned)."""
        orm_spawner = self.orm_spawner
        if orm_spawner is None or getattr(self.user, "db", None) is None:
            return
        orm_spawner.state = self.get_state()
        self.user.db.commit()
