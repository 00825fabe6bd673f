"""``replay`` with several ``--config`` and with a trace's recorded outcome: the difference per
job class comes first (stdout, metrics.json, report.html), the ``recorded`` column beside the
policies, and the per-class GPU-hours waited by reason that add up to the global ones."""

import contextlib
import csv
import dataclasses
import io
import json
import re

import pytest
from helpers import cluster, queues, trace_job

from jupyter_gpusched.cli import _config_names, main
from jupyter_gpusched.core import PolicySettings, get_policy
from jupyter_gpusched.files import load_policy
from jupyter_gpusched.sim.classes import FIGURES, label
from jupyter_gpusched.sim.cluster_loaders import load_cluster_spec, load_queue_spec
from jupyter_gpusched.sim.metrics import job_rows
from jupyter_gpusched.sim.replay import replay
from jupyter_gpusched.sim.trace import Recorded, read_trace, write_trace

EXAMPLE = ["--cluster", "examples/cluster.yaml", "--queues", "examples/queues.yaml"]
# a candidate that changes who waits: victims save at the signal, tier 2 may be pre-empted at
# once, and fair share forgets in an hour
CANDIDATE = """checkpoint: {interval: 30m, on_signal: true}
tiers:
  2: {grace_period: 1m, minimum_run_time: 0}
fair_share: {half_life: 1h}
"""


def _example():
    trace = read_trace("examples/trace.csv")
    c = load_cluster_spec("examples/cluster.yaml").cluster
    return trace, c, load_queue_spec("examples/queues.yaml", c, trace, "examples/trace.csv")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The example trace as an export of a cluster that ran gpusched under the example policy
    would write it: each job's recorded start, end, run time, pre-emptions and outcome."""
    trace, c, tree = _example()
    result = replay(trace, c, tree, load_policy("examples/policy.yaml"), get_policy("gpusched"))
    rows = []
    for t in trace:
        job = result.job(t.id)
        run_time = result.records[t.id].allocated_gpu_s / job.amount
        seen = Recorded(job.first_start, job.end_time, run_time, job.preemptions, job.state.value)
        rows.append(dataclasses.replace(t, recorded=seen))
    path = tmp_path_factory.mktemp("export") / "trace.csv"
    write_trace(path, rows)
    return path


@pytest.fixture(scope="module")
def two_configs(exported, tmp_path_factory):
    """``replay --config current --config candidate`` of the exported trace, both policies."""
    folder = tmp_path_factory.mktemp("two")
    (folder / "candidate.yaml").write_text(CANDIDATE)
    out = folder / "out"
    argv = ["replay", str(exported), *EXAMPLE, "--config", "examples/policy.yaml",
            "--config", str(folder / "candidate.yaml"), "--policy", "gpusched",
            "--policy", "fifo", "--out", str(out), "--quiet"]  # fmt: skip
    stdout = io.StringIO()  # a module-scoped fixture cannot use capsys
    with contextlib.redirect_stdout(stdout):
        assert main(argv) == 0
    return out, stdout.getvalue()


def test_two_configs_run_each_policy_under_each_and_print_the_class_table_first(two_configs):
    out, stdout = two_configs
    assert stdout.startswith("Difference per job class: gpusched@candidate vs gpusched@policy")
    assert "Difference per job class: fifo@candidate vs fifo@policy" in stdout
    first_table = stdout.split("\n\n")[0]
    assert "tier 2 / research/vision / batch" in first_table
    overall = stdout.split("\n\n")[-1].splitlines()[0].split()
    assert overall == ["recorded", "gpusched@policy", "gpusched@candidate", "fifo@policy",
                       "fifo@candidate"]  # fmt: skip
    document = json.loads((out / "metrics.json").read_text())
    assert list(document["policies"]) == overall
    assert document["class_baselines"] == {
        "gpusched@candidate": "gpusched@policy",
        "fifo@candidate": "fifo@policy",
    }
    classes = document["classes"]["gpusched@candidate"]
    assert set(classes) >= {"tier 1 / prod / batch", "tier 2 / research/nlp / batch"}
    for name, figures in classes.items():
        assert set(figures) == {key for key, _, _ in FIGURES}, name
        for key, cell in figures.items():
            b, r, d = cell["baseline"], cell["run"], cell["difference"]
            if b is not None and r is not None:
                assert d == pytest.approx(r - b, abs=1e-3), (name, key)
    with open(out / "jobs.csv") as handle:
        policies = [row["policy"] for row in csv.DictReader(handle)]
    assert policies[:400] == ["recorded"] * 400 and len(policies) == 5 * 400


