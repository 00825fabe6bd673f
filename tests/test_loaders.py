"""Loaders of real traces (Philly, Alibaba 2023), the clusters and queues built for them, and the
``replay`` options that use them (--format, --tier-mix, --skip-bad-rows, philly[:GPUS], node CSV).

Hand-made CSV files test each rule; the real traces in ``../shared/traces`` (skipped when absent)
test the counts the traces' README promises."""

import csv
import math
from pathlib import Path

import pytest

from jupyter_gpusched.cli import main
from jupyter_gpusched.core import ConfigError
from jupyter_gpusched.sim.cluster_loaders import (
    NO_GPU_NODES,
    PHILLY_VC_NODES,
    load_cluster_spec,
    load_queue_spec,
    philly_queues_data,
    read_vc_nodes,
)
from jupyter_gpusched.sim.loaders import (
    BAD_ROWS,
    NEVER_SCHEDULED,
    ZERO_GPU,
    load_trace,
    parse_tier_mix,
    tier_for,
)
from jupyter_gpusched.sim.trace import TraceError

TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"
PHILLY = TRACES / "philly" / "philly_2017_sep_oct.csv"
ALIBABA = TRACES / "alibaba2023"
PHILLY_HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"
ALIBABA_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)
NODES_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"


def real(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"real traces not found: {path} is absent (see ../shared/traces/README.md)")
    return path


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


# --- Philly ------------------------------------------------------------------------------------


def test_philly_rows_become_jobs_sorted_by_submit_time_from_the_earliest(tmp_path):
    path = write(tmp_path, "philly.csv", PHILLY_HEADER + (
        "2017-10-09 07:01:55,66.0,1,66.0,11cb48\n"
        "2017-10-09 06:13:03,2951.5,2,5903.0,6214e9\n"
        "2017-10-10 06:13:03,10.0,0,0.0,6214e9\n"
        "2017-10-09 07:01:55,5.0,16,80.0,23dbec\n"
    ))  # fmt: skip
    loaded = load_trace(path, "philly")
    assert [j.id for j in loaded.jobs] == ["philly-00002", "philly-00001", "philly-00004"]
    assert [j.submit_time for j in loaded.jobs] == [0.0, 2932.0, 2932.0]
    first = loaded.jobs[0]
    assert (first.duration, first.gpus, first.queue, first.tier) == (2951.5, 2, "6214e9", 2)
    assert (first.kind, first.user, first.gpu_models, first.walltime) == ("batch", "", None, None)
    assert loaded.skipped == {ZERO_GPU: 1}


def test_the_real_philly_log_loads_whole_and_sorted_and_quickly():
    path = real(PHILLY)
    with path.open() as handle:
        stamps = [row["timestamp"] for row in csv.DictReader(handle)]
    assert stamps != sorted(stamps)  # the file is not sorted; the loader must sort it
    loaded = load_trace(path, "philly", parse_tier_mix("10,60,30"))
    jobs = loaded.jobs
    assert len(jobs) == 52_849 and not loaded.skipped
    assert len({j.id for j in jobs}) == 52_849
    submits = [j.submit_time for j in jobs]
    assert submits == sorted(submits) and submits[0] == 0.0
    assert submits[-1] == pytest.approx(57 * 86400 + 13 * 3600 + 21 * 60 + 30)  # 10-31 23:52:11
    assert {j.queue for j in jobs} == {*PHILLY_VC_NODES, "23dbec"}  # 23dbec owns no nodes


@pytest.mark.parametrize(
    ("text", "tiers"),
    [("10,60,30", (10, 60, 30)), ("0,100,0", (0, 100, 0)), (" 5, 5 ,90", (5, 5, 90))],
)
def test_tier_mixes_parse(text, tiers):
    assert parse_tier_mix(text) == tiers


@pytest.mark.parametrize("text", ["10,60", "10,60,31", "-10,80,30", "a,b,c", "10.5,59.5,30", ""])
def test_bad_tier_mixes_are_refused(text):
    with pytest.raises(ConfigError) as error:
        parse_tier_mix(text)
    assert error.value.field == "--tier-mix"


