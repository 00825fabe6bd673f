"""Slurm's commands as both Slurm backends run them: the service's batch jobs
(:class:`~jupyter_gpusched.backends.slurm.launcher.SlurmLauncher`) and the hub's notebook servers
(:class:`~jupyter_gpusched.hub.slurm_spawner.GPUSchedSlurmSpawner`).

* :func:`run_slurm`: one command (``sbatch``, ``squeue``, ``scancel``, ``scontrol``), with
  ``SLURM_CONF`` and a directory of Slurm's commands when given, optionally as another user
  (their uid, gid and groups: munge then vouches for them), never through a shell.
* :func:`export_lines`: environment variables as ``export NAME='value'`` lines of a job script.
* :func:`read_squeue`: the state of some jobs, finished ones included, in one ``squeue``.
* :data:`HOPELESS_REASONS`: the pending reasons both backends give up on at once.
* :class:`SlurmOptions`: the settings both backends share (partition, account, extra sbatch
  options, slurm.conf, where the commands are), configurable once as ``c.SlurmOptions.*``.
"""

from __future__ import annotations

import os
import pwd
import re
import shlex
import subprocess
from typing import NamedTuple

from traitlets import Float, List, Unicode
from traitlets.config import LoggingConfigurable

from .inventory import slurm_env

#: Slurm job states in which the job may still use its nodes.
ACTIVE_STATES = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "SUSPENDED",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "RESIZING",
    "SIGNALING",
    "STAGE_OUT",
    "STOPPED",
    "RESV_DEL_HOLD",
}
#: Reasons for which Slurm will never start a pending job by itself.
HOPELESS_REASONS = {
    "BadConstraints",
    "InvalidAccount",
    "InvalidQOS",
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "DependencyNeverSatisfied",
}
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SlurmOptions(LoggingConfigurable):
    """How to reach Slurm and what every submission carries, for both backends: set them once
    as ``c.SlurmOptions.partition = ...``, or per backend as ``c.SlurmLauncher.*`` (the
    service's batch jobs) and ``c.GPUSchedSlurmSpawner.*`` (the hub's notebook servers)."""

    partition = Unicode(
        "",
        help="""The Slurm partition jobs are submitted to (sbatch --partition); empty: Slurm's
        default partition. It should hold the nodes of the cluster file and be left to
        jupyter_gpusched (see docs/slurm.md).""",
    ).tag(config=True)

    account = Unicode(
        "", help="Slurm account to charge (sbatch --account); empty: the user's default."
    ).tag(config=True)

    extra_args = List(
        Unicode(),
        default_value=[],
        help="""More sbatch options for every job, e.g. ['--qos=gpusched', '--time=UNLIMITED',
        '--cpus-per-gpu=8'].""",
    ).tag(config=True)

    slurm_conf = Unicode(
        "",
        help="""slurm.conf for Slurm's commands (sets SLURM_CONF); empty: the process's
        environment, else Slurm's default.""",
    ).tag(config=True)

    bin_dir = Unicode(
        "",
        help="""Directory of Slurm's commands (sbatch, squeue, scancel, scontrol, sacct; srun on
        the nodes); empty: $PATH.""",
    ).tag(config=True)

    command_timeout = Float(
        30.0, help="Seconds any one Slurm command may take before it is abandoned."
    ).tag(config=True)


class SlurmCommandError(RuntimeError):
    """A Slurm command failed; the message is Slurm's."""


class SqueueJob(NamedTuple):
    """One line of :func:`read_squeue`."""

    name: str
    state: str
    nodes: str  # the nodes it runs on (empty while pending)
    reason: str  # why it is pending (``None`` when it is not)


def is_active(state: str) -> bool:
    """Whether a job in Slurm state ``state`` may still use its nodes."""
    return state.split()[0].rstrip("+") in ACTIVE_STATES if state else False


def run_slurm(
    argv: list[str],
    *,
    bin_dir: str = "",
    slurm_conf: str = "",
    timeout: float = 30.0,
    input: str | None = None,
    account: pwd.struct_passwd | None = None,
    cwd: str | None = None,
) -> subprocess.CompletedProcess:
    """Run ``argv`` (``argv[0]`` from ``bin_dir`` when given) and return what it did; as
    ``account`` when given (needs root). OSError and TimeoutExpired are the caller's."""
    program = os.path.join(bin_dir, argv[0]) if bin_dir else argv[0]
    ids = {}
    if account is not None:
        groups = os.getgrouplist(account.pw_name, account.pw_gid)
        ids = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": groups}
    return subprocess.run(
        [program, *argv[1:]],
        input=input,
        capture_output=True,
        text=True,
        env=slurm_env(slurm_conf),
        timeout=timeout,
        check=False,
        cwd=cwd,
        **ids,
    )


def export_lines(env: dict[str, str]) -> list[str]:
    """``export NAME='value'`` for each variable; ValueError for a name a shell cannot take."""
    lines = []
    for name, value in env.items():
        if not ENV_NAME.fullmatch(name):
            raise ValueError(f"environment variable name {name!r} is not valid")
        lines.append(f"export {name}={shlex.quote(str(value))}")
    return lines


def read_squeue(run, ids) -> dict[str, SqueueJob]:
    """``{slurm job id: SqueueJob}`` for the jobs of ``ids`` that slurmctld still knows (a
    heterogeneous job's components under its id: an active one wins). ``run`` runs a command
    (``run(argv) -> CompletedProcess``, e.g. :func:`run_slurm` with the options bound);
    SlurmCommandError when squeue fails."""
    ids = sorted(set(ids), key=int)
    if not ids:
        return {}
    argv = ["squeue", "--noheader", "--states=all", f"--jobs={','.join(ids)}"]
    done = run([*argv, "--format=%i|%T|%j|%N|%r"])
    if done.returncode != 0 and "Invalid job id" not in done.stderr:
        raise SlurmCommandError(f"squeue failed: {' '.join(done.stderr.split())}")
    jobs: dict[str, SqueueJob] = {}
    for line in done.stdout.splitlines():
        parts = line.strip().split("|", 4)
        if len(parts) != 5:
            continue
        job, state, name, nodes, reason = parts
        job = job.split("+")[0]  # a heterogeneous job's components: 123+0, 123+1
        old = jobs.get(job)
        if old is None or (is_active(state) and not is_active(old.state)):
            jobs[job] = SqueueJob(name, state, nodes, reason)
    return jobs
