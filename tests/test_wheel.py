"""The package as users install it: ``python -m build`` on a copy of the checkout gives an sdist
and a wheel (built from that sdist) holding the JupyterLab extension and the
``jupyter_server_config.d`` file that enables the server extension; that wheel, installed in a
fresh virtualenv with no Node on PATH, is reported enabled and OK by ``jupyter labextension
list`` and ``jupyter server extension list``; and the sdist alone rebuilds the extension.

Offline and cheap: the builds run ``--no-isolation`` with the test extras' build, hatchling and
hatch-jupyter-builder, and the copy carries this checkout's built extension (``make
labextension``), so the build hook skips it. The fresh venv has no pip and no dependencies of
its own: the wheel goes in with ``--no-deps`` (this venv's pip, ``--python``) and a ``.pth``
file adds this venv's site-packages after it, so the third-party packages are shared, but not
the editable jupyter_gpusched (a ``.pth`` line only adds a path: the editable install's own
``.pth`` in there is not run), so what is imported and found is the wheel's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILT = ROOT / "jupyter_gpusched" / "labextension"
NAME = "jupyter_gpusched-0.1.0"
LAB = f"{NAME}.data/data/share/jupyter/labextensions/jupyter-gpusched/"
SERVER_CONFIG = f"{NAME}.data/data/etc/jupyter/jupyter_server_config.d/jupyter_gpusched.json"


def _run(args, cwd=None, env=None) -> str:
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    output = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)  # the lists' colours
    assert done.returncode == 0, f"{args} failed:\n{output[-4000:]}"
    return output


def _build(source: Path, out: Path, *which: str) -> None:
    env = {**os.environ, "npm_config_prefer_offline": "true", "npm_config_audit": "false"}
    env.pop("SKIP_JUPYTER_BUILDER", None)
    _run(
        [sys.executable, "-m", "build", "--no-isolation", *which, "-o", str(out), "."], source, env
    )


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """sdist and wheel, as ``python -m build`` makes them: the sdist, then the wheel from it."""
    if not (BUILT / "package.json").exists() and shutil.which("npm") is None:
        pytest.skip("the Lab extension is not built and there is no npm to build it")
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (the copy is made from `git ls-files`)")
    base = tmp_path_factory.mktemp("wheel")
    source = base / "checkout"
    listed = _run(["git", "ls-files", "-co", "--exclude-standard"], ROOT).splitlines()
    for name in listed:
        path = ROOT / name
        if path.is_file() and not path.is_symlink():  # node_modules may be a link: not source
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / name)
    if (BUILT / "package.json").exists():
        shutil.copytree(BUILT, source / "jupyter_gpusched" / "labextension")
    _build(source, base / "dist")
    return base / "dist"


def test_the_wheel_holds_the_lab_extension_and_the_server_config(dist):
    with zipfile.ZipFile(dist / f"{NAME}-py3-none-any.whl") as wheel:
        names = set(wheel.namelist())
        config = wheel.read(SERVER_CONFIG).decode()
    assert f"{LAB}package.json" in names
    assert f"{LAB}static/style.js" in names
    assert any(n.startswith(f"{LAB}static/remoteEntry.") for n in names)
    assert '"jupyter_gpusched.notebook.serverext": true' in config
    # the service's web page: its template, script and style sheet (service/page.py)
    for asset in (
        "page.html",
        *(f"static/{n}" for n in ("page.css", "draw.js", "admin.js", "page.js")),
    ):
        assert f"jupyter_gpusched/service/web/{asset}" in names, asset
    # shipped once, as data, not also as a Python subpackage
    assert not any(n.startswith("jupyter_gpusched/labextension/") for n in names)


def test_the_sdist_rebuilds_the_lab_extension_from_its_sources(dist, tmp_path):
    """The sdist has what the build hook needs; without the built extension it builds it."""
    with tarfile.open(dist / f"{NAME}.tar.gz") as sdist:
        names = set(sdist.getnames())
        for needed in ("package.json", "package-lock.json", "tsconfig.json", "src/index.ts"):
            assert f"{NAME}/labextension/{needed}" in names
        assert f"{NAME}/jupyter-config/jupyter_server_config.d/jupyter_gpusched.json" in names
        assert not any(n.startswith(f"{NAME}/labextension/node_modules") for n in names)
        if shutil.which("npm") is None:
            pytest.skip("no npm: the extension cannot be rebuilt from the sdist's sources")
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}  # Python >= 3.11.4
        sdist.extractall(tmp_path, **safe)
    unpacked = tmp_path / NAME
    shutil.rmtree(unpacked / "jupyter_gpusched" / "labextension")
    _build(unpacked, tmp_path / "dist", "--wheel")
    with zipfile.ZipFile(tmp_path / "dist" / f"{NAME}-py3-none-any.whl") as wheel:
        assert f"{LAB}static/style.js" in wheel.namelist()


def test_the_wheel_in_a_fresh_venv_without_node_enables_both_extensions(dist, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    wheel = dist / f"{NAME}-py3-none-any.whl"
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    _run([*pip, "install", "-q", "--no-deps", str(wheel)])
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
    ours = sysconfig.get_path("purelib")  # this venv's third-party packages, after the wheel's
    (Path(site.strip()) / "shared-test-deps.pth").write_text(ours + "\n")
    env = {
        "PATH": str(venv / "bin"),  # no node, no npm
        "HOME": str(tmp_path),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "JUPYTER_PLATFORM_DIRS": "1",
    }
    assert shutil.which("node", path=env["PATH"]) is None
    assert shutil.which("npm", path=env["PATH"]) is None
    # run outside the checkout: `python -c` puts the working directory first on sys.path
    code = "import jupyter_gpusched; print(jupyter_gpusched.__file__)"
    where = _run([str(python), "-c", code], cwd=tmp_path, env=env)
    assert where.strip().startswith(str(venv)), where  # the wheel's, not the editable checkout

    labs = _run([str(python), "-m", "jupyterlab.labextensions", "list"], tmp_path, env)
    line = next((x for x in labs.splitlines() if "jupyter-gpusched" in x), "")
    assert "enabled" in line and "OK" in line, labs
    assert str(venv / "share" / "jupyter" / "labextensions") in labs

    servers = _run(
        [str(python), "-m", "jupyter_server.extension.serverextension", "list"], tmp_path, env
    )
    assert "jupyter_gpusched.notebook.serverext enabled" in servers, servers
    assert "jupyter_gpusched.notebook.serverext  OK" in servers, servers
    assert str(venv / "etc" / "jupyter") in servers
