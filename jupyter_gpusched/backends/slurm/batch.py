"""The batch job a placement becomes: its job script and ``sbatch``'s options.

Apart from :mod:`.launcher` (which submits, watches and signals jobs) because it is pure text
built from a :class:`LaunchSpec` and the engine's nodes: no command runs here, so what Slurm
is asked for can be read (and tested) on its own. The hub's notebook servers
(:mod:`jupyter_gpusched.hub.slurm_spawner`) share :func:`sbatch_common` and :func:`gres`.

* **Pinned.** ``sbatch --nodelist=<the engine's nodes> --nodes=<k> --ntasks-per-node=1
  --gres=gpu:<n>``; a gang whose nodes hold different GPU counts becomes a heterogeneous job
  (one component per node: ``-N1 -w n1 --gres=gpu:3 : -N1 -w n2 --gres=gpu:1``). The job
  script runs the command once per node with ``srun`` (one task per node), so each task sees
  the GPUs Slurm bound to it in ``CUDA_VISIBLE_DEVICES`` (Slurm, not the engine, picks *which*
  GPUs of a node: the count per node is the engine's, the indices are Slurm's; every task's
  line in the log says which it got). A notebook (``spec.notebook``) runs once, on the first
  node, with nbclient: ``python -m jupyter_gpusched.backends.slurm.launcher notebook IN OUT``.
* **Environment.** ``sbatch --export=NONE``: the job starts from the user's login environment on
  the node (as Slurm builds it), not the service's; the job script then sets
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` and the spec's variables (the request's ``env`` and
  GPUSCHED_*), and runs ``srun --export=ALL``.
* **Working directory.** ``--chdir``, and the job script enters it again (``cd``) before
  ``srun``: both run on the node, as the user, so a directory the user cannot enter there fails
  the job with a line in its log instead of running it in Slurm's fallback ``/tmp``.
"""

from __future__ import annotations

import os
import shlex

from ..accounts import JOB_PYTHON_ENV
from ..interface import LaunchError, LaunchSpec
from .commands import SlurmOptions, export_lines


def gres(gpus: int) -> list[str]:
    """sbatch's GPU request for ``gpus`` GPUs on a node: none for a CPU-only job."""
    return [f"--gres=gpu:{gpus}"] if gpus else []


def describe_nodes(nodes) -> str:
    """``n1: 2 GPUs, n2: 1 GPU``: a placement, for the log and messages."""
    return ", ".join(f"{name}: {len(gpus)} GPU{'s' * (len(gpus) != 1)}" for name, gpus in nodes)


def sbatch_common(name: str, log: str, cwd: str) -> list[str]:
    """The options every job of ours is submitted with: named, logged (appended), not
    requeued by Slurm, started from the user's login environment, in ``cwd``."""
    return [
        "sbatch",
        "--parsable",
        f"--job-name={name}",
        f"--output={log}",
        "--open-mode=append",
        "--no-requeue",
        "--export=NONE",
        f"--chdir={cwd}",
    ]


def batch_script(
    spec: LaunchSpec,
    nodes: list[tuple[str, list[int]]],
    run: str,
    cwd: str | None,
    python: str,
) -> str:
    """The batch script: the working directory, environment, a header line, and srun."""
    lines = [
        "#!/bin/sh",
        f"# jupyter_gpusched job {spec.job_id} (launch {run}), on {describe_nodes(nodes)}",
    ]
    if cwd is not None:  # as the user, on the node; Slurm's own --chdir falls back to /tmp
        where = shlex.quote(cwd)
        fail = f"echo '===== the job did not run: could not enter the directory' {where}"
        lines.append(f"cd -- {where} || {{ {fail}; exit 1; }}")
    lines.append("export CUDA_DEVICE_ORDER=PCI_BUS_ID")
    lines.append(f"export {JOB_PYTHON_ENV}={shlex.quote(python)}")
    try:
        lines += export_lines(spec.env)
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    lines.append(
        f'echo "===== $(date -u +%Y-%m-%dT%H:%M:%S+00:00) job {spec.job_id}: Slurm job '
        '$SLURM_JOB_ID on $SLURM_JOB_NODELIST as $(id -un)"'
    )
    srun = ["srun", "--export=ALL", "--kill-on-bad-exit=1"]
    uneven = len({len(gpus) for _, gpus in nodes}) > 1
    if spec.notebook is not None:
        srun += ["--het-group=0"] if uneven else []
        srun += ["--nodes=1", "--ntasks=1"]
        output = os.path.join(os.path.abspath(spec.log_dir), spec.job_id + ".out.ipynb")
        task = [python, "-m", "jupyter_gpusched.backends.slurm.launcher", "notebook"]
        task += [spec.notebook, output]
    else:
        if uneven:
            srun.append(f"--het-group=0-{len(nodes) - 1}")
        else:
            srun += [f"--nodes={len(nodes)}", "--ntasks-per-node=1"]
        header = 'echo "===== $SLURMD_NODENAME: CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"'
        task = ["/bin/sh", "-c", header + '; exec /bin/sh -c "$1"', "sh", spec.command]
    lines.append("exec " + " ".join(shlex.quote(word) for word in srun + task))
    return "\n".join(lines) + "\n"


def sbatch_argv(spec: LaunchSpec, nodes, log: str, cwd: str, options: SlurmOptions) -> list[str]:
    """sbatch's options: common ones, then one component per node when the GPU counts
    differ (a heterogeneous job), else one for all."""
    common = sbatch_common(f"gpusched-{spec.job_id}", log, cwd)
    if options.account:
        common.append(f"--account={options.account}")
    common += list(options.extra_args)
    where = [f"--partition={options.partition}"] if options.partition else []
    counts = {len(gpus) for _, gpus in nodes}
    if len(counts) == 1:
        names = ",".join(name for name, _ in nodes)
        return (
            common
            + where
            + [
                f"--nodes={len(nodes)}",
                f"--nodelist={names}",
                "--ntasks-per-node=1",
                *gres(counts.pop()),
            ]
        )
    args = list(common)
    for i, (name, gpus) in enumerate(nodes):
        if i:
            args.append(":")
        args += [*where, "--nodes=1", f"--nodelist={name}", "--ntasks-per-node=1"]
        args += gres(len(gpus))
    return args
