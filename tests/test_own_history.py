"""Replay your own cluster, end to end: ``benchmarks/bench_own_history.py`` runs a real
``jupyter-gpusched serve`` with the demo's cluster and queues under a seeded workload (batch jobs
of three users in three tiers, pre-emptions, notebook servers whose simulated GPUs go busy and
idle, culls), exports it with the real ``export-trace`` command, replays it and runs the
idle-timeout what-if, each as its own process. Here, at a small size: the exported files against
the service's own database, field by field."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from jupyter_gpusched.service.models import allocations_table, events_table, utilization_table
from jupyter_gpusched.service.store import Store
from jupyter_gpusched.sim.trace import read_trace
from jupyter_gpusched.sim.utilization import read_utilization

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    out = tmp_path_factory.mktemp("own-history")
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_own_history.py"),
            *("--seconds", "40", "--out", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out, json.loads(done.stdout)


def test_the_trace_is_the_services_history_field_by_field(history):
    out, result = history
    trace = {job.id: job for job in read_trace(out / "trace.csv")}
    store = Store(f"sqlite:///{out / 'gpusched.sqlite'}")
    try:
        rows = {r["id"]: r for r in store.jobs() if r["first_start"] is not None}
        with store.engine.connect() as conn:
            runs = conn.execute(
                sa.select(allocations_table).order_by(allocations_table.c.run)
            ).mappings()
            lengths: dict[str, dict[int, float]] = {}
            for a in runs:
                lengths.setdefault(a["job_id"], {})[a["run"]] = a["end"] - a["start"]
            culled = set(
                conn.execute(
                    sa.select(events_table.c.job_id).where(events_table.c.kind == "reaper-cull")
                ).scalars()
            )
            utilization = conn.execute(sa.select(utilization_table)).mappings().all()
    finally:
        store.close()
    assert set(trace) == set(rows) and len(trace) == result["submitted"]
    origin = min(r["submit_time"] for r in rows.values())
    kinds = {"batch": 0, "notebook": 0}
    for job_id, row in rows.items():
        job, recorded = trace[job_id], trace[job_id].recorded
        kinds[job.kind] += 1
        assert job.submit_time == pytest.approx(row["submit_time"] - origin, abs=1e-6)
        assert recorded.start_time == pytest.approx(row["first_start"] - origin, abs=1e-6)
        assert recorded.end_time == pytest.approx(row["end_time"] - origin, abs=1e-6)
        for name in ("gpus", "tier", "queue", "user", "kind", "walltime", "gpus_per_node"):
            assert getattr(job, name) == row[name], (job_id, name)
        assert job.gpu_fraction == row["gpu_fraction"] and job.gpu_models is None
        assert recorded.preemptions == row["preemptions"]
        runs = [lengths[job_id][n] for n in sorted(lengths[job_id])]
        assert len(runs) == row["runs"] == row["preemptions"] + 1
        assert recorded.run_time == pytest.approx(sum(runs), abs=1e-6)
        # the work: its last run (the default checkpoint interval, 30 min, keeps nothing of
        # the seconds-long runs before it)
        assert job.duration == pytest.approx(runs[-1], abs=1e-6)
        outcome = "culled" if job_id in culled else row["state"]
        assert recorded.outcome == outcome, job_id
        assert recorded.profile is None  # posted without one (the hub's spawner sends it)
    assert kinds["notebook"] >= 3 and kinds["batch"] > 20
    assert sum(job.recorded.preemptions for job in trace.values()) > 0  # reclaims happened
    assert {trace[j].recorded.outcome for j in trace} >= {"completed", "cancelled"}
    # the servers' utilization: every recorded run, on the trace's clock
    exported = read_utilization(out / "trace-utilization.csv")
    assert sum(len(v) for v in exported.values()) == len(utilization) > 0
    for r in utilization:
        match = [u for u in exported[r["job_id"]] if u.start == pytest.approx(r["start"] - origin)]
        assert len(match) == 1 and match[0].utilization == r["utilization"]
        assert match[0].end == pytest.approx(r["end"] - origin, abs=1e-6)
        assert trace[r["job_id"]].kind == "notebook"
    assert any(u.utilization >= 50 for runs in exported.values() for u in runs)
    assert any(u.utilization < 1 for runs in exported.values() for u in runs)
    for name in ("trace.csv", "trace-utilization.csv", "trace-queues.yaml", "trace-reaper.json"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name


def test_the_replay_shows_the_recorded_outcome_beside_the_policy(history):
    out, result = history
    figures = json.loads((out / "replay" / "metrics.json").read_text())["policies"]
    assert set(figures) == {"recorded", "gpusched"}
    assert figures["recorded"]["jobs"] == figures["gpusched"]["jobs"] == result["submitted"]
    assert figures["gpusched"]["completed"] == result["submitted"]  # nobody lost in the replay
    for tier in ("1", "2", "3"):
        assert set(result["waits"]["recorded"][tier]) == {"mean", "p95"}
    # the same engine on the same jobs: the mean waits agree to within a few seconds (the
    # live service passes every 0.2 s and starts processes; the replay at each event)
    recorded, replayed = result["wait_s"]["recorded"], result["wait_s"]["gpusched"]
    assert abs(recorded - replayed) < 5.0, result["wait_s"]


def test_the_what_if_replays_every_server_under_both_settings(history):
    out, result = history
    what_if = result["what_if"]
    servers = [j for j in read_trace(out / "trace.csv") if j.kind == "notebook"]
    assert what_if["total"]["servers"] == len(servers)
    assert what_if["total"]["live_culled"] == sum(
        1 for j in servers if j.recorded.outcome == "culled"
    )
    # current: what the service had in force (its policy file's reaper: section), exported
    settings = what_if["settings"]
    assert settings["current"]["timeout_tier_2"] == 40 and settings["current"]["warning_lead"] == 10
    assert settings["candidate"]["timeout_tier_2"] == 20
    current, candidate = what_if["total"]["current"], what_if["total"]["candidate"]
    # the candidate's timeouts are half the current ones: it culls at least as many servers
    assert candidate["culled"] >= current["culled"]
    assert candidate["gpu_hours_reclaimed"] >= current["gpu_hours_reclaimed"]
