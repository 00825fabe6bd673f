"""GPUSchedSlurmSpawner: notebook servers placed by the GPU scheduler and run as Slurm jobs.

``c.JupyterHub.spawner_class = "gpusched-slurm"``. Everything up to the allocation is
:class:`~jupyter_gpusched.hub.spawner.GPUSchedSpawner`'s (profiles, the queue, progress, the
allocation's life); then, instead of a local process, the single-user server becomes one Slurm
job on the node and GPU count the engine allocated:

* ``sbatch --nodelist=<node> --nodes=1 --ntasks=1 --gres=gpu:<n> --no-requeue
  --export=NONE --job-name=gpusched-<job id> --output=<log_dir>/<job id>.log``, as the user's
  OS account when the hub is root, never a system account (``AccountPolicy``, checked before
  the scheduler is asked, as for GPUSchedSpawner); ``run_as_hub_user``, for a hub that is not
  root: as the hub's own user. The script exports the server's environment (``get_env()``: the
  hub's API token and URLs, ``GPUSCHED_*``) and runs ``self.cmd + get_args()`` with ``srun``
  (so ``scancel --signal`` reaches it). ``CUDA_VISIBLE_DEVICES`` is Slurm's (the GPUs it
  bound to the job, which may differ from the engine's indices), not the engine's.
* The server listens on ``bind_ip`` (all addresses) and on a port chosen by the spawner; the
  hub's proxy reaches it at the node's address: ``node_addresses``, else Slurm's ``NodeAddr``.
* A job Slurm keeps pending longer than ``pending_timeout`` (or for a reason Slurm never gets
  over) is cancelled: the spawn fails with Slurm's reason and the allocation is released.
* ``poll``: the job's state in ``squeue`` (gone or ended: the server exited, the allocation is
  released). ``stop``: ``scancel --signal=TERM``, ``stop_grace``, then ``scancel``.
* The hub's database keeps the Slurm job id (``get_state``): a restarted hub finds its servers.

See docs/slurm.md, "Notebooks on Slurm".
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shlex
import subprocess
import time

from jupyterhub.utils import random_port
from traitlets import Dict, Float, Unicode

from ..backends.slurm.batch import gres, sbatch_common
from ..backends.slurm.commands import (
    HOPELESS_REASONS,
    SlurmCommandError,
    SlurmOptions,
    export_lines,
    is_active,
    read_squeue,
    run_slurm,
)
from ..backends.slurm.parse import parse_oneliner
from .profiles import GPUSchedSpawnError, describe_duration
from .spawner import GPUSchedSpawner

_addresses: dict[tuple[str, str], str] = {}  # (slurm_conf, node) -> NodeAddr, read once


class GPUSchedSlurmSpawner(GPUSchedSpawner, SlurmOptions):
    """GPUSchedSpawner whose servers run as Slurm jobs on the allocated node (see the module
    docstring)."""

    log_dir = Unicode(
        "{home}/.jupyter-gpusched",
        help="""Directory of the servers' Slurm output, <log_dir>/<job id>.log ({home} and
        {username} are replaced). It must be at the same path on the hub and the nodes; the hub
        creates it (as the user's) when missing.""",
    ).tag(config=True)

    bind_ip = Unicode(
        "0.0.0.0",
        help="The address the server listens on, on its node (all of them by default: the "
        "hub's proxy must reach it).",
    ).tag(config=True)

    node_addresses = Dict(
        value_trait=Unicode(),
        help="""Address by which the hub's proxy reaches a node ({node name: address}); a node
        not listed: Slurm's NodeAddr (scontrol show node), else its name.""",
    ).tag(config=True)

    pending_timeout = Float(
        120.0,
        help="""Seconds Slurm may keep a server's job pending before the spawn fails (the job is
        cancelled and the GPUs go back to the scheduler). A reason Slurm never gets over by itself
        (BadConstraints, InvalidAccount, ...) fails it at once.""",
    ).tag(config=True)

    stop_grace = Float(
        10.0,
        help="Seconds between scancel --signal=TERM (the server shuts down) and scancel.",
    ).tag(config=True)

    kill_wait = Float(
        30.0,
        help="Seconds stop() waits after scancel for Slurm to end the job.",
    ).tag(config=True)

    slurm_poll_interval = Float(
        0.5, help="Seconds between squeue reads while a job starts or stops."
    ).tag(config=True)

    # The server's Slurm job (kept in the hub's database by get_state).
    slurm_job_id = Unicode("")
    slurm_job_name = Unicode("")
    slurm_node = Unicode("")
    slurm_log = Unicode("")

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._configured_port = self.port  # Spawner.port: 0 unless an admin set one

    # -- Slurm's commands ------------------------------------------------------------------------
    def _run_sync(self, argv, **kwargs) -> subprocess.CompletedProcess:
        options = {"bin_dir": self.bin_dir, "slurm_conf": self.slurm_conf}
        return run_slurm(argv, timeout=self.command_timeout, **options, **kwargs)

    async def _slurm(self, argv, **kwargs) -> subprocess.CompletedProcess:
        """Run a Slurm command off the event loop."""
        return await asyncio.to_thread(self._run_sync, argv, **kwargs)

    async def slurm_state(self) -> tuple[str, str, str] | None:
        """``(state, nodes, reason)`` of the server's job, None when Slurm no longer knows it
        (or a job of that id is not ours); OSError, TimeoutExpired or SlurmCommandError when
        Slurm cannot say."""
        job = self.slurm_job_id
        found = (await asyncio.to_thread(read_squeue, self._run_sync, [job])).get(job)
        if found is None or found.name != self._job_name():  # a reused id is not ours
            return None
        return found.state, found.nodes, found.reason

    async def _scancel(self, *options: str) -> None:
        try:
            done = await self._slurm(["scancel", *options, self.slurm_job_id])
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.log.warning("%s: scancel %s: %s", self._log_name, self.slurm_job_id, exc)
            return
        if done.returncode != 0:
            why = " ".join(done.stderr.split())
            self.log.warning("%s: scancel %s: %s", self._log_name, self.slurm_job_id, why)

    def node_address(self, node: str) -> str:
        """Where the proxy reaches ``node``: node_addresses, Slurm's NodeAddr, or the name."""
        if node in self.node_addresses:
            return self.node_addresses[node]
        key = (self.slurm_conf, node)
        if key not in _addresses:
            try:
                done = self._run_sync(["scontrol", "show", "node", "--oneliner", node])
                fields = parse_oneliner(done.stdout) if done.returncode == 0 else {}
            except (OSError, subprocess.TimeoutExpired):
                fields = {}
            if not fields.get("NodeAddr"):
                return node  # not cached: ask again next time
            _addresses[key] = fields["NodeAddr"]
        return _addresses[key]

    # -- the job ---------------------------------------------------------------------------------
    def _job_name(self) -> str:
        return self.slurm_job_name or f"gpusched-{self.job_id}"

    def _account(self) -> pwd.struct_passwd | None:
        """The account sbatch runs as: the user's (checked by the account policy, see
        GPUSchedSpawner.server_account) when the hub is root; else None, the hub's own."""
        account = self.server_account()
        return account if account is not None and os.geteuid() == 0 else None

    def get_env(self):
        env = super().get_env()
        env.pop("CUDA_VISIBLE_DEVICES", None)  # Slurm's, inside the job (see the docstring)
        return env

    def job_script(self, env: dict, cmd: list[str]) -> str:
        """The batch script: the server's environment, a header line in the log, srun."""
        lines = [
            "#!/bin/sh",
            f"# jupyter_gpusched notebook server {self.user.name!r}/{self.name!r} "
            f"(job {self.job_id})",  # repr: no newline of a name can start a line of its own
            "export CUDA_DEVICE_ORDER=PCI_BUS_ID",
        ]
        try:
            lines += export_lines(env)
        except ValueError as exc:
            raise GPUSchedSpawnError(str(exc), reason="slurm", status_code=500) from None
        lines.append(
            f'echo "===== $(date -u +%Y-%m-%dT%H:%M:%S+00:00) job {self.job_id}: Slurm job '
            "$SLURM_JOB_ID on $SLURMD_NODENAME as $(id -un), "
            'CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"'
        )
        srun = os.path.join(self.bin_dir, "srun") if self.bin_dir else "srun"
        words = [srun, "--export=ALL", "--nodes=1", "--ntasks=1", "--kill-on-bad-exit=1", *cmd]
        lines.append("exec " + " ".join(shlex.quote(word) for word in words))
        return "\n".join(lines) + "\n"

    def sbatch_args(self, node: str, gpus: int, log: str, cwd: str) -> list[str]:
        args = [
            *sbatch_common(self._job_name(), log, cwd),
            f"--nodelist={node}",
            "--nodes=1",
            "--ntasks=1",
            *gres(gpus),  # none for a CPU-only profile
        ]
        if self.partition:
            args.append(f"--partition={self.partition}")
        if self.account:
            args.append(f"--account={self.account}")
        return args + list(self.extra_args)

    def _prepare_log(self, log: str, account: pwd.struct_passwd | None) -> None:
        """Create the log's directory and file (Slurm does not create directories). For another
        user's account this runs as that user, in a child process: the path is in their home,
        and a symlink they planted there must not make root create files elsewhere."""
        script = 'umask 077 && mkdir -p "$1" && : >> "$2"'
        argv = ["/bin/sh", "-c", script, "sh", os.path.dirname(log), log]
        ids = {}
        if account is not None and account.pw_uid != os.geteuid():
            groups = os.getgrouplist(account.pw_name, account.pw_gid)
            ids = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": groups}
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=30, **ids)
        except (OSError, subprocess.SubprocessError) as exc:
            done = None
            why = str(exc)
        else:
            why = done.stderr.strip() or f"status {done.returncode}"
        if done is None or done.returncode != 0:  # e.g. a shared home: Slurm may still manage
            self.log.warning("%s: cannot create %s: %s", self._log_name, log, why)

    # -- the server: GPUSchedSpawner's hooks -----------------------------------------------------
    def server_started(self) -> bool:
        return bool(self.slurm_job_id)

    async def launch_server(self):
        part = self.allocation[0]
        node, gpus = part["node"], len(part["gpus"])
        account = self._account()
        # a free port on the hub's host, chosen anew for each start (the node may differ)
        self.port = self._configured_port or random_port()
        self.ip = self.bind_ip
        env = self.get_env()
        cmd = [*self.cmd, *self.get_args()]
        if self.run_as_hub_user:
            home = self._home()
            os.makedirs(home, mode=0o700, exist_ok=True)
        else:
            home = env.get("HOME") or (account.pw_dir if account else "/")
        log_dir = self.log_dir.format(home=home, username=self.user.name)
        log = os.path.join(os.path.abspath(log_dir), f"{self.job_id}.log")
        await asyncio.to_thread(self._prepare_log, log, account)  # a child process: off the loop
        argv = self.sbatch_args(node, gpus, log, home if os.path.isdir(home) else "/")
        try:
            done = await self._slurm(
                argv, input=self.job_script(env, cmd), account=account, cwd="/"
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise GPUSchedSpawnError(
                f"Could not submit your server to Slurm: {exc}", reason="slurm", status_code=503
            ) from None
        slurm_id = done.stdout.strip().split(";")[0]
        if done.returncode != 0 or not slurm_id.isdigit():
            why = " ".join((done.stderr or done.stdout).split()) or f"status {done.returncode}"
            raise GPUSchedSpawnError(
                f"Slurm refused your server ({node}: {gpus} GPUs): {why}",
                reason="slurm",
                status_code=503,
            )
        self.slurm_job_id, self.slurm_job_name = slurm_id, self._job_name()
        self.slurm_node, self.slurm_log = node, log
        self.log.info("%s: Slurm job %s on %s, log %s", self._log_name, slurm_id, node, log)
        self._save_state()  # a hub restart from here on finds the job
        try:
            await self._wait_until_running()
        except BaseException:  # failed, timed out, or the spawn was cancelled
            await asyncio.shield(self._scancel())
            self._clear_slurm()
            raise
        return (await asyncio.to_thread(self.node_address, node), self.port)

    async def _wait_until_running(self) -> None:
        submitted = time.monotonic()
        while True:
            try:
                found = await self.slurm_state()
            except (OSError, subprocess.TimeoutExpired, SlurmCommandError) as exc:
                self.log.warning("%s: squeue: %s", self._log_name, exc)
                found = ("PENDING", "", "squeue did not answer")
            if found is None or not is_active(found[0]):
                state = found[0] if found else "gone"
                raise GPUSchedSpawnError(
                    f"Your server's Slurm job {self.slurm_job_id} ended before it ran ({state}); "
                    f"its output: {self.slurm_log}",
                    reason="slurm",
                    status_code=500,
                )
            state, _, reason = found
            if state != "PENDING":
                return  # RUNNING (or CONFIGURING: the hub's http_timeout covers the rest)
            waited = time.monotonic() - submitted
            if reason in HOPELESS_REASONS or waited > self.pending_timeout:
                hopeless = reason in HOPELESS_REASONS
                when = "" if hopeless else f" within {describe_duration(self.pending_timeout)}"
                raise GPUSchedSpawnError(
                    f"Slurm did not start your server on {self.slurm_node}{when} ({reason}); "
                    "its GPUs went back to the scheduler.",
                    reason="slurm",
                    status_code=503,
                )
            self._report(
                f"Slurm job {self.slurm_job_id} pending on {self.slurm_node} ({reason})",
                70,
                job_id=self.job_id,
                state="running",
                slurm_job_id=self.slurm_job_id,
            )
            await asyncio.sleep(self.slurm_poll_interval)

    async def poll_server(self):
        if not self.slurm_job_id:
            self.clear_state()
            return 0
        try:
            found = await self.slurm_state()
        except (OSError, subprocess.TimeoutExpired, SlurmCommandError) as exc:
            self.log.warning("%s: squeue: %s", self._log_name, exc)
            return None  # Slurm cannot say: still running, as far as we know
        if found is not None and is_active(found[0]):
            return None
        state = found[0] if found else "gone from squeue"
        self.log.warning(
            "%s: Slurm job %s ended (%s); output: %s",
            self._log_name,
            self.slurm_job_id,
            state,
            self.slurm_log,
        )
        self.clear_state()
        return 0 if state == "COMPLETED" else 1

    async def stop_server(self, now: bool = False) -> None:
        if not self.slurm_job_id:
            return
        found = await self._state_or_unknown()
        if found is not None and found[0] != "PENDING" and not now and self.stop_grace > 0:
            await self._scancel("--signal=TERM")  # to the server (srun's step), not the script
            found = await self._wait_gone(self.stop_grace)
        if found is not None:
            await self._scancel()
            if await self._wait_gone(self.kill_wait) is not None:
                self.log.warning(
                    "%s: Slurm job %s still there after scancel",
                    self._log_name,
                    self.slurm_job_id,
                )
        self._clear_slurm()

    async def _state_or_unknown(self):
        """The job's state; when Slurm cannot say, assume it runs (so it is cancelled)."""
        try:
            found = await self.slurm_state()
        except (OSError, subprocess.TimeoutExpired, SlurmCommandError):
            return ("UNKNOWN", "", "")
        return found if found is not None and is_active(found[0]) else None

    async def _wait_gone(self, seconds: float):
        """None once the job has ended, else its last state after ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            found = await self._state_or_unknown()
            if found is None or time.monotonic() >= deadline:
                return found
            await asyncio.sleep(
                min(self.slurm_poll_interval, max(0.0, deadline - time.monotonic()))
            )

    # -- state -----------------------------------------------------------------------------------
    def get_state(self):
        state = super().get_state()
        if self.slurm_job_id:
            state["slurm"] = {
                "job_id": self.slurm_job_id,
                "name": self.slurm_job_name,
                "node": self.slurm_node,
                "log": self.slurm_log,
            }
        return state

    def load_state(self, state):
        super().load_state(state)
        saved = state.get("slurm") or {}
        if saved.get("job_id"):
            self.slurm_job_id = str(saved["job_id"])
            self.slurm_job_name = saved.get("name") or ""
            self.slurm_node = saved.get("node") or ""
            self.slurm_log = saved.get("log") or ""

    def _clear_slurm(self) -> None:
        self.slurm_job_id = self.slurm_job_name = self.slurm_node = self.slurm_log = ""

    def clear_state(self):
        super().clear_state()
        self._clear_slurm()
