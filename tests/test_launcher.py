"""LocalLauncher with real processes: environment, logs, notebooks, stopping, restarts, accounts."""

import json
import os
import pwd
import signal
import time

import nbformat
import psutil
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from jupyter_gpusched.backends.local.launcher import LaunchError, LaunchSpec, LocalLauncher

#: The hub user of most jobs here. They run as our own account, as the service's jobs do with
#: run_as_submitting_user = False; a hub user named like us would be refused when we are root
#: (AccountPolicy.denied_users).
HUB_USER = "gpusched-test"


def own_launcher(**traits) -> LocalLauncher:
    """A launcher whose jobs run as this process's account."""
    return LocalLauncher(run_as_submitting_user=False, **traits)


def spec(tmp_path, command=None, notebook=None, *, job_id="j1", gpus=(), env=None, **more):
    fields = dict(job_id=job_id, user=HUB_USER, command=command, notebook=notebook)
    fields["gpus"] = list(gpus)
    fields.update(env=env or {}, cwd=None, log_dir=str(tmp_path / "logs"))
    fields.update(more)
    return LaunchSpec(**fields)


def wait_exit(launcher, handle, timeout=30.0):
    deadline = time.monotonic() + timeout
    while (exit := launcher.poll(handle)) is None:
        assert time.monotonic() < deadline, "the job did not end"
        time.sleep(0.05)
    return exit


