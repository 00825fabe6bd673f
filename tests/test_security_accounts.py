"""Jobs run as their user, with that user's rights only; the state is readable by the service
alone (issue 14; docs/security.md).

Through a real service (tests/service_helpers.py) and real processes. The tests that switch
users need root: they create Unix accounts of their own (``gpusched-ann`` and ``gpusched-ben``
with uids from 1000, ``gpusched-sys`` a system account) and remove them afterwards.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from service_helpers import services, start_service, wait_job

from jupyter_gpusched.backends.accounts import AccountPolicy, AccountRefused, cwd_problem_for
from jupyter_gpusched.backends.local.launcher import LocalLauncher
from jupyter_gpusched.service.app import GPUSchedService
from jupyter_gpusched.service.identity import Identity
from jupyter_gpusched.service.requests import RequestError, parse_job_request

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="jobs switch users only as root")
PEOPLE = ("gpusched-ann", "gpusched-ben")
SYSTEM = "gpusched-sys"


@pytest.fixture
async def service_factory(tmp_path):
    async with services(tmp_path) as make:
        yield make


def _useradd(name: str, *options: str) -> None:
    done = subprocess.run(["useradd", *options, name], capture_output=True, text=True)
    if done.returncode not in (0, 9):  # 9: it exists
        pytest.fail(f"useradd {name}: {done.stderr.strip()}")


def _userdel(name: str) -> None:
    subprocess.run(["userdel", "--remove", name], capture_output=True)


@pytest.fixture(scope="module")
def people():
    """Two Unix accounts of people (uid >= 1000, a home directory each), for hub users of the
    same names."""
    if os.geteuid() != 0:
        pytest.skip("only root can create Unix accounts")
    for name in PEOPLE:
        _useradd(name, "--create-home", "--user-group", "--shell", "/bin/sh")
        uid = pwd.getpwnam(name).pw_uid
        assert uid >= AccountPolicy().min_uid, f"{name} has uid {uid}: remove it, and rerun"
    yield PEOPLE
    for name in PEOPLE:
        _userdel(name)


@pytest.fixture
def system_account():
    """A system account (``useradd --system``: a uid below 1000), removed after the test."""
    if os.geteuid() != 0:
        pytest.skip("only root can create Unix accounts")
    _useradd(SYSTEM, "--system", "--no-create-home")
    assert pwd.getpwnam(SYSTEM).pw_uid < 1000
    yield SYSTEM
    _userdel(SYSTEM)


@pytest.fixture
def shared_dir():
    """A directory under /tmp that every user may enter (pytest's tmp_path is root's, 0700),
    as the demo's state directory was."""
    path = Path(tempfile.mkdtemp(prefix="gpusched-sec-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def nothing_stored(service) -> None:
    store = service.app.store
    assert store.jobs() == []
    assert store.events() == []
    assert service.live.engine.jobs == {}


# -- accounts ---------------------------------------------------------------------------------
async def test_a_hub_user_named_root_is_refused_even_where_jobs_run_as_the_service(
    service_factory, tmp_path
):
    """Jobs run as the service's own account here: the deny list still refuses the name."""
    service = await service_factory(queues=None)
    mark = tmp_path / "ran"
    status, error = await service.client("root").post(
        "api/jobs", {"gpus": 1, "command": f"id -u > {mark}"}
    )
    assert status == 403, error
    assert error["field"] == "user"
    assert "'root'" in error["error"] and "denied_users" in error["error"], error
    nothing_stored(service)
    assert not mark.exists()


@root_only
async def test_as_root_a_hub_user_named_root_never_runs_as_uid_0(service_factory, tmp_path):
    service = await service_factory(queues=None, run_as_submitting_user=True)
    root = service.client("root")
    mark = tmp_path / "ran"
    for body in (
        {"gpus": 1, "command": f"id -u > {mark}"},
        {"gpus": 1, "notebook": "x.ipynb"},
        {"gpus": 1, "kind": "notebook"},  # a notebook server's allocation, as the spawner asks
    ):
        status, error = await root.post("api/jobs", body)
        assert (status, error["field"]) == (403, "user"), error
    with pytest.raises(RequestError) as refused:  # the engine's door, not only the handler's
        service.live.submit(
            Identity("root", admin=True), parse_job_request({"gpus": 1, "command": "id"})
        )
    assert refused.value.status == 403
    nothing_stored(service)
    assert not mark.exists()


@root_only
async def test_as_root_a_system_account_is_refused(service_factory, system_account):
    service = await service_factory(queues=None, run_as_submitting_user=True)
    status, error = await service.client(system_account).post(
        "api/jobs", {"gpus": 1, "command": "id"}
    )
    assert status == 403, error
    assert "system account" in error["error"] and "min_uid" in error["error"], error
    nothing_stored(service)


@root_only
async def test_as_root_a_hub_user_without_an_account_is_refused(service_factory):
    with contextlib.suppress(KeyError):
        pwd.getpwnam("gpusched-nobody")
        pytest.skip("this host has a user gpusched-nobody")
    service = await service_factory(queues=None, run_as_submitting_user=True)
    status, error = await service.client("gpusched-nobody").post(
        "api/jobs", {"gpus": 1, "command": "true"}
    )
    assert status == 403, error
    assert "does not exist" in error["error"]
    nothing_stored(service)


def test_the_policy_is_configured_on_the_service():
    """c.AccountPolicy (here from the command line) reaches the launcher's policy."""
    assert AccountPolicy in GPUSchedService.classes
    app = GPUSchedService()
    app.parse_command_line(["--AccountPolicy.min_uid=2000", "--AccountPolicy.denied_users=alice"])
    launcher = LocalLauncher(parent=app, run_as_submitting_user=False)
    assert launcher.account_policy.min_uid == 2000
    with pytest.raises(AccountRefused, match="denied"):
        launcher.job_account("alice")
    assert launcher.job_account("root") is None  # no longer denied: jobs run as the service's


# -- the working directory --------------------------------------------------------------------
@root_only
def test_the_working_directory_is_checked_with_the_users_rights(people, shared_dir):
    ann = pwd.getpwnam(people[0])
    private = shared_dir / "root-only"
    private.mkdir(mode=0o700)
    (private / "inside").mkdir(mode=0o755)
    theirs = shared_dir / "ann"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, ann.pw_uid, ann.pw_gid)
    assert cwd_problem_for(ann, str(theirs)) is None
    assert cwd_problem_for(ann, "/") is None
    for where in (private / "inside", "/root", shared_dir / "missing", "/etc/passwd"):
        problem = cwd_problem_for(ann, str(where))
        assert problem is not None and "may not enter" in problem, where


@root_only
def test_a_passed_check_is_remembered_briefly_and_the_launch_checks_again(people, shared_dir):
    """The check costs a process; a success is reused for a few seconds (the runner enters the
    directory as the user at launch anyway: see the test after the next)."""
    ann = pwd.getpwnam(people[0])
    theirs = shared_dir / "ann"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, ann.pw_uid, ann.pw_gid)
    launcher = LocalLauncher(run_as_submitting_user=True)
    assert launcher.cwd_problem(ann, str(theirs)) is None
    os.chown(theirs, 0, 0)
    assert launcher.cwd_problem(ann, str(theirs)) is None  # remembered
    assert cwd_problem_for(ann, str(theirs)) is not None
    assert LocalLauncher().cwd_problem(ann, str(theirs)) is not None  # not across launchers


