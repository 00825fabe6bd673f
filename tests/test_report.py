"""``report.html``: a self-contained page (embedded PNGs, no scripts, escaped text), the ratio
table, Jain's index, and the downsampling that keeps long replays small."""

import base64
import copy
import math
import re

import numpy as np
import pytest
from helpers import cluster, queues, run_replay, trace_job

from jupyter_gpusched.sim.metrics import metrics
from jupyter_gpusched.sim.report import _started, fairness, jain_index, write_report
from jupyter_gpusched.sim.report_plots import MAX_POINTS, _steps, _usage

SECTIONS = (
    "Summary",
    "Metrics",
    "Queue waits",
    "GPU allocation",
    "Pending GPUs by reason",
    "Queue usage vs guarantee",
    "Fairness",
)
IMAGES = 5
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _trace():
    """Jobs of every tier in queue ``a`` (and a borrower in ``scratch``): more than fits at once,
    so someone waits; nothing in queue ``b``."""
    jobs = [
        trace_job(f"j{i}", submit=60.0 * i, duration=900.0 + 100 * i, gpus=4, tier=1 + i % 3,
                  queue="a")
        for i in range(9)
    ]  # fmt: skip
    return [*jobs, trace_job("s0", submit=30.0, duration=600.0, gpus=2, queue="scratch")]


@pytest.fixture(scope="module")
def replayed():
    c = cluster(("n[1-2]", 8, "leaf-1"))
    tree = queues({"a": {"guaranteed": 6}, "b": {"guaranteed": 6}, "scratch": {"guaranteed": 0}}, c)
    results = [run_replay(_trace(), c, tree, policy=p)[0] for p in ("gpusched", "fifo")]
    return results, {r.policy: metrics(r) for r in results}


