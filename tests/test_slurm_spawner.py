"""GPUSchedSlurmSpawner: notebook servers spawned through a real JupyterHub run as Slurm jobs on
the nodes the scheduler chose, against the real test Slurm (``scripts/slurm.sh``: nodes n1 and
n2, 4 fake GPUs each; skipped without Slurm, failed with ``GPUSCHED_REQUIRE_SLURM=1``).

- a server spawned with a profile is a Slurm job ``gpusched-<job id>`` on the allocated node,
  answers through the hub's proxy, and a second server goes to the other node; stopping them
  ends the Slurm jobs and gives the GPUs back to the scheduler;
- a job Slurm keeps pending (its node drained in Slurm only) fails the spawn with Slurm's reason
  after ``pending_timeout``, and the scheduler's job is released;
- a restarted hub finds its servers' Slurm jobs again;
- the job script and sbatch options, without Slurm.

The hub is ``hub_config/jupyterhub_config.py`` (as in test_spawner.py) with
``spawner_class = "gpusched-slurm"``, the scheduler's cluster file read from Slurm's nodes, and
the servers run as the hub's user (``run_as_hub_user``, as in the demo).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import time
from pathlib import Path

import hub_harness
import psutil
import pytest
import requests
import yaml
from test_spawner import (
    RELEASED,
    HubRunner,
    Progress,
    free_gpus,
    module_hub,
    servers_of,
    service_job,
    spawner_state,
    start_in_background,
    start_server,
    stop_every_server,
    stop_server,
    wait_free,
    wait_gone,
    wait_pending,
    wait_ready,
)

from jupyter_gpusched.backends.slurm.inventory import cluster_document

QUEUES = """\
queues:
  a: {guaranteed: 4, limit: 8, users: [alice]}
  b: {guaranteed: 4, limit: 8, users: [bob]}
  sandbox: {guaranteed: 0, limit: 8, users: [carol, admin]}
"""
SLURM_CONFIG = """
# -- added by tests/test_slurm_spawner.py
c.JupyterHub.spawner_class = "gpusched-slurm"
c.GPUSchedSlurmSpawner.slurm_conf = {conf!r}
c.GPUSchedSlurmSpawner.pending_timeout = 8
c.GPUSchedSlurmSpawner.stop_grace = 5
c.GPUSchedSpawner.profiles = [
    {{"display_name": "A node on Slurm", "slug": "slurm-4", "gpus": 4}},
    {{"display_name": "1 GPU on Slurm", "slug": "slurm-1", "gpus": 1}},
]
c.GPUSchedSpawner.queue_poll_interval = 0.3
c.Spawner.http_timeout = 90
"""
# carol's servers run as carol (the production way: run_as_hub_user False, the hub as root). The
# venv's server is not hers to run (it lives under /root): hers is a tiny HTTP server, from her
# home, on the port the spawner chose, that says who and where it is.
AS_CAROL = r"""
def _carol_as_herself(spawner):
    if spawner.user.name == "carol":
        spawner.run_as_hub_user = False
        spawner.cmd = ["/bin/sh", "-c", (
            'p=${JUPYTERHUB_SERVICE_URL#*//}; p=${p#*:}; p=${p%%/*}; '
            'echo "I am $(id -un) in $(pwd), HOME=$HOME"; '
            'cd "$(mktemp -d)" && mkdir -p user/carol && '
            'echo "$(id -un) on $SLURMD_NODENAME" > user/carol/index.html && '
            'exec /usr/bin/python3 -m http.server --bind 0.0.0.0 "$p"'
        )]
c.Spawner.pre_spawn_hook = _carol_as_herself
"""
TIMEOUT = 120.0  # a server's start: Slurm, then jupyterhub-singleuser on a loaded machine


class SlurmHubRunner(HubRunner):
    """test_spawner's hub, with the Slurm spawner and a cluster file read from Slurm."""

    def __init__(self, slurm):
        super().__init__()
        cluster = cluster_document({"nodes": "slurm", "slurm": {"slurm_conf": slurm.conf}})
        for variable, text in (("CLUSTER", yaml.safe_dump(cluster)), ("QUEUE", QUEUES)):
            path = hub_harness.readable_file(self.state_dir, f"slurm-{variable.lower()}.yaml", text)
            self.env[f"GPUSCHED_{variable}_FILE"] = str(path)
        generated = hub_harness.GENERATED_CONFIG.format(
            config=str(hub_harness.HUB_CONFIG),
            harness=hub_harness.HARNESS,
            token=self.harness_token,
        )
        self.config.write_text(generated + SLURM_CONFIG.format(conf=slurm.conf) + AS_CAROL)


