"""A notebook server's terminal (and a kernel's ``!``) runs ``jupyter gpusched ...`` with no
set-up: the server's PATH, from :func:`~jupyter_gpusched.hub.singleuser_command
.singleuser_command`, starts with this environment's commands in a form the user can run, also
where the environment's own interpreter lives under root's 0700 home (then a system Python of
the same version runs them). Run as alice, a demo account, when the tests run as root, as the
hub's servers are; else as the tests' own user."""

from __future__ import annotations

import os
import pwd
import subprocess

from hub_harness import _create_demo_users

from jupyter_gpusched import __version__
from jupyter_gpusched.hub.singleuser_command import singleuser_command


def test_the_servers_path_runs_jupyter_gpusched_as_its_user():
    cmd, env = singleuser_command()
    assert "PATH" in env, (cmd, env)  # every way of starting a server sets it
    ids = {}
    if os.geteuid() == 0:
        _create_demo_users()
        alice = pwd.getpwnam("alice")
        ids = {"user": alice.pw_uid, "group": alice.pw_gid, "extra_groups": []}
    done = subprocess.run(
        ["/bin/sh", "-c", "jupyter gpusched --version && jupyter-gpusched --version"],
        env={"HOME": "/tmp", **env},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        **ids,
    )
    assert done.returncode == 0, (done.stdout, done.stderr, env["PATH"])
    assert done.stdout.split() == [__version__, __version__], done.stdout
