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


class DuplicateKey(yaml.YAMLError):
    """A key given twice in one mapping: YAML keeps the last silently, so an edit merged into a
    queue file would drop a quota without a word."""

    def __init__(self, key, first: int, again: int):
        super().__init__()
        self.key, self.first, self.again = key, first, again


def _construct_mapping(loader, node):
    mapping = LineDict()
    mapping.lines = {}
    given = {id(key_node) for key_node, _ in node.value}  # (not those a <<: *anchor merges in)
    loader.flatten_mapping(node)  # (merged keys come first; a key given overrides one merged)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in mapping.lines and id(key_node) in given and mapping.lines[key] > 0:
            raise DuplicateKey(key, mapping.lines[key], line)
        mapping[key] = loader.construct_object(value_node, deep=True)
        mapping.lines[key] = line if id(key_node) in given else -line  # (-: merged)
    mapping.lines = {key: abs(line) for key, line in mapping.lines.items()}
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
    except DuplicateKey as exc:
        raise ConfigError(
            f"{exc.key!r} is given twice, on lines {exc.first} and {exc.again}: keep one",
            source=str(path),
            line=exc.again,
            field=str(exc.key),
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"not valid YAML: {problem}", source=str(path), line=line) from None
