"""The service's store, on real SQLite and PostgreSQL databases (fixtures: db_fixtures.py)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.exc import IntegrityError

from jupyter_gpusched.service.models import Base
from jupyter_gpusched.service.store import Store

T0 = 1_700_000_000.0


def job(n: int, **fields) -> dict:
    """A minimal job row: number ``n``, id ``j-00000n``."""
    return {
        "id": f"j-{n:06d}",
        "number": n,
        "user": "alice",
        "queue": "research",
        "tier": 2,
        "kind": "batch",
        "gpus": 1,
        "submit_time": T0 + n,
        **fields,
    }


def alloc(job_id: str, **fields) -> dict:
    row = {
        "job_id": job_id,
        "run": 1,
        "node": "n1",
        "gpu_indices": [0],
        "gpu_model": "A100",
        "gpus": 1.0,
        "queue": "research",
        "user": "alice",
        "tier": 2,
        "start": T0,
    }
    return {**row, **fields}


@pytest.fixture
def store(db_url):
    with Store(db_url) as s:
        yield s


# -- jobs ------------------------------------------------------------------------------------


def test_job_round_trip_every_field(store):
    row = job(
        7,
        kind="notebook",
        name="fine-tune llama",
        server_name="llama",
        profile="big-gpu",
        gpus=4,
        gpus_per_node=2,
        gpu_models=["A100", "H100"],
        gpu_fraction=0.5,
        cpus=8.5,
        memory_gb=64.0,
        walltime=3600.0,
        deadline=T0 + 7200.5,
        labels={"ib": "yes", "zone": "b"},
        command="python train.py --lr 1e-3",
        notebook="analysis.ipynb",
        env={"SEED": "1", "NESTED": {"a": [1, 2]}},
        cwd="/home/alice",
        priority=5,
        held=True,
        state="running",
        reason={"family": "capacity", "detail": "gpus", "message": "busy", "eta": T0 + 60},
        start_time=T0 + 10.25,
        first_start=T0 + 5.125,
        end_time=None,
        runs=2,
        preemptions=1,
        deadline_missed=True,
        exit_code=None,
        message=None,
        handle={"pid": 1234, "create_time": 1699999999.5},
        array_id="a-000005",
        array_index=2,
        array_max_running=8,
    )
    store.add_job(row)
    assert store.get_job("j-000007") == row
    assert store.get_job("j-999999") is None


def test_defaults_and_bad_rows(store):
    store.add_job(job(1))
    got = store.get_job("j-000001")
    assert got["state"] == "pending" and got["held"] is False and got["priority"] == 0
    assert got["gpu_fraction"] == 1.0 and got["labels"] == {} and got["env"] == {}
    assert got["runs"] == 0 and got["preemptions"] == 0 and got["gpu_models"] is None
    with pytest.raises(ValueError, match="colour, flavour"):
        store.add_job(job(2, flavour=1, colour=2))
    with pytest.raises(ValueError, match="queue"):
        store.add_job({k: v for k, v in job(3).items() if k != "queue"})
    assert [j["id"] for j in store.jobs()] == ["j-000001"]


def test_add_job_writes_its_event_in_the_same_transaction(store):
    store.add_job(job(1), {"kind": "submitted", "actor": "alice", "time": T0})
    [event] = store.events()
    assert (
        event["job_id"] == "j-000001" and event["user"] == "alice" and event["kind"] == "submitted"
    )
    # a bad event: the job is not written either
    with pytest.raises(ValueError, match="bogus"):
        store.add_job(job(2), {"kind": "submitted", "bogus": 1})
    with pytest.raises(IntegrityError):  # number 1 is taken: nor is the event written
        store.add_job(job(3, number=1), {"kind": "submitted"})
    assert store.get_job("j-000002") is None and store.get_job("j-000003") is None
    assert len(store.events()) == 1


def test_jobs_order_filters_paging(store):
    assert store.next_number() == 1
    rows = [
        job(3, state="running"),
        job(1),
        job(2, user="bob", state="completed"),
        job(5, user="bob"),
        job(4, state="failed"),
    ]
    store.add_jobs(rows, [{"kind": "submitted", "job_id": r["id"]} for r in rows])
    assert store.next_number() == 6
    assert [j["number"] for j in store.jobs()] == [1, 2, 3, 4, 5]
    assert [j["number"] for j in store.jobs(states=["pending", "failed"])] == [1, 4, 5]
    assert [j["number"] for j in store.jobs(user="bob")] == [2, 5]
    assert [j["number"] for j in store.jobs(states=["pending"], user="bob")] == [5]
    assert [j["number"] for j in store.jobs(limit=2)] == [1, 2]
    assert [j["number"] for j in store.jobs(limit=2, offset=2)] == [3, 4]
    assert [j["number"] for j in store.jobs(offset=3)] == [4, 5]
    assert [j["id"] for j in store.unfinished_jobs()] == ["j-000001", "j-000003", "j-000005"]
    assert len(store.events(kind="submitted")) == 5


def test_update_job(store):
    store.add_job(job(1))
    store.update_job(
        "j-000001",
        {"state": "running", "start_time": T0 + 1, "handle": {"slurm": 77}, "runs": 1},
        {"kind": "started", "node": "n1"},
    )
    got = store.get_job("j-000001")
    assert (got["state"], got["handle"], got["runs"]) == ("running", {"slurm": 77}, 1)
    [event] = store.events()
    assert (event["kind"], event["job_id"], event["node"]) == ("started", "j-000001", "n1")
    store.update_job("j-000001", {"handle": None})
    assert store.get_job("j-000001")["handle"] is None
    with pytest.raises(ValueError, match="colour"):
        store.update_job("j-000001", {"colour": "red"})
    with pytest.raises(KeyError, match="j-000404"):
        store.update_job("j-000404", {"state": "cancelled"}, {"kind": "cancelled"})
    assert len(store.events()) == 1  # the failed update's event was rolled back


# -- apply -----------------------------------------------------------------------------------


def test_apply_writes_a_whole_pass(store):
    store.add_jobs([job(1), job(2), job(3)], [])
    store.apply([("j-000001", {"state": "running"})], [alloc("j-000001")], [], [])
    store.apply(
        [
            ("j-000001", {"state": "completed", "end_time": T0 + 50, "exit_code": 0}),
            ("j-000002", {"state": "running", "runs": 1}),
            ("j-000003", {"state": "running", "runs": 1}),
            ("j-000002", {"start_time": T0 + 50}),  # same job again: merged, later wins
        ],
        [alloc("j-000002", node="n2", gpu_indices=[0, 1]), alloc("j-000003", node="n3")],
        [("j-000001", 1, T0 + 50)],
        [{"kind": "completed", "job_id": "j-000001"}, {"kind": "started", "job_id": "j-000002"}],
    )
    assert store.get_job("j-000001")["state"] == "completed"
    j2 = store.get_job("j-000002")
    assert (j2["state"], j2["runs"], j2["start_time"]) == ("running", 1, T0 + 50)
    assert [a["job_id"] for a in store.open_allocations()] == ["j-000002", "j-000003"]
    assert store.open_allocations("j-000002")[0]["gpu_indices"] == [0, 1]
    assert store.open_allocations("j-000001") == []
    assert [e["kind"] for e in store.events()] == ["started", "completed"]


def _snapshot(store):
    return store.jobs(), store.open_allocations(), store.events()


def test_apply_checks_everything_before_writing(store):
    store.add_jobs([job(1), job(2)], [])
    before = _snapshot(store)
    with pytest.raises(ValueError, match="no_such_column"):
        store.apply(
            [("j-000001", {"state": "running"}), ("j-000002", {"no_such_column": 1})],
            [alloc("j-000001")],
            [],
            [{"kind": "started", "job_id": "j-000001"}],
        )
    with pytest.raises(ValueError, match="colour"):  # a bad allocation row, checked up front
        store.apply([("j-000001", {"state": "running"})], [alloc("j-000001", colour=1)], [], [])
    assert _snapshot(store) == before


def test_apply_rolls_back_on_a_database_error(store):
    store.add_jobs([job(1), job(2)], [])
    store.apply([("j-000001", {"state": "running"})], [alloc("j-000001")], [], [])
    before = _snapshot(store)
    with pytest.raises(IntegrityError):  # the allocation's job does not exist: foreign key
        store.apply(
            [("j-000001", {"state": "completed"}), ("j-000002", {"state": "running"})],
            [alloc("j-000002"), alloc("j-404404")],
            [("j-000001", 1, T0 + 9)],
            [{"kind": "completed", "job_id": "j-000001"}],
        )
    with pytest.raises(KeyError, match="j-404404"):  # an update of a job that does not exist
        store.apply(
            [("j-000002", {"state": "running"}), ("j-404404", {"state": "running"})],
            [],
            [("j-000001", 1, T0 + 9)],
            [],
        )
    assert _snapshot(store) == before


# -- usage -----------------------------------------------------------------------------------


def test_usage_overlaps(store):
    store.add_jobs([job(n) for n in range(1, 6)], [])
    h = 3600.0
    store.apply(
        [],
        [
            # half inside the period: 1 h x 2 GPUs
            alloc("j-000001", queue="q1", user="u1", gpu_model="A100", gpus=2.0, start=T0),
            # starts inside, still open: counts up to the period's end, 2 h x 0.5
            alloc("j-000002", queue="q2", user="u2", gpu_model="H100", gpus=0.5, start=T0 + h),
            # entirely before the period, and one ending exactly at its start: nothing
            alloc("j-000003", queue="q1", user="u2", gpu_model="H100", start=T0 - h),
            alloc("j-000004", queue="q3", user="u3", gpu_model="V100", start=T0 - h),
            # covers the whole period: clipped at both ends, 2 h x 1
            alloc("j-000005", queue="q2", user="u1", gpu_model="A100", start=T0 - h),
        ],
        [("j-000001", 1, T0 + 2 * h), ("j-000003", 1, T0 - 1), ("j-000004", 1, T0 + h)],
        [],
    )
    store.apply([], [], [("j-000005", 1, T0 + 10 * h)], [])  # closed after the period
    period = (T0 + h, T0 + 3 * h)

    def usage(by):
        return [(u["key"], round(u["gpu_hours"], 9)) for u in store.usage(*period, by=by)]

    assert usage("queue") == [("q1", 2.0), ("q2", 3.0)]
    assert usage("user") == [("u1", 4.0), ("u2", 1.0)]
    assert usage("gpu_model") == [("A100", 4.0), ("H100", 1.0)]
    assert store.usage(T0 + 20 * h, T0 + 21 * h) == [
        {"key": "q2", "gpu_hours": pytest.approx(0.5)}  # only the open allocation
    ]
    with pytest.raises(ValueError, match="node"):
        store.usage(*period, by="node")


# -- settings and the audit log --------------------------------------------------------------


def test_settings(store):
    assert store.get_setting("quota.research") is None
    assert store.get_setting("quota.research", {"gpus": 0}) == {"gpus": 0}
    store.set_setting("quota.research", {"gpus": 8, "models": ["A100"]}, by="admin")
    store.set_setting("drained", ["n1", "n2"])
    store.set_setting(
        "quota.research", {"gpus": 16}, by="root", event={"kind": "quota-changed", "time": T0}
    )
    assert store.get_setting("quota.research") == {"gpus": 16}
    assert store.settings() == {"drained": ["n1", "n2"], "quota.research": {"gpus": 16}}
    with store.engine.connect() as conn:
        who = conn.execute(sa.text("SELECT updated_by FROM settings WHERE key = 'quota.research'"))
        assert who.scalar() == "root"
    [event] = store.events()
    assert (event["kind"], event["actor"]) == ("quota-changed", "root")


def test_events_filters_and_paging(store):
    for i in range(12):
        store.add_event(
            {
                "time": T0 + i,
                "kind": ["submitted", "started", "completed"][i % 3],
                "job_id": f"j-{i % 4:06d}",
                "user": "bob" if i % 2 else "alice",
                "actor": "sched",
                "message": f"event {i}",
                "data": {"i": i},
            }
        )
    everything = store.events()
    assert [e["data"]["i"] for e in everything] == list(range(11, -1, -1))  # newest first
    assert [e["data"]["i"] for e in store.events(kind="started")] == [10, 7, 4, 1]
    assert [e["data"]["i"] for e in store.events(job_id="j-000001")] == [9, 5, 1]
    assert [e["data"]["i"] for e in store.events(user="bob", kind="completed")] == [11, 5]
    assert [e["data"]["i"] for e in store.events(since=T0 + 3, until=T0 + 6)] == [5, 4, 3]
    pages, before = [], None
    while page := store.events(limit=5, before_id=before):
        pages.append([e["data"]["i"] for e in page])
        before = page[-1]["id"]
    assert pages == [[11, 10, 9, 8, 7], [6, 5, 4, 3, 2], [1, 0]]
    with pytest.raises(ValueError, match="kind"):
        store.add_event({"message": "no kind"})


# -- migrations ------------------------------------------------------------------------------


def test_upgrade_creates_everything_once(db_url):
    Store(db_url).close()
    engine = sa.create_engine(db_url)
    try:
        inspector = sa.inspect(engine)
        assert set(inspector.get_table_names()) == {
            "alembic_version",
            "jobs",
            "allocations",
            "settings",
            "events",
            "history",
            "utilization_runs",
        }
        assert {ix["name"] for ix in inspector.get_indexes("history")} == {"ix_history_time"}
        assert {ix["name"] for ix in inspector.get_indexes("utilization_runs")} == {
            "ix_utilization_runs_job_id",
            "ix_utilization_runs_end",
        }
        assert {ix["name"] for ix in inspector.get_indexes("events")} == {
            "ix_events_time",
            "ix_events_job_id",
            "ix_events_kind",
        }
        statements = []

        def record(conn, cursor, statement, *args):
            statements.append(statement.split(None, 1)[0].upper())

        sa.event.listen(sa.engine.Engine, "before_cursor_execute", record)
        try:
            with Store(db_url) as again:  # at head: reads the version, writes nothing
                again.upgrade()
        finally:
            sa.event.remove(sa.engine.Engine, "before_cursor_execute", record)
        assert statements and set(statements) <= {"SELECT", "PRAGMA", "BEGIN"}
        # a database from a newer version of the package is refused, not "upgraded"
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE alembic_version SET version_num = 'fffffff'"))
        with pytest.raises(RuntimeError, match="fffffff"):
            Store(db_url)
    finally:
        engine.dispose()


def test_models_match_migrations(db_url):
    Store(db_url).close()
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


# -- durability ------------------------------------------------------------------------------


def test_commits_survive_kill_9(sqlite_url):
    code = textwrap.dedent(
        f"""
        import os
        from jupyter_gpusched.service.store import Store
        store = Store({sqlite_url!r})
        for n in range(1, 101):
            store.add_job(
                {{"id": f"j-{{n:06d}}", "number": n, "user": "u", "queue": "q", "tier": 1,
                  "kind": "batch", "gpus": 1, "submit_time": float(n)}},
                {{"kind": "submitted"}},
            )
        print("done", flush=True)
        os.kill(os.getpid(), 9)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == -9, proc.stderr
    assert proc.stdout.strip() == "done"
    path = sqlite_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:  # WAL mode is a property of the file: it was on
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with Store(sqlite_url) as store:
        assert [j["number"] for j in store.jobs()] == list(range(1, 101))
        assert len(store.events(kind="submitted")) == 100
        assert store.next_number() == 101


