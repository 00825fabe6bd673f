"""The user commands of ``jupyter-gpusched`` (submit, queue, jobs, cancel, log, estimate, usage,
nodes) run as real processes against a real service (``tests/service_helpers.py``), as a user
in a terminal would: the table output, ``--json`` (the API's JSON) and the exit codes (0 ok,
1 unreachable or 5xx, 2 bad input or a 4xx).

Inside a single-user server the command needs no set-up (``GPUSCHED_SERVICE_URL`` and
``GPUSCHED_SERVICE_TOKEN``, as the spawner sets them); outside it takes ``--url`` and
``JUPYTERHUB_API_TOKEN``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest
from service_helpers import TOKENS, services, wait_job, wait_until

from jupyter_gpusched.cli.jobs import estimate_text
from jupyter_gpusched.cli.service import TABLE_WIDTH, table, when

COMMAND = str(Path(sys.executable).parent / "jupyter-gpusched")


@pytest.fixture
async def service(tmp_path):
    async with services(tmp_path) as make:
        yield await make()


def server_env(service, user: str) -> dict:
    """The environment of a single-user server of ``user`` (what the spawner sets)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSCHED_", "JUPYTERHUB_"))}
    return {**env, "GPUSCHED_SERVICE_URL": service.url, "GPUSCHED_SERVICE_TOKEN": TOKENS[user]}


async def cli(env: dict, *argv: str, cwd=None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        COMMAND,
        *argv,
        env=env,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    return process.returncode, out.decode(), err.decode()


async def test_submit_queue_jobs_log_cancel_as_a_user_in_a_server(service, tmp_path):
    env = server_env(service, "alice")
    rc, out, err = await cli(env, "submit", "--gpus", "1", "--name", "hello", "echo", "hi there")
    assert rc == 0, err
    job_id = out.strip()
    assert job_id.startswith("j-")
    alice = service.client("alice")
    await wait_job(alice, job_id, "completed")
    rc, out, _ = await cli(env, "log", job_id)
    assert rc == 0 and "\nhi there\n" in out
    rc, text, _ = await cli(env, "log", job_id, "--json")
    assert json.loads(text) == {"id": job_id, "log": out}
    rc, followed, _ = await cli(env, "log", job_id, "--follow")  # ended: all of it, then out
    assert (rc, followed) == (0, out)

    # one job holds 8 of the 16 H100s: one asking for 16 waits, first in line
    rc, out, err = await cli(env, "submit", "--gpus", "8", "--gpu-model", "H100", "sleep", "60")
    assert rc == 0, err
    running = out.strip()
    await wait_job(alice, running, "running")
    rc, out, err = await cli(env, "submit", "--gpus", "16", "--gpu-model", "H100", "sleep", "60")
    waiting = out.strip()
    rc, out, err = await cli(env, "submit", "--walltime", "120", "true")  # Slurm's minutes?
    assert rc == 2 and "'120' has no unit: write 120m for minutes" in err, err
    rc, out, err = await cli(env, "submit", "--hold", "--json", "true")
    assert rc == 0 and json.loads(out)["held"] is True, err
    held = json.loads(out)["id"]
    rc, out, err = await cli(env, "queue")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].split() == [
        "ID",
        "USER",
        "QUEUE",
        "TIER",
        "GPUS",
        "STATE",
        "POS",
        "ETA",
        "REASON",
    ]
    row = next(line for line in lines if line.startswith(waiting))
    assert "pending" in row and "alice" in row and " 1 " in row  # first in line
    assert any(line.startswith(running) and "running" in line for line in lines)
    assert any(line.startswith(held) and " held " in line for line in lines)
    assert all(len(line) <= TABLE_WIDTH for line in lines)
    rc, out, _ = await cli(env, "queue", "--json")
    data = json.loads(out)
    assert [e["id"] for e in data["queue"]["jobs"]] == [waiting]
    assert [v["id"] for v in data["running"]] == [running]
    rc, out, _ = await cli(env, "queue", "--start")
    assert [line.split()[0] for line in out.splitlines()[1:]] == [waiting]

    rc, out, _ = await cli(env, "jobs")
    assert rc == 0
    ids = [line.split()[0] for line in out.splitlines()[1:]]
    assert ids == [held, waiting, running, job_id]  # newest first, the finished one too
    rc, out, _ = await cli(env, "jobs", "--json", "--state", "completed")
    assert [v["id"] for v in json.loads(out)["jobs"]] == [job_id]

    rc, out, err = await cli(env, "cancel", waiting, running, held)
    assert rc == 0, err
    assert out.splitlines() == [
        f"{waiting}: cancelled",
        f"{running}: stopping",
        f"{held}: cancelled",
    ]
    await wait_job(alice, running, "cancelled")
    rc, _, err = await cli(env, "cancel", waiting)  # already ended: the service's 409
    assert rc == 2 and "already ended" in err
    # how each ended, where the exit code does not say it all
    rc, out, _ = await cli(env, "jobs")
    lines = out.splitlines()
    assert lines[0].split()[-3:] == ["HOW", "IT", "ENDED"]
    ending = {line.split()[0]: line.split("  ")[-1].strip() for line in lines[1:]}
    assert ending[running].startswith("cancelled by alice")
    assert ending[job_id] == "-"  # completed, exit code 0: nothing more to say


