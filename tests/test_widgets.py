"""GPU utilization in the notebook views, and ``api/me``, against a real in-process service
(token-file auth; ``ThreadedService`` of ``tests/test_client.py``).

The service samples the GPUs of each notebook server itself (here: the simulated loads in its own
folder, ``start_service(gpu_load_dir=...)``); the service's job view then carries the latest
utilization it measured, and
the client's displays (``QueueWidget``, a ``Job``'s HTML and widget) show it, or an em dash when
nobody measured it (a batch job; a server not measured yet). A notebook server's row has no
Cancel button but says where to stop it; ended jobs have none either.
"""

from __future__ import annotations

import time

import pytest
from test_client import ThreadedService

from jupyter_gpusched.notebook.client import GPUSchedError
from jupyter_gpusched.notebook.job import UNKNOWN, gpus_words, utilization_text
from jupyter_gpusched.service.records import utilization_view


@pytest.fixture
def service(tmp_path):
    running = ThreadedService(tmp_path, gpu_load_dir=tmp_path / "gpus")
    yield running
    running.close()


def start_notebook(client, gpus=2, **fields) -> dict:
    """A notebook-server job (what the spawner submits: the service only allocates)."""
    view = client.request("POST", "api/jobs", {"kind": "notebook", "gpus": gpus, **fields})
    assert view["state"] == "running", view
    return view


def report(client, job_id: str, devices=None, server=None) -> dict:
    """What a server's GPU monitor posts to the reaper (its kernels' attribution only)."""
    body = {"job_id": job_id, "server": server or {}, "kernels": {}, "devices": devices or []}
    body["backend"] = "simulated"  # the service runs the simulated cluster (start_service)
    return client.request("POST", "api/usage-samples", body)


def measured(service, client, job_id: str, utils: list[float]) -> dict:
    """Load the server's GPUs at ``utils`` and wait until its job view shows the service's
    measurement of them."""
    service.service.load(job_id, utils)
    mean = sum(utils) / len(utils)
    deadline = time.monotonic() + 15
    while True:
        view = client.job(job_id).data["utilization"]
        if view is not None and [d["utilization"] for d in view["devices"]] == utils:
            assert view["percent"] == mean
            return view
        assert time.monotonic() < deadline, f"no measurement of {utils} in {view}"
        time.sleep(0.05)


def test_a_measured_utilization_is_in_the_job_view_the_widget_and_the_display(service):
    from jupyter_gpusched.notebook.widgets import JobWidget, QueueWidget

    alice = service.client("alice")
    server = start_notebook(alice)
    assert server["utilization"] is None  # running, not measured yet
    batch = alice.submit(command="sleep 30", gpus=1, name="batch")
    assert batch.state == "running"

    before = time.time()
    # its monitor's report says otherwise: not a measurement
    report(alice, server["id"], [{"index": 0, "utilization": 5.0}], {"utilization": 5.0})
    utilization = measured(service, alice, server["id"], [80.0, 40.0])  # mean 60
    job = alice.job(server["id"])
    utilization = job.data["utilization"]
    assert utilization["percent"] == 60.0  # the mean over its 2 GPUs
    assert before - 1 <= utilization["measured_at"] <= time.time() + 1
    assert [d["utilization"] for d in utilization["devices"]] == [80.0, 40.0]
    stamp = time.strftime("%H:%M:%S", time.localtime(utilization["measured_at"]))
    assert job.summary()["utilization"] == f"60% at {stamp}"
    assert alice.job(batch.id).data["utilization"] is None  # batch jobs: nobody measures them
    # the job list carries it too (what the widget reads)
    listed = {j.id: j for j in alice.jobs(["running"])}
    assert listed[server["id"]].data["utilization"]["percent"] == 60.0

    widget = QueueWidget(alice, interval=60, autostart=False)
    widget.refresh()
    assert widget.last_error is None
    assert "GPU util 60% at " in widget.rows[server["id"]]["html"].value
    assert f"GPU util {UNKNOWN}" in widget.rows[batch.id]["html"].value
    widget.close()

    html = job._repr_html_()
    assert "utilization" in html and "60% at" in html
    assert UNKNOWN in alice.job(batch.id)._repr_html_()
    live = JobWidget(job, autostart=False)
    assert "60% at" in live.html.value
    live.close()

    # a newer measurement replaces it
    assert measured(service, alice, server["id"], [10.0, 0.0])["percent"] == 5.0


