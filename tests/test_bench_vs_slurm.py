"""The parts of benchmarks/bench_vs_slurm.py that need no Slurm: the seeded workload, what is
handed to sbatch, and how a real run's record becomes the replay's trace and figures."""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_vs_slurm as bvs


def test_workload_is_seeded_and_shaped_as_promised():
    jobs = bvs.make_workload(1)
    assert jobs == bvs.make_workload(1)
    assert jobs != bvs.make_workload(2)
    assert len(jobs) == 120
    assert sum(j["offset"] == 0.0 for j in jobs) == 40  # the burst
    assert all(0 <= j["offset"] <= 240 for j in jobs)
    assert [j["offset"] for j in jobs] == sorted(j["offset"] for j in jobs)
    low, high = bvs.DURATION_S
    for j in jobs:
        assert j["gpus"] in (1, 2, 4, 8)
        assert j["nodes"] == (2 if j["gpus"] == 8 else 1)
        assert low <= j["duration"] <= high and j["duration"] == int(j["duration"])
        # whole minutes, covering the run and at most 3x it
        assert j["walltime_min"] * 60 >= j["duration"]
        assert j["walltime_min"] == math.ceil(j["walltime_min"])
        assert (j["walltime_min"] - 1) * 60 < 3 * j["duration"]
    assert {j["gpus"] for j in jobs} == {1, 2, 4, 8}


def test_a_gang_asks_slurm_for_four_gpus_on_each_of_two_nodes():
    job = {"id": "j7", "gpus": 8, "nodes": 2, "duration": 20, "walltime_min": 1}
    argv = bvs.sbatch_argv(job)
    assert "--nodes=2" in argv and "--gres=gpu:4" in argv and "--time=1" in argv
    assert "--wrap=sleep 20" in argv


def _record():
    """Three jobs as Slurm ran them: epoch seconds, the second submitted 5 s after the first."""
    base = 1_800_000_000.0
    rows = [
        ("a", 8, 2, base, base + 1, base + 31, 1),
        ("b", 4, 1, base + 5, base + 31, base + 51, 2),
        ("c", 1, 1, base + 5, base + 31, base + 31, 1),  # ended in the second it started
    ]
    jobs = [
        {
            "id": i,
            "gpus": g,
            "nodes": n,
            "submit": s,
            "start": t,
            "end": e,
            "walltime_min": w,
            "duration": 30,
            "offset": 0.0,
            "slurm_id": i,
            "state": "COMPLETED",
        }
        for i, g, n, s, t, e, w in rows
    ]
    return {"scheduler_parameters": bvs.TUNED, "jobs": jobs}


def test_record_becomes_a_trace_of_the_jobs_as_run():
    trace = {t.id: t for t in bvs.to_trace(_record())}
    assert trace["a"].submit_time == 0 and trace["b"].submit_time == 5
    assert trace["a"].duration == 30 and trace["b"].duration == 20
    assert trace["c"].duration == 1  # never 0
    assert trace["a"].gpus_per_node == 4 and trace["b"].gpus_per_node == 4
    assert trace["a"].walltime == 60 and trace["b"].walltime == 120


def test_compare_reports_the_real_run_and_each_replay():
    record = _record()
    out = bvs.compare(record, {"slurm": ("slurm", {"backfill_interval": 1.0})})
    real = out["real_slurm"]
    # waits 1, 26, 26; the gang's 1; ends 31, 51, 31 after the first submit
    assert real["wait_mean_s"] == 17.67 and real["gang_wait_mean_s"] == 1.0
    assert real["jct_mean_s"] == round((31 + 46 + 26) / 3, 2) and real["makespan_s"] == 51
    replayed = out["slurm"]
    # the replay starts what fits at once: the gang at 0 for 30 s, then b and c at 30
    assert replayed["wait_mean_s"] == round((0 + 25 + 25) / 3, 2)
    assert replayed["gang_wait_mean_s"] == 0.0 and replayed["gang_wait_mean_s_vs_real"] == 0.0
    assert replayed["wait_mean_s_vs_real"] == round(replayed["wait_mean_s"] / 17.67, 3)
    assert replayed["wait_r_vs_real"] > 0.99
    assert replayed["wait_mean_s_vs_replay"] == 1.0  # the first replay is the yardstick


def test_later_replays_are_also_compared_with_the_first():
    variants = {"slurm": ("slurm", {}), "fifo": ("fifo", {})}
    out = bvs.compare(_record(), variants)
    first, later = out["slurm"], out["fifo"]
    assert later["wait_mean_s_vs_replay"] == round(later["wait_mean_s"] / first["wait_mean_s"], 3)
    assert later["policy"] == "fifo" and first["settings"] == {}


def test_correlation():
    assert bvs.correlation([1, 2, 3], [2, 4, 6]) == 1.0
    assert bvs.correlation([1, 2, 3], [3, 2, 1]) == -1.0
    assert bvs.correlation([1, 1], [1, 2]) is None


def test_figures_of_rows_in_any_order():
    # (submit, start, end, gpus): waits 30, 0, 10; the gang's 30
    rows = [(0, 30, 40, 8), (5, 5, 9, 1), (10, 20, 50, 2)]
    out = bvs.figures(rows)
    assert out["wait_mean_s"] == round(40 / 3, 2)
    assert out["wait_p95_s"] == 28.0  # between 10 and 30, nearer 30
    assert out["gang_wait_mean_s"] == 30.0 and out["gang_jobs"] == 1
    assert out["jct_mean_s"] == round((40 + 4 + 40) / 3, 2) and out["makespan_s"] == 50


def test_a_saved_record_reads_back_as_it_was(tmp_path):
    record = {**_record(), "seed": 3}
    path = tmp_path / "run.json"
    bvs.save_record(record, path)
    back = bvs.load_record(path)
    keep = set(bvs.SAVED)
    assert back["seed"] == 3 and back["scheduler_parameters"] == bvs.TUNED
    assert back["jobs"] == [{k: v for k, v in j.items() if k in keep} for j in record["jobs"]]