def _images(page: str) -> list[bytes]:
    return [
        base64.b64decode(m) for m in re.findall(r'data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    ]


def test_report_is_one_self_contained_page_with_every_section_and_plot(replayed, tmp_path):
    results, figures = replayed
    path = tmp_path / "report.html"
    write_report(results, figures, path)
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    for section in SECTIONS:
        assert f"<h2>{section}</h2>" in page, section
    images = _images(page)
    assert len(images) == page.count("data:image/png;base64,") == IMAGES
    assert all(image.startswith(PNG_MAGIC) and len(image) > 1000 for image in images)
    assert "<script" not in page.lower() and "http" not in page  # nothing to fetch
    assert "gpusched" in page and "fifo" in page
    assert "x)</td>" in page  # the second policy's cells carry their ratio to the first
    assert "fifo vs gpusched: mean wait" in page  # the headline compares with the first


def test_table_shows_ratios_to_the_first_policy_and_survives_zero_and_missing(replayed, tmp_path):
    results, figures = replayed
    figures = copy.deepcopy(figures)
    figures["gpusched"]["preemptions"] = figures["fifo"]["preemptions"] = 0
    figures["gpusched"]["rejected"], figures["fifo"]["rejected"] = 0, 3
    figures["gpusched"]["jobs"], figures["fifo"]["jobs"] = 40, 10
    del figures["fifo"]["jct_s"]
    path = tmp_path / "report.html"
    write_report(results, figures, path, title="Q3 <capacity> & review")
    page = path.read_text(encoding="utf-8")
    row = {m[0]: m[1] for m in re.findall(r"<tr><td>([^<]+)</td>(.*?)</tr>", page)}
    assert row["jobs"] == "<td>40</td><td>10 (0.25x)</td>"
    assert row["pre-emptions"] == "<td>0</td><td>0 (=)</td>"
    assert row["rejected"] == "<td>0</td><td>3 (from 0)</td>"
    assert row["JCT mean (s)"].endswith("<td>–</td>")
    assert "<h1>Q3 &lt;capacity&gt; &amp; review</h1>" in page


def test_a_figure_missing_for_a_policy_leaves_its_column_empty(replayed, tmp_path):
    results, figures = replayed
    path = tmp_path / "report.html"
    write_report(results, {"gpusched": figures["gpusched"]}, path)
    page = path.read_text(encoding="utf-8")
    assert re.search(r"<tr><td>completed</td><td>\d+</td><td>–</td></tr>", page)
    assert len(_images(page)) == IMAGES


def test_jain_index():
    assert jain_index([3, 3, 3, 3]) == pytest.approx(1.0)
    assert jain_index([0, 0, 5, 0]) == pytest.approx(1 / 4)
    assert jain_index([1, 2, 3]) == pytest.approx(36 / 42)
    assert math.isnan(jain_index([])) and math.isnan(jain_index([0, 0]))


def test_fairness_counts_guaranteed_leaf_queues_only(replayed):
    results, _ = replayed
    for result in results:
        # a got everything, b nothing: one of two queues (scratch, guaranteed 0, is left out)
        assert fairness(result) == pytest.approx(0.5), result.policy


def test_usage_is_rebuilt_from_job_times_for_a_policy_without_quotas(replayed):
    results, _ = replayed
    fifo = next(r for r in results if r.policy == "fifo")
    tree = fifo.scheduler.tree

    usage, rebuilt = _usage(fifo, [tree.get("a"), tree.get("scratch")], _started(fifo))
    assert rebuilt
    times, gpus = usage["a"]
    assert gpus.max() == 16 and gpus[-1] == 0  # the whole cluster at the peak, then empty
    assert np.all(np.diff(times) > 0)
    assert set(usage["scratch"][1].tolist()) == {2.0, 0.0}


def test_long_series_are_binned_keeping_their_integral():
    rng = np.random.default_rng(1)
    times = np.cumsum(rng.exponential(30.0, 200_000))
    values = rng.integers(0, 64, len(times)).astype(float)
    end = times[-1] + 500.0
    x, y = _steps(times, values, end)
    assert len(x) == len(y) == MAX_POINTS + 1
    exact = np.sum(values * np.diff(np.append(times, end)))
    assert np.sum(y[:-1] * np.diff(x)) == pytest.approx(exact, rel=1e-9)
    short_x, short_y = _steps([0.0, 10.0], [4.0, 2.0], 30.0)
    assert short_x.tolist() == [0.0, 10.0, 30.0] and short_y.tolist() == [4.0, 2.0, 2.0]


def test_a_long_timeline_still_makes_a_small_report(replayed, tmp_path):
    results, figures = replayed
    rng = np.random.default_rng(2)
    long = []
    for result in results:
        result = copy.copy(result)
        n = 150_000
        times = np.cumsum(rng.exponential(20.0, n))
        columns = rng.integers(0, 17, (n, 4))
        result.timeline = [(t, *map(int, c)) for t, c in zip(times, columns, strict=True)]
        samples = np.arange(0.0, times[-1], 300.0)
        running = rng.integers(0, 9, (3, len(samples))).astype(float)
        result.queue_usage = {
            path: list(zip(samples, gpus, strict=True))
            for path, gpus in zip(("a", "b", "scratch"), running, strict=True)
        }
        result.last_end = float(times[-1])
        long.append(result)
    path = tmp_path / "report.html"
    write_report(long, figures, path)
    page = path.read_text(encoding="utf-8")
    assert len(page) < 2_000_000
    assert len(_images(page)) == IMAGES


def test_one_policy_without_a_queue_file(tmp_path):
    c = cluster(("n1", 8, "leaf-1"))
    result, _ = run_replay(_trace()[:4], c)
    path = tmp_path / "report.html"
    write_report([result], {"gpusched": metrics(result)}, path)
    page = path.read_text(encoding="utf-8")
    assert len(_images(page)) == IMAGES
    assert "<ul>\n</ul>" in page  # nothing to compare with
    assert "<tr><td>fairness (Jain, leaf queues)</td><td>–</td></tr>" in page  # no leaf queues


def test_replay_records_the_timeline_and_queue_usage_the_report_plots(replayed):
    results, _ = replayed
    for result in results:
        assert result.timeline and result.queue_usage["a"], result.policy


def test_a_headline_duration_is_never_shown_as_zero_beside_a_larger_one():
    from jupyter_gpusched.sim.report import _duration

    # a tier-1 p99 of 60 s beside 2.2 h read "0.0 h"
    assert _duration(7920.0, 60.0) == ["2.2 h", "60 s"]
    assert _duration(7920.0, 0.0) == ["2.2 h", "0.0 h"]
    assert _duration(600.0, 300.0) == ["10.0 min", "5.0 min"]
