"""The idle reaper: the decision (``decide``) as a plain function, its settings over REST (admins
change them at run time, persisted and audited), and a notebook allocation warned then culled from
monitor reports, in an in-process service without a hub."""

from __future__ import annotations

import asyncio

import pytest
from service_helpers import start_service, wait_until

from jupyter_gpusched.service.reaper import (
    DEFAULTS,
    Cull,
    Session,
    ShutdownKernels,
    Warn,
    decide,
    next_moment,
    validate,
)
from jupyter_gpusched.service.requests import RequestError

NOW = 100_000.0


def session(**kw) -> Session:
    values = {
        "job_id": "j-000001",
        "user": "alice",
        "gpus": 2,
        "tier": 2,
        "started": NOW - 7200,
        "last_measured": NOW - 1,
        "last_busy": None,
    }
    values.update(kw)
    return Session(**values)


def settings(**kw) -> dict:
    return validate(kw)


# -- decide ------------------------------------------------------------------------------------
def test_defaults_per_tier():
    idle_35m = NOW - 35 * 60
    s1 = session(job_id="t1", tier=1, last_busy=idle_35m - 10 * 3600)
    s2 = session(job_id="t2", tier=2, last_busy=idle_35m)
    s3 = session(job_id="t3", tier=3, last_busy=idle_35m, warned=idle_35m + 20 * 60)
    actions = decide([s1, s2, s3], settings(), NOW)
    assert actions == [
        Warn("t2", idle_35m + 2700, 2700.0, idle_35m),  # 45 min, warned 10 min before
        Cull("t3", "idle", 1800.0, idle_35m),  # 30 min, warned at 20
    ]


def test_warned_first_however_far_past_the_timeout():
    """A server already idle past its timeout (the timeout just lowered, the lead shortened, an
    exemption lifted, the reaper restarted) is warned now, with the whole lead, never culled in
    the same moment; it goes when that lead, and the deadline its warning named, have passed."""
    s = session(last_busy=NOW - 3 * 3600)  # 3 h idle, tier 2 (45 min): never warned
    assert decide([s], settings(), NOW) == [Warn("j-000001", NOW + 600, 2700.0, NOW - 3 * 3600)]
    assert next_moment([s], settings(), NOW) is None  # acts now (the tick that warns)
    s.warned, s.warn_deadline = NOW, NOW + 600  # the reaper sent it
    s.last_measured = NOW + 590  # still measured, still idle
    assert decide([s], settings(), NOW + 599) == []
    assert next_moment([s], settings(), NOW + 1) == NOW + 600
    assert decide([s], settings(), NOW + 600) == [Cull("j-000001", "idle", 2700.0, NOW - 3 * 3600)]
    # the lead shortened after the warning: the deadline it named still holds
    assert decide([s], settings(warning_lead=5), NOW + 10) == []
    # the lead lengthened after the warning: a whole new lead from the warning
    assert decide([s], settings(warning_lead="20m"), NOW + 600) == []
    # GPU use ends the stretch: the next idle stretch gets its own warning
    fresh = session(last_busy=NOW - 3 * 3600, warned=None)
    lowered = settings(timeout_tier_2=60, warning_lead=30)
    assert decide([fresh], lowered, NOW) == [Warn("j-000001", NOW + 30, 60.0, NOW - 3 * 3600)]
    # the kernels-first step waits for the warning too
    fresh.kernels = {"k": {"utilization": 0.0, "memory_gb": 6.0}}
    first = settings(shutdown_kernels_first=True, warning_lead=30, timeout_tier_2=60)
    assert [type(a) for a in decide([fresh], first, NOW)] == [Warn]


def test_warned_once_per_idle_stretch_and_busy_resets():
    s = session(last_busy=NOW - 40 * 60, warned=NOW - 5 * 60)
    assert decide([s], settings(), NOW) == []
    busy = session(last_busy=NOW - 2)
    assert decide([busy], settings(), NOW) == []


