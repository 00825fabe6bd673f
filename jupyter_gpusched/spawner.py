"""GPUSchedSpawner: JupyterHub notebook servers placed by the GPU scheduler service.

``c.JupyterHub.spawner_class = "gpusched"`` (the ``jupyterhub.spawners`` entry point). Every
start goes through the scheduler service (``jupyter-gpusched serve``, run by the hub as the
managed service ``gpusched``), so notebooks and batch jobs share one queue, one quota system and
one placement logic:

1. The user picks a profile (the options form lists those their groups may use; through the REST
   API, ``{"profile": "<slug>"}``, optionally ``"gpu_model"``). A profile they may not use is
   refused with a message (HTTP 403) before anything is asked of the scheduler.
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

JupyterHub's ``start_timeout`` and the queue: the hub cancels a start that takes longer than
``Spawner.start_timeout``. Before each start this spawner sets the start timeout the hub applies
to ``max_queue_wait`` (of the chosen profile) plus the configured ``start_timeout``, which keeps
its meaning: the time to launch the server once it has its GPUs. Queued waiting is governed by
``max_queue_wait`` alone.
"""

from __future__ import annotations

import asyncio
import html
import json
import math
import os
import re
import time

from jupyterhub.spawner import LocalProcessSpawner, SpawnException
from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from traitlets import Bool, Dict, Float, List, TraitError, Unicode, default, validate

from .core.durations import parse_duration

SERVER_EXTENSION = "jupyter_gpusched.serverext"
ENDED = ("completed", "failed", "cancelled", "preempted", "rejected", "lost")
TIERS = (1, 2, 3)
PROFILE_KEYS = {
    "display_name": "the name users see",
    "slug": "the profile's id in user_options ({'profile': slug}); default: from display_name",
    "description": "a sentence under the name",
    "tier": "1 (never pre-empted), 2 (default) or 3 (opportunistic: pre-emptible)",
    "gpus": "how many GPUs (whole number >= 1)",
    "gpu_models": "GPU models to choose from (empty: any); users pick one or any of them",
    "groups": "hub groups whose members may use it (empty: everyone)",
    "queue": "the scheduler queue to submit to (default: the user's first queue)",
    "idle_timeout": "seconds (or 30m, 2h) without activity before the server shuts down",
    "max_lifetime": "the longest the server runs (seconds or 8h, 1d); the job's walltime",
    "max_queue_wait": "this profile's maximum queue wait (default: max_queue_wait)",
    "default": "preselected in the form (true/false)",
}


class GPUSchedSpawnError(SpawnException):
    """A start refused or ended, with the message the user sees (spawn page and REST API)."""

    def __init__(self, message: str, *, reason: str, status_code: int = 400):
        super().__init__(message, reason=reason, status_code=status_code)
        self.jupyterhub_message = message  # the progress stream shows this, not str(exc)


class ServiceUnavailable(Exception):
    """The scheduler service did not answer (not started yet, restarting, unreachable)."""


# -- profiles ------------------------------------------------------------------------------------
def slugify(text: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug or "profile"


def _duration(profile: dict, key: str, where: str) -> float | None:
    value = profile.get(key)
    if value in (None, 0, "", "0"):
        return None
    try:
        seconds = parse_duration(value)
    except (ValueError, TypeError) as exc:
        raise TraitError(f"{where}: {key}: {exc}") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise TraitError(f"{where}: {key} must be a positive duration")
    return seconds


def _strings(profile: dict, key: str, where: str) -> list[str]:
    value = profile.get(key) or []
    if isinstance(value, str):
        value = value.split("|") if key == "gpu_models" else [value]
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(v, str) and v.strip() for v in value
    ):
        raise TraitError(f"{where}: {key} must be a list of names")
    return [v.strip() for v in value]


