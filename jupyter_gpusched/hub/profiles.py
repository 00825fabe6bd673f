"""The GPU profiles of :class:`~jupyter_gpusched.hub.spawner.GPUSchedSpawner`: checking
``c.GPUSchedSpawner.profiles``, which profiles a user may use, choosing one from
``user_options``, and the options form. Plain functions (no hub needed)."""

from __future__ import annotations

import html
import json
import math
import re

from jupyterhub.spawner import SpawnException
from traitlets import TraitError

from ..core.durations import describe_duration, parse_duration
from ..core.quotas import valid_queue_path
from ..core.wording import gpus_text

TIERS = (1, 2, 3)
PROFILE_KEYS = {
    "display_name": "the name users see",
    "slug": "the profile's id in user_options ({'profile': slug}); default: from display_name",
    "description": "a sentence under the name",
    "tier": "1 (never pre-empted), 2 (default) or 3 (opportunistic: pre-emptible)",
    "gpus": "how many GPUs (whole number >= 0; 0: a CPU-only server, with cpus or memory_gb)",
    "cpus": "CPUs the server's job asks the scheduler for (number > 0; needed with gpus 0 unless "
    "memory_gb is given)",
    "memory_gb": "memory in GB the server's job asks the scheduler for (number > 0)",
    "gpu_models": "GPU models to choose from (empty: any); users pick one or any of them",
    "groups": "hub groups whose members may use it (empty: everyone)",
    "queue": "the scheduler queue it always uses, e.g. research/vision (default: the user's "
    "choice in the form, else their team queue)",
    "idle_timeout": "seconds (or 30m, 2h) of idle GPUs before the reaper stops the server",
    "max_lifetime": "the longest the server runs (seconds or 8h, 1d); the job's walltime",
    "max_queue_wait": "this profile's maximum queue wait (default: max_queue_wait)",
    "default": "preselected in the form (true/false)",
}


class GPUSchedSpawnError(SpawnException):
    """A start refused or ended, with the message the user sees (spawn page and REST API)."""

    def __init__(self, message: str, *, reason: str, status_code: int = 400):
        super().__init__(message, reason=reason, status_code=status_code)
        self.jupyterhub_message = message  # the progress stream shows this, not str(exc)


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


def _amount(profile: dict, key: str, where: str) -> float | None:
    value = profile.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise TraitError(f"{where}: {key} must be a number > 0, got {value!r}")
    return float(value)


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
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
            raise TraitError(f"{where}: gpus must be a whole number >= 0, got {gpus!r}")
        cpus, memory = _amount(raw, "cpus", where), _amount(raw, "memory_gb", where)
        if gpus == 0 and cpus is None and memory is None:
            raise TraitError(
                f"{where}: a profile with gpus 0 needs cpus or memory_gb (the scheduler places "
                "a CPU-only server by them)"
            )
        if gpus == 0 and raw.get("gpu_models"):
            raise TraitError(f"{where}: gpu_models needs gpus >= 1")
        if tier not in TIERS or isinstance(tier, bool):
            raise TraitError(f"{where}: tier must be 1, 2 or 3, got {tier!r}")
        queue = raw.get("queue")
        if queue is not None and not valid_queue_path(queue):
            raise TraitError(
                f"{where}: queue must be a queue path like 'research/vision' (names of letters, "
                f"digits, '_', '-', '.', '@' joined by '/'), got {queue!r}"
            )
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
                "cpus": cpus,
                "memory_gb": memory,
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


def select_queue(profile: dict, user_options) -> str | None:
    """The queue the server's job asks for: the profile's own (a pinned queue wins over a
    choice), else the one chosen (form or REST ``{"queue": path}``), else None: the service
    puts it in the user's team queue. Whether the user may use it is the service's to say (its
    403 or 400 message reaches the spawn page)."""
    if profile["queue"]:
        return profile["queue"]
    options = user_options if isinstance(user_options, dict) else {}
    queue = _first(options.get("queue"))
    if queue in (None, ""):
        return None
    if not valid_queue_path(queue):
        raise GPUSchedSpawnError(
            f"{str(queue)[:100]!r} is not a queue path (like 'research/vision').",
            reason="queue",
        )
    return queue


