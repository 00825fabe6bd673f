"""GPUSchedSpawner: JupyterHub notebook servers placed by the GPU scheduler service.

``c.JupyterHub.spawner_class = "gpusched"`` (the ``jupyterhub.spawners`` entry point). Every
start goes through the scheduler service (``jupyter-gpusched serve``, run by the hub as the
managed service ``gpusched``), so notebooks and batch jobs share one queue, one quota system and
one placement logic:

1. The user picks a profile (the options form lists those their groups may use; through the REST
   API, ``{"profile": "<slug>"}``, optionally ``"gpu_model"``) and a queue (the form lists the
   user's queues from the service's ``GET api/me`` with GPUs in use, guaranteed and limit, their
   default preselected; REST: ``"queue"``; a profile with a ``queue`` always uses that one). A
   profile they may not use is refused with a message (HTTP 403) before anything is asked of
   the scheduler; a queue they may not use, with the scheduler's message.
2. ``start()`` submits a ``kind: notebook`` job to the service *as the user* (a token of the user
   that the spawner creates, limited to the service's access scope and the user's groups) and
   waits while it is pending; ``progress()`` streams the position in the queue, the reason
   (capacity / placement / policy, with the scheduler's message) and the ETA whenever they
   change. After :attr:`GPUSchedSpawner.max_queue_wait` the request leaves the queue and the
   user is told so. Cancelling the pending spawn (the spawn page's cancel, or ``DELETE`` on the
   server) removes the request from the queue.
3. Once placed, the server is started the way :class:`LocalProcessSpawner` starts it, with
   ``CUDA_VISIBLE_DEVICES`` set to the allocated GPUs and ``GPUSCHED_JOB_ID``,
   ``GPUSCHED_TIER``, ``GPUSCHED_GPUS``, ``GPUSCHED_NODE`` and ``GPUSCHED_PROFILE``.
4. ``stop()`` stops the process, then releases the allocation (the next queued request starts at
   once). ``poll()`` reports the server gone, stopping its process, when the allocation ended
   (pre-empted, cancelled by an admin, past its maximum lifetime). ``get_state``/``load_state``
   keep the job id beside the process id, so a hub restart keeps servers and allocations.

The server process is LocalProcessSpawner's, run as the hub user's own OS account (never a
system account; ``run_as_hub_user``: the hub's own), behind five methods a subclass may replace
(``launch_server``, ``server_answering``, ``poll_server``, ``stop_server``, ``server_started``,
with ``get_state``/``load_state``/``clear_state``): ``GPUSchedSlurmSpawner``
(``jupyter_gpusched/hub/slurm_spawner.py``, ``spawner_class = "gpusched-slurm"``) runs the server
as a Slurm job on the allocated node instead. The class is built in layers, a module each:
``local_server.py`` (:class:`~jupyter_gpusched.hub.local_server.LocalServerProcess`: the server
process, and which account it runs as), ``allocation_state.py``
(:class:`~jupyter_gpusched.hub.allocation_state.AllocationState`: what the hub's database keeps
of the allocation), and this module (the scheduler's side: the profile, the queue, following the
allocation). The profiles and the options form are in ``profiles.py``; the conversation with the
service (token, submission, queue, progress) in ``spawner_queue.py``.

JupyterHub's ``start_timeout`` and the queue: the hub cancels a start that takes longer than
``Spawner.start_timeout``. Before each start this spawner sets the start timeout the hub applies
to ``max_queue_wait`` (of the chosen profile) plus the configured ``start_timeout``, which keeps
its meaning: the time to launch the server once it has its GPUs. Queued waiting is governed by
``max_queue_wait`` alone.
"""

from __future__ import annotations

import asyncio
import math
import time

from traitlets import Bool, Dict, Float, List, Unicode, default, validate

from ..core.quotas import valid_queue_path
from .allocation_state import AllocationState
from .profiles import (  # noqa: F401 (importable from here too)
    PROFILE_KEYS,
    TIERS,
    GPUSchedSpawnError,
    _first,
    allowed_profiles,
    describe_duration,
    normalize_profiles,
    profile_options_from_form,
    render_options_form,
    select_profile,
    select_queue,
    slugify,
)
from .spawner_queue import SchedulerClient, ServiceUnavailable
from .stop_notice import stop_record

SERVER_EXTENSION = "jupyter_gpusched.notebook.serverext"
ENDED = ("completed", "failed", "cancelled", "preempted", "rejected", "lost")