def test_a_class_whose_figures_differ_shows_the_difference(two_configs):
    out, stdout = two_configs
    classes = json.loads((out / "metrics.json").read_text())["classes"]["gpusched@candidate"]
    changed = [
        (name, f["wait_mean_s"])
        for name, f in classes.items()
        if f["wait_mean_s"]["difference"] not in (0, None)
    ]
    assert changed, "the candidate changes nobody's wait"
    name, cell = changed[0]
    sign = "+" if cell["difference"] > 0 else "-"
    row = next(line for line in stdout.splitlines() if line.startswith(name))
    assert re.search(rf"-> [\d,.]+ \({re.escape(sign)}[\d,.]+\)", row), row
    unchanged = next(n for n, f in classes.items() if f["wait_mean_s"]["difference"] == 0)
    row = next(line for line in stdout.splitlines() if line.startswith(unchanged))
    assert "(=)" in row


def test_the_report_shows_the_class_table_first_and_n_a_for_the_recorded_unknowns(two_configs):
    out, _ = two_configs
    page = (out / "report.html").read_text(encoding="utf-8")
    assert page.index("<h2>Difference per job class</h2>") < page.index("<h2>Summary</h2>")
    assert "<h3>gpusched@candidate vs gpusched@policy</h3>" in page
    assert "<tr><td>lost GPU-hours</td><td>n/a</td>" in page  # the recorded column
    assert "→" in page


def test_with_one_config_the_baseline_is_the_recorded_outcome_which_it_reproduces(
    exported, tmp_path, capsys
):
    out = tmp_path / "out"
    argv = ["replay", str(exported), *EXAMPLE, "--config", "examples/policy.yaml",
            "--policy", "gpusched", "--out", str(out), "--quiet"]  # fmt: skip
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    assert stdout.startswith("Difference per job class: gpusched vs recorded")
    document = json.loads((out / "metrics.json").read_text())
    recorded, replayed = document["policies"]["recorded"], document["policies"]["gpusched"]
    assert list(document["policies"]) == ["recorded", "gpusched"]
    for key in ("jobs", "completed", "makespan_s", "gpu_utilization", "wait_s", "jct_s",
                "preemptions"):  # fmt: skip
        assert recorded[key] == replayed[key], key  # the same policy: the same history
    assert recorded["lost_gpu_hours"] is None
    assert re.search(r"^lost GPU-hours +n/a +[\d.]+$", stdout, re.MULTILINE)
    for figures in document["classes"]["gpusched"].values():
        assert figures["wait_mean_s"]["difference"] in (0, None)
        assert figures["lost_gpu_hours"]["baseline"] is None


