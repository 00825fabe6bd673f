"""The single-user server as a process on the hub's host, run as the hub user's own account:
:class:`LocalServerProcess`, the base of :class:`~jupyter_gpusched.hub.spawner.GPUSchedSpawner`.

Apart from the spawner (which talks to the scheduler, chooses the profile and follows the
allocation) because this is the part a subclass replaces: the five methods ``server_started``,
``launch_server``, ``server_answering``, ``poll_server`` and ``stop_server`` start, watch and
stop the server LocalProcessSpawner's way; ``GPUSchedSlurmSpawner`` (``hub/slurm_spawner.py``)
runs it as a Slurm job on the allocated node instead (and, having no local process, does not
wait in ``server_answering``). Their traits are configured as before, as
``c.GPUSchedSpawner.*``.

Which OS account a server runs as: the hub user's own Unix account (LocalProcessSpawner's way:
its uid, gid and groups, HOME its home directory, entered after the privileges are dropped),
and never a system account: :class:`~jupyter_gpusched.backends.accounts.AccountPolicy` (``min_uid``,
``denied_users``) refuses a hub user named like one (a hub user ``root`` created by a hub admin)
before anything is asked of the scheduler, with its message on the spawn page (HTTP 403).
``run_as_hub_user`` runs every server as the hub's own user instead, for a hub that is not root
(a laptop); set while the hub is root it is refused, since every server, kernel and job it
submits would then run as root.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import signal
import time

from jupyterhub.spawner import LocalProcessSpawner
from tornado.httpclient import AsyncHTTPClient
from traitlets import Bool, Float, Unicode

from ..backends.accounts import AccountPolicy, AccountRefused
from ..backends.process_tree import descendants, process_created, wait_gone
from .profiles import GPUSchedSpawnError


class LocalServerProcess(LocalProcessSpawner):
    """The server as a local process of the hub user's account (see the module's docstring)."""

    run_as_hub_user = Bool(
        False,
        help="""Run single-user servers as the hub's own OS user, for a hub that is not root (a
        laptop, a demo without Unix accounts), not as the OS account named like the hub user
        (the default, LocalProcessSpawner's way, which needs a root hub and one OS account per
        hub user). HOME is home_dir_template for each user. Refused while the hub runs as root:
        every server, every kernel and every job submitted from them would run as root.""",
    ).tag(config=True)

    home_dir_template = Unicode(
        "/tmp/jupyter-gpusched/{username}",
        help="""With run_as_hub_user: each user's HOME and working directory ({username} is
        replaced; created if missing).""",
    ).tag(config=True)

    pid_created = Float(0.0)  # the server process's start time (0: unknown)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # c.AccountPolicy.* in the hub's config: the same rule the service applies to jobs
        self.account_policy = AccountPolicy(parent=self)

    def server_account(self) -> pwd.struct_passwd | None:
        """The OS account the server runs as: the hub user's own, if the account policy allows
        it; None with run_as_hub_user (the hub's own account, which is not root). Raises
        GPUSchedSpawnError with the reason the user sees on the spawn page."""
        if self.run_as_hub_user:
            if os.geteuid() == 0:
                raise GPUSchedSpawnError(
                    "The hub runs as root with GPUSchedSpawner.run_as_hub_user set: your "
                    "server, its kernels and its jobs would all run as root. An administrator "
                    "must unset run_as_hub_user (servers then run as each user's own account).",
                    reason="config",
                    status_code=500,
                )
            return None
        try:
            return self.account_policy.account(self.user.name)
        except AccountRefused as exc:
            raise GPUSchedSpawnError(
                f"Your server cannot start: {exc.message}.", reason="account", status_code=403
            ) from None

    def _home(self) -> str:
        return self.home_dir_template.format(username=self.user.name)

    def make_preexec_fn(self, name):
        if not self.run_as_hub_user:
            return super().make_preexec_fn(name)
        home = self._home()
        os.makedirs(home, mode=0o700, exist_ok=True)

        def preexec():
            os.chdir(home)

        return preexec

    def user_env(self, env):
        if not self.run_as_hub_user:
            return super().user_env(env)
        env["USER"] = self.user.name
        env["HOME"] = self._home()
        env["SHELL"] = "/bin/bash"
        return env

    # -- the server process: LocalProcessSpawner's. A subclass that runs the server elsewhere
    # (GPUSchedSlurmSpawner) replaces these four, and get_state/load_state/clear_state.
    def server_started(self) -> bool:
        """Is there a server (process, job) to stop?"""
        return bool(self.pid)  # never signal pid 0 (our own process group)

    async def launch_server(self):
        """Start the single-user server on ``self.allocation``; returns what start() returns
        (the server's URL, or ``(ip, port)``)."""
        url = await LocalProcessSpawner.start(self)
        self.pid_created = process_created(self.pid) or 0.0
        return url

    async def server_answering(self, address, within: float) -> None:
        """Wait until the server just launched at ``address`` (``(ip, port)``) answers HTTP
        where the hub will ask it (``<base_url>api``; any status below 500 will do, as for the
        hub), trying every 50 ms. The hub's own wait, which starts when start() returns, backs
        off to seconds between its tries (up to 5 s): a server up 3 s after its launch was
        found about 1.5 s later, on average; now at the hub's first try. A process that ends
        first fails the start at once (a GPUSchedSpawnError), not after the hub's
        ``http_timeout``; after ``within`` seconds this returns, and the hub waits and reports
        as it always did."""
        if self.internal_ssl or self.server is None or not isinstance(address, tuple):
            return
        ip, port = address
        url = f"http://{ip}:{port}{self.server.base_url}api"
        client = AsyncHTTPClient()
        deadline = time.monotonic() + within
        while self.proc is not None and time.monotonic() < deadline:
            if (status := self.proc.poll()) is not None:
                raise GPUSchedSpawnError(
                    f"Your server stopped while starting (exit status {status}), before it "
                    "answered; an administrator finds its output in the hub's log.",
                    reason="exited",
                    status_code=500,
                )
            try:
                response = await client.fetch(
                    url, raise_error=False, follow_redirects=False, request_timeout=2
                )
            except Exception:  # not listening yet (refused, reset)
                pass
            else:
                if response.code < 500:
                    return
            await asyncio.sleep(0.05)

    async def poll_server(self):
        """None while the server runs; else its exit status, with its state cleared. A PID
        restored from the hub's database that now names another process (the server is gone
        and the PID was reused, e.g. after a reboot) is taken for the server's end, so that no
        one else's process is ever signalled as the server."""
        # (not for our own child, whose Popen knows its end: only a PID restored by the hub)
        restored = self.proc is None and self.pid and self.pid_created
        if restored and process_created(self.pid) != self.pid_created:
            self.log.warning("%s: pid %s is no longer the server", self._log_name, self.pid)
            self.pid = 0
        return await LocalProcessSpawner.poll(self)

    async def stop_server(self, now: bool = False) -> None:
        """Stop the server and wait until it *and its kernels* are gone.

        SIGTERM first, not LocalProcessSpawner's SIGINT: on SIGTERM jupyter-server shuts its
        kernels down and then exits, whereas a SIGINT makes a server without a terminal exit at
        once and leave its kernels to notice a second or so later, still holding GPU memory
        while the scheduler hands the GPUs to the next job. SIGKILL after ``term_timeout``; then
        every process of the server's tree left (kernels run in their own sessions) is waited
        for, and killed after ``kill_timeout``, before this returns and the GPUs are released."""
        running = await self.poll_server() is None  # also: the PID is still the server's
        tree = descendants(self.pid) if running else []
        if not now and running:
            await self._signal(signal.SIGTERM)
            # every 50 ms (JupyterHub's wait_for_death backs off to seconds): the GPUs go back
            # as soon as the server is gone
            deadline = time.monotonic() + self.term_timeout
            while await self.poll_server() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        if self.pid and await self.poll_server() is None:
            await LocalProcessSpawner.stop(self, now=True)  # SIGKILL
        await wait_gone(tree, self.kill_timeout, self.log)
