"""Jobs submitted from a notebook cell under a real hub, as ``make demo`` runs it: JupyterHub,
configurable-http-proxy, the scheduler service, GPUSchedSpawner and alice's real single-user
server and kernel (the demo cluster and queues, simulated GPUs). As root, her server, her kernel
and her jobs run as her own Unix account.

In the kernel (over its websocket, as JupyterLab sends cells): ``%%gpujob`` with a two-line
script, ``client.submit(command=...)``, ``client.submit(function=lambda: 6 * 7)`` and
``client.submit(notebook=...)`` all end ``completed``, as alice (her uid, checked inside each
job), in the kernel's working directory, with a log she can read through the API; they run
``"$GPUSCHED_PYTHON"``, the launcher's choice, not the kernel's interpreter. A kernel whose
working directory alice can no longer enter still gets its ``%%gpujob`` run, in her home.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import re

import hub_harness
import pytest
import requests
import test_spawner as ts
from kernel_ws import run_cell

DEMO = hub_harness.ROOT / "hub_config"
JOB_TIMEOUT = 120  # seconds a job may take in the kernel (a notebook job starts a kernel)


@pytest.fixture(scope="module")
def hub():
    cluster = str(DEMO / "demo-cluster.yaml")
    env = {
        "GPUSCHED_CLUSTER_FILE": cluster,
        "GPUSCHED_QUEUE_FILE": str(DEMO / "demo-queues.yaml"),
        "GPUSCHED_GPU_BACKEND": "simulated",  # as make demo
        "GPUSCHED_SIM_CLUSTER": cluster,
    }
    with hub_harness.running_hub(env=env) as running:
        yield running
        ts.stop_every_server(running)


@pytest.fixture(scope="module")
def kernel(hub):
    """alice's 1-GPU server (the demo's default profile) and a kernel in it."""
    ts.start_server(hub, "alice", "gpu-1")
    url = hub.url + "/user/alice/api/kernels"
    headers = {"Authorization": f"token {hub.token('alice')}"}
    response = requests.post(url, json={"name": "python3"}, headers=headers, timeout=30)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def execute(hub, kernel_id: str, code: str, timeout: float = JOB_TIMEOUT) -> str:
    """Run ``code`` in alice's kernel; what it printed (the cell must succeed)."""
    ws_url = hub.url.replace("http", "ws", 1) + f"/user/alice/api/kernels/{kernel_id}/channels"
    reply, shown = asyncio.run(run_cell(ws_url, hub.token("alice"), code, timeout))
    assert reply["status"] == "ok", shown
    return shown


def job_of_alice(hub, job_id: str) -> tuple[dict, str]:
    """The job as alice sees it, and its log (which she must be able to read)."""
    token = hub.token("alice")
    view = hub.service("GET", f"api/jobs/{job_id}", token)
    assert view.status_code == 200, view.text
    log = hub.service("GET", f"api/jobs/{job_id}/log", token)
    assert log.status_code == 200, log.text
    return view.json(), log.text


def alice() -> tuple[int, str]:
    # a hub that is not root runs everything as its own user
    entry = pwd.getpwnam("alice") if os.geteuid() == 0 else pwd.getpwuid(os.geteuid())
    return entry.pw_uid, entry.pw_name


