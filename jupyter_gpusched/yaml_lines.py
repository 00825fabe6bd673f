"""Reading a YAML file with the line number of each key, for errors that name file, line and
field (:class:`~jupyter_gpusched.core.ConfigError`).

Apart from :mod:`jupyter_gpusched.files` (the cluster, queue and policy files, which need the
backends for ``nodes: discover`` and ``nodes: slurm``) so that the backends can read YAML files
too without importing it back.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from .core import ConfigError


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