def test_tier_mix_is_a_deterministic_hash_close_to_the_percentages():
    ids = [f"philly-{n:05d}" for n in range(1, 20_001)]
    mix = (10, 60, 30)
    tiers = [tier_for(i, mix) for i in ids]
    assert tiers == [tier_for(i, mix) for i in reversed(ids)][::-1]  # order plays no part
    for tier, percent in zip((1, 2, 3), mix, strict=True):
        assert abs(100 * tiers.count(tier) / len(ids) - percent) < 1.5, tier
    assert {tier_for(i, (0, 100, 0)) for i in ids} == {2}
    assert {tier_for(i, (100, 0, 0)) for i in ids} == {1}
    assert {tier_for(i, (0, 0, 100)) for i in ids} == {3}


def test_without_a_mix_every_philly_job_is_tier_2_and_the_mix_is_philly_only(tmp_path):
    path = write(tmp_path, "p.csv", PHILLY_HEADER + "2017-10-09 07:01:55,66.0,1,66.0,a\n" * 50)
    assert {j.tier for j in load_trace(path, "philly").jobs} == {2}
    assert {j.tier for j in load_trace(path, "philly", (0, 0, 100)).jobs} == {3}
    with pytest.raises(ConfigError) as error:
        load_trace(path, "csv", (10, 60, 30))
    assert error.value.field == "--tier-mix"


def test_the_philly_cluster_has_8_gpu_nodes_16_per_leaf_8_leaves_per_spine():
    cluster = load_cluster_spec("philly").cluster
    assert cluster.total_gpus == 2816 and len(cluster.nodes) == 352
    assert {len(nodes) for nodes in cluster.leaves.values()} == {16}
    assert [len(leaves) for leaves in cluster.spines.values()] == [8, 8, 6]
    node = cluster.nodes[0]
    assert (node.gpus, len(node.domains), len(node.pcie_groups)) == (8, 8, 2)
    small = load_cluster_spec("philly:64").cluster
    assert (small.total_gpus, len(small.leaves), len(small.spines)) == (64, 1, 1)


@pytest.mark.parametrize("spec", ["philly:60", "philly:0"])
def test_philly_cluster_sizes_must_be_whole_nodes(spec):
    with pytest.raises(ConfigError) as error:
        load_cluster_spec(spec)
    assert error.value.field == "--cluster"


def test_philly_queues_are_the_vcs_share_scaled_and_rounded_down():
    names = [*PHILLY_VC_NODES, "23dbec", ""]
    queues = philly_queues_data(names, 768)["queues"]
    assert set(queues) == set(PHILLY_VC_NODES) | {"23dbec"}
    guaranteed = {name: spec["guaranteed"] for name, spec in queues.items()}
    assert sum(guaranteed.values()) <= 768
    assert sum(guaranteed.values()) > 768 - len(PHILLY_VC_NODES)  # only rounding is lost
    for name, nodes in PHILLY_VC_NODES.items():
        assert guaranteed[name] == math.floor(nodes * 8 * 768 / 2816)
    assert guaranteed["6214e9"] == 139 and guaranteed["ed69ec"] == 17
    assert guaranteed["23dbec"] == 0  # owns no nodes: borrows only
    assert all(spec["weight"] == 1 and "limit" not in spec for spec in queues.values())
    default = philly_queues_data(PHILLY_VC_NODES)["queues"]
    assert {n: s["guaranteed"] for n, s in default.items()} == {
        n: 8 * nodes for n, nodes in PHILLY_VC_NODES.items()
    }


def test_philly_queue_tree_follows_the_trace_vcs(tmp_path):
    path = write(tmp_path, "p.csv", PHILLY_HEADER + (
        "2017-10-09 07:01:55,66.0,1,66.0,6214e9\n"
        "2017-10-09 07:01:56,66.0,1,66.0,ed69ec\n"
        "2017-10-09 07:01:57,66.0,1,66.0,23dbec\n"
    ))  # fmt: skip
    jobs = load_trace(path, "philly").jobs
    cluster = load_cluster_spec("philly:768").cluster
    tree = load_queue_spec("philly:768", cluster, jobs, path)
    leaves = {q.path: (q.guaranteed, q.limit, q.weight) for q in tree.leaves}
    assert leaves == {
        "6214e9": (139, math.inf, 1),
        "ed69ec": (17, math.inf, 1),
        "23dbec": (0, math.inf, 1),
    }
    with pytest.raises(ConfigError, match="guarantee"):  # 2,816 GPUs of VCs on 64 GPUs
        load_queue_spec("philly", load_cluster_spec("philly:64").cluster, jobs, path)