async def test_a_notebook_file_is_submitted_as_a_notebook_job(service, tmp_path):
    notebook = tmp_path / "analysis.ipynb"
    notebook.write_text(
        json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    )
    env = server_env(service, "alice")
    rc, out, err = await cli(
        env, "submit", "--json", "--gpus", "0", "--cpus", "1", "analysis.ipynb", cwd=tmp_path
    )
    assert rc == 0, err
    view = json.loads(out)
    assert view["notebook"] == str(notebook) and view["command"] is None
    assert view["cwd"] == str(tmp_path)
    rc, _, err = await cli(env, "submit", "missing.ipynb", cwd=tmp_path)
    assert rc == 2 and "no notebook missing.ipynb" in err


async def test_an_array_is_submitted_listed_as_one_row_and_cancelled_as_one(service):
    env = server_env(service, "alice")
    rc, out, err = await cli(env, "submit", "--array", "0-9%2", "sleep", "60")
    assert rc == 0, err
    array_id, count = out.split()[0], out.split()[1]
    assert array_id.startswith("a-") and count == "(10"
    alice = service.client("alice")

    async def two_running():
        _, answer = await alice.get("api/jobs?state=running")
        return len(answer["jobs"]) == 2

    await wait_until(two_running, what="two elements running")
    rc, out, _ = await cli(env, "queue")
    rows = out.splitlines()[1:]
    folded = [line for line in rows if line.startswith(array_id)]
    assert len(folded) == 1
    assert folded[0].split()[0] == f"{array_id}_[2-9%2]"
    assert f"array {array_id} is at its limit of 2" in folded[0]
    assert sum(1 for line in rows if "running" in line) == 2
    rc, out, _ = await cli(env, "jobs")
    assert f"{array_id}_9" in out
    rc, out, err = await cli(env, "cancel", array_id)
    assert rc == 0, err
    assert out.strip() == f"{array_id}: cancelled 10 jobs"
    rc, _, err = await cli(env, "cancel", array_id)
    assert rc == 2 and f"array {array_id}" in err
    rc, _, err = await cli(env, "submit", "--array", "9-0", "true")
    assert rc == 2 and "'array'" in err and "upwards" in err


async def test_nodes_and_usage(service):
    env = server_env(service, "alice")
    rc, out, err = await cli(env, "nodes")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["NODE", "MODEL", "GPUS", "FREE", "STATE", "LEAF"]
    assert {line.split()[0] for line in lines[1:5]} == {"gpu1", "gpu2", "l40s1", "l40s2"}
    assert "0 of 24 GPUs allocated" in out
    rc, out, _ = await cli(env, "nodes", "--json")
    assert json.loads(out)["total_gpus"] == 24
    rc, out, err = await cli(env, "usage")
    assert rc == 0, err
    assert out.startswith("alice: 0.0 GPU-hours in the last 30 days")
    assert any(line.split()[:2] == ["team", "*"] for line in out.splitlines())
    rc, out, _ = await cli(env, "usage", "--json", "--days", "7")
    data = json.loads(out)
    assert data["me"]["name"] == "alice"
    assert data["usage"]["until"] - data["usage"]["since"] == pytest.approx(7 * 86400)