def test_utilization_is_only_for_running_jobs_and_only_the_owners(service):
    from jupyter_gpusched.notebook.widgets import QueueWidget

    alice, bob = service.client("alice"), service.client("bob")
    server = start_notebook(alice)
    assert measured(service, alice, server["id"], [90.0, 0.0])["percent"] == 45.0
    with pytest.raises(GPUSchedError) as refused:  # bob cannot report for alice's server...
        report(bob, server["id"], server={"utilization": 0.0})
    assert refused.value.status == 404  # (answered as an unknown server)
    with pytest.raises(GPUSchedError) as hidden:  # ...nor see it
        bob.job(server["id"])
    assert hidden.value.status == 404
    assert service.client("admin").job(server["id"]).data["utilization"]["percent"] == 45.0

    alice.cancel(server["id"])  # a notebook server's job ends "completed" (the server stopped)
    ended = alice.job(server["id"])
    assert ended.finished and "utilization" not in ended.data
    assert "utilization" not in ended.summary()
    # a pending job has no utilization line either
    for _ in range(3):
        alice.submit(command="sleep 30", gpus=8, gpu_model="H100")
    waiting = alice.jobs(["pending"])
    assert waiting and all("utilization" not in j.summary() for j in waiting)
    # what a job is planned to run shows while it is unfinished (the job view's, in words)
    planned = "1 d, the default for a job without a walltime: give one if it runs less, and it "
    planned += "may start sooner"
    assert all(j.summary()["planned"] == planned for j in waiting)
    assert "<th style='text-align:left;padding-right:1em'>planned</th>" in waiting[0]._repr_html_()
    assert "planned" not in ended.summary() and "planned_run_time" not in ended.data
    widget = QueueWidget(alice, interval=60, autostart=False)
    widget.refresh()
    assert f"planned to run {planned}</span>" in widget.rows[waiting[0].id]["html"].value
    widget.close()


def test_utilization_view_and_text():
    assert utilization_view(None, 1) is None
    unknown = utilization_view({"time": 5.0, "utilization": None, "devices": []}, 1)
    assert unknown == {"percent": None, "measured_at": 5.0, "devices": []}
    assert utilization_text(unknown) == UNKNOWN and utilization_text(None) == UNKNOWN
    partial = {
        "time": 1.0,
        "devices": [{"index": 0, "utilization": None}, {"index": 1, "utilization": 30}],
    }
    assert utilization_view(partial, 2)["percent"] == 30.0  # the GPUs whose figure is known
    assert utilization_view({"time": 1.0, "utilization": 250.0}, 2)["percent"] == 100.0


def test_what_a_job_asks_for_reads_as_words():
    """The widget's line: not "2 GPU" or "1x H100|L40S GPU" (what it said before)."""
    cases = [
        ({"gpus": 8, "gpu_models": ["H100"]}, "8x H100"),
        ({"gpus": 1, "gpu_models": ["H100", "L40S"]}, "1x H100 or L40S"),
        ({"gpus": 2}, "2 GPUs"),
        ({"gpus": 1}, "1 GPU"),
        ({"gpus": 1, "gpu_fraction": 0.5}, "0.5 of a GPU"),
        ({"gpus": 0, "cpus": 2}, "no GPU"),
    ]
    for view, words in cases:
        assert gpus_words(view) == words, view


def test_me_says_who_the_caller_is(service):
    me = service.client("alice").request("GET", "api/me")
    assert {key: me[key] for key in ("name", "admin", "groups")} == {
        "name": "alice",
        "admin": False,
        "groups": [],
    }
    # her queues (service_helpers.QUEUES), her team's queue as her default
    assert [(q["path"], q["default"]) for q in me["queues"]] == [("small", False), ("team", True)]
    assert service.client("admin").request("GET", "api/me")["admin"] is True


