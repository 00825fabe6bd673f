"""The engine benchmarks run and measure what they say, at a size that takes seconds (their
figures are measured by running them in full; see the README)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(script: str, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout)


def test_bench_engine_deep_queue_replays_every_job():
    out = run("bench_engine.py", "--workload", "deep", "--nodes", "64", "--jobs", "600")
    assert out["workload"] == "deep" and out["seed"] == 2 and out["gpus"] == 512
    # (a tier-1 job larger than its team's guarantee of 8 GPUs is rejected)
    assert out["completed"] + out["rejected"] == 600 and out["completed"] > 550
    assert out["passes"] > 600  # a pass per submission time at least, and more as jobs end
    assert out["steady_placements"] > 0 and out["placements_per_s"] > 0
    # every pass is of one kind, and every job that ran was started by one
    kinds = out["passes_by_kind"]
    assert set(kinds) == {"deep", "deep_woken_early", "other"}
    assert sum(k["passes"] for k in kinds.values()) == out["passes"]
    assert kinds["deep"]["passes"] > 0 and kinds["other"]["passes"] > 0
    assert sum(k["starts"] for k in kinds.values()) >= out["completed"]
    assert (
        set(out["met"])
        == set(out["targets"])
        == {"sim_wall_s", "placements_per_s", "peak_memory_mb"}
    )


def test_bench_live_pass_times_passes_on_a_deep_queue():
    out = run("bench_live_pass.py", "--nodes", "64", "--pending", "500", "--passes", "60")
    assert out["gpus"] == 512 and out["pending"] >= 400  # the queue stays about as deep
    assert out["running"] > 0
    timed = out["deep"]["passes"] + out["quick"]["passes"]
    assert timed == out["all"]["passes"] > 0
    assert out["deep"]["passes"] > 0  # with 1 s between ends, a deep pass every 30 s at least
    assert 0 < out["all"]["p50_ms"] <= out["all"]["p99_ms"] <= out["all"]["max_ms"]


def test_bench_estimate_times_estimates_at_two_sizes():
    out = run("bench_estimate.py", "--nodes", "32", "--pending", "100", "--estimates", "5")
    assert out["demo"]["gpus"] == 24 and out["large"]["gpus"] == 256
    for size in ("demo", "large"):
        assert out[size]["pending"] >= (20 if size == "demo" else 100)
        assert out[size]["running"] > 0
        assert set(out[size]["estimate"]) == {"p50_ms", "p95_ms", "max_ms"}
    assert isinstance(out["met"], bool)


def test_bench_plan_times_plays_and_counts_the_jobs_they_reach():
    out = run("bench_plan.py", "--sizes", "32:100", "--runs", "1", "--max-ends", "50")
    for state in ("demo", "256 GPUs"):
        assert out[state]["pending"] > 0 and out[state]["running"] > 0
        assert 0 < out[state]["reached"] <= out[state]["pending"]
        assert out[state]["seconds"]["min"] <= out[state]["seconds"]["max"]
    assert out["demo"]["reached"] == out["demo"]["pending"]  # 50 ends reach all 20 or so there


def test_bench_estimates_summarises_the_seeds_and_takes_the_model():
    out = run(
        "bench_estimates.py", "--part", "synthetic", "--seeds", "1", "2",
        "--estimate-quantile", "0.5", "--estimate-margin", "1.0",
    )  # fmt: skip
    rows, summary = out["synthetic"], out["synthetic_summary"]
    assert [r["seed"] for r in rows] == [1, 2]
    # the median as the estimate, no margin: about half the runs outlast it (0.09 by default)
    assert all(r["always"]["estimate_too_short_fraction"] > 0.3 for r in rows)
    ratios = [r["always"]["wait_mean_s"] / r["never"]["wait_mean_s"] for r in rows]
    mean = summary["wait_mean_s"]
    assert mean["seeds"] == 2 and mean["range"] == [round(min(ratios), 3), round(max(ratios), 3)]
    assert mean["geometric_mean"] == round((ratios[0] * ratios[1]) ** 0.5, 3)
    low, high = mean["interval_95"]
    assert low <= mean["geometric_mean"] <= high
