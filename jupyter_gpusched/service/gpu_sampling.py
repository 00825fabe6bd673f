"""The seam between the GPU sampler and its sources (a copy of the declarations agreed for issue
16; the sampler's own module replaces this file at the merge)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPUReading:
    """One GPU's measurement as the service took it (never from the user's server)."""

    node: str  # the cluster file's node name
    index: int  # the node's GPU index (what the engine allocates)
    utilization: float | None  # percent 0-100, None unknown
    memory_used_gb: float | None  # GiB, None unknown
    backend: str  # "nvml", "dcgm", "simulated": who measured it
    time: float  # epoch seconds it was measured (or scraped)


class SourceError(Exception):
    """A source could not be read (message says which and why)."""


class ReadingSource:
    """Where the service reads GPU samples of some nodes."""

    name: str = "source"  # "local", "node-agent", "prometheus": shown in api/reaper

    def covers(self, node: str) -> bool: ...

    async def read(self, nodes: set[str]) -> list[GPUReading]: ...  # raises SourceError
