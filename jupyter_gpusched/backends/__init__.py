"""What the scheduler drives on the machines: the launch interface (:mod:`.interface`), GPU
telemetry (:mod:`.gpu`, with the node agent), the local launcher and its job wrapper
(:mod:`.local`), Slurm (:mod:`.slurm`), the Unix accounts jobs and servers run as
(:mod:`.accounts`) and process trees (:mod:`.process_tree`).

Used by the service, the hub's spawners and the notebook server; imports none of them (the import
rules in ``pyproject.toml``, ``[tool.importlinter]``).
"""
