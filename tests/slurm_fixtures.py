"""A real Slurm cluster for the tests (``scripts/slurm.sh``): munged, slurmctld and two slurmd
(nodes n1 and n2, 4 fake GPUs of type h100 each) on this host, started once per test session
and stopped at its end.

``slurm_cluster`` (session) starts it; ``slurm`` (per test) hands the same cluster to a test and
puts it back afterwards: every job cancelled, both nodes back in service. Without Slurm on the
machine (and no root/apt-get to install it) the tests that use them are skipped with the reason;
set ``GPUSCHED_REQUIRE_SLURM=1`` (as CI should) to make that a failure instead.

Import the fixtures in ``tests/conftest.py``::

    from slurm_fixtures import slurm, slurm_cluster  # noqa: F401
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "slurm.sh"
UNAVAILABLE = 3  # slurm.sh's exit status when Slurm cannot be had here
NODES = ("n1", "n2")


class SlurmCluster:
    """The test cluster: its directory, its slurm.conf, and Slurm's commands run against it."""

    def __init__(self, directory: str, conf: str):
        self.directory = directory
        self.conf = conf
        self.env = {**os.environ, "SLURM_CONF": conf}

    def run(self, *argv: str, check: bool = True) -> str:
        """A Slurm command's output (``check``: fail the test when it fails)."""
        done = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=60)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
        return done.stdout

    def jobs(self, since: set[str] = frozenset()) -> dict[str, tuple[str, str, str]]:
        """Every job slurmctld knows, finished ones included, but those in ``since`` (an
        earlier ``set(jobs())``): id -> (name, state, nodes)."""
        out = self.run("squeue", "--noheader", "--states=all", "--format=%i|%j|%T|%N")
        jobs = {}
        for line in out.splitlines():
            job, name, state, nodes = line.strip().split("|", 3)
            if job not in since:
                jobs[job] = (name, state, nodes)
        return jobs

    def job(self, slurm_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields for one job."""
        from jupyter_gpusched.backends.slurm.parse import parse_oneliner

        return parse_oneliner(self.run("scontrol", "show", "job", "--oneliner", slurm_id))

    def node_state(self, node: str) -> str:
        from jupyter_gpusched.backends.slurm.parse import parse_oneliner

        return parse_oneliner(self.run("scontrol", "show", "node", "--oneliner", node))["State"]

    def set_node(self, node: str, state: str, reason: str = "gpusched test") -> None:
        argv = ["scontrol", "update", f"nodename={node}", f"state={state}"]
        if state.lower() != "resume":
            argv.append(f"reason={reason}")
        self.run(*argv)

    def reset(self) -> None:
        """Cancel every job, and bring both nodes back to idle."""
        active = [j for j, (_, state, _) in self.jobs().items() if state in _ACTIVE]
        if active:
            self.run("scancel", *active, check=False)
        deadline = time.monotonic() + 30
        while any(state in _ACTIVE for _, state, _ in self.jobs().values()):
            if time.monotonic() > deadline:
                raise AssertionError(f"Slurm jobs left running: {self.jobs()}")
            time.sleep(0.2)
        for node in NODES:
            state = self.node_state(node)
            if "DRAIN" in state or "DOWN" in state or "FAIL" in state:
                self.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        deadline = time.monotonic() + 30
        # IDLE, not IDLE* (resumed but not answering yet: sbatch then takes any request)
        while not all(self.node_state(node) == "IDLE" for node in NODES):
            if time.monotonic() > deadline:
                states = {node: self.node_state(node) for node in NODES}
                raise AssertionError(f"Slurm nodes not idle again: {states}")
            time.sleep(0.2)


_ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "SIGNALING"}


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The session's Slurm cluster (started on first use)."""
    # Not under pytest's tmp_path: slurmstepd and the jobs must reach the files.
    directory = tempfile.mkdtemp(prefix="gpusched-slurm-")
    try:
        proc = subprocess.run(
            ["bash", str(SCRIPT), "start", directory],
            capture_output=True,
            text=True,
            timeout=600,  # a first run may install the packages
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        shutil.rmtree(directory, ignore_errors=True)
        pytest.fail(f"scripts/slurm.sh start: {exc}")
    if proc.returncode != 0:
        subprocess.run(["bash", str(SCRIPT), "stop", directory], capture_output=True, timeout=120)
        shutil.rmtree(directory, ignore_errors=True)
        why = f"no Slurm test cluster: {proc.stderr.strip()[-3000:]}"
        if proc.returncode == UNAVAILABLE and not os.environ.get("GPUSCHED_REQUIRE_SLURM"):
            pytest.skip(why)
        pytest.fail(why)
    conf = proc.stdout.strip().splitlines()[-1].partition("=")[2]
    try:
        yield SlurmCluster(directory, conf)
    finally:
        subprocess.run(
            ["bash", str(SCRIPT), "stop", directory], capture_output=True, timeout=120, check=False
        )
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The Slurm cluster, left as found (no jobs, nodes idle) after the test."""
    slurm_cluster.reset()
    yield slurm_cluster
    slurm_cluster.reset()
