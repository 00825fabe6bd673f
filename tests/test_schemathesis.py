"""Schemathesis against the live service behind a real JupyterHub, from ``api/openapi.json``.

The hub of ``hub_harness`` (hub, configurable-http-proxy, the service; ``hub_config/``) serves
the document; Schemathesis' own command line (``schemathesis run``, config
``tests/schemathesis.toml``, hooks ``tests/schemathesis_hooks.py``) loads it through the proxy
and runs every phase (examples, coverage, fuzzing, stateful: a submitted job's links) in both
data generation modes: *positive* (what the document allows: accepted) and *negative* (what it
forbids: refused with a 4xx), with all its checks: no 5xx, documented status, content type,
headers and body, negative data rejected, positive data accepted, missing or bad auth refused,
undeclared methods 405 with ``Allow``, use after free, resource availability. Any failure fails
the test, with Schemathesis' report of it.

alice (a user) calls the users' operations, admin (the ``custom:gpusched:admin`` scope, through
the role ``gpusched-admin``) the admins' ones, with tokens the hub issued.

``HYPOTHESIS_PROFILE=ci`` (``.ci/run``): :data:`EXAMPLES` cases per operation; set
``GPUSCHED_SCHEMATHESIS_EXAMPLES`` for a quicker (or longer) run by hand.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import hub_harness
import pytest

hub = hub_harness.hub  # the fixture: a running hub, module scope

HERE = Path(__file__).resolve().parent
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "dev")
EXAMPLES = {"ci": 200, "thorough": 1000}.get(PROFILE, 50)
EXAMPLES = int(os.environ.get("GPUSCHED_SCHEMATHESIS_EXAMPLES") or EXAMPLES)
TIMEOUT = 1200  # seconds: the whole run (about 3 minutes under the ci profile)


def test_schemathesis_finds_nothing(hub, tmp_path):
    tokens = {"GPUSCHED_USER_TOKEN": hub.token("alice"), "GPUSCHED_ADMIN_TOKEN": hub.token("admin")}
    env = {
        **os.environ,
        **tokens,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
    }
    report = tmp_path / "report.json"
    command = [
        str(Path(sys.executable).parent / "schemathesis"),
        "--config-file",
        str(HERE / "schemathesis.toml"),
        "--no-color",
        "run",
        hub.service_url + "api/openapi.json",
        "--checks",
        "all",
        "--exclude-checks",  # replaced by the hooks' positive_data_acceptance_here
        "positive_data_acceptance",
        "--max-examples",
        str(EXAMPLES),
        "--workers",  # one: CPython 3.11's ast (Hypothesis reads lambdas with it) is not
        "1",  # thread-safe ("AST constructor recursion depth mismatch")
        "--seed",
        os.environ.get("GPUSCHED_SCHEMATHESIS_SEED", "1"),
        "--generation-database",
        "none",
        "--report",
        "json",
        "--report-json-path",
        str(report),
    ]
    started = time.monotonic()
    done = subprocess.run(  # in tmp_path: its cache (.schemathesis/) stays out of the tree
        command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT
    )
    took = time.monotonic() - started
    output = done.stdout + done.stderr
    print(output[-6000:])
    print(f"schemathesis: {took:.0f} s")
    if done.returncode != 0:
        pytest.fail(f"schemathesis exited with {done.returncode}:\n{output[-20000:]}")
    summary = json.loads(report.read_text())
    print(json.dumps({k: v for k, v in summary.items() if not isinstance(v, (dict, list))}))

    # the service is still well, and no generated job was left holding GPUs
    deadline = time.monotonic() + 20
    while True:
        cluster = hub.service("GET", "api/cluster", tokens["GPUSCHED_USER_TOKEN"])
        assert cluster.status_code == 200, cluster.text
        if not cluster.json()["allocated_gpus"] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert cluster.json()["allocated_gpus"] == 0, cluster.json()
