"""How a Slurm batch job ended: Slurm's end states as an :class:`Exit`, read from ``scontrol
show job`` (while slurmctld remembers the job) and else from ``sacct`` (with slurmdbd).

Apart from :mod:`.launcher` because it is the one translation table between Slurm's words and
the service's outcomes, and it needs nothing of the launcher's state: give it a way to run a
Slurm command. Slurm's end states map to :class:`Exit`:

===================  =====================================================
COMPLETED            completed, exit code 0
FAILED               failed, exit code N (killed, when ended by a signal)
OUT_OF_MEMORY        failed ("out of memory")
CANCELLED            killed ("cancelled in Slurm")
TIMEOUT, DEADLINE    killed (Slurm's time limit)
PREEMPTED            killed (Slurm's own pre-emption: see docs/slurm.md)
NODE_FAIL, BOOT_FAIL lost (the node failed; see ``SlurmNodeSync``)
===================  =====================================================

A heterogeneous job (one component per node) ends as its worst component. ``scontrol`` keeps
finished jobs for ``MinJobAge``, 300 s by default: set it above the service's longest expected
downtime, or run slurmdbd (``sacct`` needs it; without either, the outcome is ``lost``).
"""

from __future__ import annotations

import subprocess

from ..interface import Exit
from ..local.exits import signal_name
from .commands import is_active
from .parse import parse_oneliner

#: How bad an outcome is, for the end of a job of several components (the worst counts).
SEVERITY = {"completed": 0, "failed": 1, "killed": 2, "lost": 3}


def scontrol_end(run, job: str, name: str) -> tuple[str, Exit] | None:
    """``(Slurm state, Exit)`` of Slurm job ``job`` named ``name`` from ``scontrol show job``;
    None while it is active, or when slurmctld does not know it (any more). ``run`` runs a Slurm
    command (``SlurmLauncher._run``); its OSError and TimeoutExpired go to the caller."""
    done = run(["scontrol", "show", "job", "--oneliner", job])
    if done.returncode != 0:
        return None
    records = [parse_oneliner(line) for line in done.stdout.splitlines() if line.strip()]
    records = [r for r in records if r.get("JobName") == name]
    if not records or any(is_active(r.get("JobState", "")) for r in records):
        return None
    return worst_end([(r.get("JobState", ""), r.get("ExitCode", "0:0")) for r in records])


def sacct_end(run, job: str, name: str) -> tuple[str, Exit] | None:
    """The same from ``sacct`` (slurmdbd's accounting); None when sacct cannot say."""
    try:
        fields = "--format=JobName,State,ExitCode"
        done = run(["sacct", "--noheader", "--parsable2", "-X", f"--jobs={job}", fields])
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    rows = [line.split("|") for line in done.stdout.splitlines() if line.count("|") == 2]
    rows = [(state.split()[0], code) for job_name, state, code in rows if job_name == name]
    if not rows or any(is_active(state) for state, _ in rows):
        return None
    return worst_end(rows)


def exit_for(state: str, code_text: str) -> Exit:
    """Slurm's end state and ``ExitCode=code:signal`` -> Exit."""
    code, _, signum = code_text.partition(":")
    try:
        code_n, sig_n = int(code), int(signum or 0)
    except ValueError:
        code_n, sig_n = 0, 0
    state = state.split()[0] if state else ""
    if state == "COMPLETED":
        return Exit(0, "completed", "exit code 0")
    if state == "FAILED":
        if sig_n:
            return Exit(None, "killed", f"killed by {signal_name(sig_n)}")
        return Exit(code_n, "failed", f"exit code {code_n}")
    if state == "OUT_OF_MEMORY":
        return Exit(code_n or None, "failed", "out of memory (Slurm: OUT_OF_MEMORY)")
    if state == "CANCELLED":
        return Exit(None, "killed", "cancelled in Slurm")
    if state in ("TIMEOUT", "DEADLINE"):
        return Exit(None, "killed", f"killed by Slurm at its time limit ({state})")
    if state == "PREEMPTED":
        return Exit(None, "killed", "pre-empted by Slurm's own scheduler")
    if state in ("NODE_FAIL", "BOOT_FAIL"):
        return Exit(None, "lost", f"a node of the job failed (Slurm: {state})")
    return Exit(None, "lost", f"Slurm says {state or 'nothing'}")


def worst_end(rows: list[tuple[str, str]]) -> tuple[str, Exit]:
    """The end of a (heterogeneous) job: its worst component's."""
    ends = [(state.split()[0] if state else "", exit_for(state, code)) for state, code in rows]
    return max(ends, key=lambda end: SEVERITY[end[1].outcome])