def normalize_profiles(profiles) -> list[dict]:
    """Check ``c.GPUSchedSpawner.profiles`` and fill in defaults; TraitError names the profile
    and the key that is wrong."""
    if not isinstance(profiles, (list, tuple)) or not profiles:
        raise TraitError("profiles must be a non-empty list of dicts")
    out, slugs = [], set()
    for index, raw in enumerate(profiles):
        where = f"GPUSchedSpawner.profiles[{index}]"
        if not isinstance(raw, dict):
            raise TraitError(f"{where} must be a dict")
        unknown = set(raw) - set(PROFILE_KEYS)
        if unknown:
            raise TraitError(
                f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
                f"known: {', '.join(PROFILE_KEYS)}"
            )
        name = raw.get("display_name")
        if not isinstance(name, str) or not name.strip():
            raise TraitError(f"{where}: display_name is required")
        slug = raw.get("slug") or slugify(name)
        if not isinstance(slug, str) or slugify(slug) != slug:
            raise TraitError(f"{where}: slug {slug!r} must be lowercase letters, digits and '-'")
        if slug in slugs:
            raise TraitError(f"{where}: slug {slug!r} is used twice")
        slugs.add(slug)
        gpus, tier = raw.get("gpus", 1), raw.get("tier", 2)
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise TraitError(f"{where}: gpus must be a whole number >= 1, got {gpus!r}")
        if tier not in TIERS or isinstance(tier, bool):
            raise TraitError(f"{where}: tier must be 1, 2 or 3, got {tier!r}")
        queue = raw.get("queue")
        if queue is not None and (not isinstance(queue, str) or not queue.strip()):
            raise TraitError(f"{where}: queue must be a queue path")
        description = raw.get("description", "")
        if not isinstance(description, str):
            raise TraitError(f"{where}: description must be a string")
        out.append(
            {
                "display_name": name.strip(),
                "slug": slug,
                "description": description,
                "tier": tier,
                "gpus": gpus,
                "gpu_models": _strings(raw, "gpu_models", where),
                "groups": _strings(raw, "groups", where),
                "queue": queue,
                "idle_timeout": _duration(raw, "idle_timeout", where),
                "max_lifetime": _duration(raw, "max_lifetime", where),
                "max_queue_wait": _duration(raw, "max_queue_wait", where),
                "default": bool(raw.get("default", False)),
            }
        )
    return out


def allowed_profiles(profiles: list[dict], groups) -> list[dict]:
    """The profiles a member of ``groups`` may use (a profile without groups: everyone)."""
    mine = set(groups)
    return [p for p in profiles if not p["groups"] or mine & set(p["groups"])]


def _first(value):
    """A form field arrives as a list of strings; the REST API may send a plain value."""
    if isinstance(value, list):
        return value[0] if value else None
    return value


def select_profile(profiles: list[dict], username: str, groups, user_options) -> tuple:
    """``(profile, gpu_models)`` for ``user_options``, or GPUSchedSpawnError saying why not.
    ``gpu_models`` is what the request asks for: the chosen model, or the profile's list (any of
    them), or None (any model)."""
    options = user_options if isinstance(user_options, dict) else {}
    mine = allowed_profiles(profiles, groups)
    slug = _first(options.get("profile"))
    if slug in (None, ""):
        if not mine:
            raise GPUSchedSpawnError(
                f"No GPU profile is available to {username}: ask the hub admin to add you to "
                "a group that may use one.",
                reason="profile",
                status_code=403,
            )
        profile = next((p for p in mine if p["default"]), mine[0])
    else:
        profile = next((p for p in profiles if p["slug"] == slug), None)
        if profile is None:
            names = ", ".join(p["slug"] for p in mine) or "none"
            raise GPUSchedSpawnError(
                f"There is no profile {str(slug)[:100]!r}; yours: {names}.", reason="profile"
            )
        if profile not in mine:
            raise GPUSchedSpawnError(
                f"{username} may not use the profile {profile['display_name']!r}: it is for "
                f"members of {', '.join(profile['groups'])}. Yours: "
                f"{', '.join(repr(p['display_name']) for p in mine) or 'none'}.",
                reason="profile",
                status_code=403,
            )
    model = _first(options.get("gpu_model"))
    if model in (None, "", "any"):
        models = list(profile["gpu_models"]) or None
    elif isinstance(model, str) and (not profile["gpu_models"] or model in profile["gpu_models"]):
        models = [model]
    else:
        choices = ", ".join(profile["gpu_models"])
        raise GPUSchedSpawnError(
            f"The profile {profile['display_name']!r} offers the GPU models {choices}, "
            f"not {str(model)[:100]!r}.",
            reason="profile",
        )
    return profile, models


