"""``jupyter-gpusched replay``: the output files and their fields, and bad input."""

import contextlib
import csv
import http.server
import json
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from jupyter_gpusched.cli import main
from jupyter_gpusched.sim.metrics import JOB_COLUMNS

EXAMPLE = [
    "examples/trace.csv",
    "--cluster", "examples/cluster.yaml",
    "--queues", "examples/queues.yaml",
    "--config", "examples/policy.yaml",
]  # fmt: skip
METRIC_KEYS = {
    "jobs", "completed", "rejected", "makespan_s", "gpu_utilization", "busy_utilization",
    "wait_s", "wait_s_by_tier", "jct_s", "preemptions", "lost_gpu_hours", "gang_jobs",
    "gang_single_leaf_fraction", "wait_gpu_hours_by_reason", "sim_wall_s", "jobs_per_s",
    "estimated_jobs", "estimate_too_short_fraction", "reserved_jobs",
    "reservations_too_short_fraction", "deadline_jobs", "deadline_met_fraction",
    "deadline_miss_s", "deadline_cancelled",
}  # fmt: skip


def test_replay_writes_jobs_csv_metrics_json_and_a_table(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["replay", *EXAMPLE, "--policy", "gpusched", "--policy", "fifo",
                 "--out", str(out), "--quiet"])  # fmt: skip
    assert code == 0
    table = capsys.readouterr().out
    assert "gpusched" in table and "fifo" in table and "wait mean" in table
    figures = json.loads((out / "metrics.json").read_text())["policies"]
    assert set(figures) == {"gpusched", "fifo"}
    for name, values in figures.items():
        assert set(values) == METRIC_KEYS, name
        assert set(values["wait_s"]) == {"mean", "p50", "p95", "p99", "max"}
        assert set(values["wait_s_by_tier"]) == {"1", "2", "3"}
        assert set(values["jct_s"]) == {"mean", "p50", "p95", "p99"}
        assert set(values["wait_gpu_hours_by_reason"]) == {"capacity", "placement", "policy"}
        assert values["jobs"] == 400
        assert values["completed"] + values["rejected"] <= values["jobs"]
        assert 0 < values["gpu_utilization"] <= 1
    with open(out / "jobs.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == JOB_COLUMNS
    assert len(rows) == 800
    for row in rows:
        assert row["state"] in {"completed", "rejected", "preempted"}
        if row["start_time"]:
            assert float(row["wait_s"]) == float(row["start_time"]) - float(row["submit_time"])
            assert "." not in row["gpus"] and "." not in row["runs"]
        assert row["first_reason"] in {"", "capacity", "placement", "policy"}


def test_replay_is_deterministic(tmp_path):
    outputs = []
    for run in range(2):
        out = tmp_path / f"out{run}"
        assert main(["replay", *EXAMPLE, "--out", str(out), "--quiet"]) == 0
        outputs.append((out / "jobs.csv").read_text())
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ("j2,10,100,two,2", "gpus"),
        ("j2,10,100,-1,2", "gpus"),
        ("j2,10,100,0,2", "cpus"),  # a CPU-only row needs cpus or memory_gb
        ("j2,ten,100,1,2", "submit_time"),
        ("j2,10,100,1,5", "tier"),
        ("j1,10,100,1,2", "job_id"),
    ],
)
def test_malformed_trace_row_exits_2_with_file_line_and_field(tmp_path, capsys, row, field):
    trace = tmp_path / "trace.csv"
    trace.write_text(f"job_id,submit_time,duration,gpus,tier\nj1,0,100,1,2\n{row}\n")
    code = main(["replay", str(trace), "--cluster", "examples/cluster.yaml",
                 "--out", str(tmp_path / "out"), "--quiet"])  # fmt: skip
    assert code == 2
    error = capsys.readouterr().err
    assert f"{trace}:3" in error
    assert f"field '{field}'" in error


def test_bad_cluster_file_exits_2(tmp_path, capsys):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes:\n  - {name: a, gpus: -1}\n")
    code = main(["replay", "examples/trace.csv", "--cluster", str(cluster),
                 "--out", str(tmp_path / "o"), "--quiet"])  # fmt: skip
    assert code == 2
    assert "gpus" in capsys.readouterr().err