def test_the_built_in_vc_table_is_the_shared_file():
    assert read_vc_nodes(real(TRACES / "philly" / "philly_vc_nodes.csv")) == PHILLY_VC_NODES
    assert 8 * sum(PHILLY_VC_NODES.values()) == 2816


# --- Alibaba 2023 ------------------------------------------------------------------------------

ALIBABA_ROWS = (
    "pod-a,12000,16384,1,1000,,LS,Running,100,5000,150\n"
    "pod-b,6000,12288,1,460,T4|V100M32,BE,Failed,50,900,60\n"
    "pod-c,88000,327680,8,1000,G2,Burstable,Succeeded,70,700,70\n"
    "pod-d,1000,2048,0,0,,LS,Running,10,200,10\n"
    "pod-e,4000,8192,1,1000,,Guaranteed,Running,80,9000,80\n"
    "pod-f,4000,8192,2,1000,,BE,Pending,90,400,\n"
)


def test_alibaba_tasks_map_qos_fractions_models_and_run_times(tmp_path):
    loaded = load_trace(write(tmp_path, "pods.csv", ALIBABA_HEADER + ALIBABA_ROWS), "alibaba2023")
    jobs = {j.id: j for j in loaded.jobs}
    assert [j.id for j in loaded.jobs] == ["pod-b", "pod-c", "pod-e", "pod-a"]  # by creation
    assert {i: j.tier for i, j in jobs.items()} == {"pod-a": 2, "pod-b": 3, "pod-c": 2, "pod-e": 1}
    b = jobs["pod-b"]
    assert (b.gpus, b.gpu_fraction, b.gpu_models) == (1, 0.46, frozenset({"T4", "V100M32"}))
    assert (b.submit_time, b.duration, b.cpus, b.memory_gb) == (50, 840, 6.0, 12.0)
    assert jobs["pod-a"].gpu_fraction == 1.0 and jobs["pod-a"].gpu_models is None
    assert (jobs["pod-c"].gpus, jobs["pod-c"].duration) == (8, 630)
    assert {j.queue for j in jobs.values()} == {""}
    assert loaded.skipped == {ZERO_GPU: 1, NEVER_SCHEDULED: 1}


@pytest.mark.parametrize("name", ["openb_pod_list_default.csv", "openb_pod_list_gpuspec33.csv"])
def test_the_real_alibaba_pod_lists(name):
    loaded = load_trace(real(ALIBABA / name), "alibaba2023")
    assert loaded.skipped == {ZERO_GPU: 1088, NEVER_SCHEDULED: 861}
    jobs = loaded.jobs
    assert len(jobs) == 8152 - 1088 - 861
    assert sum(j.gpu_fraction < 1 for j in jobs) == 2573
    assert all(j.gpus == 1 for j in jobs if j.gpu_fraction < 1)
    assert {j.tier for j in jobs} == {1, 2, 3} and all(j.duration >= 0 for j in jobs)
    constrained = sum(j.gpu_models is not None for j in jobs)
    assert constrained == 0 if name.endswith("default.csv") else constrained > 1000


def test_alibaba_node_list_becomes_a_cluster_without_gpu_less_nodes(tmp_path):
    path = write(tmp_path, "nodes.csv", NODES_HEADER + (
        "n1,64000,262144,2,P100\n"
        "n2,96000,393216,8,G2\n"
        "n3,32000,131072,0,\n"
    ))  # fmt: skip
    loaded = load_cluster_spec(str(path))
    cluster = loaded.cluster
    assert [(n.name, n.gpus, n.gpu_model) for n in cluster.nodes] == [
        ("n1", 2, "P100"),
        ("n2", 8, "G2"),
    ]
    assert (cluster.nodes[0].cpus, cluster.nodes[0].memory_gb) == (64.0, 256.0)
    assert len(cluster.leaves) == 1 and loaded.skipped == {NO_GPU_NODES: 1}


