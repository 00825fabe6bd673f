"""The extras of pyproject.toml cover what each part of the package imports: a module of
``core/``, ``sim/``, ``service/``, ``backends/`` or ``cli/`` imports only the standard library and
the base install; ``hub/`` adds ``[hub]``, ``notebook/`` adds ``[notebook]``, ``sim/`` adds
``[sim]``; ``[all]`` is every extra. Read from the source (every import, lazy ones included), so a
new third-party import without its requirement fails here rather than on a user's machine."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jupyter_gpusched"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

#: distribution -> the import names it provides (where they differ, or it brings them along)
PROVIDES = {
    "pyyaml": {"yaml"},
    "nvidia-ml-py": {"pynvml"},
    "sqlalchemy": {"sqlalchemy"},
    "nbclient": {"nbclient", "jupyter_client"},  # nbclient runs kernels through jupyter_client
    "ipywidgets": {"ipywidgets", "IPython"},  # ipywidgets requires IPython
}
#: imports of a part that need an extra the part's own install does not bring, and why
NEEDS_EXTRA = {
    # service/auth.py: HubOAuth, imported only where the service authenticates through a hub,
    # which is installed there ([hub], README "Installing")
    ("service", "jupyterhub"),
}


def _names(requirements: list[str]) -> set[str]:
    names = set()
    for requirement in requirements:
        dist = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower().replace("_", "-")
        if dist == "jupyter-gpusched":
            continue
        names |= PROVIDES.get(dist, {dist.replace("-", "_")})
    return names


def _extra(name: str) -> set[str]:
    return _names(PROJECT["optional-dependencies"][name])


def _imports(folder: Path) -> set[str]:
    found = set()
    files = folder.rglob("*.py") if folder.is_dir() else [folder]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"jupyter_gpusched", "__future__"}


def test_each_part_imports_only_what_its_install_brings():
    base = _names(PROJECT["dependencies"])
    allowed = {
        "core": base,
        "sim": base | _extra("sim"),
        "service": base,
        "backends": base,
        "cli": base,
        "hub": base | _extra("hub"),
        "notebook": base | _extra("notebook"),
    }
    missing = {}
    for part, names in allowed.items():
        extra_ok = {module for owner, module in NEEDS_EXTRA if owner == part}
        unmet = _imports(PACKAGE / part) - names - extra_ok
        if unmet:
            missing[part] = sorted(unmet)
    top_level = set()
    for path in PACKAGE.glob("*.py"):
        top_level |= _imports(path)
    assert top_level - base == set()
    assert missing == {}


def test_all_is_every_extra_and_test_includes_all():
    extras = PROJECT["optional-dependencies"]
    (everything,) = extras["all"]
    named = set(re.search(r"\[(.*)\]", everything).group(1).split(","))
    assert named == set(extras) - {"all", "test"}
    assert "jupyter_gpusched[all]" in extras["test"]