def profile_options_from_form(form_data: dict) -> dict:
    """The options form's fields -> ``user_options``: ``{"profile": slug}``, plus ``"gpu_model"``
    when one was chosen for that profile (the form has one model list per profile) and
    ``"queue"`` when the form offered a choice of queues."""
    slug = _first(form_data.get("profile"))
    options = {"profile": slug} if slug else {}
    model = _first(form_data.get(f"gpu_model:{slug}")) if slug else None
    if model and model != "any":
        options["gpu_model"] = model
    queue = _first(form_data.get("queue"))
    if queue:
        options["queue"] = queue
    return options


def render_options_form(
    profiles: list[dict],
    selected: str | None = None,
    queues: list[dict] | str | None = None,
    chosen_queue: str | None = None,
    estimates: dict[str, str] | None = None,
    idle_timeouts: dict | None = None,
) -> str:
    """The HTML of the options form (JupyterHub adds the <form> and the start button).
    ``queues``: the user's queues as ``GET api/me`` lists them (a list to choose from below the
    profiles), or why they could not be listed (a string), or None (no queue section);
    ``estimates``: when a server of each profile would start, in words, by slug (a profile
    without one shows none); ``idle_timeouts``: the idle timeout a new server of each profile
    would have now, as the service says (``api/me``: the admin's changes and exemptions
    included; None: never stopped for idleness), by slug; a profile it does not name shows its
    own ``idle_timeout``."""
    estimates, idle_timeouts = estimates or {}, idle_timeouts or {}
    if not profiles:
        return (
            '<p class="alert alert-warning">No GPU profile is available to you: ask the hub '
            "admin to add you to a group that may use one.</p>"
        )
    default = selected or next((p["slug"] for p in profiles if p["default"]), profiles[0]["slug"])
    if default not in {p["slug"] for p in profiles}:
        default = profiles[0]["slug"]
    what = "GPUs" if all(p["gpus"] for p in profiles) else "GPUs or CPUs"  # a CPU-only profile
    rows = ['<div class="gpusched-profiles">', f"<p>{what} for your server:</p>"]
    for profile in profiles:
        slug = html.escape(profile["slug"])
        checked = " checked" if profile["slug"] == default else ""
        gpus = gpus_text(profile["gpus"]) if profile["gpus"] else "CPU only (no GPU)"
        if len(profile["gpu_models"]) == 1:  # (several: a list to choose from, below)
            gpus += f" on {profile['gpu_models'][0]}"
        facts = [
            gpus,
            *([f"{profile['cpus']:g} CPUs"] if profile.get("cpus") else []),
            *([f"{profile['memory_gb']:g} GB memory"] if profile.get("memory_gb") else []),
            f"tier {profile['tier']}" + (" (pre-emptible)" if profile["tier"] == 3 else ""),
        ]
        idle_timeout = idle_timeouts.get(profile["slug"], profile["idle_timeout"])
        if idle_timeout:
            facts.append(f"stops after {describe_duration(idle_timeout)} idle")
        elif profile["slug"] in idle_timeouts:
            facts.append("not stopped when idle")
        if profile["max_lifetime"]:
            facts.append(f"runs at most {describe_duration(profile['max_lifetime'])}")
        if profile["queue"]:
            facts.append(f"in queue {profile['queue']}")
        rows.append(
            f'<div class="radio"><label for="gpusched-profile-{slug}">'
            f'<input type="radio" name="profile" id="gpusched-profile-{slug}" value="{slug}"'
            f"{checked}> <strong>{html.escape(profile['display_name'])}</strong>"
        )
        if profile["description"]:
            rows.append(f" &mdash; {html.escape(profile['description'])}")
        rows.append(f"<br><small>{html.escape(', '.join(facts))}</small>")
        if profile["slug"] in estimates:  # (the scheduler's, for the preselected queue)
            rows.append(
                f'<small class="gpusched-estimate" id="gpusched-estimate-{slug}"> &middot; '
                f"{html.escape(estimates[profile['slug']])}</small>"
            )
        rows.append("</label>")
        if len(profile["gpu_models"]) > 1:
            rows.append(
                f'<select class="form-control" name="gpu_model:{slug}" '
                f'aria-label="GPU model for {html.escape(profile["display_name"])}">'
                '<option value="any">any of them</option>'
            )
            for model in profile["gpu_models"]:
                rows.append(f'<option value="{html.escape(model)}">{html.escape(model)}</option>')
            rows.append("</select>")
        rows.append("</div>")
    rows.append("</div>")
    rows.append(render_queue_choice(queues, chosen_queue, pinned=any(p["queue"] for p in profiles)))
    return "\n".join(rows)


