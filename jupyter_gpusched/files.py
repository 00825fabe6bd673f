"""Reading the YAML files of DESIGN.md (cluster, queues, policy) with line numbers for errors.

The engine (:mod:`jupyter_gpusched.core`) never touches files; adapters call these.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from .core import Cluster, ConfigError, PolicySettings, QueueTree
from .core.settings import policy_error
from .gpu.discover import expand_discover


class LineDict(dict):
    """A dict that remembers the YAML line (1-based) of each key in ``lines``."""

    lines: dict


class _LineLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader, node):
    mapping = LineDict()
    mapping.lines = {}
    loader.flatten_mapping(node)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        mapping[key] = loader.construct_object(value_node, deep=True)
        mapping.lines[key] = key_node.start_mark.line + 1
    return mapping


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path) -> object:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read the file: {exc.strerror}", source=str(path)) from None
    try:
        return yaml.load(text, Loader=_LineLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"not valid YAML: {problem}", source=str(path), line=line) from None


def load_cluster(path) -> Cluster:
    """The cluster file; ``nodes: discover`` entries are filled in from this machine's GPUs
    (see docs/gpu.md)."""
    data = expand_discover(read_yaml(path), source=str(path))
    if isinstance(data, dict) and data.get("nodes") == "slurm":  # read from scontrol
        from .slurm_inventory import cluster_document

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