@root_only
async def test_a_directory_the_user_cannot_enter_is_a_400_naming_cwd(
    service_factory, people, shared_dir
):
    private = shared_dir / "root-only"
    private.mkdir(mode=0o700)
    (private / "inside").mkdir(mode=0o755)
    (private / "inside" / "secret").write_text("root's secret\n")
    service = await service_factory(queues=None, run_as_submitting_user=True)
    ann = service.client(people[0])
    for cwd in (str(private / "inside"), "/root", str(shared_dir / "missing")):
        status, error = await ann.post("api/jobs", {"gpus": 1, "command": "cat secret", "cwd": cwd})
        assert (status, error["field"]) == (400, "cwd"), (cwd, error)
        assert "may not enter" in error["error"]
    nothing_stored(service)


@root_only
async def test_a_notebook_the_user_cannot_read_is_a_400_naming_notebook(
    service_factory, people, shared_dir
):
    """Checked at submit as the user (not left to fail at launch with the runner's traceback,
    holding a GPU meanwhile): missing, or root's, relative to the job's directory (her home by
    default) or absolute."""
    account = pwd.getpwnam(people[0])
    theirs = shared_dir / "ann"
    theirs.mkdir(mode=0o700)
    (theirs / "train.ipynb").write_text("{}")
    (theirs / "roots.ipynb").write_text("{}")
    for path in (theirs, theirs / "train.ipynb"):
        os.chown(path, account.pw_uid, account.pw_gid)
    (theirs / "roots.ipynb").chmod(0o600)  # root's, in her folder
    service = await service_factory(queues=None, run_as_submitting_user=True)
    ann = service.client(people[0])
    for body in (
        {"notebook": "nosuch.ipynb"},  # in her home
        {"notebook": "nosuch.ipynb", "cwd": str(theirs)},
        {"notebook": "roots.ipynb", "cwd": str(theirs)},
        {"notebook": str(theirs / "roots.ipynb")},
        {"notebook": str(theirs)},  # a folder
    ):
        status, error = await ann.post("api/jobs", {"gpus": 1, **body})
        assert (status, error["field"]) == (400, "notebook"), (body, error)
        assert "is not a file" in error["error"] and people[0] in error["error"], error
    nothing_stored(service)
    status, job = await ann.post(
        "api/jobs", {"gpus": 1, "notebook": "train.ipynb", "cwd": str(theirs)}
    )
    assert status == 201, job