def describe_queue(queue: dict) -> str:
    """``research/vision: 4 GPUs in use (3 guaranteed, limit 8)`` (a queue of ``api/me``;
    "of 3 guaranteed" read oddly past the guarantee, and "0 of 0" without one)."""
    limit = "no limit" if queue.get("limit") is None else f"limit {queue['limit']:g}"
    guaranteed = f"{queue['guaranteed']:g} guaranteed" if queue["guaranteed"] else "none guaranteed"
    return f"{queue['path']}: {gpus_text(queue['in_use'])} in use ({guaranteed}, {limit})"


def render_queue_choice(queues, chosen: str | None, pinned: bool = False) -> str:
    """The form's queue section: a list of the user's queues with their figures, the default
    (or the previous choice) preselected."""
    if queues is None:
        return ""
    note = " (a profile that names its own queue uses that one)" if pinned else ""
    if isinstance(queues, str) or not queues:
        why = html.escape(queues) if isinstance(queues, str) and queues else "none listed"
        return (
            f'<p class="gpusched-queues"><small>Queue: your default queue{note} (the queues '
            f"could not be listed: {why}).</small></p>"
        )
    paths = {q["path"] for q in queues}
    chosen = chosen if chosen in paths else next((q["path"] for q in queues if q["default"]), None)
    rows = [
        '<div class="form-group gpusched-queues">',
        f'<label for="gpusched-queue">Queue{html.escape(note)}</label>',
        '<select class="form-control" name="queue" id="gpusched-queue">',
    ]
    for queue in queues:
        path = html.escape(queue["path"])
        mark = " selected" if queue["path"] == chosen else ""
        text = describe_queue(queue) + (" (your default)" if queue["default"] else "")
        rows.append(f'<option value="{path}"{mark}>{html.escape(text)}</option>')
    rows.append("</select></div>")
    return "\n".join(rows)


IDLE_TIMEOUTS_OPTION = "--GPUSchedService.profile_idle_timeouts="
SHAPES_OPTION = "--GPUSchedService.profile_shapes="


def pass_idle_timeouts_to_service(config, service_name: str = "gpusched") -> list[str]:
    """In a hub's config file, after ``c.GPUSchedSpawner.profiles`` and ``c.JupyterHub.services``:
    give the scheduler service (the managed service ``service_name``) each profile's
    ``idle_timeout``, which the idle reaper then applies to that profile's servers (what the
    spawn form promises), and each profile's GPUs and tier, which a notebook job naming the
    profile must match. Call it again after changing the profiles; returns the options set."""
    section = config.GPUSchedSpawner
    # unset: the default profile, which has no idle_timeout of its own
    profiles = normalize_profiles(section.profiles) if "profiles" in section else []
    options = [
        f"{IDLE_TIMEOUTS_OPTION}{p['slug']}={p['idle_timeout']:g}"
        for p in profiles
        if p["idle_timeout"]
    ]
    # and each profile's GPUs and tier: a notebook job claiming a profile must match it
    options += [
        f"{SHAPES_OPTION}{p['slug']}={json.dumps({'gpus': p['gpus'], 'tier': p['tier']})}"
        for p in profiles
    ]
    ours = (IDLE_TIMEOUTS_OPTION, SHAPES_OPTION)
    for service in config.JupyterHub.services:
        if service.get("name") == service_name and service.get("command"):
            kept = [a for a in service["command"] if not a.startswith(ours)]
            service["command"] = kept + options
            return options
    raise ValueError(f"JupyterHub.services has no managed service {service_name!r}")