@pytest.fixture(scope="module")
def slurm_hub(slurm_cluster):
    slurm_cluster.reset()
    with module_hub(lambda: SlurmHubRunner(slurm_cluster), scan=False, servers_left=False) as hub:
        yield hub


@pytest.fixture
def hub(slurm_hub, slurm):
    # Slurm keeps ended jobs a while, and other tests' services name theirs gpusched-j-000001
    # too: a test looks only at the Slurm jobs submitted after it began
    slurm.before_test = set(slurm.jobs())
    yield slurm_hub.hub
    stop_every_server(slurm_hub.hub)
    wait_free(slurm_hub.hub, 8, timeout=15)


# -- helpers -------------------------------------------------------------------------------------
def slurm_job_of(slurm, job_id: str) -> tuple[str, tuple[str, str, str]]:
    """(Slurm job id, (name, state, nodes)) of the scheduler job's server."""
    old = getattr(slurm, "before_test", set())
    found = [
        (j, v) for j, v in slurm.jobs().items() if v[0] == f"gpusched-{job_id}" and j not in old
    ]
    assert len(found) == 1, f"Slurm jobs named gpusched-{job_id}: {found} of {slurm.jobs()}"
    return found[0]


def wait_slurm_ended(slurm, slurm_id: str, timeout=30.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        job = slurm.jobs().get(slurm_id)
        if job is None or job[1] not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"):
            return job[1] if job else "gone"
        assert time.monotonic() < deadline, f"Slurm job {slurm_id} still {job}"
        time.sleep(0.2)


def server_env(job_id: str, slurm_id: str) -> dict:
    """The environment of the server of scheduler job ``job_id``, Slurm job ``slurm_id`` (the
    Slurm nodes are this host): jupyterhub-singleuser under slurmstepd."""
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if any("jupyterhub-singleuser" in part for part in process.info["cmdline"] or []):
                env = process.environ()
                if (env.get("GPUSCHED_JOB_ID"), env.get("SLURM_JOB_ID")) == (job_id, slurm_id):
                    return env
    raise AssertionError(f"no server process of {job_id}")


def answers_through_the_proxy(hub, user: str, name: str = "") -> None:
    server = servers_of(hub, user)[name]
    response = requests.get(
        hub.url + server["url"] + "api/status",
        headers={"Authorization": f"token {hub.token(user)}"},
        timeout=10,
    )
    assert response.status_code == 200, response.text


def server_on_slurm(hub, slurm, user: str) -> tuple[str, str, str]:
    """Check that the user's server is a running Slurm job named after its scheduler job, on
    the node the engine allocated; returns (scheduler job id, Slurm job id, node)."""
    state = spawner_state(hub, user)
    job_id = state["gpusched"]["job_id"]
    job = service_job(hub, user, job_id)
    assert job["state"] == "running" and job["kind"] == "notebook", job
    (part,) = job["allocation"]
    slurm_id, (_, slurm_state, nodes) = slurm_job_of(slurm, job_id)
    assert state["slurm"]["job_id"] == slurm_id and state.get("pid", 0) == 0, state
    assert (slurm_state, nodes) == ("RUNNING", part["node"]), slurm.jobs()
    fields = slurm.job(slurm_id)
    assert "gpu:4" in fields.get("TresPerNode", "") + fields.get("TRES", ""), fields
    assert fields["Requeue"] == "0", fields
    return job_id, slurm_id, part["node"]


# -- the tests -----------------------------------------------------------------------------------
def test_servers_run_as_slurm_jobs_on_the_allocated_nodes(hub, slurm):
    start_server(hub, "alice", "slurm-4", wait=False)
    wait_ready(hub, "alice", timeout=TIMEOUT)
    alice_job, alice_slurm, alice_node = server_on_slurm(hub, slurm, "alice")
    answers_through_the_proxy(hub, "alice")
    log = Path(spawner_state(hub, "alice")["slurm"]["log"])
    assert log.name == f"{alice_job}.log" and log.parent.name == ".jupyter-gpusched"
    header = log.read_text()
    assert f"job {alice_job}: Slurm job {alice_slurm} on {alice_node}" in header, header
    assert free_gpus(hub) == 4
    env = server_env(alice_job, alice_slurm)  # Slurm's GPUs (the node's 4), not the engine's
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    assert env["SLURMD_NODENAME"] == env["GPUSCHED_NODE"] == alice_node
    assert env["GPUSCHED_GPUS"] == "4" and env["JUPYTERHUB_USER"] == "alice"
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3" in header

    # the other node's 4 GPUs: bob's server goes there, while alice's holds hers
    start_server(hub, "bob", "slurm-4", wait=False)
    wait_ready(hub, "bob", timeout=TIMEOUT)
    bob_job, bob_slurm, bob_node = server_on_slurm(hub, slurm, "bob")
    assert {alice_node, bob_node} == {"n1", "n2"}
    answers_through_the_proxy(hub, "bob")
    assert free_gpus(hub) == 0

    stop_server(hub, "alice")  # scancel --signal=TERM: the server shuts down, the job ends
    assert wait_slurm_ended(slurm, alice_slurm) in ("COMPLETED", "CANCELLED", "gone")
    assert service_job(hub, "alice", alice_job)["state"] in RELEASED
    wait_free(hub, 4)
    answers_through_the_proxy(hub, "bob")  # untouched
    stop_server(hub, "bob")
    assert wait_slurm_ended(slurm, bob_slurm) in ("COMPLETED", "CANCELLED", "gone")
    assert service_job(hub, "bob", bob_job)["state"] in RELEASED
    wait_free(hub, 8)


def test_a_server_slurm_keeps_pending_fails_the_spawn_and_frees_the_gpus(hub, slurm):
    start_server(hub, "alice", "slurm-4", wait=False)
    wait_ready(hub, "alice", timeout=TIMEOUT)
    _, _, alice_node = server_on_slurm(hub, slurm, "alice")
    other = ({"n1", "n2"} - {alice_node}).pop()
    slurm.set_node(other, "drain")  # in Slurm only: the engine still places there

    post = start_in_background(hub, "bob", "slurm-4")
    wait_pending(hub, "bob")
    progress = Progress(hub, "bob")
    post.join(TIMEOUT)
    progress.join(30)
    message = progress.events[-1]["message"]
    assert progress.events[-1].get("failed"), progress.events
    assert f"Slurm did not start your server on {other} within 8 s" in message, message
    assert "ReqNodeNotAvail" in message and "went back to the scheduler" in message, message
    job_ids = {(e.get("gpusched") or {}).get("job_id") for e in progress.events} - {None}
    (bob_job,) = job_ids
    assert service_job(hub, "bob", bob_job)["state"] in RELEASED  # its GPUs are free again
    _, (_, state, _) = slurm_job_of(slurm, bob_job)
    assert state == "CANCELLED"
    wait_gone(hub, "bob")
    assert free_gpus(hub) == 4  # only alice's
    answers_through_the_proxy(hub, "alice")


def test_a_restarted_hub_finds_its_servers_slurm_jobs(slurm_hub, hub, slurm):
    start_server(hub, "alice", "slurm-1", wait=False)
    wait_ready(hub, "alice", timeout=TIMEOUT)
    before = spawner_state(hub, "alice")
    slurm_id = before["slurm"]["job_id"]

    slurm_hub.stop_keeping_servers()
    assert slurm.jobs()[slurm_id][1] == "RUNNING"
    hub = slurm_hub.start()

    server = wait_ready(hub, "alice", timeout=TIMEOUT)
    assert server["state"]["slurm"] == before["slurm"]
    assert server["state"]["gpusched"]["job_id"] == before["gpusched"]["job_id"]
    answers_through_the_proxy(hub, "alice")  # routed again through the proxy
    assert free_gpus(hub) == 7
    stop_server(hub, "alice")
    assert wait_slurm_ended(slurm, slurm_id) in ("COMPLETED", "CANCELLED", "gone")
    wait_free(hub, 8)


@pytest.mark.skipif(os.geteuid() != 0, reason="submitting as the user needs a root hub")
def test_a_root_hub_runs_the_server_as_the_users_account(hub, slurm):
    carol = pwd.getpwnam("carol")
    start_server(hub, "carol", "slurm-1", wait=False)
    wait_ready(hub, "carol", timeout=TIMEOUT)
    state = spawner_state(hub, "carol")
    slurm_id, (_, slurm_state, node) = slurm_job_of(slurm, state["gpusched"]["job_id"])
    assert slurm_state == "RUNNING" and slurm.job(slurm_id)["UserId"].startswith("carol(")
    log = Path(state["slurm"]["log"])
    assert log.parent == Path(carol.pw_dir) / ".jupyter-gpusched"
    assert log.stat().st_uid == carol.pw_uid and log.parent.stat().st_uid == carol.pw_uid
    wait_log = time.monotonic() + 30
    while "I am carol" not in log.read_text():
        assert time.monotonic() < wait_log, log.read_text()
        time.sleep(0.2)
    assert f"I am carol in {carol.pw_dir}, HOME={carol.pw_dir}" in log.read_text()
    response = requests.get(hub.url + servers_of(hub, "carol")[""]["url"], timeout=10)
    assert response.status_code == 200 and response.text.strip() == f"carol on {node}"
    stop_server(hub, "carol")
    assert wait_slurm_ended(slurm, slurm_id) in ("COMPLETED", "CANCELLED", "FAILED", "gone")


# -- without Slurm -------------------------------------------------------------------------------
class FakeUser:
    name = "carol"
    groups = ()


def test_the_job_script_and_sbatch_options():
    from jupyter_gpusched.hub.slurm_spawner import GPUSchedSlurmSpawner

    spawner = GPUSchedSlurmSpawner(
        user=FakeUser(), partition="gpu", extra_args=["--time=8:00:00"], bin_dir="/opt/slurm/bin"
    )
    spawner.job_id = "j-000042"
    args = spawner.sbatch_args("n2", 2, "/home/carol/.jupyter-gpusched/j-000042.log", "/home/c")
    for option in (
        "--job-name=gpusched-j-000042",
        "--nodelist=n2",
        "--nodes=1",
        "--ntasks=1",
        "--gres=gpu:2",
        "--no-requeue",
        "--export=NONE",
        "--output=/home/carol/.jupyter-gpusched/j-000042.log",
        "--partition=gpu",
        "--time=8:00:00",
    ):
        assert option in args, args
    cpu_only = spawner.sbatch_args("n2", 0, "/home/carol/j.log", "/home/c")  # a gpus: 0 profile
    assert "--nodelist=n2" in cpu_only and not any("gres" in a for a in cpu_only), cpu_only
    script = spawner.job_script({"JUPYTERHUB_API_TOKEN": "s3cr3t x", "PATH": "/usr/bin"}, ["a b"])
    assert "export JUPYTERHUB_API_TOKEN='s3cr3t x'" in script
    assert "CUDA_VISIBLE_DEVICES=" not in script.replace("=$CUDA_VISIBLE_DEVICES", "")
    assert script.splitlines()[-1] == (
        "exec /opt/slurm/bin/srun --export=ALL --nodes=1 --ntasks=1 --kill-on-bad-exit=1 'a b'"
    )
    with pytest.raises(Exception, match="not valid"):
        spawner.job_script({"BAD NAME": "x"}, ["x"])


def test_the_state_keeps_the_slurm_job():
    from jupyter_gpusched.hub.slurm_spawner import GPUSchedSlurmSpawner

    spawner = GPUSchedSlurmSpawner(user=FakeUser())
    spawner.job_id, spawner.allocation = "j-000007", [{"node": "n1", "gpus": [0]}]
    spawner.slurm_job_id, spawner.slurm_job_name = "1234", "gpusched-j-000007"
    spawner.slurm_node, spawner.slurm_log = "n1", "/tmp/x.log"
    state = spawner.get_state()
    assert "pid" not in state and state["slurm"]["job_id"] == "1234"
    restored = GPUSchedSlurmSpawner(user=FakeUser())
    restored.load_state(state)
    assert restored.server_started() and restored.slurm_node == "n1"
    assert restored.job_id == "j-000007" and restored.slurm_job_name == "gpusched-j-000007"
    restored.clear_state()
    assert restored.get_state() == {} and not restored.server_started()
