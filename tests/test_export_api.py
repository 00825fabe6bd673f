"""The service's own history as a trace: the utilization runs it records of notebook servers
(service/utilization_record.py) and ``GET api/export`` (service/export.py), through a real service
in this process (tests/service_helpers.py). The whole round trip, a real ``serve`` process, the
export command, replay and what-if, is tests/test_own_history.py."""

from __future__ import annotations

import asyncio
import json

import pytest
from service_helpers import TOKENS, services, wait_job, wait_until

from jupyter_gpusched.cli import main
from jupyter_gpusched.service.export import pseudonym
from jupyter_gpusched.service.store import Store
from jupyter_gpusched.service.utilization_record import UtilizationRecorder, utilization_runs


@pytest.fixture
async def service_factory(tmp_path):
    async with services(tmp_path) as make:
        yield make


# -- the recorder --------------------------------------------------------------------------------
def test_samples_in_one_band_are_one_run_a_new_band_or_a_gap_starts_another(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    recorder = UtilizationRecorder(store.engine, retention_days=1.0, flush_every=60.0)
    for t, util in ((0, 0.0), (10, 0.5), (20, 0.2), (30, 0.9)):  # band [0, 1)
        recorder.add("j-1", 1000.0 + t, util, stale_after=120.0)
    recorder.add("j-1", 1040.0, 87.0, stale_after=120.0)  # busy: a new run
    recorder.add("j-1", 1050.0, 30.0, stale_after=120.0)  # still [20, 100]: busy
    recorder.add("j-1", 1300.0, 70.0, stale_after=120.0)  # after a gap: unmeasured between
    recorder.add("j-1", 1310.0, 15.0, stale_after=120.0)  # [10, 20): a band of its own
    recorder.add("j-2", 1000.0, 3.0, stale_after=120.0)
    recorder.close("j-1")
    recorder.flush()
    runs = utilization_runs(store.engine, ["j-1", "j-2"])
    assert [(r["job_id"], r["start"], r["end"], r["utilization"]) for r in runs] == [
        ("j-1", 1000.0, 1030.0, 0.9),
        ("j-1", 1040.0, 1050.0, 87.0),
        ("j-1", 1300.0, 1300.0, 70.0),
        ("j-1", 1310.0, 1310.0, 15.0),
        ("j-2", 1000.0, 1000.0, 3.0),
    ]
    recorder.tick(86400.0 + 1200.0)  # a day after 1200: the runs that ended before go
    assert [r["start"] for r in utilization_runs(store.engine, ["j-1", "j-2"])] == [1300.0, 1310.0]
    store.close()


def test_a_growing_runs_row_is_written_at_most_every_flush_interval(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    recorder = UtilizationRecorder(store.engine, retention_days=1.0, flush_every=60.0)
    for t in range(0, 100, 10):
        recorder.add("j-1", float(t), 0.0, stale_after=120.0)
    (row,) = utilization_runs(store.engine, ["j-1"])
    assert row["end"] == 60.0  # the write at 60 s; 70-90 s are still in memory
    recorder.flush()
    (row,) = utilization_runs(store.engine, ["j-1"])
    assert row["end"] == 90.0
    store.close()


# -- GET api/export --------------------------------------------------------------------------------
async def test_export_lists_what_ran_with_its_outcome_and_the_servers_utilization(
    service_factory, tmp_path, capsys, monkeypatch
):
    service = await service_factory(
        gpu_load_dir=tmp_path / "gpus", gpu_sample_interval=0.1, history_interval=0.5
    )
    alice, bob, carol, admin = (service.client(u) for u in ("alice", "bob", "carol", "admin"))
    _, done = await alice.post("api/jobs", {"command": "sleep 0.3", "gpus": 2, "walltime": 60})
    _, failed = await carol.post("api/jobs", {"command": "exit 3", "gpus": 1, "tier": 3})
    _, held = await bob.post("api/jobs", {"command": "true", "gpus": 1, "held": True})
    _, server = await bob.post("api/jobs", {"gpus": 1, "kind": "notebook"})
    await wait_job(alice, done["id"], {"completed"})
    await wait_job(carol, failed["id"], {"failed"})
    await wait_job(bob, server["id"], {"running"})
    service.load(server["id"], 90)
    reaper = service.live.reaper
    await wait_until(lambda: reaper.sessions[server["id"]].last_busy, what="measured busy")
    service.load(server["id"], 0)
    await wait_until(
        lambda: (
            reaper.sessions[server["id"]].last_measured
            > (reaper.sessions[server["id"]].last_busy or 0) + 0.3
        ),
        what="measured idle",
    )
    status, _ = await admin.put("api/reaper", {"timeout_tier_2": 0.6, "warning_lead": 0.3})
    assert status == 200
    await wait_job(bob, server["id"], {"completed"}, timeout=20)  # culled by the reaper

    status, answer = await admin.get("api/export")
    assert status == 200, answer
    jobs = {job["job_id"]: job for job in answer["jobs"]}
    assert set(jobs) == {done["id"], failed["id"], server["id"]}
    assert held["id"] not in jobs  # it never started: left out, and counted
    assert answer["left_out"] == {"never started": 1} and answer["pseudonymized"] is False
    assert answer["queues"] == service.live.quota_document
    assert answer["reaper"] == {**reaper.settings(), "timeout_tier_2": 0.6, "warning_lead": 0.3}
    for job_id, client, outcome in (
        (done["id"], alice, "completed"),
        (failed["id"], carol, "failed"),
        (server["id"], bob, "culled"),
    ):
        _, view = await client.get(f"api/jobs/{job_id}")
        job = jobs[job_id]
        for field in ("submit_time", "end_time", "gpus", "tier", "queue", "user", "kind"):
            assert job[field] == view[field], (job_id, field)
        assert job["gpu_model"] == view["gpu_models"] and job["walltime"] == view["walltime"]
        assert job["start_time"] == view["start_time"]  # one run: its first start
        assert job["outcome"] == outcome and job["preemptions"] == 0
        ran = view["end_time"] - view["start_time"]
        assert job["run_time"] == pytest.approx(ran, abs=0.01)
    assert jobs[done["id"]]["walltime"] == 60 and jobs[done["id"]]["profile"] is None
    runs = [r for r in answer["utilization"] if r["job_id"] == server["id"]]
    assert runs and all(r["job_id"] == server["id"] for r in answer["utilization"])
    assert [r["start"] for r in runs] == sorted(r["start"] for r in runs)
    assert any(r["utilization"] == 90 for r in runs) and runs[-1]["utilization"] == 0
    server_view = jobs[server["id"]]
    assert server_view["start_time"] <= runs[0]["start"] <= runs[-1]["end"]
    assert runs[-1]["end"] <= server_view["end_time"]

    # only the service's admins; bad arguments are a 400 naming the field
    status, error = await alice.get("api/export")
    assert status == 403, error
    for params, field in (
        ({"pseudonymize": "yes"}, "pseudonymize"),
        ({"queue": "nowhere"}, "queue"),
        ({"since": answer["until"] - 400 * 86400}, "since"),
        ({"since": "yesterday"}, "since"),
    ):
        status, error = await admin.get("api/export", params=params)
        assert status == 400 and error["field"] == field, (params, error)

    # one queue and those below it
    status, private = await admin.get("api/export", params={"queue": "private"})
    assert status == 200 and [j["job_id"] for j in private["jobs"]] == [failed["id"]]
    assert private["utilization"] == []

    # the what-if without a trace exports the service's last 30 days first (the command blocks:
    # run it in a thread while this loop serves); alice's token is refused with the 403's words
    def what_if(user):
        monkeypatch.setenv("GPUSCHED_SERVICE_TOKEN", TOKENS[user])  # (no --token: ps shows it)
        argv = ["reaper", "what-if", "--url", service.url, "--json"]
        return main([*argv, "--timeout-tier-2", "1h"])

    assert await asyncio.to_thread(what_if, "admin") == 0
    result = json.loads(capsys.readouterr().out)
    assert result["total"]["servers"] == 1 and result["total"]["live_culled"] == 1
    assert result["settings"]["current"]["timeout_tier_2"] == 0.6  # in force: the admin's
    assert result["total"]["current"]["culled"] == 1 and result["total"]["candidate"]["culled"] == 0
    assert await asyncio.to_thread(what_if, "alice") == 2
    assert "403" in capsys.readouterr().err


async def test_pseudonyms_are_stable_and_reach_queue_names_and_the_queue_document(
    service_factory,
):
    queues = {
        "queues": {
            "team": {
                "guaranteed": 8,
                "children": {"alice": {"guaranteed": 4, "users": ["alice"]}, "bob": {}},
            },
        },
        "user_limits": {"default": {"pending_jobs": 10}, "bob": {"pending_jobs": 5}},
    }
    service = await service_factory(queues=queues, policy={"reaper": {"exempt_users": ["bob"]}})
    alice, admin = service.client("alice"), service.client("admin")
    _, job = await alice.post("api/jobs", {"command": "true", "gpus": 1, "queue": "team/alice"})
    await wait_job(alice, job["id"], {"completed"})
    _, first = await admin.get("api/export", params={"pseudonymize": "true"})
    _, second = await admin.get("api/export", params={"pseudonymize": "true"})
    (exported,) = first["jobs"]
    assert first["pseudonymized"] and exported["user"] != "alice"
    assert exported["user"].startswith("user-") and second["jobs"][0]["user"] == exported["user"]
    assert exported["queue"] == f"team/{exported['user']}"
    key = service.live.store.get_setting("export_pseudonym_key")
    assert exported["user"] == pseudonym(key, "alice") and pseudonym(key, "bob") != exported["user"]
    document = first["queues"]
    children = document["queues"]["team"]["children"]
    assert set(children) == {exported["user"], pseudonym(key, "bob")}
    assert children[exported["user"]]["users"] == [exported["user"]]
    assert set(document["user_limits"]) == {"default", pseudonym(key, "bob")}
    assert first["reaper"]["exempt_users"] == [pseudonym(key, "bob")]
    assert "alice" not in str(first) and "bob" not in str(first)
    assert key not in str(first)  # the key stays in the service
    await asyncio.sleep(0)


def test_a_job_waiting_again_after_a_preemption_is_unfinished_and_its_work_is_its_last_run():
    """Its end_time is its pre-empted run's end, not an end: the export says it has none, and
    its duration is the work a replay needs (earlier runs keep whole checkpoint intervals)."""
    from jupyter_gpusched.core.jobspec import TRACE_FIELDS
    from jupyter_gpusched.core.settings import PolicySettings
    from jupyter_gpusched.service.export import _job, work

    row = {f.column_name: None for f in TRACE_FIELDS}
    row.update(id="j-000007", submit_time=10.0, first_start=20.0, end_time=80.0, kind="batch")
    row.update(state="pending", preemptions=1, profile=None, gpus=2, tier=3, queue="q", user="u")
    settings = PolicySettings.from_dict({"checkpoint": {"interval": "25s"}})
    record = _job(row, [60.0], culled=False, settings=settings)
    assert record["outcome"] == "running" and record["end_time"] is None
    assert record["start_time"] == 20.0 and record["preemptions"] == 1
    assert record["run_time"] == 60.0 and record["duration"] == 60.0
    assert work([60.0, 30.0], settings) == 30.0 + 50.0  # two whole intervals of the first
    assert work([60.0, 30.0], settings.replace(checkpoint_on_signal=True)) == 90.0
    row.update(state="completed", end_time=130.0)
    assert _job(row, [60.0, 50.0], culled=False, settings=settings)["outcome"] == "completed"
    assert _job(row, [60.0, 50.0], culled=True, settings=settings)["outcome"] == "culled"


def test_a_queue_keeps_its_subtree_only_whatever_its_name_holds(tmp_path):
    """``queue=a_b`` is a path, not a LIKE pattern: axb's jobs stay out."""
    from jupyter_gpusched.core.settings import PolicySettings
    from jupyter_gpusched.service.export import export

    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    rows = [
        {"id": f"j-00000{n}", "number": n, "user": "u", "queue": queue, "tier": 2,
         "kind": "batch", "gpus": 1, "state": "completed", "submit_time": 10.0 * n,
         "first_start": 10.0 * n + 1, "end_time": 10.0 * n + 5}
        for n, queue in enumerate(("a_b", "a_b/x", "axb/x", "a_bc", "a%b/x"), 1)
    ]  # fmt: skip
    store.add_jobs(rows, [])
    exported = export(store, 0.0, 100.0, "a_b", None, None, PolicySettings(), None)
    assert [j["queue"] for j in exported["jobs"]] == ["a_b", "a_b/x"]
    assert [j["queue"] for j in export(store, 0.0, 100.0, "a%b", None, None, PolicySettings())[
        "jobs"
    ]] == ["a%b/x"]  # fmt: skip
    store.close()


def test_export_trace_writes_a_deadline_as_seconds_from_the_trace_start(tmp_path):
    from jupyter_gpusched.cli.export import write_export
    from jupyter_gpusched.sim.trace import read_trace

    t0 = 1_800_000_000.0
    job = {
        "job_id": "j-000001",
        "submit_time": t0,
        "duration": 60.0,
        "gpus": 1,
        "tier": 2,
        "queue": "team",
        "user": "alice",
        "kind": "batch",
        "walltime": 120.0,
        "deadline": t0 + 3600.0,
        "start_time": t0 + 5,
        "end_time": t0 + 65,
        "run_time": 60.0,
        "preemptions": 0,
        "outcome": "completed",
    }
    later = {**job, "job_id": "j-000002", "submit_time": t0 + 1, "deadline": None}
    write_export({"jobs": [job, later]}, tmp_path / "trace.csv")
    first, second = read_trace(tmp_path / "trace.csv")
    assert (first.submit_time, first.deadline) == (0.0, 3600.0)
    assert (second.submit_time, second.deadline) == (1.0, None)