def test_the_real_alibaba_node_list_has_1213_nodes_and_6212_gpus():
    cluster = load_cluster_spec(str(real(ALIBABA / "openb_node_list_gpu_node.csv"))).cluster
    assert (len(cluster.nodes), cluster.total_gpus) == (1213, 6212)
    assert set(cluster.gpu_models) == {"A10", "G2", "G3", "P100", "T4", "V100M16", "V100M32"}


# --- malformed rows ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "header", "row", "field"),
    [
        ("philly", PHILLY_HEADER, "2017-13-09 07:01:55,66.0,1,66.0,a", "timestamp"),
        ("philly", PHILLY_HEADER, "2017-10-09 7:01,66.0,1,66.0,a", "timestamp"),
        ("philly", PHILLY_HEADER, "2017-10-09 07:01:55,-1,1,66.0,a", "duration"),
        ("philly", PHILLY_HEADER, "2017-10-09 07:01:55,nan,1,66.0,a", "duration"),
        ("philly", PHILLY_HEADER, "2017-10-09 07:01:55,66.0,1.5,66.0,a", "num_gpus"),
        ("philly", PHILLY_HEADER, "2017-10-09 07:01:55,66.0,1,66.0,", "cluster"),
        ("philly", PHILLY_HEADER, "2017-10-09 07:01:55,66.0,1", "cluster"),
        ("philly", PHILLY_HEADER, "2017-10-09 07:01:55,66.0,1,66.0,a,extra", "cluster"),
        ("alibaba2023", ALIBABA_HEADER, "p9,1000,1024,1,500,,Gold,Running,0,9,0", "qos"),
        ("alibaba2023", ALIBABA_HEADER, "p9,1000,1024,2,500,,LS,Running,0,9,0", "gpu_milli"),
        ("alibaba2023", ALIBABA_HEADER, "p9,1000,1024,1,1000,,LS,Running,0,9,20", "scheduled_time"),
        ("alibaba2023", ALIBABA_HEADER, "p9,1000,x,1,1000,,LS,Running,0,9,0", "memory_mib"),
        ("alibaba2023", ALIBABA_HEADER, "pod-a,1000,1024,1,1000,,LS,Running,0,9,0", "name"),
        ("csv", "job_id,submit_time,duration,gpus\nj1,0,10,1\n", "j2,0,10,two", "gpus"),
    ],
)  # fmt: skip
def test_a_malformed_row_names_file_line_and_field(tmp_path, fmt, header, row, field):
    good = {"philly": "2017-10-09 07:01:55,66.0,1,66.0,a\n", "alibaba2023": ALIBABA_ROWS}
    path = write(tmp_path, "trace.csv", header + good.get(fmt, "") + row + "\n")
    bad_line = len(path.read_text().splitlines())
    with pytest.raises(TraceError) as error:
        load_trace(path, fmt)
    assert (error.value.line, error.value.field) == (bad_line, field)
    assert f"trace.csv:{bad_line}" in str(error.value)
    loaded = load_trace(path, fmt, skip_bad_rows=True)
    assert loaded.skipped[BAD_ROWS] == 1 and loaded.first_error.field == field
    assert len(loaded.jobs) == {"philly": 1, "alibaba2023": 4, "csv": 1}[fmt]  # the good rows


def test_a_header_without_the_columns_is_an_error_even_when_skipping(tmp_path):
    path = write(tmp_path, "p.csv", "timestamp,duration,gpus\n2017-10-09 07:01:55,1,1\n")
    with pytest.raises(TraceError, match="num_gpus") as error:
        load_trace(path, "philly", skip_bad_rows=True)
    assert error.value.line == 1


def test_a_bad_node_row_names_line_and_field_or_is_counted(tmp_path):
    path = write(tmp_path, "nodes.csv", NODES_HEADER + "n1,1000,1024,2,T4\nn2,1000,1024,99,T4\n")
    with pytest.raises(TraceError) as error:
        load_cluster_spec(str(path))
    assert (error.value.line, error.value.field) == (3, "gpu")
    loaded = load_cluster_spec(str(path), skip_bad_rows=True)
    assert loaded.skipped == {BAD_ROWS: 1} and loaded.cluster.total_gpus == 2


