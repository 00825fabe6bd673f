"""Reading the YAML files of DESIGN.md (cluster, queues, policy) with line numbers for errors.

The engine (:mod:`jupyter_gpusched.core`) never touches files; adapters call these.
"""

from __future__ import annotations

from .backends.gpu.discover import expand_discover
from .core import Cluster, ConfigError, PolicySettings, QueueTree
from .core.settings import policy_error
from .yaml_lines import LineDict, read_yaml  # noqa: F401 (the service reads YAML from here too)


def load_cluster(path) -> Cluster:
    """The cluster file; ``nodes: discover`` entries are filled in from this machine's GPUs
    (see docs/gpu.md)."""
    data = expand_discover(read_yaml(path), source=str(path))
    if isinstance(data, dict) and data.get("nodes") == "slurm":  # read from scontrol
        from .backends.slurm.inventory import cluster_document

        data = cluster_document(data, source=str(path))
    return Cluster.from_dict(data, source=str(path))


def load_queues(path, cluster: Cluster) -> QueueTree:
    return QueueTree.from_dict(read_yaml(path), cluster.total_gpus, source=str(path))


def load_policy(path) -> PolicySettings:
    """The policy file. Its ``reaper:`` section is checked here, by the reaper's own rules
    (:func:`jupyter_gpusched.core.reaper_settings.validate`, the same as for ``PUT
    api/reaper``): a bad setting there is a :class:`ConfigError` with file, line and field like
    any other, for ``serve`` and ``replay --config`` alike."""
    data = read_yaml(path)
    settings = PolicySettings.from_dict(data, source=str(path))
    check_reaper_section(data, str(path))
    return settings


def check_reaper_section(data, source: str) -> None:
    """ConfigError naming ``reaper.<field>`` and its line when the policy document's ``reaper:``
    section has an unknown or invalid setting."""
    from .core.reaper_settings import validate  # the reaper's rules (no import at start-up)

    reaper = data.get("reaper") if isinstance(data, dict) else None
    if not reaper:  # absent or empty (PolicySettings.from_dict refused a non-mapping)
        return
    try:
        validate(dict(reaper))
    except ConfigError as exc:
        where = f"reaper.{exc.field}" if exc.field else "reaper"
        raise policy_error(data, source, exc.message, where) from None
