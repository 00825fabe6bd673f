"""The hub profile a notebook job names, and what the reaper makes of it: the profile decides the
reaper's timeout and exemptions (:func:`..core.reaper.timeout_for`), so it is the spawner's word
(the job's ``profile``), checked against the hub's profiles, never the server's
``GPUSCHED_PROFILE``, which the user can change. Plain functions, no I/O."""

from __future__ import annotations

import json

from .requests import RequestError


def profile_shapes(raw: dict) -> dict[str, tuple[int, int]]:
    """The hub's profiles as the service is given them (``GPUSchedService.profile_shapes``:
    slug -> ``{"gpus": N, "tier": T}``, or that as JSON text from the command line) as slug ->
    ``(gpus, tier)``; RequestError naming the profile when one is not that."""
    shapes = {}
    for slug, shape in (raw or {}).items():
        field_name = f"profile_shapes.{slug}"
        if isinstance(shape, str):
            try:
                shape = json.loads(shape)
            except ValueError:
                shape = None
        gpus = shape.get("gpus") if isinstance(shape, dict) else None
        tier = shape.get("tier") if isinstance(shape, dict) else None
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0 or tier not in (1, 2, 3):
            raise RequestError(
                f'\'{field_name}\' must be {{"gpus": <whole number>, "tier": 1, 2 or 3}}',
                field_name,
            )
        shapes[str(slug)] = (gpus, tier)
    return shapes


def check_claimed_profile(profile, gpus, tier: int, shapes: dict) -> None:
    """A notebook job that names one of the hub's profiles (what its reaper timeout and
    exemptions go by) must have that profile's GPUs and tier: a job submitted by hand cannot
    borrow a longer timeout, or an exempt profile. RequestError (400, field ``profile``) if
    not. A profile the service was not told of is no profile to the reaper
    (:func:`applied_profile`), so it is taken as it comes."""
    if profile is None or profile not in shapes:
        return
    want_gpus, want_tier = shapes[profile]
    if gpus != want_gpus or tier != want_tier:
        raise RequestError(
            f"profile {profile!r} is {want_gpus} GPU(s) at tier {want_tier}; this job asks "
            f"for {gpus} at tier {tier}",
            "profile",
        )


def applied_profile(profile: str | None, shapes: dict) -> str | None:
    """The profile the reaper goes by for a job that names ``profile``: that one when the
    service was told the hub's profiles and it is one of them (or was told none: a service
    without a hub's profiles), else None (its tier's timeout, no profile exemption)."""
    if profile is None or not shapes or profile in shapes:
        return profile
    return None
