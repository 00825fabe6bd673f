# ruff: noqa: F811
"""Deadlines from a notebook: ``client.submit(deadline=...)``, ``client.estimate(deadline=...)``
and ``%%gpujob --deadline``, against a real in-process service (the fixtures of
``tests/test_client.py``). What the service does with a deadline: ``tests/test_deadlines_api.py``.

Cluster: gpu1, gpu2 with 8 H100 each, l40s1, l40s2 with 4 L40S; alice uses "team". No policy
file: a batch job without a walltime is planned as 24 h.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest

# service, shell and workdir: the fixtures of tests/test_client.py, used as arguments (F811)
from test_client import fill_h100, run, service, shell, workdir  # noqa: F401

from jupyter_gpusched.notebook.client import GPUSchedError
from jupyter_gpusched.notebook.estimate import Estimate

L40S = {"command": "sleep 60", "gpus": 1, "gpu_model": "L40S", "walltime": "1h"}


def test_submit_takes_a_datetime_a_timedelta_or_the_apis_forms(service, workdir):
    alice = service.client()
    when = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(days=2)
    local = when.astimezone(timezone(timedelta(hours=-5)))  # the same moment, another zone
    for given, expected in [
        (when, when.timestamp()),
        (local, when.timestamp()),
        (when.strftime("%Y-%m-%dT%H:%MZ"), when.replace(second=0).timestamp()),
    ]:
        job = alice.submit(**L40S, deadline=given)
        assert job.data["deadline"] == pytest.approx(expected), given
    for given, seconds in [(timedelta(hours=6), 6 * 3600), ("6h", 6 * 3600), (7200, 7200)]:
        before = time.time()
        job = alice.submit(**L40S, deadline=given)
        assert before + seconds <= job.data["deadline"] <= time.time() + seconds, given
    assert job.data["deadline_missed"] is False
    assert job.summary()["deadline"]  # shown in the job's displays


def test_a_naive_datetime_is_refused_before_anything_is_sent(service, workdir):
    alice = service.client()
    naive = datetime.now() + timedelta(days=1)
    with pytest.raises(ValueError, match="no time zone: add tzinfo"):
        alice.submit(**L40S, deadline=naive)
    with pytest.raises(ValueError, match="no time zone"):
        alice.estimate(command="true", deadline=naive)
    assert alice.jobs() == [] and not (workdir / ".gpusched").exists()


def test_a_deadline_that_cannot_be_met_raises_with_the_earliest_finish(service, workdir):
    alice = service.client()
    fill_h100(alice)  # planned as 24 h each
    before = alice.queue()
    # one time for both requests ("6h" is read when each arrives, and may cross a second)
    due = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(hours=6)
    with pytest.raises(GPUSchedError) as info:
        alice.submit(command="true", gpus=8, gpu_model="H100", walltime="1h", deadline=due)
    assert (info.value.status, info.value.field) == (400, "deadline")
    assert "the earliest this job can finish is 20" in info.value.message, info.value
    with pytest.raises(GPUSchedError) as estimated:  # the estimate: the same refusal
        alice.estimate(command="true", gpus=8, gpu_model="H100", walltime="1h", deadline=due)
    assert estimated.value.message == info.value.message
    assert alice.queue() == before


def test_an_estimate_with_a_deadline_gives_the_earliest_finish(service, workdir):
    alice = service.client()
    before = time.time()
    answer = alice.estimate(command="true", gpus=1, walltime="2h", deadline=timedelta(hours=6))
    assert answer.start_now
    assert before + 7200 <= answer.earliest_finish <= time.time() + 7200
    assert "; can finish at " in answer.line() and answer.line().endswith(" (queue team)")
    plain = alice.estimate(command="true", gpus=1)
    assert plain.earliest_finish is None and "finish" not in plain.line()


def test_estimate_line_words_the_finish_in_utc():
    now = datetime(2026, 12, 5, 12, 0, tzinfo=timezone.utc).timestamp()
    data = {"start_now": True, "eta": None, "reason": None, "queue": "team", "position": None}
    same_day = Estimate({**data, "earliest_finish": now + 3 * 3600 + 600}, now=now)
    assert same_day.line() == "starts now; can finish at 15:10 UTC (queue team)"
    later = Estimate({**data, "earliest_finish": now + 2 * 86400}, now=now)
    assert later.line() == "starts now; can finish at 2026-12-07 12:00 UTC (queue team)"
    assert Estimate(data, now=now).line() == "starts now (queue team)"  # an older service's


# -- %%gpujob --deadline ------------------------------------------------------------------------
def test_gpujob_deadline_as_a_duration_or_a_time_with_its_zone(shell, workdir, capsys):
    before = time.time()
    job = run(shell, "%%gpujob --gpus 1 --walltime 1h --deadline 6h\nprint(1)\n")
    assert before + 6 * 3600 <= job.data["deadline"] <= time.time() + 6 * 3600
    when = datetime.now(timezone.utc).replace(second=0, microsecond=0) + timedelta(days=3)
    text = when.strftime("%Y-%m-%dT%H:%MZ")
    job = run(shell, f"%%gpujob --gpus 1 --walltime 1h --deadline {text}\nprint(1)\n")
    assert job.data["deadline"] == when.timestamp()
    run(shell, "%gpusched jobs")
    assert "deadline " in capsys.readouterr().out


def test_gpujob_deadline_refusals_are_one_line_usage_errors(shell, service, workdir, capsys):
    from IPython.core.error import UsageError

    fill_h100(service.client())
    cases = [
        ("--gpus 8 --gpu-model H100 --walltime 1h --deadline 6h", "cannot be met"),
        ("--deadline 2026-12-24T18:00", "has no time zone"),
        ("--deadline soon", "'deadline' must be a time with its zone"),
    ]
    for options, text in cases:
        for estimate in ("", " --estimate"):
            cell = f"%%gpujob {options}{estimate}\nprint(1)\n"
            result = shell.run_cell(cell, store_history=False)
            assert isinstance(result.error_in_exec, UsageError), (options, result.error_in_exec)
            shown = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
            assert len(shown) == 1 and shown[0].startswith("UsageError: %%gpujob --deadline: ")
            assert text in shown[0], (options, shown)
    assert not list(workdir.glob(".gpusched/cell-*.py"))  # refused cells leave no file


def test_gpujob_estimate_with_a_deadline_prints_the_earliest_finish(shell, workdir, capsys):
    run(shell, "%%gpujob --estimate --gpus 1 --walltime 2h --deadline 1d\nprint(1)\n")
    out = capsys.readouterr().out
    assert out.startswith("%%gpujob: starts now; can finish at "), out


def test_the_queue_widget_says_when_a_job_is_due_and_when_it_missed(service, workdir):
    from jupyter_gpusched.notebook.job import Job
    from jupyter_gpusched.notebook.widget_lines import job_line
    from jupyter_gpusched.notebook.widgets import QueueWidget

    alice = service.client()
    due = alice.submit(**L40S, deadline="6h")
    plain = alice.submit(**L40S)
    widget = QueueWidget(alice, interval=60, autostart=False)
    widget.refresh()
    clock = due.summary()["deadline"]
    assert f"due by {clock}" in widget.rows[due.id]["html"].value
    assert "due by" not in widget.rows[plain.id]["html"].value
    widget.close()
    # a job the service marked as having missed its deadline (the engine's part: test_deadlines)
    missed = Job(alice, due.id, {**due.data, "deadline_missed": True})
    line = job_line(missed)
    assert f"missed its deadline {clock}" in line and "due by" not in line