# -- run-time estimates ----------------------------------------------------------------------


def test_a_restarted_engine_plans_with_estimates_learned_from_the_stored_history(store):
    """recovery.fit_run_times: the last completed jobs, from the real store, fit the engine's
    run-time estimates before anything is queued (core/runtime_estimates.py)."""
    from helpers import cluster
    from helpers import job as engine_job

    from jupyter_gpusched.core import PolicySettings, Scheduler
    from jupyter_gpusched.service.recovery import fit_run_times

    times = {1: 100.0, 2: 200.0, 3: 300.0}
    for number, ran in times.items():  # alice's "train" runs, completed
        store.add_job(
            job(number, name="train", state="completed", start_time=T0, end_time=T0 + ran)
        )
    store.add_job(job(4, name="train", state="failed", start_time=T0, end_time=T0 + 9999))
    store.add_job(job(5, name="train", state="running", start_time=T0))
    store.add_job(  # resumed after a pre-emption: its last run is not the whole job's
        job(6, name="train", state="completed", start_time=T0, end_time=T0 + 5, preemptions=1)
    )
    assert [r["end_time"] - r["start_time"] for r in store.completed_runs(10)] == [100, 200, 300]
    assert len(store.completed_runs(2)) == 2  # bounded: the last ones

    settings = PolicySettings.from_dict({"walltime": {"estimate": "missing"}})
    engine = Scheduler(cluster(("n1", 8, "leaf")), settings=settings)
    assert fit_run_times(engine, store) == 3
    first = store.get_job("j-000001")
    submitted = engine_job("new", first["gpus"], user="alice")  # (this engine has no queues)
    submitted.run_name = "train"
    engine.submit(submitted, T0 + 1000)
    # p90 of 100, 200, 300 (280) x 1.2
    assert submitted.estimated and submitted.planned_run_time == pytest.approx(336.0)