# -- the spawner ---------------------------------------------------------------------------------
class GPUSchedSpawner(SchedulerClient, AllocationState):
    """Notebook servers on GPUs allocated by the jupyter_gpusched scheduler service (see the
    module's docstring). The launch itself is LocalProcessSpawner's (local_server.py)."""

    profiles = List(
        Dict(),
        default_value=[
            {"display_name": "1 GPU (tier 2)", "slug": "gpu-1", "gpus": 1, "tier": 2},
        ],
        help="""The GPU profiles users choose from, like KubeSpawner's profile_list. Each a dict:
        display_name (required), slug (default: from display_name), description, tier (1, 2 or
        3; default 2), gpus (default 1), gpu_models (choices; empty: any model), groups (hub
        groups whose members may use it; empty: everyone), queue (a scheduler queue it always
        uses, e.g. 'research/vision'; default: the user's choice in the form, else the team
        queue the scheduler gives them), idle_timeout (the idle reaper's timeout for its
        servers, see pass_idle_timeouts_to_service) and max_lifetime (seconds or '30m', '8h';
        none by default), max_queue_wait (overrides
        GPUSchedSpawner.max_queue_wait), default (preselected).""",
    ).tag(config=True)

    max_queue_wait = Float(
        1800.0,
        help="""Seconds a start may wait in the scheduler's queue (default 30 minutes). Then the
        request is removed from the queue and the user is told to try again later or choose a
        smaller profile. The hub's start timeout is raised to this plus Spawner.start_timeout
        for each start, so JupyterHub does not cancel a queued start itself.""",
    ).tag(config=True)

    service_name = Unicode(
        "gpusched", help="The name of the scheduler service in JupyterHub.services."
    ).tag(config=True)

    service_url = Unicode(
        "",
        help="""The scheduler service's URL, up to and including its prefix, e.g.
        http://127.0.0.1:8765/services/gpusched/. Default: the URL of the hub service named
        service_name (requests then go to the service directly, not through the proxy).""",
    ).tag(config=True)

    queue_poll_interval = Float(
        2.0,
        help="Seconds between checks of a queued request (position, reason, ETA).",
    ).tag(config=True)

    request_timeout = Float(
        20.0, help="Seconds to wait for one answer of the scheduler service."
    ).tag(config=True)

    estimate_timeout = Float(
        2.0,
        help="""Seconds the options form waits for the scheduler's estimate of when a server of
        each profile would start (POST api/estimate, all profiles at once). A profile without
        an answer by then is listed without an estimate: a slow or stopped scheduler never
        holds the form up longer. 0 turns the estimates off.""",
    ).tag(config=True)

    enable_server_extension = Bool(
        True,
        help="""Enable the jupyter_gpusched server extension in the servers it starts (pre-emption
        notices at <server>/gpusched/api/notices), on their command line.""",
    ).tag(config=True)

    @validate("profiles")
    def _check_profiles(self, proposal):
        normalize_profiles(proposal.value)  # raises TraitError naming the profile and key
        return proposal.value

    @default("options_from_form")
    def _default_options_from_form(self):
        return profile_options_from_form

    @default("apply_user_options")
    def _default_apply_user_options(self):
        # user_options are read in run_pre_spawn_hook (which also runs when an admin sets their
        # own apply_user_options); this only tells JupyterHub that they are handled.
        return lambda spawner, user_options: None

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._launch_timeout = self.start_timeout  # the configured value: the launch alone
        self._profile: dict | None = None
        self._gpu_models: list[str] | None = None
        self._queue: str | None = None  # the queue chosen for this start (None: the default)
        self._starting = self._stopping = False
        self._service_token: str | None = None  # the spawner's own (spawner_queue.py)
        self._started_token: str | None = None  # the server's, while this hub started it
        self._discovered_url = ""
        self._progress_event: dict = {}
        self._progress_serial = 0
        self._progress_changed = asyncio.Event()
        self._progress_done = True

    # -- profiles ------------------------------------------------------------------------------
    @property
    def profile_list(self) -> list[dict]:
        return normalize_profiles(self.profiles)

    def user_groups(self) -> list[str]:
        groups = getattr(self.user, "groups", None) or []
        return [g if isinstance(g, str) else g.name for g in groups]

    def choose_profile(self, user_options) -> dict:
        profile, models = select_profile(
            self.profile_list, self.user.name, self.user_groups(), user_options
        )
        self._profile, self._gpu_models = profile, models
        self._queue = select_queue(profile, user_options)
        return profile

    async def get_options_form(self):
        if self.options_form:  # an admin's own form
            return await super().get_options_form()
        mine = allowed_profiles(self.profile_list, self.user_groups())
        previous = _first((self.user_options or {}).get("profile"))
        chosen = _first((self.user_options or {}).get("queue"))
        if not mine:
            return render_options_form(mine, previous, None, chosen)
        # the queues first: that request makes (or renews) the spawner's token, which the
        # estimates then share (asked together, a revoked token would be renewed by each); a
        # service that did not answer it is not asked again
        me, estimates = await self.about_me(), {}
        if isinstance(me, str):  # why the service did not say
            return render_options_form(mine, previous, me, chosen)
        if self.estimate_timeout > 0:
            queue = chosen if isinstance(chosen, str) and valid_queue_path(chosen) else None
            estimates = await self.estimates(mine, queue)
        timeouts = me.get("idle_timeouts") if isinstance(me.get("idle_timeouts"), dict) else {}
        return render_options_form(mine, previous, me["queues"], chosen, estimates, timeouts)

    def run_pre_spawn_hook(self):
        self.server_account()  # before the profile: a refused account gets nothing at all
        self.choose_profile(self.user_options)
        self._progress_event, self._progress_done = {}, False  # a new spawn: fresh progress
        wait = self._max_wait()
        # What JupyterHub waits for start() (user.spawn reads it after this hook): the queue
        # wait plus the launch. Queued waiting itself ends at max_queue_wait (see start).
        self.start_timeout = math.ceil(wait + self._launch_timeout)
        return super().run_pre_spawn_hook()

    def _max_wait(self) -> float:
        profile = self._profile or {}
        return profile.get("max_queue_wait") or self.max_queue_wait

    # -- start -------------------------------------------------------------------------------
    async def start(self):
        began = time.monotonic()
        self.server_account()  # also when start() is called without the pre-spawn hook
        if self._profile is None:
            self.choose_profile(self.user_options)
        profile = self._profile
        self.last_stop = {}  # a new start: the last stop's story is over
        self._starting, self._progress_done = True, False
        self._progress_event = {}
        self.job_id = ""
        self.allocation = []
        job_id = ""
        try:
            self._report(f"Asking the GPU scheduler for {profile['display_name']}", 10)
            job = await self._submit()
            job_id = self.job_id = job["id"]
            self.profile_slug = profile["slug"]
            self.job_tier, self.job_gpus = float(profile["tier"]), float(profile["gpus"])
            self.lifetime = profile["max_lifetime"] or 0.0
            self._save_state()  # a hub restart while queued then releases the request
            job = await self._wait_for_allocation(job)
            self.allocation = job.get("allocation") or []
            self.placed_at = time.time()
            where = "; ".join(
                f"{part['node']} GPU {','.join(map(str, part['gpus']))}"
                if part["gpus"]
                else f"{part['node']}, no GPU"
                for part in self.allocation
            )
            self._report(
                f"{'GPUs' if self.job_gpus else 'CPUs'} allocated ({where}); starting your server",
                60,
                job_id=job_id,
                state="running",
            )
            url = await self.launch_server()  # the hub saves the state when start() returns
            self._report("Server process started; waiting for it to answer", 80, job_id=job_id)
            # at most http_timeout, and within start_timeout (which covers the queue too)
            left = self.start_timeout - (time.monotonic() - began) - 1.0
            await self.server_answering(url, within=min(self.http_timeout, left))
            return url
        except BaseException as exc:  # CancelledError too: the spawn was cancelled
            if self.server_started():  # failed or cancelled as it came up: gone first
                try:
                    await asyncio.shield(self.stop_server(now=True))
                except Exception as stop_error:  # the release below must still happen
                    self.log.error("%s: stopping the server: %s", self._log_name, stop_error)
            if job_id:
                why = (
                    "the start was cancelled through the hub"
                    if isinstance(exc, asyncio.CancelledError)
                    else (f"the start failed: {exc}")
                )
                await asyncio.shield(self.release(job_id, why))
            self.job_id, self.allocation = "", []
            self._revoke_server_token()  # a server that never started uses none
            if isinstance(exc, asyncio.CancelledError):
                self._forget_server()
            raise
        finally:
            self._starting, self._progress_done = False, True
            self._wake()

    def _forget_server(self) -> None:
        """A start cancelled by the hub (Stop Server on a queued start): JupyterHub stops this
        spawner only about a second later, and meanwhile the server record it made for this
        start makes the spawner look ready, so the spawn page is told to go to the server that
        never started (a redirect loop, then a 424). Without the record the page hears "Spawn
        cancelled" and the home page offers Start."""
        if self.orm_spawner is None or getattr(self.user, "db", None) is None:
            return
        self.server = None  # JupyterHub's setter deletes the record
        self.user.db.commit()

    # -- the server process ------------------------------------------------------------------
    def get_env(self):
        env = super().get_env()
        if self.allocation:
            first = self.allocation[0]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in first["gpus"])
            if not first["gpus"]:  # a CPU-only server: no GPU in NVIDIA's container runtime either
                env["NVIDIA_VISIBLE_DEVICES"] = "void"
            env["GPUSCHED_NODE"] = first["node"]
        env["GPUSCHED_JOB_ID"] = self.job_id
        env["GPUSCHED_TIER"] = f"{self.job_tier:g}"
        env["GPUSCHED_GPUS"] = f"{self.job_gpus:g}"
        env["GPUSCHED_PROFILE"] = self.profile_slug
        try:  # where the server extension's GPU monitor reports (serverext/monitor.py)
            env["GPUSCHED_SERVICE_URL"] = self._base_url()
            env["GPUSCHED_SERVICE_TOKEN"] = self._server_token()
        except GPUSchedSpawnError:
            pass
        return env

    def get_args(self):
        args = list(super().get_args())
        if self.enable_server_extension:
            args.append(f"--ServerApp.jpserver_extensions={SERVER_EXTENSION}=True")
        # The profile's idle_timeout is the idle reaper's (core/reaper.py), which warns
        # first and records why: no culling of jupyter-server's own, unannounced, beside it.
        return args

    # -- the allocation's life -----------------------------------------------------------------
    async def poll(self):
        if self._starting:
            return None  # still in start(): queued or launching
        job_id = self.job_id
        status = await self.poll_server()  # clears the state when the server is gone
        if status is not None:
            if job_id and not self._stopping:
                await self.release(job_id, f"the server process exited (status {status})")
            return status
        if not job_id or self._stopping:
            return None
        if self.lifetime and self.placed_at and time.time() > self.placed_at + self.lifetime:
            return await self._end(
                job_id, f"its maximum lifetime ({describe_duration(self.lifetime)}) is over", True
            )
        try:
            code, job = await self.api("GET", f"api/jobs/{job_id}")
        except ServiceUnavailable:
            return None  # e.g. the hub is starting and the service not yet: ask again later
        except GPUSchedSpawnError:
            return None
        if code == 404:
            return await self._end(job_id, f"the scheduler has no job {job_id}", False)
        if code != 200 or not isinstance(job, dict):
            return None
        if job.get("state") == "running":
            if job.get("stopping") != "cancelled":  # a pre-empted one has its grace period
                return None
            # cancelled through the service, which asked the hub to stop the server; should
            # that request not have come through, the server stops here, and is released
            return await self._end(job_id, "cancelled through the scheduler", True)
        why = (job.get("message") or job["state"]) if job["state"] in ENDED else job["state"]
        return await self._end(job_id, f"its allocation ended ({why})", False)

    async def _end(self, job_id: str, why: str, release: bool) -> int:
        """Stop the server's process because its allocation is gone (or must go)."""
        self.log.warning("%s: stopping the server: %s", self._log_name, why)
        allocation = list(self.allocation)  # the poll of the stopped server clears it
        self._stopping = True
        try:
            if self.server_started():
                await self.stop_server(now=True)
        finally:
            self._stopping = False
        if release:
            await self.release(job_id, why)
        await self._remember_stop(job_id, allocation)
        self.clear_state()
        return 0

    async def stop(self, now=False):
        job_id, allocation = self.job_id, list(self.allocation)
        self._stopping = True
        try:
            if self.server_started():
                await self.stop_server(now=now)
        finally:
            self._stopping = False
        if job_id:  # JupyterHub does not say who asked (its user, an admin, a service, itself)
            await self.release(job_id, "server stopped through the hub")
            await self._remember_stop(job_id, allocation)
        self.job_id, self.allocation = "", []

    async def _remember_stop(self, job_id: str, allocation: list) -> None:
        """Keep why the allocation ended, if the reaper ended it (the hub's home page says so)."""
        self.last_stop = await stop_record(self, job_id, allocation)

    def delete_forever(self):
        """The server is deleted (a named server removed, or the user): its tokens go too."""
        self._drop_token()
        self._revoke_server_token()

    def clear_state(self):
        """The server is gone (JupyterHub calls this after a stop and before a start; the
        poll, when the process has ended): so is its state, and its token for the service."""
        super().clear_state()
        self._revoke_server_token()
        self._clear_allocation()
