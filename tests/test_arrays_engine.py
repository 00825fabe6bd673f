"""Job arrays in the engine (core/arrays.py): Slurm's syntax read and written back, and
``%max_running`` kept by a pass (the live service and the replay run the same pass).
"""

from __future__ import annotations

import pytest
from helpers import cluster, job, run_replay, started, trace_job

from jupyter_gpusched.core import PolicySettings, Scheduler
from jupyter_gpusched.core.arrays import (
    MAX_ARRAY_ELEMENTS,
    ArraySpec,
    array_text,
    parse_array,
)
from jupyter_gpusched.core.errors import ConfigError
from jupyter_gpusched.sim.trace import read_trace, write_trace


@pytest.mark.parametrize(
    ("text", "indices", "cap"),
    [
        ("0-3", (0, 1, 2, 3), None),
        ("0-99%8", tuple(range(100)), 8),
        ("1,3,5-7", (1, 3, 5, 6, 7), None),
        ("0-20:5", (0, 5, 10, 15, 20), None),
        ("3,1,3", (1, 3), None),  # sorted, no repeats
        ("7%1", (7,), 1),
    ],
)
def test_slurms_array_syntax(text, indices, cap):
    assert parse_array(text) == ArraySpec(indices, cap)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "Slurm's syntax"),
        ("0-9%", "Slurm's syntax"),
        ("a-b", "Slurm's syntax"),
        (["0-9"], "Slurm's syntax"),
        ("9-0", "must go upwards"),
        ("0-9:0", "step of at least 1"),
        ("0-9%0", f"from 1 to {MAX_ARRAY_ELEMENTS}"),
        ("0-9%99999999999999999999999", f"from 1 to {MAX_ARRAY_ELEMENTS}"),  # (no database int)
        (f"0-{MAX_ARRAY_ELEMENTS}", "more than"),
        (f"0-{MAX_ARRAY_ELEMENTS // 2},{MAX_ARRAY_ELEMENTS}-{2 * MAX_ARRAY_ELEMENTS}", "more than"),
    ],
)
def test_a_bad_array_names_the_field(text, says):
    with pytest.raises(ConfigError) as caught:
        parse_array(text)
    assert caught.value.field == "array" and says in caught.value.message


def test_array_text_writes_ranges_back():
    assert array_text([5, 6, 7, 9, 1], 8) == "1,5-7,9%8"
    assert array_text(range(100)) == "0-99"
    assert array_text(parse_array("0-20:5").indices) == "0,5,10,15,20"


def test_max_running_holds_elements_back_and_lets_the_next_one_start():
    sched = Scheduler(cluster(("n1", 8, "leaf-1")), None, PolicySettings())
    for i in range(5):
        sched.submit(job(f"j{i}", 1, array_id="a0", array_index=i, array_max_running=2), 0.0)
    sched.submit(job("other", 1), 0.0)  # not of the array: not held back
    first = started(sched.schedule(0.0))
    assert sorted(first) == ["j0", "j1", "other"]
    for i in (2, 3, 4):
        reason = sched.jobs[f"j{i}"].reason
        assert (reason.family, reason.detail) == ("policy", "array-limit")
        assert reason.message == "array a0 is at its limit of 2 running"
    sched.job_ended("j0", 10.0, "completed")
    assert sorted(started(sched.schedule(10.0))) == ["j2"]
    # a cancelled running element frees its place as well
    sched.cancel("j1", 20.0)
    sched.job_ended("j1", 20.0, "cancelled")
    assert sorted(started(sched.schedule(20.0))) == ["j3"]


def test_an_array_held_back_does_not_block_the_jobs_behind_it():
    """Its elements wait on policy, not capacity: no reservation, no stop of the pass."""
    sched = Scheduler(cluster(("n1", 4, "leaf-1")), None, PolicySettings())
    for i in range(4):
        sched.submit(job(f"j{i}", 1, array_id="a0", array_index=i, array_max_running=1), 0.0)
    sched.submit(job("later", 3, t=1.0), 1.0)
    assert sorted(started(sched.schedule(1.0))) == ["j0", "later"]
    assert sched.reservation is None


def test_a_replayed_trace_keeps_an_arrays_cap_as_the_live_service(tmp_path):
    """The trace's array columns (what a live export carries) reach the same engine rule: two
    at a time on a node with room for all five."""
    trace = [
        trace_job(f"j{i}", 0.0, 100.0, 1, array_id="a-1", array_index=i, array_max_running=2)
        for i in range(5)
    ]
    write_trace(tmp_path / "t.csv", trace)
    assert read_trace(tmp_path / "t.csv") == trace
    _, rows = run_replay(read_trace(tmp_path / "t.csv"), cluster(("n1", 8, "leaf-1")))
    assert [rows[f"j{i}"]["start_time"] for i in range(5)] == [0, 0, 100, 100, 200]


def test_a_trace_row_with_an_index_but_no_array_is_refused(tmp_path):
    (tmp_path / "t.csv").write_text("job_id,submit_time,duration,gpus,array_index\nj1,0,10,1,3\n")
    with pytest.raises(ConfigError) as caught:
        read_trace(tmp_path / "t.csv")
    assert caught.value.field == "array_id" and caught.value.line == 2