def profile_options_from_form(form_data: dict) -> dict:
    """The options form's fields -> ``user_options``: ``{"profile": slug}``, plus ``"gpu_model"``
    when one was chosen for that profile (the form has one model list per profile)."""
    slug = _first(form_data.get("profile"))
    options = {"profile": slug} if slug else {}
    model = _first(form_data.get(f"gpu_model:{slug}")) if slug else None
    if model and model != "any":
        options["gpu_model"] = model
    return options


def describe_duration(seconds: float) -> str:
    if seconds % 86400 == 0:
        return f"{seconds / 86400:g} d"
    if seconds % 3600 == 0 or seconds > 6 * 3600:
        return f"{seconds / 3600:g} h"
    if seconds >= 60:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def render_options_form(profiles: list[dict], selected: str | None = None) -> str:
    """The HTML of the options form (JupyterHub adds the <form> and the start button)."""
    if not profiles:
        return (
            '<p class="alert alert-warning">No GPU profile is available to you: ask the hub '
            "admin to add you to a group that may use one.</p>"
        )
    default = selected or next((p["slug"] for p in profiles if p["default"]), profiles[0]["slug"])
    if default not in {p["slug"] for p in profiles}:
        default = profiles[0]["slug"]
    rows = ['<div class="gpusched-profiles">', "<p>GPUs for your server:</p>"]
    for profile in profiles:
        slug = html.escape(profile["slug"])
        checked = " checked" if profile["slug"] == default else ""
        facts = [
            f"{profile['gpus']} GPU{'s' if profile['gpus'] != 1 else ''}",
            f"tier {profile['tier']}" + (" (pre-emptible)" if profile["tier"] == 3 else ""),
        ]
        if profile["idle_timeout"]:
            facts.append(f"stops after {describe_duration(profile['idle_timeout'])} idle")
        if profile["max_lifetime"]:
            facts.append(f"runs at most {describe_duration(profile['max_lifetime'])}")
        rows.append(
            f'<div class="radio"><label for="gpusched-profile-{slug}">'
            f'<input type="radio" name="profile" id="gpusched-profile-{slug}" value="{slug}"'
            f"{checked}> <strong>{html.escape(profile['display_name'])}</strong>"
        )
        if profile["description"]:
            rows.append(f" &mdash; {html.escape(profile['description'])}")
        rows.append(f"<br><small>{html.escape(', '.join(facts))}</small></label>")
        if len(profile["gpu_models"]) > 1:
            rows.append(
                f'<select class="form-control" name="gpu_model:{slug}" '
                f'aria-label="GPU model for {html.escape(profile["display_name"])}">'
                '<option value="any">any of them</option>'
            )
            for model in profile["gpu_models"]:
                rows.append(f'<option value="{html.escape(model)}">{html.escape(model)}</option>')
            rows.append("</select>")
        elif profile["gpu_models"]:
            rows.append(f"<small> on {html.escape(profile['gpu_models'][0])}</small>")
        rows.append("</div>")
    rows.append("</div>")
    return "\n".join(rows)