async def test_queues_lists_every_queue_with_its_use_and_waiting_gpus(service):
    env = server_env(service, "alice")
    for _ in range(2):  # small's limit is 2 GPUs: the second waits
        rc, _, err = await cli(env, "submit", "--gpus", "2", "--queue", "small", "sleep 60")
        assert rc == 0, err
    rc, out, err = await cli(env, "queues")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].split() == [
        "QUEUE",
        "GUARANTEED",
        "LIMIT",
        "IN",
        "USE",
        "BORROWED",
        "WAITING",
        "WEIGHT",
    ]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert rows["root"][:3] == ["24", "-", "2"]
    assert rows["small"] == ["0", "2", "2", "2", "2", "1"]  # 2 borrowed above 0, 2 waiting
    assert rows["team"] == ["12", "24", "0", "1"]
    assert lines[[line.split()[0] for line in lines].index("small")].startswith("  small")
    rc, out, _ = await cli(env, "queues", "--json")
    small = {q["path"]: q for q in json.loads(out)}["small"]
    assert (small["running"], small["pending"]) == (2, 2)


async def test_outside_a_server_it_takes_url_and_the_hub_token(service):
    bare = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSCHED_", "JUPYTERHUB_"))}
    rc, _, err = await cli({**bare, "GPUSCHED_HUB_PORT": "9299"}, "queue")
    assert rc == 2 and "token" in err  # no token: a set-up to fix, said so
    env = {**bare, "JUPYTERHUB_API_TOKEN": TOKENS["bob"]}
    rc, out, err = await cli(env, "queue", "--url", service.url, "--me")
    assert rc == 0, err
    assert out.splitlines()[0].startswith("ID")


async def test_cancel_json_answers_the_apis_views(service):
    env = server_env(service, "alice")
    _, out, _ = await cli(env, "submit", "--hold", "true")
    job_id = out.strip()
    _, out, _ = await cli(env, "submit", "--hold", "--array", "0-1", "true")
    array_id = out.split()[0]
    rc, out, err = await cli(env, "cancel", "--json", job_id, array_id)
    assert rc == 0, err
    job, array = json.loads(out)
    assert (job["id"], job["state"]) == (job_id, "cancelled")
    assert array["array_id"] == array_id
    assert [v["state"] for v in array["jobs"]] == ["cancelled", "cancelled"]


async def test_exit_codes(service):
    env = server_env(service, "alice")
    rc, _, err = await cli(env, "submit", "--gpus", "99", "true")  # more than the cluster has
    assert rc == 2 and "can never run here" in err and "'gpus'" in err
    assert err.startswith("jupyter-gpusched submit: error: "), err  # the command, not its words
    rc, _, err = await cli(env, "submit", "--queue", "private", "true")  # carol's only
    assert rc == 2 and "may not submit" in err
    rc, _, err = await cli(env, "log", "j-999999")
    assert rc == 2 and "j-999999" in err
    rc, _, err = await cli(env, "cancel", "x-1")
    assert rc == 2 and "neither a job id" in err
    rc, _, _ = await cli(env, "submit")  # nothing to run: a usage error
    assert rc == 2
    rc, _, _ = await cli(env, "queue", "--no-such-option")
    assert rc == 2
    bad = {**env, "GPUSCHED_SERVICE_TOKEN": "not-a-token"}
    rc, _, err = await cli(bad, "queue")
    assert rc == 2  # 401/403: refused
    # nothing listens there: unreachable is a failure, not bad input
    rc, _, err = await cli(env, "queue", "--url", "http://127.0.0.1:9/")
    assert rc == 1 and "cannot reach" in err


