"""``binder/``: ``start`` runs the scheduler service (the simulated demo cluster) for a session
with no hub, then the session's command; the service ends with the command.

Run for real here: ``binder/start`` with a command that submits a batch job through
``jupyter_gpusched.notebook.client`` (as a notebook cell would) and waits for it, in a throwaway
HOME. The environment and ``postBuild`` are checked for what Binder needs of them.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"
START = BINDER / "start"

#: the session's command: what a notebook cell does with the client, the widget and the job
SESSION = textwrap.dedent(
    """
    import os
    from jupyter_gpusched import client
    from jupyter_gpusched.notebook.widgets import QueueWidget

    print("url", os.environ["GPUSCHED_SERVICE_URL"])
    print("session", os.environ["GPUSCHED_JOB_ID"], os.environ["CUDA_VISIBLE_DEVICES"])
    job = client.submit(command="echo binder-ok on $CUDA_VISIBLE_DEVICES", gpus=2, name="t")
    print("state", job.wait(timeout=60))
    print(job.logs())
    me = client.Client().request("GET", "api/me")
    print("admin", me["admin"])
    widget = QueueWidget(autostart=False)
    widget.refresh()
    print("widget", widget.last_error, len(widget.rows))
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_env(home: Path, port: int, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCHED_")}
    env.update(
        HOME=str(home),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', os.defpath)}",
        GPUSCHED_PYTHON=sys.executable,
        GPUSCHED_BINDER_PORT=str(port),
        # a Binder session's own single-user server variables: the service must ignore them
        JUPYTERHUB_SERVICE_PREFIX="/user/someone/",
        JUPYTERHUB_API_TOKEN="not-for-the-scheduler",
        **extra,
    )
    return env


def test_start_serves_the_scheduler_for_the_command_and_stops_it_after(tmp_path):
    port = free_port()
    done = subprocess.run(
        [str(START), sys.executable, "-c", SESSION],
        env=start_env(tmp_path, port),
        capture_output=True,
        text=True,
        timeout=180,
    )
    state = tmp_path / ".gpusched-binder"
    log = (state / "service.log").read_text() if (state / "service.log").exists() else ""
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n--- service.log\n{log}"
    out = done.stdout
    assert f"url http://127.0.0.1:{port}/" in out
    assert "session j-000001 " in out  # the session's own GPUs (a notebook job)
    assert "state completed" in out
    assert "binder-ok on " in out
    assert "admin True" in out  # the session's user administers its scheduler
    assert "widget None 1" in out  # the session's job (the batch job has ended)
    assert "the GPU scheduler serves" in done.stderr

    tokens = state / "tokens.yaml"
    assert stat.S_IMODE(tokens.stat().st_mode) == 0o600
    assert (state / "gpusched.sqlite").exists() and (state / "logs").is_dir()

    # the service ends with the command: its watcher stops it within seconds
    pid = int((state / "service.pid").read_text())
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"the service (pid {pid}) still runs after the command ended")
    assert not answers(port)


def test_start_stops_when_the_service_cannot_start(tmp_path):
    port = free_port()
    marker = tmp_path / "ran"
    done = subprocess.run(
        [str(START), "touch", str(marker)],
        env=start_env(tmp_path, port, GPUSCHED_BINDER_CLUSTER=str(tmp_path / "missing.yaml")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "the scheduler service exited" in done.stderr and "missing.yaml" in done.stderr
    assert not marker.exists()  # the command did not run


def test_the_environment_and_postbuild_install_this_repository():
    env = yaml.safe_load((BINDER / "environment.yml").read_text())
    deps = env["dependencies"]
    assert "python=3.11" in deps and "pip" in deps
    assert any(str(d).startswith("nodejs") for d in deps)  # builds the lab extension if needed
    post = (BINDER / "postBuild").read_text()
    assert "pip install --no-cache-dir ." in post
    enable = "jupyter server extension enable --sys-prefix jupyter_gpusched.notebook.serverext"
    assert enable in post
    for script in ("postBuild", "start"):
        assert os.access(BINDER / script, os.X_OK), f"binder/{script} is not executable"
    assert (BINDER / "start").read_text().rstrip().endswith('exec "$@"')
