"""The recorded columns of an exported trace (sim/trace.py) and the ``recorded`` baseline of a
replay computed from them (sim/recorded.py)."""

import csv

import pytest
from helpers import trace_job

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