def test_an_ordinary_trace_with_one_config_has_no_class_table(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["replay", "examples/trace.csv", *EXAMPLE, "--config", "examples/policy.yaml",
            "--policy", "gpusched", "--out", str(out), "--quiet", "--no-report"]  # fmt: skip
    assert main(argv) == 0
    assert not capsys.readouterr().out.startswith("Difference")
    document = json.loads((out / "metrics.json").read_text())
    assert list(document) == ["policies"] and list(document["policies"]) == ["gpusched"]


def test_a_bad_second_config_exits_2_with_file_line_and_field(tmp_path, capsys):
    bad = tmp_path / "candidate.yaml"
    bad.write_text("backfill:\n  depth: 10\n  intervall: 30s\n")
    argv = ["replay", "examples/trace.csv", *EXAMPLE, "--config", "examples/policy.yaml",
            "--config", str(bad), "--out", str(tmp_path / "out"), "--quiet"]  # fmt: skip
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert f"{bad}:3" in error and "backfill.intervall" in error
    assert not (tmp_path / "out").exists()


def test_config_names_are_stems_or_what_tells_equal_stems_apart():
    assert _config_names(["a/current.yaml", "b/candidate.yaml"]) == [
        ("current", "a/current.yaml"),
        ("candidate", "b/candidate.yaml"),
    ]
    assert [n for n, _ in _config_names(["x/a/policy.yaml", "x/b/policy.yml"])] == [
        "a/policy",
        "b/policy",
    ]
    assert [n for n, _ in _config_names(["p.yaml", "p.yaml"])] == ["p#1", "p#2"]


def _busy_trace():
    """Two queues' gangs and singles on 16 GPUs, more than fit: jobs wait on capacity,
    placement and (tier 3 behind quotas) policy."""
    jobs = []
    for i in range(24):
        jobs.append(trace_job(f"g{i}", 40.0 * i, 1500.0 + 70 * i, 8 if i % 3 else 4,
                              tier=1 + i % 3, queue="a" if i % 2 else "b",
                              kind="notebook" if i % 5 == 0 else "batch"))  # fmt: skip
    return jobs


def test_per_class_reason_waits_add_up_to_the_global_ones_and_change_no_decision():
    c = cluster(("n[1-2]", 8, "leaf-1"))
    tree = queues({"a": {"guaranteed": 8}, "b": {"guaranteed": 8}}, c)
    trace = _busy_trace()
    plain = replay(trace, c, tree, PolicySettings(), get_policy("gpusched"))
    tallied = replay(trace, c, tree, PolicySettings(), get_policy("gpusched"), by_class=True)
    assert plain.wait_gpu_s_by_class is None and plain.scheduler.pending_gpus_by_class is None
    assert list(job_rows(plain)) == list(job_rows(tallied))  # the same decisions
    by_class = tallied.wait_gpu_s_by_class
    assert len(by_class) > 2
    for family, total in tallied.wait_gpu_s_by_reason.items():
        assert sum(c[family] for c in by_class.values()) == pytest.approx(total), family
    assert sum(tallied.wait_gpu_s_by_reason.values()) > 0
    # nothing is left pending at the end: every class's tally is back at zero
    for counts in tallied.scheduler.pending_gpus_by_class.values():
        assert all(v == pytest.approx(0) for v in counts.values())


def test_jobs_csv_gives_the_queue_a_job_was_filed_under_as_the_classes_do():
    c = cluster(("n[1-2]", 8, "leaf-1"))
    tree = queues({"a": {"guaranteed": 8, "users": ["ann"]}, "b": {"guaranteed": 8}}, c)
    trace = [
        trace_job("no-queue", 0.0, 60.0, 1, user="ann"),  # its user's queue, a
        trace_job("slashed", 0.0, 60.0, 1, user="bo", queue="/b/"),  # its path: b
    ]
    for policy, expected in (("gpusched", ["a", "b"]), ("fifo", ["", "/b/"])):
        result = replay(trace, c, tree, PolicySettings(), get_policy(policy))
        assert [row["queue"] for row in job_rows(result)] == expected, policy


def test_per_class_reason_waits_in_metrics_json_add_up(two_configs):
    out, _ = two_configs
    document = json.loads((out / "metrics.json").read_text())
    for run, classes in document["classes"].items():
        total = document["policies"][run]["wait_gpu_hours_by_reason"]
        for family in ("capacity", "placement", "policy"):
            parts = [f[f"waited_{family}_gpu_hours"]["run"] for f in classes.values()]
            assert sum(parts) == pytest.approx(total[family], abs=1e-3 * len(parts)), (run, family)
        assert sum(f["gpu_utilization"]["run"] for f in classes.values()) == pytest.approx(
            document["policies"][run]["gpu_utilization"], abs=1e-3
        )


def test_label():
    assert label((2, "research/vision", "batch")) == "tier 2 / research/vision / batch"
    assert label((3, "", "notebook")) == "tier 3 / - / notebook"