def test_use_since_the_warning_cancels_it_use_learned_late_from_before_it_does_not():
    """The hub reports a CPU-only server's activity late (``busy_at`` older than the tick that
    reads it). Activity from before the warning, learned after it, restarts the idle stretch but
    the warning stands: one warning for the same quiet, and the stop at least a timeout after
    that activity and no sooner than the warning said. Activity after the warning answers it."""
    lead, timeout = 30.0, 60.0
    rules = settings(timeout_tier_2=timeout, warning_lead=lead)
    s = session(gpus=0, last_busy=NOW - 40, last_measured=NOW - 1)
    (warn,) = decide([s], rules, NOW)
    s.warned, s.warn_deadline = NOW, warn.deadline  # the reaper sent it: stop at NOW + 30
    s.measured(NOW + 1, busy=True, busy_at=NOW - 10)  # use at NOW - 10, learned only now
    assert (s.warned, s.idle_since) == (NOW, NOW - 10)
    assert decide([s], rules, NOW + 2) == []  # no second warning
    assert next_moment([s], rules, NOW + 2) == NOW + 50  # a whole timeout after that use
    s.measured(NOW + 49, busy=False)
    assert decide([s], rules, NOW + 50) == [Cull("j-000001", "idle", timeout, NOW - 10)]
    # use after the warning went out: the warning is answered, the next stretch warns anew
    s.measured(NOW + 5, busy=True, busy_at=NOW + 3)
    assert (s.warned, s.warn_deadline, s.idle_since) == (None, None, NOW + 3)
    # a GPU measurement's use is at its own time: after any warning
    gpu = session(last_busy=NOW - 40, warned=NOW - 5, warn_deadline=NOW + 25)
    gpu.measured(NOW, busy=True)
    assert gpu.warned is None and gpu.idle_since == NOW


def test_never_reported_busy_counts_from_the_start():
    s = session(started=NOW - 35 * 60, last_busy=None)
    assert decide([s], settings(), NOW) == [
        Warn("j-000001", NOW - 35 * 60 + 2700, 2700.0, NOW - 35 * 60)
    ]


def test_idle_time_counts_from_the_first_measurement():
    # allocated 46 min ago, first measured 35 min ago (no source read it before), never busy:
    # 35 min idle
    s = session(started=NOW - 46 * 60, first_measured=NOW - 35 * 60, last_busy=None)
    assert decide([s], settings(), NOW) == [
        Warn("j-000001", NOW - 35 * 60 + 2700, 2700.0, NOW - 35 * 60)
    ]


def test_the_next_moment_the_reaper_must_act():
    s = session(last_busy=NOW - 60)  # tier 2: warned at 35 min idle, culled at 45
    assert next_moment([s], settings(), NOW) == NOW - 60 + 2100
    assert next_moment([s], settings(), NOW - 60 + 2100) == NOW - 60 + 2700
    young = session(started=NOW - 60, last_busy=NOW - 60)
    assert next_moment([young], settings(max_lifetime="10m"), NOW) == NOW - 60 + 600
    assert next_moment([s], settings(enabled=False), NOW) is None
    assert next_moment([session(tier=1)], settings(), NOW) is None  # tier 1: never


def test_profile_timeout_wins_and_exemptions():
    s = session(profile="big", last_busy=NOW - 20 * 60)
    assert decide([s], settings(profile_timeouts={"big": "15m"}), NOW)[0].timeout == 900
    assert decide([s], settings(profile_timeouts={"big": None}, timeout_tier_2=60), NOW) == []
    old = session(last_busy=NOW - 3 * 3600, groups=frozenset({"research"}), profile="p")
    assert decide([old], settings(exempt_users=["alice"]), NOW) == []
    assert decide([old], settings(exempt_groups=["research"]), NOW) == []
    assert decide([old], settings(exempt_profiles=["p"]), NOW) == []
    assert decide([old], settings(enabled=False), NOW) == []


