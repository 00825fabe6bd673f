"""The recorded columns of an exported trace (sim/trace.py) and the ``recorded`` baseline of a
replay computed from them (sim/recorded.py)."""

import csv

import pytest
from helpers import trace_job

from jupyter_gpusched.sim.classes import recorded_classes
from jupyter_gpusched.sim.recorded import recorded_metrics, recorded_rows
from jupyter_gpusched.sim.trace import (
    OPTIONAL,
    RECORDED,
    REQUIRED,
    Recorded,
    TraceError,
    read_trace,
    write_trace,
)


def _recorded_trace():
    """Four jobs as the live service saw them: one pre-empted once, a notebook culled by the
    reaper, one still running at the export, one failed."""
    return [
        trace_job("a", 0.0, 100.0, 2, tier=1, queue="prod",
                  recorded=Recorded(10.0, 110.0, 100.0, 0, "completed")),
        trace_job("b", 5.0, 200.0, 4, queue="research", walltime=3600.0,
                  recorded=Recorded(25.0, 305.0, 200.0, 1, "completed")),
        trace_job("c", 20.0, 50.0, 1, tier=3, queue="research", kind="notebook",
                  gpu_fraction=0.5,
                  recorded=Recorded(20.0, 70.0, 50.0, 0, "culled", "small-gpu")),
        trace_job("d", 30.0, 170.0, 1, queue="research",
                  recorded=Recorded(130.0, None, 170.0, 0, "running")),
    ]  # fmt: skip


def test_recorded_columns_round_trip(tmp_path):
    trace = _recorded_trace()
    trace.append(trace_job("e", 40.0, 10.0, 1))  # a row without them reads back without them
    path = tmp_path / "t.csv"
    write_trace(path, trace)
    with open(path) as handle:
        assert tuple(next(csv.reader(handle))) == REQUIRED + OPTIONAL + RECORDED
    assert read_trace(path) == trace
    assert read_trace(path)[-1].recorded is None


def test_an_ordinary_trace_keeps_its_header(tmp_path):
    path = tmp_path / "t.csv"
    write_trace(path, [trace_job("a", 0.0, 10.0, 1)])
    with open(path) as handle:
        assert tuple(next(csv.reader(handle))) == REQUIRED + OPTIONAL
    assert read_trace(path)[0].recorded is None


def test_some_recorded_cells_may_be_empty(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("job_id,submit_time,duration,gpus,start_time,end_time,preemptions,outcome\n"
                    "a,0,10,1,5,,,\nb,1,10,1,,,,\n")  # fmt: skip
    a, b = read_trace(path)
    assert a.recorded == Recorded(5.0, None, None, 0, None, None) and b.recorded is None


@pytest.mark.parametrize(
    ("cells", "field", "words"),
    [
        ("4,20,10,0,completed", "start_time", "before submit_time"),
        ("6,5,1,0,completed", "end_time", "before start_time"),
        ("6,20,10,0,finished", "outcome", "must be one of"),
        ("6,20,10,-1,completed", "preemptions", ">= 0"),
        ("6,20,10,1.5,completed", "preemptions", "whole number"),
        ("6,20,ten,0,completed", "run_time", "not a number"),
        (",20,10,0,completed", "start_time", "is required with end_time"),
    ],
)
def test_a_bad_recorded_cell_names_file_line_and_field(tmp_path, cells, field, words):
    path = tmp_path / "t.csv"
    path.write_text("job_id,submit_time,duration,gpus,start_time,end_time,run_time,preemptions,"
                    f"outcome\nok,0,10,1,0,10,10,0,completed\nbad,5,10,1,{cells}\n")  # fmt: skip
    with pytest.raises(TraceError) as caught:
        read_trace(path)
    message = str(caught.value)
    assert f"{path}:3" in message and f"field '{field}'" in message and words in message


def test_the_recorded_baseline_by_hand():
    """4 jobs on 8 GPUs: a waits 10 s, b 20 s, c 0 s, d 100 s; a and b complete (c was culled,
    d still runs: it ends at 130 + 170 for the makespan); makespan 0 -> 305 s."""
    figures = recorded_metrics(_recorded_trace(), cluster_gpus=8)
    assert figures["jobs"] == 4 and figures["completed"] == 2 and figures["rejected"] == 0
    assert figures["makespan_s"] == 305.0
    # GPU-seconds: 100 x 2 + 200 x 4 + 50 x 1 x 0.5 + 170 x 1
    assert figures["gpu_utilization"] == round(1195 / (8 * 305), 4)
    assert figures["wait_s"] == {"mean": 32.5, "p50": 15.0, "p95": 88.0, "p99": 97.6, "max": 100.0}
    assert figures["wait_s_by_tier"]["1"]["mean"] == 10.0
    assert figures["wait_s_by_tier"]["2"]["mean"] == 60.0
    assert figures["wait_s_by_tier"]["3"]["max"] == 0.0
    # JCT: every job that ended (a 110 s, b 300 s, c culled 50 s; d still runs)
    assert figures["jct_s"]["mean"] == round(460 / 3, 3) and figures["jct_s"]["p50"] == 110.0
    assert figures["preemptions"] == 1
    assert set(figures) == set(metrics_keys())
    for unknown in ("lost_gpu_hours", "gang_single_leaf_fraction", "busy_utilization",
                    "sim_wall_s", "jobs_per_s"):  # fmt: skip
        assert figures[unknown] is None, unknown
    assert figures["wait_gpu_hours_by_reason"] == dict.fromkeys(("capacity", "placement", "policy"))


def test_the_recorded_baseline_per_job_class_by_hand():
    trace = _recorded_trace()
    classes = recorded_classes(trace, {t.id: (t.tier, t.queue, t.kind) for t in trace}, 8)
    research = classes[(2, "research", "batch")]  # b and d
    assert research["jobs"] == 2
    assert research["wait_mean_s"] == 60.0 and research["wait_p95_s"] == 96.0
    assert research["jct_mean_s"] == 300.0  # b only: d still runs
    assert research["gpu_utilization"] == round(970 / (8 * 305), 4)
    assert research["preemptions"] == 1
    assert research["lost_gpu_hours"] is None and research["waited_policy_gpu_hours"] is None
    notebook = classes[(3, "research", "notebook")]
    assert notebook["jct_mean_s"] == 50.0  # culled: it ended (the replay ends it then too)
    assert sum(c["gpu_utilization"] for c in classes.values()) == pytest.approx(
        recorded_metrics(trace, 8)["gpu_utilization"], abs=1e-3
    )


def test_recorded_rows_of_jobs_csv():
    rows = {row["job_id"]: row for row in recorded_rows(_recorded_trace())}
    assert rows["b"]["policy"] == "recorded" and rows["b"]["wait_s"] == 20
    assert rows["d"]["end_time"] == "" and rows["d"]["state"] == "running"
    assert rows["c"]["state"] == "culled" and rows["c"]["nodes"] == ""


def metrics_keys():
    from helpers import cluster, run_replay

    from jupyter_gpusched.sim.metrics import metrics

    result, _ = run_replay([trace_job("x", 0.0, 10.0, 1)], cluster(("n1", 8, "leaf-1")))
    return metrics(result)