def test_gpujob_and_every_kind_of_submit_run_as_the_user(hub, kernel):
    uid, account = alice()
    workdir = execute(
        hub,
        kernel,
        "import os, uuid\n"
        "os.chdir(os.path.expanduser('~'))\n"
        "work = os.path.abspath(f'gpusched-jobs-test-{uuid.uuid4().hex[:8]}')\n"
        "os.mkdir(work)\n"
        "os.chdir(work)\n"
        "print(work)\n",
    ).strip()
    try:
        execute(hub, kernel, "%load_ext jupyter_gpusched")
        shown = execute(
            hub, kernel, "%%gpujob --wait --name two-lines\nimport os\nprint('uid', os.getuid())\n"
        )
        cell_id = re.search(r"Submitted (j-\d+)", shown).group(1)
        assert f"{cell_id}: completed" in shown, shown
        assert f"uid {uid}" in shown  # --wait printed the job's output in the cell

        shown = execute(
            hub,
            kernel,
            "import json, nbformat\n"
            "from jupyter_gpusched import client\n"
            "out = {}\n"
            "job = client.submit(command='id -u; pwd', gpus=1, name='command')\n"
            "out['command'] = [job.id, job.wait(120)]\n"
            "job = client.submit(function=lambda: 6 * 7, gpus=1)\n"
            "out['function'] = [job.id, job.result(120)]\n"
            "job = client.submit(function=os.getuid, gpus=1)\n"
            "out['function uid'] = [job.id, job.result(120)]\n"
            "cell = nbformat.v4.new_code_cell(\n"
            '    \'import os\\nopen("notebook-uid.txt", "w").write(str(os.getuid()))\')\n'
            "nbformat.write(nbformat.v4.new_notebook(cells=[cell]), 'uid.ipynb')\n"
            "job = client.submit(notebook='uid.ipynb', gpus=1)\n"
            "out['notebook'] = [job.id, job.wait(120), open('notebook-uid.txt').read()]\n"
            "print(json.dumps(out))\n",
        )
        out = json.loads(shown.strip().splitlines()[-1])
        assert out["command"][1] == "completed", out
        assert out["function"][1] == 42
        assert out["function uid"][1] == uid  # the function ran as alice
        assert out["notebook"][1:] == ["completed", str(uid)]  # the notebook's kernel too

        for name, job_id in [("cell", cell_id)] + [(key, value[0]) for key, value in out.items()]:
            view, log = job_of_alice(hub, job_id)
            assert view["state"] == "completed", (name, view)
            assert view["cwd"] == workdir, (name, view)  # the kernel's working directory
            assert f" as {account}: CUDA_VISIBLE_DEVICES=" in log, (name, log)
            if view.get("command") and name != "command":  # the launcher's Python, no other
                assert view["command"].startswith('"$GPUSCHED_PYTHON" -u '), (name, view)
        _, log = job_of_alice(hub, out["command"][0])
        assert f"\n{uid}\n{workdir}\n" in log
        _, log = job_of_alice(hub, cell_id)
        assert f"uid {uid}\n" in log
    finally:
        execute(hub, kernel, f"import shutil; os.chdir('/'); shutil.rmtree({workdir!r})")


def test_a_working_directory_the_job_cannot_enter_falls_back_to_home(hub, kernel):
    _, account = alice()
    home = pwd.getpwnam(account).pw_dir if os.geteuid() == 0 else None
    shown = execute(
        hub,
        kernel,
        "import os, tempfile\n"
        "os.chdir(os.path.expanduser('~'))\n"
        "closed = tempfile.mkdtemp(prefix='gpusched-closed-', dir=os.getcwd())\n"
        "os.chdir(closed)\n"
        "os.chmod('.', 0)  # the kernel is still in it; nobody of alice's may enter it\n"
        "print(os.path.expanduser('~'))\n",
    )
    home = home or shown.strip()
    cell_file = None
    try:
        execute(hub, kernel, "%load_ext jupyter_gpusched")
        shown = execute(hub, kernel, "%%gpujob --wait\nimport os\nprint('in', os.getcwd())\n")
        job_id = re.search(r"Submitted (j-\d+)", shown).group(1)
        cell_file = re.search(r"the cell is in (\S+)", shown).group(1)
        assert cell_file.startswith(f"{home}/.gpusched/cell-"), shown
        assert "it runs in your home directory" in shown, shown  # the warning
        view, log = job_of_alice(hub, job_id)
        assert view["state"] == "completed" and view["cwd"] == home, view
        assert f"in {home}\n" in log
    finally:
        cleanup = "os.chmod(closed, 0o700); os.chdir(os.path.expanduser('~')); os.rmdir(closed)"
        if cell_file:  # this test's cell, in alice's real home
            cleanup += f"; os.remove({cell_file!r})"
        execute(hub, kernel, cleanup)


