"""Deep passes come sooner while completed jobs are short (core/cadence.py,
backfill.interval_fraction)."""

import pytest
from helpers import cluster, job, started

from jupyter_gpusched.core import PolicySettings, Scheduler, get_policy
from jupyter_gpusched.core.cadence import FLOOR, MIN_SAMPLES, SAMPLES, BackfillCadence
from jupyter_gpusched.core.errors import ConfigError


def test_the_interval_is_a_fraction_of_the_median_run_time_within_its_bounds():
    cadence = BackfillCadence(30.0, 0.05)
    assert MIN_SAMPLES == 5
    for run_time in (10.0, 20.0, 40.0, 30.0):
        cadence.completed(run_time)
    assert cadence.interval == 30.0  # too few completions yet
    cadence.completed(200.0)
    assert cadence.interval == pytest.approx(1.5)  # 0.05 x the median, 30 s
    cadence.completed(100.0)  # six: the median is the mean of the middle two (30, 40)
    assert cadence.interval == pytest.approx(1.75)
    for _ in range(SAMPLES):
        cadence.completed(5.0)
    assert cadence.interval == FLOOR  # 0.25 s: never below a second
    for _ in range(SAMPLES // 2 + 1):  # the 5 s runs leave the window, oldest first
        cadence.completed(3600.0)
    assert cadence.interval == 30.0  # never above backfill.interval


def test_without_a_fraction_or_below_the_floor_the_configured_interval_holds():
    fixed = BackfillCadence(30.0, 0.0)
    every_pass = BackfillCadence(0.0, 0.05)
    for _ in range(MIN_SAMPLES + 1):
        fixed.completed(5.0)
        every_pass.completed(5.0)
    assert fixed.interval == 30.0
    assert every_pass.interval == 0.0  # backfill.interval 0: every pass deep, as configured


def case(settings: PolicySettings, policy: str = "gpusched") -> Scheduler:
    """Five 20-second jobs complete; then one 8-GPU node runs a (4 GPUs), b (2) and x (2), an
    8-GPU job reserves the node and a 4-GPU job of 500 s waits behind it. x ends at 120 s (a
    deep pass), b at 125 s: the 4-GPU job now fits and ends before the reservation."""
    scheduler = Scheduler(cluster(("n1", 8, "leaf")), None, settings, get_policy(policy))
    for i in range(5):
        scheduler.submit(job(f"w{i}", 1, walltime=60), 0)
    scheduler.schedule(0)
    for i in range(5):
        scheduler.job_ended(f"w{i}", 20)
    scheduler.schedule(20)
    for name, gpus in (("a", 4), ("b", 2), ("x", 2)):
        scheduler.submit(job(name, gpus, walltime=1000, t=100), 100)
    scheduler.submit(job("big", 8, walltime=1000, t=101), 101)
    scheduler.submit(job("short", 4, walltime=500, t=102), 102)
    assert set(started(scheduler.schedule(102))) == {"a", "b", "x"}
    scheduler.job_ended("x", 120)
    assert started(scheduler.schedule(120)) == {}  # deep: 2 GPUs free, none fits
    scheduler.job_ended("b", 125)
    return scheduler


def test_deep_passes_follow_short_jobs_closely_and_long_ones_every_interval():
    adaptive = PolicySettings()  # as shipped: backfill.interval_fraction 0.05
    assert adaptive.backfill_interval_fraction == 0.05
    scheduler = case(adaptive)
    assert scheduler.cadence.interval == 1.0  # 0.05 x 20 s
    assert list(started(scheduler.schedule(125))) == ["short"]  # a deep pass, 5 s after one

    fixed = PolicySettings(backfill_interval_fraction=0.0)
    for scheduler in (case(fixed), case(adaptive, "slurm")):
        # a fixed 30 s (the slurm baseline's, as Slurm's bf_interval): a quick pass stops at
        # the reservation's holder, and the deep pass 30 s after the last backfills
        assert scheduler.cadence.interval == 30.0
        assert started(scheduler.schedule(125)) == {}
        assert scheduler.agenda.wake == 150
        assert list(started(scheduler.schedule(150))) == ["short"]


@pytest.mark.parametrize("value", [-0.1, 1.5, "often"])
def test_an_interval_fraction_outside_0_to_1_is_refused_naming_the_field(value):
    with pytest.raises(ConfigError) as error:
        PolicySettings.from_dict({"backfill": {"interval_fraction": value}})
    assert "backfill.interval_fraction" in str(error.value)
    settings = PolicySettings.from_dict({"backfill": {"interval_fraction": 0.1}})
    assert settings.backfill_interval_fraction == 0.1