@root_only
async def test_jobs_run_in_the_home_directory_by_default_and_as_their_user(service_factory, people):
    service = await service_factory(queues=None, run_as_submitting_user=True)
    ann = service.client(people[0])
    status, job = await ann.post("api/jobs", {"gpus": 1, "command": 'echo "$(id -u) in $(pwd)"'})
    assert status == 201, job
    done = await wait_job(ann, job["id"], ("completed", "failed"))
    assert done["state"] == "completed", done
    account = pwd.getpwnam(people[0])
    log = (await ann.get(f"api/jobs/{job['id']}/log"))[1]
    assert f"{account.pw_uid} in {account.pw_dir}" in log, log


@root_only
async def test_a_directory_closed_between_submit_and_launch_fails_the_job_unread(
    service_factory, people, shared_dir
):
    """Entered by the runner as the user, at launch: root's rights never reach it."""
    account = pwd.getpwnam(people[0])
    work = shared_dir / "work"
    work.mkdir(mode=0o700)
    (work / "secret").write_text("ann's words, root-only by launch time\n")
    for path in (work, work / "secret"):
        os.chown(path, account.pw_uid, account.pw_gid)
    service = await service_factory(queues=None, run_as_submitting_user=True)
    ann = service.client(people[0])
    status, blocker = await ann.post("api/jobs", {"gpus": 24, "command": "sleep 60"})
    assert (status, blocker["state"]) == (201, "running"), blocker
    status, job = await ann.post("api/jobs", {"gpus": 1, "command": "cat secret", "cwd": str(work)})
    assert (status, job["state"]) == (201, "pending"), job
    os.chown(work, 0, 0)  # now root's alone (0700)
    assert (await ann.delete(f"api/jobs/{blocker['id']}"))[0] == 200
    failed = await wait_job(ann, job["id"], ("failed", "completed"), timeout=30)
    assert failed["state"] == "failed", failed
    assert failed["message"].startswith("could not enter the working directory"), failed
    assert str(work) in failed["message"]
    log = (await ann.get(f"api/jobs/{job['id']}/log"))[1]
    assert "the job did not run" in log
    assert "ann's words" not in log


# -- files and permissions --------------------------------------------------------------------
def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


