"""alice submits batch jobs from notebook cells, in JupyterLab, and watches them in the widget.

She starts the 1-GPU server, opens a notebook and runs, cell by cell: ``%%gpujob --wait`` (the
job runs as alice, in her team's queue, and its output comes back into the cell); a function
through ``client.submit(function=...)`` (its result comes back); ``%%gpujob --gpus 0`` (one line
saying what is wrong, no traceback); ``%%gpujob --deadline 1h`` (it runs, its deadline kept),
and a deadline its walltime cannot meet (one line with the earliest finish); the QueueWidget,
where her own notebook server is not one click from being cancelled (the widget says where to
stop it) and ended jobs have no Cancel button.
"""

from __future__ import annotations

import re

import test_spawner as ts
from journey import TIMEOUT_MS, jobs_of, shot, skip_if_missing, stop_everything, sync_api
from lab import open_notebook, output_text, run_cell, write_notebook

from jupyter_gpusched.notebook.job import gpus_words

skip_if_missing()
expect = sync_api.expect
TEST = "cells"

CELLS = [
    "%load_ext jupyter_gpusched",
    "%%gpujob --gpus 1 --wait --name from-a-cell\nimport getpass, os\n"
    "print('user', getpass.getuser(), 'gpus', os.environ['CUDA_VISIBLE_DEVICES'])",
    "from jupyter_gpusched.notebook.client import Client\n"
    "job = Client().submit(function=lambda: 6 * 7, gpus=1, name='a-function')\n"
    "print('result', job.result(timeout=120))",
    "%%gpujob --gpus 0\nprint('never')",
    "%%gpujob --gpus 1 --walltime 10m --deadline 1h --wait --name with-a-deadline\n"
    "print('done in time')",
    "%%gpujob --gpus 1 --walltime 2h --deadline 30m\nprint('never')",
    "from jupyter_gpusched.notebook.widgets import QueueWidget\nQueueWidget(interval=1)",
]


def test_jobs_from_cells_run_as_alice_and_the_widget_is_safe(demo, people):
    hub = demo
    ts.start_server(hub, "alice", "gpu-1")
    write_notebook(hub, "alice", "journey-cells.ipynb", CELLS)
    page = people("alice")
    notebook = open_notebook(page, hub, "alice", "journey-cells.ipynb")
    run_cell(page, notebook, 0)

    cell = run_cell(page, notebook, 1, timeout_ms=120_000)
    text = output_text(cell)
    assert re.search(r"user alice gpus \d", text), text
    [job] = [j for j in jobs_of(hub, "alice") if j.get("name") == "from-a-cell"]
    assert job["state"] == "completed" and job["queue"] == "research/vision", job

    cell = run_cell(page, notebook, 2, timeout_ms=150_000)
    assert "result 42" in output_text(cell), output_text(cell)

    cell = run_cell(page, notebook, 3)
    text = output_text(cell)
    assert "gpus" in text and "Traceback" not in text, text
    assert len(text.strip().splitlines()) <= 2, text
    shot(page, TEST, "1-cells")

    cell = run_cell(page, notebook, 4, timeout_ms=120_000)
    assert "done in time" in output_text(cell), output_text(cell)
    [job] = [j for j in jobs_of(hub, "alice") if j.get("name") == "with-a-deadline"]
    assert job["state"] == "completed" and not job["deadline_missed"], job
    assert abs(job["deadline"] - job["submit_time"] - 3600) < 60, job

    cell = run_cell(page, notebook, 5)
    text = output_text(cell)
    assert "cannot be met" in text and "earliest" in text and "Traceback" not in text, text
    assert not [j for j in jobs_of(hub, "alice") if j.get("walltime") == 7200], "it was queued"
    shot(page, TEST, "2-deadline")

    cell = run_cell(page, notebook, 6)
    widget = cell.locator(".jp-OutputArea")
    server = next(j for j in jobs_of(hub, "alice", "running") if j["kind"] == "notebook")
    expect(widget).to_contain_text(server["id"], timeout=TIMEOUT_MS)
    # what it asks, in words ("1x H100 · tier 2", not "1x H100 GPU")
    expect(widget).to_contain_text(f"{gpus_words(server)} · tier {server['tier']}")
    # her own server's row: no Cancel that would stop it at one click, but where to stop it
    expect(widget).to_contain_text("the one you are working in")
    expect(widget.get_by_role("link", name="hub's home page")).to_have_attribute(
        "href", "/hub/home"
    )
    assert widget.get_by_role("button", name=re.compile("Cancel")).count() == 0, (
        "a Cancel button in the widget, though none of alice's jobs is cancellable"
    )
    assert ts.service_job(hub, "alice", server["id"])["state"] == "running"
    shot(page, TEST, "3-queue-widget")
    stop_everything(hub)