def test_max_lifetime_and_stale_reports():
    busy = session(started=NOW - 9 * 3600, last_busy=NOW)
    assert decide([busy], settings(max_lifetime="8h"), NOW) == [
        Cull("j-000001", "max-lifetime", 8 * 3600.0, NOW)
    ]
    silent = session(last_busy=NOW - 3 * 3600, last_measured=NOW - 200)
    assert decide([silent], settings(), NOW) == []  # unknown is not idle


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"idle_threshold": 150}, "idle_threshold"),
        ({"idle_threshold": "5"}, "idle_threshold"),
        ({"timeout_tier_2": "soon"}, "timeout_tier_2"),
        ({"timeout_tier_3": -5}, "timeout_tier_3"),
        ({"warning_lead": None}, "warning_lead"),
        ({"exempt_users": "alice"}, "exempt_users"),
        ({"enabled": "yes"}, "enabled"),
        ({"shutdown_kernels_first": 1}, "shutdown_kernels_first"),
        ({"rogue_processes": "nuke"}, "rogue_processes"),
        ({"profile_timeouts": {"x": "never"}}, "profile_timeouts.x"),
        ({"nope": 1}, "nope"),
    ],
)
def test_bad_settings_name_the_field(changes, field):
    with pytest.raises(RequestError) as raised:
        validate(changes)
    assert raised.value.field == field and raised.value.status == 400


def test_kernels_holding_memory_go_first_then_the_server():
    idle_since = NOW - 46 * 60
    s = session(last_busy=idle_since, warned=NOW - 600)
    s.kernels = {  # the monitor's attribution
        "holds": {"utilization": 0.0, "memory_gb": 6.0},
        "cpu-only": {"utilization": 0.0, "memory_gb": 0.0},
    }
    first = settings(shutdown_kernels_first=True, warning_lead="5m")
    assert decide([s], first, NOW) == [
        ShutdownKernels("j-000001", ("holds",), NOW + 300, 2700.0, idle_since)
    ]
    s.kernels_shut = NOW  # carried out: the server gets warning_lead more
    s.last_measured = NOW + 299  # still measured, still idle
    assert decide([s], first, NOW + 299) == []
    assert decide([s], first, NOW + 300) == [Cull("j-000001", "idle", 2700.0, idle_since)]
    # no kernel holds GPU memory: nothing to shut down first, the server goes at the timeout
    bare = session(last_busy=idle_since, warned=NOW - 600)
    bare.kernels = {"cpu-only": {"utilization": 0.0, "memory_gb": 0.0}}
    assert decide([bare], first, NOW) == [Cull("j-000001", "idle", 2700.0, idle_since)]
    # off (the default): the server goes at the timeout, kernels and all
    s.kernels_shut = None
    assert decide([s], settings(), NOW + 299) == [Cull("j-000001", "idle", 2700.0, idle_since)]


def test_durations_and_off():
    s = validate({"timeout_tier_2": "1h30m", "timeout_tier_3": 0, "max_lifetime": "off"})
    assert s["timeout_tier_2"] == 5400 and s["timeout_tier_3"] is None
    assert s["max_lifetime"] is None and DEFAULTS["timeout_tier_2"] == 2700


# -- the service ---------------------------------------------------------------------------------
async def test_settings_over_rest_admin_only_persisted_and_audited(tmp_path):
    policy = {"reaper": {"timeout_tier_2": "20m", "exempt_users": ["carol"]}}
    service = await start_service(tmp_path, policy=policy)
    try:
        admin, alice = service.client("admin"), service.client("alice")
        status, data = await alice.get("api/reaper")
        assert status == 200 and data["settings"]["timeout_tier_2"] == 1200
        assert data["defaults"]["exempt_users"] == ["carol"] and data["overrides"] == {}
        status, data = await alice.put("api/reaper", {"timeout_tier_2": 60})
        assert status == 403
        status, data = await admin.put("api/reaper", {"idle_threshold": 101})
        assert status == 400 and data["field"] == "idle_threshold"
        status, data = await admin.put("api/reaper", {"timeout_tier_2": "5m", "warning_lead": 30})
        assert status == 200 and data["settings"]["timeout_tier_2"] == 300
        assert service.live.reaper.settings()["warning_lead"] == 30
        status, events = await admin.get("api/events", params={"kind": "reaper-settings"})
        assert events["events"][0]["actor"] == "admin"
        changes = events["events"][0]["data"]["changes"]
        assert changes == {"timeout_tier_2": "5m", "warning_lead": 30}
    finally:
        await service.stop()
    again = await start_service(tmp_path, policy=policy)
    try:
        status, data = await again.client("alice").get("api/reaper")
        assert data["settings"]["timeout_tier_2"] == 300
        assert data["settings"]["exempt_users"] == ["carol"]  # the policy file's, still
    finally:
        await again.stop()