def test_gpujob_estimate_and_client_estimate_print_it_and_submit_nothing(hub, kernel):
    """In alice's kernel (her server holds 1 of the 8 H100; research/vision's limit is 8):
    ``%%gpujob --estimate`` and ``client.estimate`` print the scheduler's estimate, and no job
    appears."""
    token = hub.token("alice")
    before = hub.service("GET", "api/jobs", token).json()["jobs"]
    execute(hub, kernel, "%load_ext jupyter_gpusched")
    shown = execute(hub, kernel, "%%gpujob --estimate --gpus 4\nprint('never run')\n")
    assert shown == "%%gpujob: starts now (queue research/vision)\n", shown
    shown = execute(
        hub,
        kernel,
        "from jupyter_gpusched import client\n"
        "print(client.estimate(command='python train.py', gpus=4))\n"
        "print(client.estimate(command='python train.py', gpus=8))\n",
    )
    now, later = shown.splitlines()
    assert now == "starts now", shown
    # expected once her server's planned run ends (core/plan.py), and why it waits till then
    assert later.startswith("about ") and "research/vision" in later, shown
    assert hub.service("GET", "api/jobs", token).json()["jobs"] == before


def test_the_command_line_in_the_server_needs_no_set_up_and_submits_an_array(hub, kernel):
    """A terminal of alice's server has the environment the kernel has (the server's): the
    ``jupyter-gpusched`` user commands find the service and her token without an option. An
    array's jobs each see their GPUSCHED_ARRAY_INDEX, and run as alice."""
    uid, account = alice()
    shown = execute(
        hub,
        kernel,
        "import json, os, subprocess, sys, time\n"
        "os.chdir(os.path.expanduser('~'))\n"
        "def run(*argv):  # python -m jupyter_gpusched: the jupyter-gpusched command\n"
        "    command = [sys.executable, '-m', 'jupyter_gpusched', *argv]\n"
        "    done = subprocess.run(command, capture_output=True, text=True)\n"
        "    return done.returncode, done.stdout, done.stderr\n"
        "out = {'submit': run('submit', '--json', '--array', '0-2%1', '--gpus', '1',\n"
        "                     'echo index=$GPUSCHED_ARRAY_INDEX uid=$(id -u)')}\n"
        "answer = json.loads(out['submit'][1])\n"
        "ids = [job['id'] for job in answer['jobs']]\n"
        "deadline = time.monotonic() + 120\n"
        "while time.monotonic() < deadline:\n"
        "    rc, text, err = run('jobs', '--json')\n"
        "    states = {v['id']: v['state'] for v in json.loads(text)['jobs'] if v['id'] in ids}\n"
        "    if set(states.values()) == {'completed'}:\n"
        "        break\n"
        "    time.sleep(0.5)\n"
        "out['states'] = states\n"
        "out['array_id'] = answer['array_id']\n"
        "out['ids'] = ids\n"
        "out['queue'] = run('queue', '--me')\n"
        "out['bad'] = run('cancel', 'nonsense')\n"
        "print(json.dumps(out))\n",
        timeout=JOB_TIMEOUT + 30,
    )
    out = json.loads(shown.strip().splitlines()[-1])
    assert out["submit"][0] == 0, out["submit"]
    assert set(out["states"].values()) == {"completed"}, out
    assert out["queue"][0] == 0 and out["queue"][1].startswith("ID"), out["queue"]
    assert out["bad"][0] == 2 and "neither a job id" in out["bad"][2]
    for index, job_id in enumerate(out["ids"]):
        view, log = job_of_alice(hub, job_id)
        assert (view["array_id"], view["array_index"]) == (out["array_id"], index)
        assert f"index={index} uid={uid}\n" in log, log
        assert f" as {account}: " in log