# -- the spawner ---------------------------------------------------------------------------------
class GPUSchedSpawner(LocalProcessSpawner):
    """Notebook servers on GPUs allocated by the jupyter_gpusched scheduler service (see the
    module's docstring). The launch itself is LocalProcessSpawner's."""

    profiles = List(
        Dict(),
        default_value=[
            {"display_name": "1 GPU (tier 2)", "slug": "gpu-1", "gpus": 1, "tier": 2},
        ],
        help="""The GPU profiles users choose from, like KubeSpawner's profile_list. Each a dict:
        display_name (required), slug (default: from display_name), description, tier (1, 2 or
        3; default 2), gpus (default 1), gpu_models (choices; empty: any model), groups (hub
        groups whose members may use it; empty: everyone), queue (scheduler queue), idle_timeout
        and max_lifetime (seconds or '30m', '8h'; none by default), max_queue_wait (overrides
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

    run_as_hub_user = Bool(
        False,
        help="""Run single-user servers as the hub's own OS user (demos, a laptop), not as the
        OS user named like the hub user (LocalProcessSpawner's way, which needs root and one
        OS account per hub user). HOME is home_dir_template for each user; as root the server is
        started with --ServerApp.allow_root.""",
    ).tag(config=True)

    home_dir_template = Unicode(
        "/tmp/jupyter-gpusched/{username}",
        help="""With run_as_hub_user: each user's HOME and working directory ({username} is
        replaced; created if missing).""",
    ).tag(config=True)

    enable_server_extension = Bool(
        True,
        help="""Enable the jupyter_gpusched server extension in the servers it starts (pre-emption
        notices at <server>/gpusched/api/notices), on their command line.""",
    ).tag(config=True)

    # What is known about the current allocation (kept in the hub's database by get_state).
    job_id = Unicode("")
    allocation = List()
    profile_slug = Unicode("")
    placed_at = Float(0.0)
    lifetime = Float(0.0)  # the profile's max_lifetime (0: none)
    job_tier = Float(0.0)
    job_gpus = Float(0.0)

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
        self._starting = self._stopping = False
        self._service_token: str | None = None
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
        return profile

    async def get_options_form(self):
        if self.options_form:  # an admin's own form
            return await super().get_options_form()
        mine = allowed_profiles(self.profile_list, self.user_groups())
        previous = _first((self.user_options or {}).get("profile"))
        return render_options_form(mine, previous)

    def run_pre_spawn_hook(self):
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

    # -- the service -------------------------------------------------------------------------
    def _base_url(self) -> str:
        url = self.service_url or self._discovered_url
        if not url:
            from jupyterhub import orm
            from jupyterhub.objects import Server

            service = orm.Service.find(self.user.db, self.service_name)
            if service is None or service.server is None:
                raise GPUSchedSpawnError(
                    f"The GPU scheduler service {self.service_name!r} is not configured in this "
                    "hub (JupyterHub.services with a url) and GPUSchedSpawner.service_url is "
                    "not set.",
                    reason="service",
                    status_code=500,
                )
            url = self._discovered_url = Server(orm_server=service.server).url
        return url if url.endswith("/") else url + "/"

    def _token(self) -> str:
        """A token of the user for the service: only its access scope and the user's groups
        (which queues they may use). Created in the hub's database (this runs in the hub), kept
        only in memory, reused by later starts of the same server (the service then knows it:
        no check with the hub), replaced after a hub restart or when it stops working (the user
        revoked it), deleted when the server is deleted."""
        if self._service_token:
            return self._service_token
        orm_user = self.user.orm_user
        db = self.user.db
        note = f"gpusched spawner: {self.user.name}/{self.name}"
        for old in list(orm_user.api_tokens):  # made by an earlier hub process
            if old.note == note:
                db.delete(old)
        self._service_token = orm_user.new_api_token(
            note=note,
            scopes=[f"access:services!service={self.service_name}", "read:users:groups!user"],
        )
        db.commit()
        return self._service_token

    def _drop_token(self) -> None:
        token, self._service_token = self._service_token, None
        if not token or self.user is None or getattr(self.user, "db", None) is None:
            return
        from jupyterhub import orm

        found = orm.APIToken.find(self.user.db, token)
        if found is not None:
            self.user.db.delete(found)
            self.user.db.commit()

    async def api(self, method: str, path: str, body=None) -> tuple[int, object]:
        """One request to the service as the user: ``(status, JSON body)``;
        ServiceUnavailable when it does not answer."""
        reused = self._service_token is not None
        status, data = await self._request(method, path, body)
        if status == 401 and reused:  # the token was revoked or expired: a new one, once
            self._drop_token()
            status, data = await self._request(method, path, body)
        return status, data

    async def _request(self, method: str, path: str, body) -> tuple[int, object]:
        request = HTTPRequest(
            self._base_url() + path,
            method=method,
            headers={"Authorization": f"token {self._token()}", "Accept": "application/json"},
            body=json.dumps(body) if body is not None else None,
            request_timeout=self.request_timeout,
            allow_nonstandard_methods=True,
        )
        try:
            response = await AsyncHTTPClient().fetch(request, raise_error=False)
        except OSError as exc:  # connection refused, reset, unreachable (not HTTP errors)
            raise ServiceUnavailable(str(exc)) from None
        if response.code == 599 or response.code >= 502:
            raise ServiceUnavailable(str(response.error or response.code))
        try:
            data = json.loads(response.body or b"null")
        except ValueError:
            data = {"error": response.body[:200].decode(errors="replace")}
        return response.code, data

    def job_request(self) -> dict:
        profile = self._profile
        body = {
            "kind": "notebook",
            "gpus": profile["gpus"],
            "tier": profile["tier"],
            "name": f"notebook server {self.name}" if self.name else "notebook server",
            "server_name": self.name,
        }
        if self._gpu_models:
            body["gpu_model"] = self._gpu_models
        if profile["queue"]:
            body["queue"] = profile["queue"]
        if profile["max_lifetime"]:
            body["walltime"] = profile["max_lifetime"]
        return body

    async def release(self, job_id: str, why: str) -> None:
        """Give the allocation (or the queued request) back. Never raises: a failure is logged
        (the service then ends the job itself when its walltime runs out)."""
        try:
            status, data = await self.api("DELETE", f"api/jobs/{job_id}")
        except Exception as exc:
            self.log.warning(
                "%s: could not release job %s (%s): %s", self._log_name, job_id, why, exc
            )
            return
        if status == 200 or status in (404, 409):  # released / gone / already ended
            self.log.info("%s: released job %s (%s)", self._log_name, job_id, why)
        else:
            self.log.warning(
                "%s: releasing job %s (%s) failed: %s %s", self._log_name, job_id, why, status, data
            )

    # -- progress ------------------------------------------------------------------------------
    def _report(self, message: str, progress: int | None = None, **details) -> None:
        event = {"message": message}
        if progress is not None:
            event["progress"] = progress
        if details:
            event["gpusched"] = details
        if event == self._progress_event:
            return
        self._progress_event = event
        self._progress_serial += 1
        self._wake()

    def _wake(self) -> None:
        changed, self._progress_changed = self._progress_changed, asyncio.Event()
        changed.set()

    async def progress(self):
        """Every change of what start() knows: submitted, position, reason, ETA, placed."""
        seen = 0
        while True:
            if self._progress_serial != seen and self._progress_event:
                seen = self._progress_serial
                yield dict(self._progress_event)
                continue
            if self._progress_done:
                return
            await self._progress_changed.wait()

    def _pending_message(self, job: dict) -> tuple[str, dict]:
        profile = self._profile
        position, reason = job.get("position"), job.get("reason") or {}
        if position is not None:
            ahead = f"{position} ahead of you" if position else "next in line"
            parts = [
                f"{profile['display_name']}: position {position + 1} in the GPU queue ({ahead})"
            ]
        else:
            parts = [f"{profile['display_name']}: waiting for GPUs"]
        if job.get("held"):
            parts.append("held by an admin")
        if reason.get("message"):
            parts.append(f"{reason.get('family', 'waiting')}: {reason['message']}")
        eta = reason.get("eta")
        if eta:
            minutes = max(0, round((eta - time.time()) / 60))
            when = time.strftime("%H:%M UTC", time.gmtime(eta))
            parts.append(f"expected start about {when} (in ~{minutes} min)")
        details = {
            "job_id": job.get("id"),
            "state": job.get("state"),
            "position": position,
            "reason": reason or None,
            "eta": eta,
        }
        return "; ".join(parts) + ".", details

    # -- start -------------------------------------------------------------------------------
    async def start(self):
        if self._profile is None:
            self.choose_profile(self.user_options)
        profile = self._profile
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
                f"{part['node']} GPU {','.join(map(str, part['gpus']))}" for part in self.allocation
            )
            self._report(
                f"GPUs allocated ({where}); starting your server",
                60,
                job_id=job_id,
                state="running",
            )
            url = await super().start()  # JupyterHub saves the state when start() returns
            self._report("Server process started; waiting for it to answer", 80, job_id=job_id)
            return url
        except BaseException as exc:  # CancelledError too: the spawn was cancelled
            if job_id:
                why = (
                    "the spawn was cancelled"
                    if isinstance(exc, asyncio.CancelledError)
                    else (f"the start failed: {exc}")
                )
                await asyncio.shield(self.release(job_id, why))
            self.job_id, self.allocation = "", []
            raise
        finally:
            self._starting, self._progress_done = False, True
            self._wake()

    async def _submit(self) -> dict:
        try:
            status, data = await self.api("POST", "api/jobs", self.job_request())
        except ServiceUnavailable as exc:
            raise GPUSchedSpawnError(
                f"The GPU scheduler is not reachable ({exc}); try again in a minute.",
                reason="service",
                status_code=503,
            ) from None
        if status != 201:
            error = data.get("error") if isinstance(data, dict) else data
            raise GPUSchedSpawnError(
                f"The GPU scheduler refused the request: {error}",
                reason="refused",
                status_code=403 if status == 403 else 429 if status == 429 else 400,
            )
        if data["state"] == "rejected":
            reason = (data.get("reason") or {}).get("message") or "it can never run here"
            raise GPUSchedSpawnError(
                f"The GPU scheduler rejected the request: {reason}", reason="rejected"
            )
        self.log.info(
            "%s: scheduler job %s (%s), %s",
            self._log_name,
            data["id"],
            self._profile["slug"],
            data["state"],
        )
        return data

    async def _wait_for_allocation(self, job: dict) -> dict:
        wait = self._max_wait()
        deadline = time.monotonic() + wait
        while job["state"] == "pending":
            message, details = self._pending_message(job)
            self._report(message, 20, **details)
            left = deadline - time.monotonic()
            if left <= 0:
                await self.release(job["id"], "maximum queue wait reached")
                self.job_id = ""
                raise GPUSchedSpawnError(
                    f"No GPUs for {self._profile['display_name']!r} within "
                    f"{describe_duration(wait)} (the maximum queue wait): {message} "
                    "The request was removed from the queue; try again later or choose a "
                    "smaller profile.",
                    reason="queue-wait",
                    status_code=503,
                )
            await asyncio.sleep(min(self.queue_poll_interval, left))
            try:
                status, data = await self.api("GET", f"api/jobs/{job['id']}")
            except ServiceUnavailable as exc:
                self.log.warning("%s: scheduler unreachable while queued: %s", self._log_name, exc)
                continue
            if status != 200:
                raise GPUSchedSpawnError(
                    f"The GPU scheduler lost the request {job['id']}: {data}", reason="service"
                )
            job = data
        if job["state"] != "running":
            reason = (job.get("reason") or {}).get("message") or job.get("message") or ""
            raise GPUSchedSpawnError(
                f"The GPU scheduler ended the request ({job['state']})"
                + (f": {reason}" if reason else ""),
                reason=job["state"],
            )
        return job

    def _save_state(self) -> None:
        """Write the state to the hub's database now (the hub itself does so only once start()
        has returned)."""
        orm_spawner = self.orm_spawner
        if orm_spawner is None or getattr(self.user, "db", None) is None:
            return
        orm_spawner.state = self.get_state()
        self.user.db.commit()

    # -- the server process ------------------------------------------------------------------
    def get_env(self):
        env = super().get_env()
        if self.allocation:
            first = self.allocation[0]
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in first["gpus"])
            env["GPUSCHED_NODE"] = first["node"]
        env["GPUSCHED_JOB_ID"] = self.job_id
        env["GPUSCHED_TIER"] = f"{self.job_tier:g}"
        env["GPUSCHED_GPUS"] = f"{self.job_gpus:g}"
        env["GPUSCHED_PROFILE"] = self.profile_slug
        try:  # where the server extension's GPU monitor reports (serverext/monitor.py)
            env["GPUSCHED_SERVICE_URL"] = self._base_url()
            env["GPUSCHED_SERVICE_TOKEN"] = self._token()
        except GPUSchedSpawnError:
            pass
        return env

    def get_args(self):
        args = list(super().get_args())
        if self.enable_server_extension:
            args.append(f"--ServerApp.jpserver_extensions={SERVER_EXTENSION}=True")
        idle = (self._profile or {}).get("idle_timeout")
        if idle:  # kernels idle this long are culled; then the server shuts itself down
            args += [
                f"--MappingKernelManager.cull_idle_timeout={int(idle)}",
                f"--MappingKernelManager.cull_interval={max(1, min(300, int(idle) // 4))}",
                f"--ServerApp.shutdown_no_activity_timeout={int(idle)}",
            ]
        if self.run_as_hub_user and os.geteuid() == 0:
            args.append("--ServerApp.allow_root=True")
        return args

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

    async def poll(self):
        if self._starting:
            return None  # still in start(): queued or launching
        job_id = self.job_id
        status = await super().poll()  # clears the state when the process is gone
        if status is not None:
            if job_id and not self._stopping:
                await self.release(job_id, f"the server process exited ({status})")
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
        if code != 200 or not isinstance(job, dict) or job.get("state") == "running":
            return None
        why = (job.get("message") or job["state"]) if job["state"] in ENDED else job["state"]
        return await self._end(job_id, f"its allocation ended ({why})", False)

    async def _end(self, job_id: str, why: str, release: bool) -> int:
        """Stop the server's process because its allocation is gone (or must go)."""
        self.log.warning("%s: stopping the server: %s", self._log_name, why)
        self._stopping = True
        try:
            if self.pid:
                await super().stop(now=True)
        finally:
            self._stopping = False
        if release:
            await self.release(job_id, why)
        self.clear_state()
        return 0

    async def stop(self, now=False):
        job_id = self.job_id
        self._stopping = True
        try:
            if self.pid:  # never signal pid 0 (our own process group)
                await super().stop(now=now)
        finally:
            self._stopping = False
        if job_id:
            await self.release(job_id, "the server was stopped")
        self.job_id, self.allocation = "", []

    def delete_forever(self):
        """The server is deleted (a named server removed, or the user): its token goes too."""
        self._drop_token()

    # -- state ---------------------------------------------------------------------------------
    def get_state(self):
        state = super().get_state()
        if self.job_id:
            state["gpusched"] = {
                "job_id": self.job_id,
                "allocation": list(self.allocation),
                "profile": self.profile_slug,
                "tier": self.job_tier,
                "gpus": self.job_gpus,
                "placed_at": self.placed_at,
                "max_lifetime": self.lifetime,
            }
        return state

    def load_state(self, state):
        super().load_state(state)
        saved = state.get("gpusched") or {}
        if saved.get("job_id"):
            self.job_id = saved["job_id"]
            self.allocation = list(saved.get("allocation") or [])
            self.profile_slug = saved.get("profile") or ""
            self.job_tier = float(saved.get("tier") or 0)
            self.job_gpus = float(saved.get("gpus") or 0)
            self.placed_at = float(saved.get("placed_at") or 0)
            self.lifetime = float(saved.get("max_lifetime") or 0)

    def clear_state(self):
        super().clear_state()
        self.job_id, self.allocation, self.profile_slug = "", [], ""
        self.placed_at = self.lifetime = self.job_tier = self.job_gpus = 0.0