def report(job_id: str, util: float) -> dict:
    """A GPU monitor's report: since issue 16 only its kernels count (which hold GPU memory)."""
    return {
        "job_id": job_id,
        "profile": "small",
        "backend": "simulated",  # the service runs the simulated cluster (start_service)
        "server": {"utilization": util, "memory_gb": 4.0, "gpus": [0]},
        "devices": [{"index": 0, "utilization": util, "memory_gb": 4.0}],
        "kernels": {"k1": {"utilization": util, "memory_gb": 4.0}},
    }


async def test_busy_is_kept_idle_is_warned_then_culled(tmp_path):
    """The service's own samples of the server's GPU decide: busy (simulated load at 90%) it
    is kept past its timeout, whatever its monitor says (here: an idle report); idle (1%) it
    is warned, then culled, while its monitor claims 90%."""
    service = await start_service(tmp_path, poll_interval=0.05, gpu_load_dir=tmp_path / "gpus")
    try:
        admin, alice, bob = (service.client(u) for u in ("admin", "alice", "bob"))
        status, job = await alice.post("api/jobs", {"gpus": 1, "kind": "notebook"})
        assert status == 201, job
        job_id = job["id"]
        await wait_until(lambda: job_id in service.live.engine.running, what="running")
        status, _ = await bob.post("api/usage-samples", report(job_id, 0))
        assert status == 404  # not bob's server: answered as an unknown one
        status, _ = await alice.post("api/usage-samples", report("j-999999", 0))
        assert status == 404
        service.load(job_id, 90)
        status, data = await alice.post("api/usage-samples", report(job_id, 0))
        assert status == 200 and data["timeout"] == 2700
        reaper = service.live.reaper
        await wait_until(lambda: reaper.sessions[job_id].last_busy, what="measured busy")
        status, _ = await admin.put("api/reaper", {"timeout_tier_2": 1.0, "warning_lead": 0.6})
        assert status == 200
        # busy: kept past the timeout, though its monitor reports it idle
        first = reaper.sessions[job_id].last_measured
        for _ in range(15):
            await alice.post("api/usage-samples", report(job_id, 0))
            await asyncio.sleep(0.1)
        assert job_id in service.live.engine.running
        assert reaper.sessions[job_id].last_measured > first  # measured all along
        # the service's samples make the measured utilization metric
        registry = service.app.metrics.registry
        tier_2 = {"tier": "2"}
        assert registry.get_sample_value("gpusched_measured_gpus", tier_2) == 1
        measured = registry.get_sample_value("gpusched_measured_gpu_utilization_percent", tier_2)
        assert measured == 90
        status, view = await admin.get("api/reaper")
        mine = next(s for s in view["sessions"] if s["job_id"] == job_id)
        assert mine["measured_by"] == "local (simulated)" and mine["unmonitored_since"] is None
        assert mine["last_sample"]["devices"][0]["utilization"] == 90
        # idle: warned, then culled, though its monitor claims 90%
        service.load(job_id, 1)
        for _ in range(80):
            status, _ = await alice.post("api/usage-samples", report(job_id, 90))
            if job_id not in service.live.engine.running:
                break
            await asyncio.sleep(0.05)
        await wait_until(lambda: job_id not in service.live.engine.running, what="culled")
        status, events = await admin.get("api/events", params={"job_id": job_id})
        kinds = [e["kind"] for e in events["events"]]
        assert "reaper-warning" in kinds and "reaper-cull" in kinds
        cull = next(e for e in events["events"] if e["kind"] == "reaper-cull")
        assert cull["data"]["timeout"] == 1.0 and cull["data"]["samples"]
        assert cull["data"]["samples"][-1]["devices"][0]["utilization"] == 1
        assert cull["data"]["settings"]["warning_lead"] == 0.6
        assert kinds.index("reaper-cull") < kinds.index("reaper-warning")  # newest first
        assert service.app.metrics.culls._value.get() == 1
        assert service.live.reaper.reclaimed._value.get() > 0
        status, view = await alice.get(f"api/jobs/{job_id}")
        assert view["state"] == "completed", view
    finally:
        await service.stop()


