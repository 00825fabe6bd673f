"""Slurm: :mod:`.commands` (running ``sbatch``/``squeue``/``scancel`` ...), :mod:`.inventory`
(nodes and their states from ``scontrol``) and :mod:`.launcher` (the service's
``SlurmLauncher``); see docs/slurm.md."""