async def test_the_state_is_made_private_at_start(shared_dir):
    """A state directory left open (0755, as the demo's was), its logs and its database."""
    state = shared_dir / "state"
    (state / "logs").mkdir(parents=True, mode=0o755)
    state.chmod(0o755)
    (state / "gpusched.sqlite").touch(mode=0o644)
    (state / "gpusched.sqlite").chmod(0o644)
    service = await start_service(state, queues=None)
    try:
        alice = service.client("alice")
        status, job = await alice.post("api/jobs", {"gpus": 1, "command": "echo hi"})
        assert status == 201, job
        await wait_job(alice, job["id"], "completed")
        assert _mode(state) == 0o700
        assert _mode(state / "logs") == 0o700
        assert _mode(state / "logs" / "alice") == 0o700
        assert _mode(state / "logs" / "alice" / f"{job['id']}.log") == 0o600
        files = [p for p in state.iterdir() if p.name.startswith("gpusched.sqlite")]
        assert {p.name for p in files} >= {"gpusched.sqlite", "gpusched.sqlite-wal"}
        for path in files:
            assert _mode(path) == 0o600, path
    finally:
        await service.stop()


async def test_a_new_database_is_created_0600(shared_dir):
    from jupyter_gpusched.service.store import Store

    path = shared_dir / "new.sqlite"
    old = os.umask(0o022)
    try:
        with Store(f"sqlite:///{path}") as store:
            store.add_event({"kind": "test"})
            assert _mode(path) == 0o600
            for suffix in ("-wal", "-shm"):
                assert _mode(f"{path}{suffix}") == 0o600, suffix
    finally:
        os.umask(old)


@root_only
async def test_a_job_cannot_read_the_database_or_another_users_log(people, shared_dir):
    """bob's job tries to read alice's command and env: in the database, in her log."""
    ann, ben = people
    state = shared_dir / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    service = await start_service(state, queues=None, run_as_submitting_user=True)
    try:
        client = service.client(ann)
        body = {"gpus": 1, "command": 'echo "token=$API_TOKEN"', "env": {"API_TOKEN": "s3cr3t-ann"}}
        status, job = await client.post("api/jobs", body)
        assert status == 201, job
        await wait_job(client, job["id"], "completed")
        ann_log = service.live.log_path(service.live.row(job["id"]))
        assert "token=s3cr3t-ann" in Path(ann_log).read_text()
        database = state / "gpusched.sqlite"
        snoop = (
            f"cat {database} {database}-wal; cat {ann_log}; ls {state / 'logs'}; "
            f"ls {state / 'logs' / ann}; true"
        )
        other = service.client(ben)
        status, spy = await other.post("api/jobs", {"gpus": 1, "command": snoop, "cwd": "/"})
        assert status == 201, spy
        await wait_job(other, spy["id"], "completed")
        log = (await other.get(f"api/jobs/{spy['id']}/log"))[1]
        assert "s3cr3t-ann" not in log
        assert log.count("Permission denied") >= 4, log
        assert os.stat(ann_log).st_uid == pwd.getpwnam(ann).pw_uid  # her own file, 0600
        assert _mode(ann_log) == 0o600
        status, _ = await other.get(f"api/jobs/{job['id']}/log")
        assert status in (403, 404)
    finally:
        await service.stop()


@root_only
async def test_a_notebook_job_of_a_user_writes_its_executed_copy(people, shared_dir):
    """The executed copy goes through a file descriptor: the log directory stays closed."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    account = pwd.getpwnam(people[0])
    work = shared_dir / "nb"
    work.mkdir(mode=0o700)
    nbformat.write(new_notebook(cells=[new_code_cell("print(6 * 7)")]), work / "six.ipynb")
    for path in (work, work / "six.ipynb"):
        os.chown(path, account.pw_uid, account.pw_gid)
    service = await start_service(shared_dir / "state", queues=None, run_as_submitting_user=True)
    try:
        ann = service.client(people[0])
        body = {"gpus": 1, "notebook": "six.ipynb", "cwd": str(work)}
        status, job = await ann.post("api/jobs", body)
        assert status == 201, job
        done = await wait_job(ann, job["id"], ("completed", "failed"), timeout=90)
        assert done["state"] == "completed", (await ann.get(f"api/jobs/{job['id']}/log"))[1]
        logs = shared_dir / "state" / "logs" / people[0]
        executed = nbformat.read(logs / f"{job['id']}.out.ipynb", as_version=4)
        assert "42" in executed.cells[0].outputs[0]["text"]
        assert _mode(logs) == 0o700 and os.stat(logs).st_uid == 0
    finally:
        await service.stop()