async def test_kernels_first_then_the_server_in_the_service(tmp_path):
    """The GPU idle as the service measures it; which kernel holds memory, as its monitor says."""
    service = await start_service(tmp_path, poll_interval=0.05, gpu_load_dir=tmp_path / "gpus")
    try:
        admin, alice = service.client("admin"), service.client("alice")
        status, job = await alice.post("api/jobs", {"gpus": 1, "kind": "notebook"})
        job_id = job["id"]
        await wait_until(lambda: job_id in service.live.engine.running, what="running")
        service.load(job_id, 0, memory_gb=4.0)
        changes = {"timeout_tier_2": 0.5, "warning_lead": 3.0, "shutdown_kernels_first": True}
        status, _ = await admin.put("api/reaper", changes)
        assert status == 200
        for _ in range(100):
            await alice.post("api/usage-samples", report(job_id, 0))
            status, events = await admin.get("api/events", params={"job_id": job_id})
            if any(e["kind"] == "reaper-kernels" for e in events["events"]):
                break
            await asyncio.sleep(0.05)
        shut = next(e for e in events["events"] if e["kind"] == "reaper-kernels")
        assert shut["data"]["kernel_ids"] == ["k1"] and shut["data"]["samples"]
        assert job_id in service.live.engine.running  # the server stays, for now
        await wait_until(lambda: job_id not in service.live.engine.running, what="culled")
        status, events = await admin.get("api/events", params={"job_id": job_id})
        cull = next(e for e in events["events"] if e["kind"] == "reaper-cull")
        assert cull["time"] - shut["time"] >= 3.0  # warning_lead after the kernels went
    finally:
        await service.stop()


async def test_cli_show_and_set(tmp_path, capsys, monkeypatch):
    from service_helpers import TOKENS

    from jupyter_gpusched.cli import main

    def as_user(user):  # the token from the environment: there is no --token option
        monkeypatch.setenv("GPUSCHED_SERVICE_TOKEN", TOKENS[user])

    service = await start_service(tmp_path)
    try:
        base = ["--url", service.url]
        pairs = ["timeout_tier_3=10m", "exempt_users=alice,bob", "profile_timeouts.big=off"]
        as_user("admin")
        code = await asyncio.to_thread(main, ["reaper", "set", *pairs, *base])
        assert code == 0
        settings = service.live.reaper.settings()
        assert settings["timeout_tier_3"] == 600 and settings["exempt_users"] == ["alice", "bob"]
        assert settings["profile_timeouts"] == {"big": None}
        capsys.readouterr()
        as_user("bob")
        code = await asyncio.to_thread(main, ["reaper", "show", *base])
        assert code == 0 and '"timeout_tier_3": 600.0' in capsys.readouterr().out
        as_user("admin")
        code = await asyncio.to_thread(main, ["reaper", "set", "idle_threshold=500", *base])
        assert code == 2 and "idle_threshold" in capsys.readouterr().err
        as_user("bob")
        code = await asyncio.to_thread(main, ["reaper", "set", "idle_threshold=1", *base])
        assert code == 1 and "403" in capsys.readouterr().err
    finally:
        await service.stop()


