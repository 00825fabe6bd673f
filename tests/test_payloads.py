"""The payloads a ``%%gpujob`` cell or a ``client.submit(function=...)`` leaves in
``.gpusched/`` (notebook/payloads.py): a new one removes those a month old, nothing else."""

from __future__ import annotations

import os
import time

from jupyter_gpusched.notebook.payloads import KEEP_DAYS, PAYLOAD_DIR, cell_payload


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
