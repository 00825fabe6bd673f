"""The notebook client (``jupyter_gpusched.notebook.client``), the IPython magics and the queue
widget, against a real in-process service with token-file auth (``tests/service_helpers.py``).

The service runs on an event loop in a background thread, so the synchronous client is used
as in a notebook: plain calls from the test's thread.

Cluster: gpu1, gpu2 with 8 H100 each, l40s1, l40s2 with 4 L40S (24 GPUs); alice uses "team".
"""

from __future__ import annotations

import asyncio
import io
import re
import sys
import textwrap
import threading
import time

import pytest
from IPython.core.error import UsageError
from service_helpers import TOKENS, start_service

from jupyter_gpusched.notebook import client as gc
from jupyter_gpusched.notebook.client import Client, GPUSchedError, JobFailedError

FILL = {"gpus": 8, "gpu_model": "H100", "command": "sleep 60"}


class ThreadedService:
    """A service serving on its own event loop in a daemon thread."""

    def __init__(self, tmp_path, **options):
        """``options``: for :func:`service_helpers.start_service`."""
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.service = self.call(start_service(tmp_path / "service", **options))
        self.url = self.service.url

    def call(self, coroutine, timeout=30):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def client(self, user="alice") -> Client:
        return Client(self.url, TOKENS[user])

    def close(self):
        try:
            self.call(self.service.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()


@pytest.fixture
def service(tmp_path):
    running = ThreadedService(tmp_path)
    yield running
    running.close()


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    path = tmp_path / "work"
    path.mkdir()
    monkeypatch.chdir(path)
    return path


def fill_h100(alice: Client):
    """Both H100 nodes busy: a further H100 job waits."""
    jobs = [alice.submit(**FILL) for _ in range(2)]
    assert [j.state for j in jobs] == ["running", "running"]
    return jobs


# -- the client ------------------------------------------------------------------------------
def test_client_needs_url_and_token_outside_a_server(monkeypatch):
    for name in ("GPUSCHED_SERVICE_URL", "GPUSCHED_SERVICE_TOKEN", "JUPYTERHUB_API_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(GPUSchedError, match=re.escape("Client(url=..., token=...)")) as info:
        Client()
    assert info.value.field == "url"
    monkeypatch.setenv("GPUSCHED_SERVICE_URL", "http://127.0.0.1:1/x")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "t")  # the fallback token
    made = Client()
    assert (made.url, made.token) == ("http://127.0.0.1:1/x/", "t")
    with pytest.raises(GPUSchedError, match="cannot reach") as info:
        made.queue()
    assert info.value.status is None


def test_submit_follow_logs_wait(service, workdir):
    alice = service.client()
    command = 'echo "start $GPUSCHED_JOB_ID"; sleep 0.5; echo "cwd $(pwd)"; echo done'
    job = alice.submit(command=command, gpus=2, walltime="10m", name="hello")
    assert job.id.startswith("j-") and job.state in ("pending", "running")
    out = io.StringIO()
    text = job.logs(follow=True, file=out, interval=0.1)
    assert text == out.getvalue()
    assert f"start {job.id}" in text and f"cwd {workdir}" in text and "done" in text
    assert job.wait(timeout=10) == "completed"
    assert job.data["exit_code"] == 0
    assert "done" in job.logs()
    assert job.id in [j.id for j in alice.jobs()]
    assert "completed" in repr(job) and job.id in job._repr_html_()
    with pytest.raises(GPUSchedError) as info:
        job.cancel()
    assert info.value.status == 409 and "already ended" in info.value.message


def test_cancel_a_pending_job_and_queue_views(service, workdir):
    alice = service.client()
    fill_h100(alice)
    waiting = alice.submit(command="true", gpus=8, gpu_model="H100", tier=2, walltime="1h")
    assert waiting.status() == "pending"
    assert waiting.logs() == ""  # no log yet
    queue = alice.queue()
    entry = next(e for e in queue["jobs"] if e["id"] == waiting.id)
    assert entry["mine"] and entry["position"] == 0
    assert "queued #1" in repr(waiting)
    cluster = alice.cluster()
    assert cluster["allocated_gpus"] == 16 and cluster["total_gpus"] == 24
    assert [j.id for j in alice.jobs("pending")] == [waiting.id]
    assert waiting.cancel() == "cancelled"
    assert waiting.wait(timeout=5) == "cancelled"
    assert gc.jobs("pending", client=alice) == []


def test_service_errors_keep_message_and_field(service, workdir):
    alice = service.client()
    cases = [
        ({"command": "true", "gpus": -1}, "gpus", "'gpus' must be a whole number"),
        ({"command": "true", "gpus": 0}, "cpus", "must ask for 'cpus' or 'memory_gb'"),
        ({"command": "true", "tier": 7}, "tier", "1 (never pre-empted"),
        ({"command": "true", "walltime": "soon"}, "walltime", ""),
        ({"command": "true", "queue": "private"}, "queue", "private"),
        ({"command": "true", "env": {"GPUSCHED_X": "1"}}, "env", "set by the scheduler"),
    ]
    for options, field, text in cases:
        with pytest.raises(GPUSchedError) as info:
            alice.submit(**options)
        assert info.value.status in (400, 403, 404), (options, info.value)
        assert info.value.field == field, (options, info.value)
        assert text in info.value.message, (options, info.value)
    with pytest.raises(GPUSchedError, match="exactly one of") as info:
        alice.submit(command="true", notebook="x.ipynb")
    with pytest.raises(GPUSchedError) as info:
        alice.job("j-999999")
    assert info.value.status == 404 and info.value.field == "id"
    with pytest.raises(GPUSchedError) as info:
        Client(service.url, "not-a-token").jobs()
    assert info.value.status == 401 and "not authenticated" in info.value.message


# -- function jobs -----------------------------------------------------------------------------
MODULE = """
import os

def train(x, scale=1):
    print("training", x)
    return {"value": x * scale, "cwd": os.getcwd()}

def broken():
    raise ValueError("no data")
"""


def test_a_function_job_returns_its_result(service, workdir, monkeypatch):
    (workdir / "mymodel.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(workdir))
    import mymodel

    alice = service.client()
    job = alice.submit(function=mymodel.train, args=(21,), kwargs={"scale": 2}, gpus=1)
    assert job.data["name"] == "train"
    assert job.result(timeout=20) == {"value": 42, "cwd": str(workdir)}
    assert "training 21" in job.logs()
    found = alice.job(job.id)  # found again: its result file from its command
    assert found.result(timeout=5)["value"] == 42

    failing = alice.submit(function=mymodel.broken)
    with pytest.raises(JobFailedError, match="raised ValueError: no data") as info:
        failing.result(timeout=20)
    assert isinstance(info.value.__cause__, ValueError)
    assert "ValueError: no data" in info.value.remote_traceback
    assert failing.data["state"] == "failed"

    with pytest.raises(GPUSchedError, match="not submitted with function="):
        alice.submit(command="true").result()


def test_a_notebook_function_needs_cloudpickle(service, workdir):
    alice = service.client()

    def local(x):
        return x + 1

    try:
        import cloudpickle  # noqa: F401
    except ImportError:
        with pytest.raises(GPUSchedError, match="install cloudpickle") as info:
            alice.submit(function=local, args=(1,))
        assert info.value.field == "function"
    else:
        assert alice.submit(function=local, args=(1,)).result(timeout=20) == 2


# -- magics ------------------------------------------------------------------------------------
@pytest.fixture
def shell(service, monkeypatch, workdir):
    from IPython.core.interactiveshell import InteractiveShell

    monkeypatch.setenv("GPUSCHED_SERVICE_URL", service.url)
    monkeypatch.setenv("GPUSCHED_SERVICE_TOKEN", TOKENS["alice"])
    ip = InteractiveShell.instance()
    result = ip.run_cell("%load_ext jupyter_gpusched", store_history=False)
    assert result.success, result.error_in_exec
    yield ip
    from jupyter_gpusched.notebook.magics import GPUSchedMagics

    ip.magics_manager.registry.pop(GPUSchedMagics.__name__, None)
    ip.extension_manager.loaded.discard("jupyter_gpusched")


def run(ip, code):
    result = ip.run_cell(code, store_history=False)
    if result.error_in_exec is not None:
        raise result.error_in_exec
    return result.result


def test_gpujob_runs_the_cell_in_the_working_directory(shell, workdir, capsys):
    (workdir / "data.txt").write_text("forty-two")
    shell.user_ns["secret"] = "kernel-only"
    cell = textwrap.dedent(
        """\
        %%gpujob --gpus 2 --tier 2 --walltime 10m --name cell --wait
        import os, sys
        print("data:", open("data.txt").read())
        print("cvd:", os.environ["CUDA_VISIBLE_DEVICES"].count(",") + 1)
        print("python:", sys.executable)
        print("secret" in globals())
        """
    )
    job = run(shell, cell)
    out = capsys.readouterr().out
    assert f"Submitted {job.id}" in out
    assert "data: forty-two" in out and "cvd: 2" in out and "False" in out
    assert f"python: {sys.executable}" in out  # $GPUSCHED_PYTHON: the launcher's choice
    assert job.data["command"].startswith('"$GPUSCHED_PYTHON" -u -c ')
    assert job.state == "completed" and job.data["name"] == "cell"
    assert job.data["cwd"] == str(workdir)
    assert list((workdir / ".gpusched").glob("cell-*.py"))

    run(shell, "%gpusched status")
    assert "no pending or running jobs" in capsys.readouterr().out


def test_gpujob_help_and_a_job_array(shell, workdir, capsys):
    assert run(shell, "%%gpujob --help\nprint(1)\n") is None  # not "unrecognized arguments"
    out = " ".join(capsys.readouterr().out.split())
    assert "--array ARRAY a job array" in out and "(not a limit)" in out, out
    assert "%%gpujob [--gpus GPUS]" in out, out  # the cell magic's name
    assert "%%%" not in out and "::" not in out, out  # (IPython's rst marks)
    assert not list(workdir.glob(".gpusched/cell-*.py"))  # nothing written, nothing submitted
    # a cell of the magic line alone has no body, which IPython refuses, pointing to the line
    # magic %gpujob: it gives the help too, and anything else is an error that says what to do
    assert run(shell, "%gpujob --help") is None
    assert "%%gpujob [--gpus GPUS]" in capsys.readouterr().out
    with pytest.raises(UsageError, match=r"write %%gpujob \(two %\) .* on the cell's first line"):
        run(shell, "%gpujob --gpus 1")
    assert not list(workdir.glob(".gpusched/cell-*.py"))
    cell = "import os\nprint('index', os.environ['GPUSCHED_ARRAY_INDEX'])\n"
    array = run(shell, "%%gpujob --gpus 1 --walltime 5m --array 0-2%1 --wait\n" + cell)
    out = capsys.readouterr().out
    assert f"Submitted array {array.id}: 3 jobs (" in out, out
    assert [job.state for job in array] == ["completed"] * 3
    assert all(f"{job.id}: completed" in out for job in array), out
    assert "index 2" in array[2].logs()


def test_gpujob_runs_a_cpu_only_cell_without_gpus(shell, workdir, capsys):
    cell = 'import os\nprint("cvd:", repr(os.environ["CUDA_VISIBLE_DEVICES"]))\n'
    job = run(shell, "%%gpujob --gpus 0 --cpus 2 --memory-gb 1 --wait\n" + cell)
    assert "cvd: ''" in capsys.readouterr().out
    assert job.state == "completed" and (job.data["gpus"], job.data["cpus"]) == (0, 2)
    run(shell, "%gpusched jobs")
    assert re.search(rf"{job.id}  completed +no GPU  tier 2", capsys.readouterr().out)


def test_gpujob_without_wait_and_status(shell, service, capsys):
    alice = service.client()
    fill_h100(alice)
    job = run(shell, "%%gpujob --gpus 8 --gpu-model H100 --walltime 1h\nprint('hi')\n")
    assert job.status() == "pending"
    out = capsys.readouterr().out
    assert f"Submitted {job.id} (pending · queued #1)" in out
    run(shell, "%gpusched status")
    out = capsys.readouterr().out
    assert "queue: 1 pending, 2 running; yours at #1" in out
    assert job.id in out and "queued #1" in out
    assert re.search(rf"{job.id}  pending +8x H100  tier 2", out), out  # GPUs in words
    run(shell, "%gpusched cluster")
    assert "16 of 24 GPUs allocated" in capsys.readouterr().out
    run(shell, f"%gpusched status {job.id}")  # not the general status, as if it were his
    assert capsys.readouterr().out.startswith("usage: %gpusched status | jobs")
    run(shell, f"%gpusched logs {job.id}")
    assert capsys.readouterr().out == f"{job.id}: no output yet\n"  # (it printed nothing)
    run(shell, f"%gpusched cancel {job.id}")
    assert f"{job.id}: cancelled" in capsys.readouterr().out
    # a running job is stopping, not "running" as if the cancel had failed; once it is gone,
    # the list says who ended it
    busy = run(shell, "%%gpujob --gpus 1 --walltime 1h\nimport time\ntime.sleep(60)\n")
    deadline = time.monotonic() + 30
    while busy.status() != "running":
        assert time.monotonic() < deadline, busy.data
        time.sleep(0.1)
    capsys.readouterr()
    run(shell, f"%gpusched cancel {busy.id}")
    assert f"{busy.id}: running (stopping: cancelled)" in capsys.readouterr().out
    busy.wait(timeout=30)
    run(shell, "%gpusched jobs")
    listed = capsys.readouterr().out
    assert re.search(rf"{busy.id}  cancelled .* gpujob +cancelled by alice", listed), listed


def test_gpujob_bad_options_are_one_line_usage_errors(shell, workdir, capsys):
    from IPython.core.error import UsageError

    cases = [
        ("--gpus -1", "%%gpujob --gpus: 'gpus' must be a whole number from 0"),  # the service's
        ("--gpus 0", "%%gpujob --cpus: a job with 'gpus' 0 must ask for 'cpus' or 'memory_gb'"),
        ("--tier 9", "%%gpujob --tier: 'tier' must be 1 (never pre-empted"),
        ("--walltime soon", "%%gpujob --walltime: "),
        # 120 seconds to the API, 120 minutes to a Slurm user: the unit must be said
        ("--walltime 120", "argument --walltime: '120' has no unit: write 120m for minutes"),
        ("--gpus two", "argument --gpus: invalid int value: 'two'"),  # IPython's parser
        ("--gpus 1 --nodes 2", "unrecognized arguments: --nodes 2"),
    ]
    for options, text in cases:
        result = shell.run_cell(f"%%gpujob {options}\nprint(1)\n", store_history=False)
        assert isinstance(result.error_in_exec, UsageError), (options, result.error_in_exec)
        shown = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(shown) == 1 and shown[0].startswith("UsageError: "), (options, shown)
        assert text in shown[0], (options, shown)
    assert not list(workdir.glob(".gpusched/cell-*.py"))  # refused cells leave no file
    shell.run_line_magic("gpusched", "status")  # the magic's client: the service still answers
    capsys.readouterr()
    magics = shell.magics_manager.registry["GPUSchedMagics"]
    magics._client = Client("http://127.0.0.1:1/", "t")  # errors that are not options: raised
    with pytest.raises(GPUSchedError, match="cannot reach"):
        run(shell, "%%gpujob --gpus 1\nprint(1)\n")


def test_client_estimate_prints_when_it_would_start_and_submits_nothing(service, workdir):
    alice = service.client()
    now = gc.estimate(command="true", gpus=2, client=alice)
    assert (now.start_now, now.queue, str(now)) == (True, "team", "starts now")
    fill_h100(alice)
    before = (alice.queue(), [j.data for j in alice.jobs()])
    later = alice.estimate(command="python train.py", gpus=8, gpu_model="H100", walltime="1h")
    assert not later.start_now and later.position == 1 and later.eta > time.time()
    assert str(later).startswith("about ") and str(later).endswith(" UTC): needs 8 GPUs; 0 free")
    assert later.reason["family"] == "capacity"
    # the same arguments as submit, function= included: nothing pickled, written or queued
    by_function = alice.estimate(function=print, gpus=8, gpu_model="H100", walltime="1h")
    assert by_function.eta == later.eta
    assert (alice.queue(), [j.data for j in alice.jobs()]) == before
    assert not (workdir / ".gpusched").exists()
    alice.submit(command="sleep 60", gpus=2, gpu_model="L40S", queue="small")
    capped = alice.estimate(command="true", gpus=1, queue="small")
    # expected once the queue's job ends (its default walltime), and why it waits till then
    assert str(capped).startswith("about ") and "small" in str(capped), str(capped)
    with pytest.raises(GPUSchedError) as info:
        alice.estimate(command="true", gpus=99)
    assert (info.value.status, info.value.field) == (400, "gpus")


def test_gpujob_estimate_prints_it_and_submits_nothing(shell, service, workdir, capsys):
    from IPython.core.error import UsageError

    alice = service.client()
    fill_h100(alice)
    before = alice.queue()
    estimate = run(shell, "%%gpujob --estimate --gpus 8 --gpu-model H100 --walltime 1h\nprint(1)\n")
    out = capsys.readouterr().out
    assert out.startswith("%%gpujob: about ")
    assert "UTC): needs 8 GPUs; 0 free (#1 in line, queue" in out
    assert estimate.position == 1 and alice.queue() == before
    assert not list(workdir.glob(".gpusched/cell-*.py"))  # no cell file either
    run(shell, "%%gpujob --estimate --gpus 1 --gpu-model L40S\nprint(1)\n")
    assert capsys.readouterr().out.startswith("%%gpujob: starts now (queue team)\n")
    result = shell.run_cell("%%gpujob --estimate --tier 9\nprint(1)\n", store_history=False)
    assert isinstance(result.error_in_exec, UsageError)  # a bad option: as without --estimate


# -- the widget --------------------------------------------------------------------------------
def test_queue_widget_rows_and_cancel(service):
    from jupyter_gpusched.notebook.widgets import QueueWidget

    alice = service.client()
    fill_h100(alice)
    waiting = alice.submit(command="true", gpus=8, gpu_model="H100", name="big")
    widget = QueueWidget(alice, interval=60, autostart=False)
    widget.refresh()
    assert widget.last_error is None
    assert len(widget.rows) == 3
    line = widget.rows[waiting.id]["html"].value
    assert "pending" in line and "queued #1" in line and "big" in line and "8x H100" in line
    assert "16 of 24 GPUs allocated (tier 2: 16)" in widget.cluster_html.value
    assert "gpu1" in widget.cluster_html.value

    button = widget.rows[waiting.id]["cancel"]
    button.click()  # what the browser's click does
    assert waiting.status() == "cancelled"
    assert waiting.id not in widget.rows and len(widget.rows) == 2
    widget.close()


def test_queue_widget_refreshes_in_a_thread_and_stops_on_close(service):
    from jupyter_gpusched.notebook.widgets import QueueWidget

    alice = service.client()
    widget = QueueWidget(alice, interval=0.05)  # no running loop here: a thread
    assert widget._refresher.mode == "thread"
    deadline = time.monotonic() + 10
    while widget.refreshes < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert widget.refreshes >= 2
    job = alice.submit(command="sleep 30", gpus=1)
    deadline = time.monotonic() + 10
    while job.id not in widget.rows and time.monotonic() < deadline:
        time.sleep(0.02)
    assert job.id in widget.rows
    widget.close()
    widget._refresher.thread.join(5)
    assert not widget.refreshing
    count = widget.refreshes
    time.sleep(0.2)
    assert widget.refreshes == count


def test_queue_widget_on_a_running_loop_does_not_block_it(service):
    from jupyter_gpusched.notebook.widgets import QueueWidget

    alice = service.client()

    async def main():
        widget = QueueWidget(alice, interval=0.05)
        assert widget._refresher.mode == "asyncio"
        ticks = 0
        while widget.refreshes < 3:  # the loop keeps turning while the requests run
            await asyncio.sleep(0.01)
            ticks += 1
            assert ticks < 1000
        widget.close()
        await asyncio.sleep(0.2)
        assert not widget.refreshing
        return widget.refreshes

    count = asyncio.run(main())
    assert count >= 3


def test_job_display(service):
    from jupyter_gpusched.notebook.widgets import JobWidget, job_widget_bundle

    alice = service.client()
    fill_h100(alice)
    job = alice.submit(command="true", gpus=8, gpu_model="H100")
    bundle = job._repr_mimebundle_()
    assert bundle["text/plain"] == repr(job) and "pending" in bundle["text/html"]
    assert job_widget_bundle(job, {}) == {}  # no kernel here: no widget view
    widget = JobWidget(job, interval=0.05)
    widget.cancel_button.click()
    assert job.state == "cancelled"
    assert widget.cancel_button.layout.display == "none"  # an ended job: no Cancel button
    assert "cancelled" in widget.html.value
    widget.close()


def test_submit_an_array_with_max_running_and_cancel_it_whole(service):
    client = service.client()
    array = client.submit(command="sleep 60", gpus=1, array=range(6), max_running=2)
    assert array.id.startswith("a-") and len(array) == 6
    assert [job.data["array_index"] for job in array] == list(range(6))
    assert array[0].data["array_max_running"] == 2
    deadline = time.monotonic() + 15
    while sum(job.status() == "running" for job in array) < 2:
        assert time.monotonic() < deadline, "two elements never ran"
        time.sleep(0.1)
    assert sum(job.status() == "running" for job in array) == 2  # never more than the cap
    cancelled = array.cancel()
    assert len(cancelled) == 6
    for job in array:
        assert job.wait(timeout=15) == "cancelled"
    with pytest.raises(GPUSchedError) as info:
        array.cancel()  # nothing of it is left
    assert info.value.status == 404
    # Slurm's text works too; max_running without an array is a mistake
    assert len(client.submit(command="true", gpus=0, cpus=1, array="1,3%1")) == 2
    with pytest.raises(GPUSchedError, match="max_running= is for a job array"):
        client.submit(command="true", max_running=2)