def test_a_late_measurement_after_a_busy_one_is_not_idleness():
    """Idleness is what the measurements say: when the latest one showed GPU use, a sample
    that is late with the next one (a loaded machine) does not make the server idle."""
    settings = validate({"timeout_tier_2": 60, "warning_lead": 30, "stale_after": 600})
    session = Session(job_id="j-1", user="u", gpus=1, tier=2, started=0.0)
    session.last_measured = session.last_busy = 100.0
    assert decide([session], settings, 100.0 + 59) == []
    assert decide([session], settings, 100.0 + 200) == []
    session.last_measured = 300.0  # an idle measurement: idle since the last busy one (past the
    # timeout, never warned: warned first)
    assert [type(a).__name__ for a in decide([session], settings, 301.0)] == ["Warn"]


class _GroupsHub:
    """The part of HubClient the reaper uses, for a service without a hub: alice is in the
    research group. (tests/test_reaper_hub.py runs the reaper under a real hub.)"""

    def __init__(self):
        self.stopped: list[str] = []

    async def user_groups(self, user):
        return frozenset({"research"}) if user == "alice" else frozenset()

    async def stop_server(self, user, server_name):
        self.stopped.append(user)
        return True

    async def post_notice(self, user, server_name, notice):
        return True


async def test_group_exemptions_hold_before_the_first_report(tmp_path):
    service = await start_service(tmp_path, poll_interval=0.05)
    try:
        hub = service.live.hub = _GroupsHub()
        service.live.server_stop_wait = 0.1
        admin = service.client("admin")
        changes = {"max_lifetime": 1.0, "exempt_groups": ["research"]}
        status, _ = await admin.put("api/reaper", changes)
        assert status == 200
        jobs = {}
        for user in ("alice", "bob"):
            status, job = await service.client(user).post(
                "api/jobs", {"gpus": 1, "kind": "notebook"}
            )
            jobs[user] = job["id"]
        running = service.live.engine.running
        await wait_until(lambda: jobs["bob"] not in running, 10, what="bob's lifetime cull")
        assert hub.stopped == ["bob"]
        await asyncio.sleep(0.5)  # past alice's lifetime too; her group is exempt
        assert jobs["alice"] in running
        session = service.live.reaper.sessions[jobs["alice"]]
        assert session.last_report is None and session.groups == {"research"}
    finally:
        await service.stop()


def test_the_profiles_own_idle_timeout_between_the_admins_and_the_tiers():
    """Precedence: the admin's profile_timeouts for the profile, else the profile's own
    idle_timeout (the hub's profiles), else the tier's; the hub's values are not set by PUT."""
    from jupyter_gpusched.service.reaper import timeout_for, with_profile_idle_timeouts

    hub = with_profile_idle_timeouts(settings(), {"gpu-1": 3600.0, "plain": None})
    assert hub["profile_idle_timeouts"] == {"gpu-1": 3600.0}
    assert timeout_for(session(profile="gpu-1"), hub) == 3600  # not the tier's 2700
    assert timeout_for(session(profile="plain"), hub) == 2700
    assert timeout_for(session(profile=None), hub) == 2700
    admin = validate({"profile_timeouts": {"gpu-1": "20m"}}, hub)
    assert timeout_for(session(profile="gpu-1"), admin) == 1200
    assert validate({"timeout_tier_2": 60}, hub)["profile_idle_timeouts"] == {"gpu-1": 3600.0}
    with pytest.raises(RequestError) as raised:
        validate({"profile_idle_timeouts": {"gpu-1": 1}}, hub)
    assert raised.value.field == "profile_idle_timeouts"
    assert "profile_timeouts" in raised.value.message
    with pytest.raises(RequestError) as raised:
        with_profile_idle_timeouts(settings(), {"gpu-1": "soon"})
    assert raised.value.field == "profile_idle_timeouts.gpu-1"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        *[(0.4, "0 s"), (45, "45 s"), (90, "1 min 30 s"), (599, "9 min 59 s"), (600, "10 min")],
        *[(2700, "45 min"), (3600, "1 h"), (5400, "90 min"), (86400, "1 d")],
    ],
)
def test_durations_as_people_read_them(seconds, text):
    from jupyter_gpusched.core.durations import describe_duration

    assert describe_duration(seconds) == text