def wait_for(predicate, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def group_members(pgid):
    """Live (non-zombie) processes in process group ``pgid``."""
    members = []
    for process in psutil.process_iter():
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return members


def gone(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def read_log(launcher, handle):
    with open(launcher.log_path(handle)) as file:
        return file.read()


def test_command_gets_its_gpus_and_env_but_not_the_services(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVICE_SECRET", "s3cret")
    launcher = own_launcher()
    command = (
        'echo "cvd=[$CUDA_VISIBLE_DEVICES] job=$GPUSCHED_JOB_ID '
        'secret=${SERVICE_SECRET-unset} mine=$MINE home=$HOME"'
    )
    env = {"GPUSCHED_JOB_ID": "j1", "MINE": "yes", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    handle = launcher.start(spec(tmp_path, command, gpus=[0, 3], env=env))
    exit = wait_exit(launcher, json.loads(json.dumps(handle)))
    assert (exit.code, exit.outcome, exit.message) == (0, "completed", "exit code 0")
    log = read_log(launcher, handle)
    home = pwd.getpwuid(os.geteuid()).pw_dir
    assert f"cvd=[0,3] job=j1 secret=unset mine=yes home={home}" in log
    assert "CUDA_VISIBLE_DEVICES='0,3'" in log.splitlines()[0]  # the run's header line


def test_no_gpus_means_an_empty_cuda_visible_devices(tmp_path):
    launcher = own_launcher()
    handle = launcher.start(spec(tmp_path, 'echo "cvd=[${CUDA_VISIBLE_DEVICES-unset}]"'))
    assert wait_exit(launcher, handle).outcome == "completed"
    assert "cvd=[]" in read_log(launcher, handle)


def test_nonzero_exit_is_failed_and_a_requeued_run_appends(tmp_path):
    launcher = own_launcher()
    first = launcher.start(spec(tmp_path, "echo first-run; exit 3"))
    exit = wait_exit(launcher, first)
    assert (exit.code, exit.outcome, exit.message) == (3, "failed", "exit code 3")
    second = launcher.start(spec(tmp_path, "echo second-run"))
    assert wait_exit(launcher, second).outcome == "completed"
    log = read_log(launcher, second)
    assert log.index("first-run") < log.index("second-run")
    assert log.count("CUDA_VISIBLE_DEVICES=") == 2  # one header per run


def write_notebook(path, *sources):
    notebook = new_notebook(cells=[new_code_cell(source) for source in sources])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nbformat.write(notebook, str(path))
    return str(path)


@pytest.fixture(scope="module")
def notebook_jobs(tmp_path_factory):
    """Two notebook jobs, started together (a kernel takes seconds to start)."""
    tmp_path = tmp_path_factory.mktemp("notebooks")
    good = write_notebook(
        tmp_path / "good.ipynb", "import os", "print('cvd=' + os.environ['CUDA_VISIBLE_DEVICES'])"
    )
    bad = write_notebook(tmp_path / "bad.ipynb", "raise ValueError('boom')", "print('never')")
    slow = write_notebook(tmp_path / "slow.ipynb", "import time; time.sleep(60)")
    launcher = own_launcher()
    handles = {
        "good": launcher.start(spec(tmp_path, notebook=good, job_id="good", gpus=[2])),
        "bad": launcher.start(spec(tmp_path, notebook=bad, job_id="bad")),
        "slow": launcher.start(spec(tmp_path, notebook=slow, job_id="slow")),
    }
    yield launcher, handles
    for handle in handles.values():
        if launcher.alive(handle):
            os.killpg(handle["pgid"], signal.SIGKILL)


def test_notebook_runs_and_its_output_is_saved(notebook_jobs):
    launcher, handles = notebook_jobs
    handle = handles["good"]
    assert handle["notebook_output"].endswith("good.out.ipynb")
    exit = wait_exit(launcher, handle)
    assert (exit.code, exit.outcome) == (0, "completed"), read_log(launcher, handle)
    executed = nbformat.read(handle["notebook_output"], as_version=4)
    assert [out["text"] for out in executed.cells[1].outputs] == ["cvd=2\n"]


def test_notebook_with_a_failing_cell_fails(notebook_jobs):
    launcher, handles = notebook_jobs
    handle = handles["bad"]
    exit = wait_exit(launcher, handle)
    assert (exit.code, exit.outcome) == (1, "failed")
    executed = nbformat.read(handle["notebook_output"], as_version=4)  # saved up to the failure
    outputs = executed.cells[0].outputs
    assert outputs and outputs[0]["ename"] == "ValueError", read_log(launcher, handle)
    assert executed.cells[1].outputs == []


def test_a_failing_notebook_fails_even_when_its_kernel_must_be_killed_afterwards(tmp_path):
    """After a cell raises, nbclient shuts the kernel down, and kills it when it does not go
    within 5 s (here: an exit handler that sleeps; on a busy machine, a slow kernel). The job
    failed because of its cell, not because of that signal."""
    stubborn = write_notebook(
        tmp_path / "stubborn.ipynb",
        "import atexit, time; atexit.register(time.sleep, 60)",
        "raise ValueError('boom')",
    )
    launcher = own_launcher()
    handle = launcher.start(spec(tmp_path, notebook=stubborn, job_id="stubborn"))
    exit = wait_exit(launcher, handle, timeout=60)
    assert (exit.code, exit.outcome) == (1, "failed"), read_log(launcher, handle)


async def test_stopping_a_notebook_signals_its_kernel(notebook_jobs):
    launcher, handles = notebook_jobs
    handle = handles["slow"]

    def kernel_started():
        members = group_members(handle["pgid"])
        return any("ipykernel_launcher" in " ".join(p.cmdline()) for p in members)

    wait_for(kernel_started, timeout=30)  # the kernel is in the job's process group
    exit = await launcher.stop(handle, "SIGTERM", grace=10)
    assert (exit.code, exit.outcome, exit.message) == (None, "killed", "killed by SIGTERM")
    assert group_members(handle["pgid"]) == []


async def test_stop_lets_a_job_that_traps_the_signal_finish(tmp_path):
    launcher = own_launcher()
    command = "trap 'echo got-term; exit 0' TERM; echo ready; sleep 60 & wait"
    handle = launcher.start(spec(tmp_path, command))
    wait_for(lambda: "ready" in read_log(launcher, handle))
    began = time.monotonic()
    exit = await launcher.stop(handle, "SIGTERM", grace=5)
    assert time.monotonic() - began < 5
    assert exit.outcome == "completed"
    assert "got-term" in read_log(launcher, handle)
    assert group_members(handle["pgid"]) == []


async def test_stop_kills_what_ignores_the_signal_grandchildren_included(tmp_path):
    launcher = own_launcher()
    command = "trap '' TERM; sleep 300 & echo $! > grandchild.pid; sleep 60"
    handle = launcher.start(spec(tmp_path, command, cwd=str(tmp_path)))
    pid_file = tmp_path / "grandchild.pid"
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
    grandchild = int(pid_file.read_text())
    began = time.monotonic()
    exit = await launcher.stop(handle, "SIGTERM", grace=0.5)
    assert time.monotonic() - began >= 0.5
    assert (exit.code, exit.outcome, exit.message) == (None, "killed", "killed by SIGKILL")
    assert gone(grandchild)
    assert group_members(handle["pgid"]) == []
    assert not launcher.alive(handle)
    assert launcher.poll(handle) == exit  # asked again: the same answer


def test_background_processes_do_not_outlive_their_job(tmp_path):
    launcher = own_launcher()
    handle = launcher.start(spec(tmp_path, "sleep 300 & echo $! > bg.pid", cwd=str(tmp_path)))
    assert wait_exit(launcher, handle).outcome == "completed"
    wait_for(lambda: gone(int((tmp_path / "bg.pid").read_text())))


FORGER = """
import os, sys, time
if any(arg.startswith("--exit-fd=") for arg in sys.argv):  # in the runner, before it starts
    fd = int(next(a for a in sys.argv if a.startswith("--exit-fd=")).split("=")[1])
    if os.fork() == 0:  # the work goes on, in the job's group ...
        script = 'echo $$ > "$WORK_PID.new"; mv "$WORK_PID.new" "$WORK_PID"; exec sleep 300'
        os.execvp("sh", ["sh", "-c", script])
    while not os.path.exists(os.environ["WORK_PID"]):
        time.sleep(0.01)
    run = next((a[6:] for a in sys.argv if a.startswith("--run=")), None)  # (if it has one)
    os.write(fd, ('{"run": "%s", "code": 0}\\n' % run).encode())  # ... while it says it ended
    os._exit(0)
"""


def test_a_job_cannot_say_it_ended_while_its_work_runs_on(tmp_path):
    """Code of the user's runs in the runner (a sitecustomize.py on the job's PYTHONPATH; a
    usercustomize.py or LD_PRELOAD does as well): it reports "exit code 0" and goes on working.
    Once the job reads as ended its GPUs go to another job, so none of its work may be left."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(FORGER)
    launcher = own_launcher()
    env = {"PYTHONPATH": str(site), "WORK_PID": str(tmp_path / "work.pid")}
    job = spec(tmp_path, "sleep 300", env=env, cwd=str(tmp_path))
    handle = launcher.start(job)
    exit = wait_exit(launcher, handle)
    assert exit.outcome == "completed"  # how it ended is the user's to say; when is not:
    wait_for(lambda: (tmp_path / "work.pid").exists())
    wait_for(lambda: gone(int((tmp_path / "work.pid").read_text())), timeout=5)
    assert not group_members(handle["pgid"])


ESCAPE = (  # a process in a session of its own, out of the job's group, as a daemon makes one
    "setsid sh -c 'echo $$ > \"$ESCAPED\"; exec sleep 300' </dev/null >/dev/null 2>&1 & "
    'while [ ! -s "$ESCAPED" ]; do sleep 0.05; done'
)


def test_a_process_that_left_the_jobs_group_does_not_outlive_the_job(tmp_path):
    """Its GPUs go to the next job once this one has ended: what left the process group (the
    group's signals do not reach it) ends with the job too (the supervisor adopts it)."""
    launcher = own_launcher()
    escaped = tmp_path / "escaped.pid"
    handle = launcher.start(spec(tmp_path, ESCAPE, env={"ESCAPED": str(escaped)}))
    assert wait_exit(launcher, handle).outcome == "completed", read_log(launcher, handle)
    wait_for(lambda: gone(int(escaped.read_text())), timeout=5)


async def test_stop_reaches_a_process_that_left_the_jobs_group(tmp_path):
    launcher = own_launcher()
    escaped = tmp_path / "escaped.pid"
    command = ESCAPE + "; sleep 300"
    handle = launcher.start(spec(tmp_path, command, env={"ESCAPED": str(escaped)}))
    wait_for(lambda: escaped.exists() and escaped.read_text().strip())
    pid = int(escaped.read_text())
    assert os.getpgid(pid) != handle["pgid"]
    exit = await launcher.stop(handle, "SIGTERM", grace=2)
    assert exit.outcome == "killed", exit
    wait_for(lambda: gone(pid), timeout=5)


async def test_a_job_killed_by_its_signal_is_killed(tmp_path):
    launcher = own_launcher()
    handle = launcher.start(spec(tmp_path, "echo ready; sleep 60"))
    wait_for(lambda: "ready" in read_log(launcher, handle))
    exit = await launcher.stop(handle, "SIGUSR1", grace=5)
    assert (exit.code, exit.outcome, exit.message) == (None, "killed", "killed by SIGUSR1")


def test_a_new_launcher_instance_takes_over_after_a_restart(tmp_path):
    old = own_launcher()
    handle = old.start(spec(tmp_path, "sleep 0.5; exit 5"))
    new = own_launcher()
    stored = json.loads(json.dumps(handle))
    assert new.alive(stored)
    assert new.poll(stored) is None
    exit = wait_exit(new, stored)  # only the exit record can tell the new instance
    assert (exit.code, exit.outcome) == (5, "failed")
    # The record is what counts, even once the pid belongs to another process.
    reused = dict(stored, pid=os.getpid(), pgid=os.getpgid(0))
    reused["create_time"] = psutil.Process().create_time()
    assert new.alive(reused)
    assert new.poll(reused) == exit
    assert wait_exit(old, handle) == exit  # and the old instance reaps its child


def test_alive_checks_the_create_time_not_just_the_pid():
    process = psutil.Process()
    assert own_launcher().alive({"pid": os.getpid(), "create_time": process.create_time()})
    stale = {"pid": os.getpid(), "create_time": process.create_time() - 3600}
    assert not own_launcher().alive(stale)


def test_a_runner_killed_behind_the_launchers_back_is_lost(tmp_path):
    launcher = own_launcher()
    handle = launcher.start(spec(tmp_path, "echo ready; sleep 60"))
    wait_for(lambda: "ready" in read_log(launcher, handle))
    assert launcher.poll(handle) is None
    os.killpg(handle["pgid"], signal.SIGKILL)
    after_restart = wait_exit(own_launcher(), json.loads(json.dumps(handle)))
    assert (after_restart.code, after_restart.outcome) == (None, "lost")
    exit = wait_exit(launcher, handle)
    assert (exit.code, exit.outcome) == (None, "lost")
    assert "SIGKILL" in exit.message


def test_what_is_left_of_a_job_whose_supervisor_was_killed_is_killed(tmp_path):
    launcher = own_launcher()
    handle = launcher.start(spec(tmp_path, "echo ready; sleep 60"))
    wait_for(lambda: "ready" in read_log(launcher, handle))
    os.kill(handle["pid"], signal.SIGKILL)  # the supervisor alone (by an admin, the OOM killer)
    exit = wait_exit(launcher, handle)
    assert (exit.code, exit.outcome) == (None, "lost")
    wait_for(lambda: not group_members(handle["pgid"]), timeout=5)  # no work on its GPUs


def test_bad_specs_are_refused(tmp_path):
    launcher = own_launcher()
    with pytest.raises(LaunchError, match="exactly one"):
        launcher.start(spec(tmp_path, "true", notebook="x.ipynb"))
    with pytest.raises(LaunchError, match="cannot name a log file"):
        launcher.start(spec(tmp_path, "true", job_id="../escape"))


def test_a_working_directory_that_cannot_be_entered_fails_the_job_before_it_runs(tmp_path):
    launcher = own_launcher()
    mark = tmp_path / "ran"
    job = spec(tmp_path, 'touch "$MARK"', env={"MARK": str(mark)}, cwd=str(tmp_path / "missing"))
    handle = launcher.start(job)
    exit = wait_exit(launcher, handle)
    assert (exit.code, exit.outcome) == (1, "failed")
    assert exit.message.startswith("could not enter the working directory"), exit.message
    assert str(tmp_path / "missing") in exit.message
    assert "the job did not run" in read_log(launcher, handle)
    assert not mark.exists()


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")


@root_only
def test_as_root_a_job_runs_as_the_submitting_user(tmp_path):
    """As root, the job runs as its user, with an interpreter that user can run (this one, or
    the system python3 when this one lives under /root, as a pyenv Python does)."""
    launcher = LocalLauncher()
    job = spec(tmp_path, 'echo "uid=$(id -u) user=$USER"', user="nobody", cwd="/")
    handle = launcher.start(job)
    assert wait_exit(launcher, handle).outcome == "completed", read_log(launcher, handle)
    assert f"uid={pwd.getpwnam('nobody').pw_uid} user=nobody" in read_log(launcher, handle)
    assert os.stat(launcher.log_path(handle)).st_uid == pwd.getpwnam("nobody").pw_uid


@root_only
def test_as_root_an_unknown_user_is_refused_not_run_as_root(tmp_path):
    job = spec(tmp_path, "touch ran", user="no-such-user-x9", cwd=str(tmp_path))
    with pytest.raises(LaunchError, match="does not exist"):
        LocalLauncher().start(job)
    time.sleep(0.2)
    assert not (tmp_path / "ran").exists()


@root_only
def test_as_root_a_job_cannot_kill_what_records_its_end(tmp_path):
    """The job's user kills every process of the job's group it may: its record is still
    written (by the supervisor, the service's), not "lost" with the work's fate unknown."""
    launcher = LocalLauncher()
    command = 'kill -9 -"$(ps -o pgid= -p $$ | tr -d " ")"; sleep 5'
    handle = launcher.start(spec(tmp_path, command, user="nobody", cwd="/"))
    exit = wait_exit(launcher, handle)
    assert (exit.outcome, exit.message) == ("killed", "killed by SIGKILL"), read_log(
        launcher, handle
    )