def test_a_notebook_server_has_no_cancel_button_but_a_link_to_stop_it(service, monkeypatch):
    import ipywidgets as w

    from jupyter_gpusched.notebook.widgets import JobWidget, QueueWidget

    alice = service.client("alice")
    mine = start_notebook(alice, gpus=1)  # the server this kernel runs in
    named = start_notebook(alice, gpus=1, server_name="big")
    batch = alice.submit(command="sleep 30", gpus=1, name="batch")
    monkeypatch.setenv("GPUSCHED_JOB_ID", mine["id"])  # as the spawner sets it in the server
    monkeypatch.setenv("JUPYTERHUB_BASE_URL", "/jhub/")

    widget = QueueWidget(alice, interval=60, autostart=False)
    widget.refresh()
    for server, says in (
        (mine, "this notebook server (the one you are working in)"),
        (named, "notebook server &#x27;big&#x27;"),
    ):
        row = widget.rows[server["id"]]
        assert row["cancel"] is None
        assert not [c for c in row["box"].children if isinstance(c, w.Button)]
        hint = row["box"].children[0].value
        assert says in hint and "stop it from the" in hint
        assert "href='/jhub/hub/home'" in hint

    button = widget.rows[batch.id]["cancel"]
    assert button.layout.display != "none"
    button.click()
    assert button.layout.display == "none"  # stopping or ended: nothing more to cancel
    assert batch.id not in widget.rows or widget.rows[batch.id]["cancel"].layout.display == "none"
    assert alice.job(mine["id"]).state == "running"  # the widget stopped no server
    widget.close()

    live = JobWidget(alice.job(mine["id"]), autostart=False)
    assert live.cancel_button is None and "hub's home page" in live.children[1].value
    live.close()
    ended = JobWidget(alice.job(batch.id), autostart=False)
    ended.job.wait(timeout=15)
    ended._render(ended.job)
    assert ended.cancel_button.layout.display == "none"
    ended.close()


def test_a_cpu_only_job_shows_as_no_gpu(service):
    from jupyter_gpusched.notebook.widgets import QueueWidget

    alice = service.client("alice")
    job = alice.submit(command="sleep 30", gpus=0, cpus=1, name="cpu work")
    summary = job.summary()
    assert job.state == "running" and summary["gpus"] == "none"
    assert summary["where"] == job.data["allocation"][0]["node"]  # no "node:" without GPUs
    widget = QueueWidget(alice, interval=60, autostart=False)
    widget.refresh()
    line = widget.rows[job.id]["html"].value
    assert "no GPU · tier 2" in line and "0 GPU" not in line
    widget.close()
    alice.cancel(job.id)


def test_a_job_array_is_one_row_with_one_cancel_for_all_its_elements(service):
    """As the Lab panel and the page show an array: one line with its counts, the first
    waiting element's place and reason, and a Cancel that ends the array, not one per element."""
    from jupyter_gpusched.notebook.widgets import QueueWidget

    alice = service.client("alice")
    array = alice.submit(command="sleep 30", gpus=1, name="sweep", array="0-5%2")
    single = alice.submit(command="sleep 30", gpus=1, name="single")
    widget = QueueWidget(alice, interval=60, autostart=False)
    widget.refresh()
    assert set(widget.rows) == {("array", array.id), single.id}
    row = widget.rows[("array", array.id)]
    line = row["html"].value
    assert f"<b>{array.id}_[2-5%2]</b> · sweep · array of 6 jobs, 2 running, 4 pending" in line
    assert "1 GPU each · tier 2" in line and "at most 2 running" in line
    # its first waiting element: the next to start, and why it waits
    assert f"first waiting queued #1 · array {array.id} is at its limit of 2 running" in line
    assert [type(c).__name__ for c in row["box"].children] == ["Button", "HTML"]
    row["cancel"].click()  # one click: every element, and nothing else
    assert {alice.job(job.id).state for job in array} <= {"cancelled", "running"}
    assert all(alice.job(job.id).state == "cancelled" or alice.job(job.id).data["stopping"]
               for job in array)  # fmt: skip
    assert alice.job(single.id).state == "running"
    assert ("array", array.id) not in widget.rows or (
        widget.rows[("array", array.id)]["cancel"].layout.display == "none"
    )
    widget.close()
    alice.cancel(single.id)