def test_the_stop_phrase_says_seconds_and_the_clock():
    from jupyter_gpusched.core.reaper import stop_phrase

    deadline = 1_700_000_045.0  # 22:14:05 UTC
    assert stop_phrase(deadline, deadline - 45) == "in 45 s (at 22:14:05 UTC)"
    assert stop_phrase(deadline, deadline - 600) == "in 10 min (at 22:14:05 UTC)"


def test_the_hub_home_page_says_a_cpu_only_server_had_no_activity():
    from jupyter_gpusched.hub.stop_notice import sentence

    cpu = sentence({"cpu_only": True, "gpus": "gpu1", "idle_seconds": 6, "timeout": 6})
    assert "it had no activity for 6 s, and the idle timeout is 6 s" in cpu, cpu
    assert "GPU" not in cpu, cpu
    gpu = sentence({"cpu_only": False, "gpus": "gpu1:0", "idle_seconds": 6, "timeout": 6})
    assert "its GPUs (gpu1:0) were idle for 6 s" in gpu, gpu


def test_the_core_rules_name_the_field_in_a_config_error():
    """The reaper's rules in core import nothing of the service: its settings' checks raise the
    engine's ConfigError, which the REST edge (service/reaper_requests.py) answers as a 400."""
    from jupyter_gpusched.core import reaper_settings as rules
    from jupyter_gpusched.core.errors import ConfigError

    with pytest.raises(ConfigError) as raised:
        rules.validate({"warning_lead": "soon"})
    assert raised.value.field == "warning_lead"
    assert raised.value.message == "'warning_lead' must be a duration (seconds, or 30m, 1h)"


def test_a_reading_of_its_gpu_from_before_the_server_started_is_not_its_measurement():
    """A server allocated a GPU that an earlier job left idle: the sampler's last reading of
    that GPU is the earlier job's. Taken as the server's, it made the server idle since before
    it existed, warned as it started and stopped a minute later (seen in make demo)."""
    from jupyter_gpusched.service.gpu_sampling import GPUReading
    from jupyter_gpusched.service.reaper_measure import take_readings

    server = session(started=NOW, last_measured=None)
    before = GPUReading("gpu1", 1, 0.0, 0.0, "simulated", NOW - 80)
    assert not take_readings(server, [before], 1, 5.0, "sampler")
    assert server.first_measured is None and server.idle_since == NOW
    after = GPUReading("gpu1", 1, 0.0, 0.0, "simulated", NOW + 10)
    assert take_readings(server, [after], 1, 5.0, "sampler")
    assert server.idle_since == NOW + 10
    settings = {**DEFAULTS, "timeout_tier_2": 120, "warning_lead": 60}
    (warn,) = decide([server], settings, NOW + 70)
    assert isinstance(warn, Warn) and warn.deadline == NOW + 130  # the whole timeout from then


async def test_a_warning_that_did_not_reach_the_server_is_posted_again_while_it_stands():
    """The warning of a server not up yet (its notice answered 403 by the hub) was never posted
    again: the Lab then saw the server stopped without one. The stop does not wait for it."""
    from jupyter_gpusched.service.reaper_actions import ReaperActions

    posted, answers, tasks = [], [False, True], []

    class Hub:
        async def post_notice(self, user, server_name, notice):
            posted.append(notice["kind"])
            return answers.pop(0)

    class Live:
        hub = Hub()

        def _spawn(self, coroutine):
            tasks.append(asyncio.ensure_future(coroutine))

    actions = ReaperActions(Live())
    server = session(warned=NOW, warn_deadline=NOW + 60)
    await actions._deliver(server, server.warned, {"kind": "idle", "deadline": NOW + 60})
    assert posted == ["idle"] and "j-000001" in actions.undelivered
    actions.resend(server)
    await asyncio.gather(*tasks)
    assert posted == ["idle", "idle"] and not actions.undelivered
    actions.resend(server)  # delivered: nothing more
    assert posted == ["idle", "idle"] and len(tasks) == 1
    # a warning that use has called off is not posted again
    answers.append(False)
    await actions._deliver(server, server.warned, {"kind": "idle", "deadline": NOW + 60})
    server.warned = None
    actions.resend(server)
    assert len(tasks) == 1 and not actions.undelivered