def test_unknown_policy_exits_2(tmp_path, capsys):
    code = main(["replay", *EXAMPLE, "--policy", "magic", "--out", str(tmp_path), "--quiet"])
    assert code == 2
    assert "unknown policy 'magic'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        ("reaper:\n  timeout_tier_2: 1h\n  timout_tier_3: 30m\n", 3, "reaper.timout_tier_3"),
        ("walltime:\n  batch: 1h\nreaper:\n  timeout_tier_2: soon\n", 4, "reaper.timeout_tier_2"),
        ("reaper:\n  profile_timeouts:\n    big: later\n", 3, "reaper.profile_timeouts.big"),
        ("reaper:\n  warning_lead: 5m\n  unmonitored: kill\n", 3, "reaper.unmonitored"),
        ("reaper:\n  unmonitored_after: never\n", 2, "reaper.unmonitored_after"),
    ],
)
def test_a_bad_reaper_setting_in_the_policy_file_exits_2(tmp_path, text, line, field):
    """``replay --config`` reads the policy file ``serve`` reads: a bad ``reaper:`` setting is
    exit code 2 with file, line and field there too (tests/test_service_restart.py: serve)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(text)
    bindir = __import__("pathlib").Path(sys.executable).parent
    result = subprocess.run(
        [bindir / "jupyter-gpusched", "replay", *EXAMPLE[:5], "--config", str(policy),
         "--out", str(tmp_path / "out"), "--quiet"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert f"{policy}:{line}" in result.stderr and f"field '{field}'" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()  # stopped before it replayed anything


def test_an_empty_trace_and_an_out_that_is_a_file_exit_2(tmp_path, capsys):
    empty = tmp_path / "empty.csv"
    empty.write_text(Path("examples/trace.csv").read_text().splitlines()[0] + "\n")
    code = main(["replay", str(empty), "--cluster", "examples/cluster.yaml",
                 "--out", str(tmp_path / "out"), "--quiet"])  # fmt: skip
    assert code == 2 and "the trace has no jobs" in capsys.readouterr().err
    taken = tmp_path / "taken"
    taken.write_text("")
    code = main(["replay", *EXAMPLE, "--out", str(taken), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "field '--out': cannot make the directory" in err, err


def test_console_script_and_jupyter_subcommand_are_installed():
    bindir = __import__("pathlib").Path(sys.executable).parent
    result = subprocess.run([bindir / "jupyter-gpusched", "--version"], capture_output=True,
                            text=True, check=False)  # fmt: skip
    assert result.returncode == 0
    assert result.stdout.strip()
    via_jupyter = subprocess.run([bindir / "jupyter", "gpusched", "--version"],
                                 capture_output=True, text=True, check=False)  # fmt: skip
    assert via_jupyter.returncode == 0
    assert via_jupyter.stdout == result.stdout


@contextlib.contextmanager
def answering(answer: dict):
    """A local HTTP server answering every GET with ``answer`` (JSON); yields its port and the
    (path, Authorization) of each request."""
    seen = []

    class Answer(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            body = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], seen
    finally:
        server.shutdown()
        server.server_close()


def test_reaper_show_follows_the_demo_hub_port(monkeypatch, capsys):
    """``jupyter-gpusched reaper`` without --url goes to the hub of GPUSCHED_HUB_PORT, like the
    rest of the demo (a second demo on another port is not the first one's)."""
    with answering({"settings": {"timeout_tier_2": 60}}) as (port, seen):
        for name in ("GPUSCHED_SERVICE_URL", "GPUSCHED_URL"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("GPUSCHED_HUB_PORT", str(port))
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "t0ken")
        assert main(["reaper", "show"]) == 0
        assert json.loads(capsys.readouterr().out)["settings"] == {"timeout_tier_2": 60}
        assert seen == [("/services/gpusched/api/reaper", "token t0ken")]


def test_a_service_older_than_the_command_gets_a_message_not_a_traceback(monkeypatch, capsys):
    """A notebook image upgraded before the hub: ``queues`` reads ``in_use``, which an older
    service's api/quotas lacks. The command says so (exit 1); --json still prints the answer."""
    old = {"path": "root", "guaranteed": 8, "limit": None, "weight": 1, "running": 2}
    old.update(claimed=0, pending=0, leaf=False, users=[], groups=[])
    with answering({"document": None, "queues": [old]}) as (port, _):
        monkeypatch.setenv("GPUSCHED_SERVICE_URL", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("GPUSCHED_SERVICE_TOKEN", "t0ken")
        assert main(["queues"]) == 1
        error = capsys.readouterr().err
        assert "the service's answer has no 'in_use': the service is older than" in error
        assert "Traceback" not in error
        assert main(["queues", "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == [old]


def test_replay_with_a_deadline_model_reports_the_deadline_figures(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["replay", *EXAMPLE, "--policy", "gpusched", "--policy", "slurm",
                 "--deadlines", "25", "--out", str(out), "--quiet", "--no-report"])  # fmt: skip
    assert code == 0
    figures = json.loads((out / "metrics.json").read_text())["policies"]
    for name in ("gpusched", "slurm"):
        assert 60 <= figures[name]["deadline_jobs"] <= 140, figures[name]  # ~25 % of 400
        assert 0 < figures[name]["deadline_met_fraction"] <= 1
    assert figures["gpusched"]["deadline_jobs"] == figures["slurm"]["deadline_jobs"]
    assert "deadlines met" in capsys.readouterr().out
    assert main(["replay", *EXAMPLE, "--deadlines", "120", "--out", str(out)]) == 2


def test_jobs_tells_how_a_finished_job_ended_where_its_exit_code_does_not():
    from jupyter_gpusched.cli.listings import JOBS_HEADERS, with_endings

    culled = {"state": "completed", "exit_code": 0, "message": "culled by the reaper: GPUs idle"}
    plain = {"state": "completed", "exit_code": 0, "message": "exit code 0"}
    running = {"state": "running", "exit_code": None, "message": "started"}
    headers, rows = with_endings(JOBS_HEADERS, [["a"], ["b"], ["c"]], [culled, plain, running])
    assert headers[-1] == "HOW IT ENDED"
    assert [row[-1] for row in rows] == ["culled by the reaper: GPUs idle", None, None]
    assert with_endings(JOBS_HEADERS, [["b"]], [plain]) == (JOBS_HEADERS, [["b"]])


def test_a_reader_that_goes_away_ends_the_command_without_a_traceback():
    """``jupyter-gpusched ... --json | head``: Python would print BrokenPipeError's traceback."""
    talk = (
        "import sys, jupyter_gpusched.cli as cli\n"
        "def run(args):\n"
        "    for _ in range(2000):\n"
        "        print('x' * 1000)\n"
        "    return 0\n"
        "cli.run_replay = run\n"
        "sys.exit(cli.main(['replay', 't.csv', '--cluster', 'c.yaml', '--out', 'o']))\n"
    )
    shell = f"{sys.executable} -c {shlex.quote(talk)} | head -c 10; "
    shell += "status=${PIPESTATUS[0]}; echo; echo $status"
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60)
    assert done.stderr == "", done.stderr  # (no BrokenPipeError, at the print or at exit)
    assert done.stdout.split() == ["x" * 10, "1"]


def test_check_reads_the_files_as_the_service_does(tmp_path, capsys):
    demo = ["--cluster", "hub_config/demo-cluster.yaml", "--queues", "hub_config/demo-queues.yaml"]
    assert main(["check", *demo, "--policy", "examples/policy.yaml"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "hub_config/demo-cluster.yaml: 2 nodes, 8 GPUs (8 H100), 1 leaf switch"
    assert out[1] == (
        "hub_config/demo-queues.yaml: 4 leaf queues, 8 of 8 GPUs guaranteed, default queue sandbox"
    )
    assert out[2].startswith("examples/policy.yaml: backfill every 30 s at most")
    # the first error, with file, line and field, and exit status 2
    policy = tmp_path / "policy.yaml"
    policy.write_text("backfill:\n  depth: 0\n")
    assert main(["check", *demo, "--policy", str(policy)]) == 2
    err = capsys.readouterr().err
    assert f"{policy}:2, field 'backfill.depth'" in err, err