# --- the command line --------------------------------------------------------------------------


def philly_trace(tmp_path, rows=40):
    lines = [
        f"2017-10-{9 + n % 3:02d} {n % 24:02d}:{n % 60:02d}:00,{60 * (n + 1)}.0,"
        f"{(1, 2, 4, 8, 16)[n % 5]},0,{('6214e9', 'ed69ec', '23dbec')[n % 3]}"
        for n in range(rows)
    ]
    return write(tmp_path, "philly.csv", PHILLY_HEADER + "\n".join(lines) + "\n")


def test_replay_of_a_philly_trace_on_a_philly_cluster_with_vc_queues(tmp_path, capsys):
    trace, out = philly_trace(tmp_path), tmp_path / "out"
    code = main(["replay", str(trace), "--format", "philly", "--cluster", "philly:64",
                 "--queues", "philly:64", "--tier-mix", "10,60,30", "--policy", "fifo",
                 "--quiet", "--no-report", "--out", str(out)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    with open(out / "jobs.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 40 and {r["policy"] for r in rows} == {"fifo"}
    assert {r["job_id"] for r in rows} == {f"philly-{n:05d}" for n in range(1, 41)}
    assert {r["queue"] for r in rows} == {"6214e9", "ed69ec", "23dbec"}
    assert all(int(r["tier"]) == tier_for(r["job_id"], (10, 60, 30)) for r in rows)
    assert all(r["state"] == "completed" for r in rows)
    assert capsys.readouterr().err == ""  # nothing skipped, and --quiet


def test_replay_reports_skipped_rows_or_stops_at_the_first(tmp_path, capsys):
    trace = write(tmp_path, "p.csv", PHILLY_HEADER + (
        "2017-10-09 07:01:55,66.0,1,66.0,6214e9\n"
        "2017-10-09 07:02:55,66.0,0,0.0,6214e9\n"
        "2017-10-09 07:03:55,soon,1,66.0,6214e9\n"
    ))  # fmt: skip
    out = str(tmp_path / "out")
    args = ["replay", str(trace), "--format", "philly", "--cluster", "philly:16",
            "--policy", "fifo", "--quiet", "--no-report", "--out", out]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "p.csv:4" in err and "field 'duration'" in err
    assert main([*args, "--skip-bad-rows"]) == 0
    err = capsys.readouterr().err
    assert "skipped bad rows: 1" in err and "skipped zero-GPU tasks: 1" in err
    assert "first bad row" in err and "p.csv:4" in err


def test_replay_of_a_contract_trace_on_an_alibaba_node_list(tmp_path, capsys):
    nodes = write(
        tmp_path, "nodes.csv", NODES_HEADER + "n1,8000,32768,4,T4\nn2,8000,32768,2,P100\n"
    )
    trace = write(tmp_path, "t.csv", "job_id,submit_time,duration,gpus,gpu_model\n"
                  "j1,0,10,2,P100\nj2,0,10,4,\nj3,1,5,x,\n")  # fmt: skip
    out = tmp_path / "out"
    args = ["replay", str(trace), "--cluster", str(nodes), "--policy", "fifo", "--quiet",
            "--no-report", "--out", str(out)]  # fmt: skip
    assert main(args) == 2 and "t.csv:4" in capsys.readouterr().err
    assert main([*args, "--skip-bad-rows"]) == 0
    with open(out / "jobs.csv") as handle:
        placed = {r["job_id"]: r["nodes"] for r in csv.DictReader(handle)}
    assert placed == {"j1": "n2", "j2": "n1"}
    assert "skipped bad rows: 1" in capsys.readouterr().err


def test_replay_refuses_a_tier_mix_for_other_formats(tmp_path, capsys):
    code = main(["replay", "examples/trace.csv", "--cluster", "examples/cluster.yaml",
                 "--tier-mix", "10,60,30", "--out", str(tmp_path / "out"), "--quiet"])  # fmt: skip
    assert code == 2 and "--tier-mix" in capsys.readouterr().err
