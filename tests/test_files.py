"""The cluster, queue and policy files: what they accept, and errors that say what to fix."""

from pathlib import Path

import pytest

from jupyter_gpusched.core import ConfigError
from jupyter_gpusched.core.hostlist import expand_hostlist
from jupyter_gpusched.files import load_cluster, load_policy, load_queues


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_hostlists_expand_with_padding():
    assert expand_hostlist("gpu-a[01-04]") == ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a04"]
    assert expand_hostlist("n[1,3,8-9]") == ["n1", "n3", "n8", "n9"]
    assert expand_hostlist("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    assert expand_hostlist("plain") == ["plain"]


@pytest.mark.parametrize("bad", ["n[01-", "n[a-b]", "n[5-1]", "n[]"])
def test_malformed_ranges_are_refused(bad):
    with pytest.raises(ValueError):
        expand_hostlist(bad)


def test_the_example_cluster_loads_with_its_topology():
    cluster = load_cluster("examples/cluster.yaml")
    assert cluster.total_gpus == 48
    dgx = cluster.by_name["dgx01"]
    assert dgx.domains == (0b1111, 0b11110000) and dgx.pcie_groups == (0b1111, 0b11110000)
    l40s = cluster.by_name["l40s04"]
    assert len(l40s.domains) == 4 and l40s.labels == {"zone": "b"}
    assert cluster.spine_of_leaf == {"leaf-1": "spine-1", "leaf-2": "spine-1"}


@pytest.mark.parametrize(
    ("text", "field", "line", "words"),
    [
        (
            "nodes:\n  - name: a\n    gpus: 8\n    leaf: nowhere\nswitches:\n  s: [leaf-1]\n",
            "leaf", 4, "unknown leaf 'nowhere'",
        ),
        ("nodes:\n  - name: a\n    gpus: 0\n", "gpus", 3, "gpus"),
        ("nodes:\n  - {name: a, gpus: 8}\n  - {name: 'a', gpus: 4}\n", "name", 3, "duplicate"),
        ("nodes:\n  - name: n[01-\n    gpus: 8\n", "name", 2, "brackets"),
        ("nodes:\n  - name: a\n    gpus: 6\n    pcie_switches: 4\n", "pcie_switches", 4, "evenly"),
        ("nodes:\n  - name: a\n    gpus: 8\n    colour: red\n", "colour", 4, "unknown field"),
        ("nodes:\n  - name: a\n    gpus: 2\n    nvlink: [[0, 5]]\n", "nvlink", 4, "between 0"),
    ],
)  # fmt: skip
def test_bad_cluster_files_name_file_line_entry_and_field(tmp_path, text, field, line, words):
    path = write(tmp_path, "cluster.yaml", text)
    with pytest.raises(ConfigError) as error:
        load_cluster(path)
    message = str(error.value)
    assert error.value.field == field
    assert f"cluster.yaml:{line}" in message
    assert "nodes[" in message
    assert words in message


def test_bad_yaml_names_its_line(tmp_path):
    path = write(tmp_path, "cluster.yaml", "nodes:\n  - name: [a\n")
    with pytest.raises(ConfigError, match=r"cluster.yaml:\d+: not valid YAML"):
        load_cluster(path)


def test_queue_file_loads_and_fills_parent_guarantees(tmp_path):
    cluster = load_cluster("examples/cluster.yaml")
    tree = load_queues("examples/queues.yaml", cluster)
    assert tree.get("research/vision").limit == 32
    assert tree.get("research").guaranteed == 32
    assert tree.get("scratch").guaranteed == 0
    assert tree.half_life == 7 * 86400
    path = write(tmp_path, "q.yaml", "queues:\n  a:\n    children:\n      x: {guaranteed: 3}\n")
    assert load_queues(path, cluster).get("a").guaranteed == 3


@pytest.mark.parametrize(
    ("text", "field", "words"),
    [
        ("queues:\n  a: {guaranteed: 8, limit: 4}\n", "limit", "below"),
        ("queues:\n  a: {guaranteed: 100}\n", "guaranteed", "cluster has 48"),
        ("queues:\n  a:\n    guaranteed: 4\n    children:\n      b: {guaranteed: 8}\n",
         "guaranteed", "children guarantee 8"),
        ("queues:\n  a: {guaranteed: 4, wieght: 2}\n", "wieght", "unknown field"),
        ("queues:\n  a: {weight: 0}\n", "weight", "greater than 0"),
        ("queues:\n  a: {guaranteed: -1}\n", "guaranteed", ">= 0"),
    ],
)  # fmt: skip
def test_bad_queue_files_are_refused_with_the_field(tmp_path, text, field, words):
    cluster = load_cluster("examples/cluster.yaml")
    with pytest.raises(ConfigError) as error:
        load_queues(write(tmp_path, "queues.yaml", text), cluster)
    assert error.value.field == field
    assert "queues.yaml" in str(error.value)
    assert words in str(error.value)


def test_policy_file_defaults_and_overrides(tmp_path):
    settings = load_policy("examples/policy.yaml")
    assert settings.tiers[2].grace_period == 300 and settings.tiers[3].grace_period == 60
    assert settings.tiers[2].minimum_run_time == 600 and settings.tiers[3].minimum_run_time == 0
    assert settings.fair_share_half_life == 7 * 86400
    path = write(
        tmp_path, "p.yaml", "tiers:\n  3: {grace_period: 2m}\ncheckpoint: {on_signal: true}\n"
    )
    custom = load_policy(path)
    assert custom.tiers[3].grace_period == 120 and custom.checkpoint_on_signal


@pytest.mark.parametrize(
    ("text", "field", "line"),
    [
        ("tiers:\n  1: {grace_period: 5m}\n", "tiers.1", 2),
        ("fair_share: {half_life: soon}\n", "fair_share.half_life", 1),
        ("fair_share:\n  weight: 1\n  half_life: soon\n", "fair_share.half_life", 3),
        ("preemption_signal: SIGNOPE\n", "preemption_signal", 1),
        ("agee: {weight: 1}\n", "agee", 1),
        ("tiers: 7\n", "tiers", 1),
        # "false" in quotes is a string, which bool() would read as true: refused
        ('checkpoint:\n  interval: 30m\n  on_signal: "false"\n', "checkpoint.on_signal", 3),
        # a key given twice: YAML would keep the last without a word
        ("fair_share:\n  half_life: 7d\n  half_life: 1d\n", "half_life", 3),
    ],
)
def test_bad_policy_files_name_the_field(tmp_path, text, field, line):
    """The error names the field and the line of the field itself, not of its section."""
    with pytest.raises(ConfigError) as error:
        load_policy(write(tmp_path, "policy.yaml", text))
    assert error.value.field == field
    assert f"policy.yaml:{line}," in str(error.value)


def test_an_unknown_policy_section_lists_the_sections_and_the_page_that_has_them(tmp_path):
    with pytest.raises(ConfigError) as error:
        load_policy(write(tmp_path, "policy.yaml", "backfil: {order: shortest}\n"))
    message = str(error.value)
    assert error.value.field == "backfil"
    assert "the sections are age, backfill, checkpoint," in message
    assert "docs/files.md, 'Policy file'" in message
    assert "## Policy file" in Path("docs/files.md").read_text()  # the page it names has it


def test_a_queue_given_twice_is_refused_with_both_lines(tmp_path):
    text = "queues:\n  a:\n    guaranteed: 4\n  b:\n    guaranteed: 2\n  a:\n    guaranteed: 8\n"
    with pytest.raises(ConfigError) as error:
        load_queues(write(tmp_path, "queues.yaml", text), load_cluster("examples/cluster.yaml"))
    assert error.value.field == "a"
    assert "queues.yaml:6," in str(error.value)
    assert "'a' is given twice, on lines 2 and 6: keep one" in str(error.value)


def test_a_yaml_merge_key_may_still_be_overridden(tmp_path):
    from jupyter_gpusched.files import read_yaml

    text = "base: &base {x: 1, y: 2}\nc:\n  <<: *base\n  y: 3\n"
    data = read_yaml(write(tmp_path, "merge.yaml", text))
    assert data["c"] == {"x": 1, "y": 3} and data["c"].lines["y"] == 4


def test_a_default_queue_with_queues_under_it_is_refused(tmp_path):
    text = "default_queue: org\nqueues:\n  org:\n    children:\n      a: {guaranteed: 2}\n"
    with pytest.raises(ConfigError) as error:
        load_queues(write(tmp_path, "queues.yaml", text), load_cluster("examples/cluster.yaml"))
    assert error.value.field == "default_queue" and "queues.yaml:1," in str(error.value)
    assert "has queues under it; jobs go to a leaf queue: name one, such as 'org/a'" in str(
        error.value
    )


def test_a_misspelt_nodes_key_and_guarantees_above_the_cluster_name_their_line(tmp_path):
    with pytest.raises(ConfigError) as error:
        load_cluster(write(tmp_path, "cluster.yaml", "node:\n  - {name: a, gpus: 8}\n"))
    assert error.value.field == "node" and "cluster.yaml:1," in str(error.value)
    text = "# the teams\nqueues:\n  a: {guaranteed: 100}\n"
    with pytest.raises(ConfigError) as error:
        load_queues(write(tmp_path, "queues.yaml", text), load_cluster("examples/cluster.yaml"))
    assert "queues.yaml:2," in str(error.value)
    assert "the top-level queues guarantee 100 GPUs but the cluster has 48" in str(error.value)