async def test_estimate_asks_the_service_and_queues_nothing(service):
    env = server_env(service, "alice")
    rc, out, err = await cli(env, "estimate", "--gpus", "1")
    assert rc == 0, err
    assert out.startswith("starts now")
    rc, out, _ = await cli(env, "estimate", "--json", "--gpus", "2")
    assert json.loads(out)["start_now"] is True
    rc, _, err = await cli(env, "estimate", "--gpus", "99")
    assert rc == 2
    assert service.app.store.jobs() == []


async def test_deadlines_are_submitted_listed_and_refused_with_the_earliest_finish(service):
    env = server_env(service, "alice")
    argv = ("submit", "--json", "--walltime", "1h", "--deadline", "6h", "sleep", "60")
    rc, out, err = await cli(env, *argv)
    assert rc == 0, err
    job = json.loads(out)
    assert job["deadline"] > job["submit_time"] + 6 * 3600 - 1 and not job["deadline_missed"]
    rc, out, _ = await cli(env, "jobs")
    header, row = out.splitlines()[0].split(), out.splitlines()[1]
    assert header[header.index("STATE") + 1] == "DEADLINE"
    assert row.startswith(job["id"]) and when(job["deadline"]) in row, out
    rc, out, _ = await cli(env, "jobs", "--json")
    assert json.loads(out)["jobs"][0]["deadline"] == job["deadline"]
    for _ in range(2):  # every H100 busy, planned as 24 h each
        rc, _, err = await cli(env, "submit", "--gpus", "8", "--gpu-model", "H100", "sleep", "60")
        assert rc == 0, err
    h100 = ("--gpus", "8", "--gpu-model", "H100", "--walltime", "1h")
    rc, out, err = await cli(env, "submit", *h100, "--deadline", "3d", "true")
    assert rc == 0, err
    waiting = out.strip()
    rc, out, _ = await cli(env, "queue")
    assert "DEADLINE" in out.splitlines()[0]
    assert any(line.startswith(waiting) for line in out.splitlines()), out
    rc, out, _ = await cli(env, "queue", "--json")
    [entry] = json.loads(out)["queue"]["jobs"]
    assert entry["id"] == waiting and entry["deadline"] and entry["deadline_missed"] is False
    rc, _, err = await cli(env, "submit", *h100, "--deadline", "6h", "true")
    assert rc == 2 and "'deadline'" in err and "the earliest this job can finish is" in err, err
    rc, _, err = await cli(env, "estimate", *h100, "--deadline", "6h")
    assert rc == 2 and "cannot be met" in err, err
    rc, out, err = await cli(env, "estimate", "--walltime", "1h", "--deadline", "6h")
    assert rc == 0 and out.startswith("starts now; can finish at "), (out, err)
    rc, _, err = await cli(env, "submit", "--deadline", "2026-12-24T18:00", "true")
    assert rc == 2 and "no time zone" in err, err


def test_estimate_text_follows_the_contract():
    assert (
        estimate_text(
            {"start_now": True, "eta": None, "reason": None, "queue": "team", "position": None}
        )
        == "starts now (queue team)"
    )
    text = estimate_text(
        {
            "start_now": False,
            "eta": None,
            "reason": {
                "family": "policy",
                "detail": "queue-limit",
                "message": "queue small is at its limit",
                "eta": None,
            },
            "queue": "small",
            "position": 3,
        }
    )
    assert text == "waits: queue small is at its limit (#3 in line, queue small)"


def test_tables_cut_the_widest_column_with_an_ellipsis_and_never_wrap():
    reason = "the free GPUs it could use are reserved for job j-000001, which has priority " * 3
    out = table(["ID", "REASON"], [["j-000002", reason], ["j-000003", "short"]])
    lines = out.splitlines()
    assert len(lines) == 3 and all(len(line) <= TABLE_WIDTH for line in lines)
    assert lines[1].endswith("…") and lines[2].endswith("short")
    assert lines[1].startswith("j-000002  the free GPUs")
