"""The profile the reaper applies (issue 16, point 2): the one the spawner names in its notebook
job (``profile``), checked against the hub's profiles' GPUs and tier
(``GPUSchedService.profile_shapes``), kept with the job across service restarts, and never the one
the server's monitor reports (its ``GPUSCHED_PROFILE`` is the user's to change)."""

from __future__ import annotations

import pytest
from service_helpers import start_service, wait_until

from jupyter_gpusched.core.errors import ConfigError
from jupyter_gpusched.hub.profiles import pass_idle_timeouts_to_service

SHAPES = {
    "t2-1": {"gpus": 1, "tier": 2},
    "t2-idle": '{"gpus": 1, "tier": 2}',  # as the command line gives it
    "t3-2": {"gpus": 2, "tier": 3},
}
OPTIONS = {"profile_shapes": SHAPES, "profile_idle_timeouts": {"t2-idle": 7200}}


async def test_a_notebook_job_claims_only_a_profile_it_is_and_keeps_it(tmp_path):
    service = await start_service(tmp_path, **OPTIONS)
    try:
        alice = service.client("alice")
        for body, why in (
            ({"gpus": 2, "profile": "t2-idle"}, "is 1 GPU(s) at tier 2; this job asks for 2"),
            ({"gpus": 1, "tier": 3, "profile": "t2-1"}, "at tier 3"),
            ({"gpus": 1, "profile": "x" * 201}, "at most 200 characters"),
        ):
            status, error = await alice.post("api/jobs", {"kind": "notebook", **body})
            assert status == 400 and error["field"] == "profile", (body, error)
            assert why in error["error"], error
        status, error = await alice.post(
            "api/jobs", {"command": "true", "gpus": 1, "profile": "t2-1"}
        )
        assert status == 400 and error["field"] == "profile", error  # batch jobs have none
        status, job = await alice.post(
            "api/jobs", {"kind": "notebook", "gpus": 1, "profile": "t2-idle"}
        )
        assert status == 201 and job["profile"] == "t2-idle", job
        # the server's monitor claims another profile: not what the reaper applies
        report = {"job_id": job["id"], "profile": "t2-1", "backend": "simulated"}
        status, answer = await alice.post("api/usage-samples", report)
        assert status == 200 and answer["timeout"] == 7200, answer
        status, view = await alice.get("api/reaper")
        (session,) = view["sessions"]
        assert session["profile"] == "t2-idle" and session["timeout"] == 7200
    finally:
        await service.stop()
    again = await start_service(tmp_path, **OPTIONS)  # kept with the job
    try:

        async def listed():
            _, view = await again.client("alice").get("api/reaper")
            return view["sessions"]

        (session,) = await wait_until(listed, what="the recovered server's session")
        assert session["profile"] == "t2-idle" and session["timeout"] == 7200
        # a profile the hub does not have is no profile to the reaper: the tier's timeout
        status, other = await again.client("alice").post(
            "api/jobs", {"kind": "notebook", "gpus": 1, "profile": "nope"}
        )
        assert status == 201, other
        sessions = await wait_until(lambda: len(again.live.reaper.sessions) == 2 and listed())
        unknown = next(s for s in sessions if s["job_id"] == other["id"])
        assert unknown["profile"] is None and unknown["timeout"] == 2700
    finally:
        await again.stop()


async def test_a_bad_profile_shape_stops_the_start(tmp_path):
    with pytest.raises(ConfigError) as info:
        await start_service(tmp_path, profile_shapes={"t2-1": '{"gpus": 1, "tier": 7}'})
    assert "profile_shapes.t2-1" in str(info.value)


def test_the_hub_config_passes_each_profiles_gpus_and_tier():
    from traitlets.config import Config

    c = Config()
    c.GPUSchedSpawner.profiles = [
        {"display_name": "1 GPU", "slug": "one", "gpus": 1, "idle_timeout": "1h"},
        {"display_name": "2 GPUs, tier 3", "slug": "two", "gpus": 2, "tier": 3},
    ]
    c.JupyterHub.services = [{"name": "gpusched", "command": ["serve", "--old=1"]}]
    options = pass_idle_timeouts_to_service(c)
    assert options == [
        "--GPUSchedService.profile_idle_timeouts=one=3600",
        '--GPUSchedService.profile_shapes=one={"gpus": 1, "tier": 2}',
        '--GPUSchedService.profile_shapes=two={"gpus": 2, "tier": 3}',
    ]
    assert pass_idle_timeouts_to_service(c) == options  # again: replaced, not added
    assert c.JupyterHub.services[0]["command"] == ["serve", "--old=1", *options]
