"""The payloads a ``%%gpujob`` cell or a ``client.submit(function=...)`` leaves in
``.gpusched/`` (notebook/payloads.py): private to their user, never in a folder another user
could write to, and a new one removes those a month old, nothing else."""

from __future__ import annotations

import os
import pickle
import stat
import time

import pytest

from jupyter_gpusched.notebook.errors import JobFailedError
from jupyter_gpusched.notebook.job import Job
from jupyter_gpusched.notebook.payloads import (
    KEEP_DAYS,
    PAYLOAD_DIR,
    cell_payload,
    function_payload,
    pickled_call,
)


def aged(path, days: float) -> None:
    moment = time.time() - days * 86_400
    os.utime(path, (moment, moment), follow_symlinks=False)


def test_a_new_payload_removes_those_not_changed_for_a_month(tmp_path):
    folder = tmp_path / PAYLOAD_DIR
    folder.mkdir()
    old_cell, recent_cell = folder / "cell-old.py", folder / "cell-recent.py"
    old_function, notes = folder / "fn-old", folder / "notes.txt"
    elsewhere = tmp_path / "keep"
    elsewhere.mkdir()
    (elsewhere / "data").write_text("mine")
    link = folder / "fn-link"
    link.symlink_to(elsewhere)
    for path in (old_cell, recent_cell, notes):
        path.write_text("print(1)")
    old_function.mkdir()
    (old_function / "result.pkl").write_bytes(b"")
    for path, days in ((old_cell, KEEP_DAYS + 1), (old_function, KEEP_DAYS + 1)):
        aged(path, days)
    aged(recent_cell, KEEP_DAYS - 1)
    aged(notes, KEEP_DAYS + 1)  # not a payload: left alone
    aged(link, KEEP_DAYS + 1)

    _command, _result, made = cell_payload("print(2)", str(tmp_path))

    left = sorted(p.name for p in folder.iterdir())
    assert left == sorted([made.name, "cell-recent.py", "notes.txt"])
    assert (elsewhere / "data").read_text() == "mine"  # a link is removed, not what it points to


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_payloads_are_readable_by_their_user_only_whatever_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        _command, _none, cell = cell_payload("secret = 1", str(tmp_path))
        _command, _result, function = function_payload(pickled_call(len, ([1],), {}), str(tmp_path))
    finally:
        os.umask(old)
    assert mode(tmp_path / PAYLOAD_DIR) == 0o700 and mode(function) == 0o700
    assert mode(cell) == 0o600
    assert {mode(path) for path in function.iterdir()} == {0o600}
    # a folder made readable to others (by an older version) is made private again
    os.chmod(tmp_path / PAYLOAD_DIR, 0o755)
    cell_payload("x = 2", str(tmp_path))
    assert mode(tmp_path / PAYLOAD_DIR) == 0o700


def test_a_folder_others_may_write_to_or_a_link_is_refused_and_nothing_written(tmp_path):
    shared = tmp_path / "shared"
    (shared / PAYLOAD_DIR).mkdir(parents=True)
    os.chmod(shared / PAYLOAD_DIR, 0o777)  # another user could swap run.py for their own
    with pytest.raises(PermissionError, match="only you may write to"):
        cell_payload("x = 1", str(shared))
    with pytest.raises(PermissionError, match="only you may write to"):
        function_payload(pickled_call(len, ([1],), {}), str(shared))
    assert list((shared / PAYLOAD_DIR).iterdir()) == []
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / PAYLOAD_DIR).symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    with pytest.raises(PermissionError):
        cell_payload("x = 1", str(linked))
    assert list((tmp_path / "elsewhere").iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_folder_another_user_made_first_is_refused(tmp_path):
    """In a shared /tmp, bob makes .gpusched (his, 0700 or not) before alice submits there."""
    (tmp_path / PAYLOAD_DIR).mkdir(mode=0o700)
    os.chown(tmp_path / PAYLOAD_DIR, 65534, 65534)
    with pytest.raises(PermissionError, match="not a folder of yours"):
        cell_payload("x = 1", str(tmp_path))


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_result_that_is_not_the_users_own_is_not_unpickled(tmp_path):
    result = tmp_path / "result.pkl"
    result.write_bytes(pickle.dumps({"ok": True, "value": 42}))
    os.chown(result, 65534, 65534)

    class Ended:
        def request(self, method, path, body=None):
            return {"id": "j-1", "state": "completed"}

    job = Job(Ended(), "j-1", {"id": "j-1", "state": "completed"}, result_path=str(result))
    with pytest.raises(JobFailedError, match="is not your file"):
        job.result(timeout=1)
    os.chown(result, 0, 0)
    assert job.result(timeout=1) == 42
