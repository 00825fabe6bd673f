"""ipywidgets for the notebook: :class:`QueueWidget` (my jobs, the queue, the cluster) and a
job's live display (``Job._repr_mimebundle_``).

    from jupyter_gpusched.notebook.widgets import QueueWidget
    QueueWidget()          # refreshes every 5 s without blocking the kernel; .close() stops it

Refreshing: on the kernel's running asyncio loop when there is one (the requests run in a worker
thread, the widgets are updated on the loop); otherwise in a daemon thread of its own.

Cancel buttons: only on jobs that can still be cancelled (not on ended or stopping ones), and
never on a notebook server's job (kind ``notebook``). A server is stopped from the hub's home
page, which the row links to: one click in a jobs list should not end the server the user is
typing in (the widget itself runs in it), and the hub's stop is the one that ends the server's
processes before its GPUs are given back. A confirmation dialog would still be one slip away
from that, and ipywidgets has none that the user would not have to learn first.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import threading
import time

import ipywidgets as w

from .client import Client, GPUSchedError
from .environment import JobEnvironment
from .job import ACTIVE, FINISHED, Job
from .widget_lines import array_line, cluster_html, job_line


class _Refresher:
    """Calls ``fetch`` (blocking, in a worker thread) then ``render(data)`` every ``interval``
    seconds until :meth:`stop` or ``done(data)``."""

    def __init__(self, fetch, render, interval: float, done=lambda data: False):
        self.fetch, self.render, self.interval, self.done = fetch, render, interval, done
        self.stopped = threading.Event()
        self.task: asyncio.Task | None = None
        self.thread: threading.Thread | None = None
        self.mode = "stopped"

    def start(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None:
            self.mode = "asyncio"
            self.task = loop.create_task(self._run_async())
        else:
            self.mode = "thread"
            self.thread = threading.Thread(target=self._run_thread, daemon=True)
            self.thread.start()

    def _step(self, data) -> bool:
        if self.stopped.is_set():
            return False
        self.render(data)
        return not self.done(data)

    async def _run_async(self) -> None:
        while not self.stopped.is_set():
            data = await asyncio.to_thread(self._fetch)
            if not self._step(data):
                return
            await asyncio.sleep(self.interval)

    def _run_thread(self) -> None:
        while not self.stopped.is_set():
            if not self._step(self._fetch()):
                return
            self.stopped.wait(self.interval)

    def _fetch(self):
        try:
            return self.fetch()
        except GPUSchedError as exc:
            return exc

    @property
    def running(self) -> bool:
        if self.task is not None:
            return not self.task.done()
        return self.thread is not None and self.thread.is_alive()

    def stop(self) -> None:
        self.stopped.set()
        if self.task is not None and not self.task.done():
            with contextlib.suppress(RuntimeError):  # its loop is closed
                self.task.cancel()


class QueueWidget(w.VBox):
    """My running and pending jobs (position, reason, ETA, GPUs; running: where, and the GPU
    utilization its notebook server last reported, "—" when unknown; a cancel button each; a job
    array: one row, one Cancel array) and the cluster's occupancy by node and tier, refreshed
    every ``interval`` seconds.
    ``autostart=False``: no refreshing until :meth:`start` (call :meth:`refresh` yourself)."""

    def __init__(self, client: Client | None = None, interval: float = 5, autostart=True, **kw):
        self.client = client if client is not None else Client()
        self.interval = interval
        self.status_line = w.HTML("<i>loading…</i>")
        self.jobs_box = w.VBox()
        self.cluster_html = w.HTML()
        self.rows: dict[str, dict] = {}  # job id -> {"job": Job, "html": HTML, "cancel": Button}
        self.last_error: str | None = None
        self.refreshes = 0
        super().__init__(
            [
                w.HTML("<b>My GPU jobs</b>"),
                self.jobs_box,
                w.HTML("<b>Cluster</b>"),
                self.cluster_html,
                self.status_line,
            ],
            **kw,
        )
        self._refresher = _Refresher(self._fetch, self._render, interval)
        if autostart:
            self.start()

    # -- refreshing ----------------------------------------------------------------------------
    def start(self) -> None:
        if not self._refresher.running:
            self._refresher = _Refresher(self._fetch, self._render, self.interval)
            self._refresher.start()

    @property
    def refreshing(self) -> bool:
        return self._refresher.running

    def close(self) -> None:
        """Stop refreshing and close the widgets."""
        self._refresher.stop()
        super().close()

    def refresh(self) -> None:
        """Fetch and show now (blocking: call it from a thread in an event loop's thread)."""
        try:
            data = self._fetch()
        except GPUSchedError as exc:
            data = exc
        self._render(data)

    def _fetch(self) -> dict:
        return {
            "jobs": self.client.jobs(state=list(ACTIVE)),
            "queue": self.client.queue(),
            "cluster": self.client.cluster(),
            "time": time.time(),
        }

    def _render(self, data) -> None:
        if isinstance(data, GPUSchedError):
            self.last_error = str(data)
            self.status_line.value = (
                f"<span style='color:#c62828'>{html.escape(self.last_error)}</span>"
            )
            return
        self.last_error = None
        self.refreshes += 1
        queue = data["queue"]
        positions = {e["id"]: e for e in queue["jobs"] if e.get("mine")}
        rows: dict = {}
        for job in data["jobs"]:
            entry = positions.get(job.id)
            if entry is not None and job.data.get("position") is None:
                job.data["position"] = entry["position"]
            array_id = job.data.get("array_id")
            if array_id:  # an array is one row, where its newest element stands (as the panel)
                key = ("array", array_id)
                row = rows.get(key) or self.rows.get(key) or self._make_array_row(array_id)
                if key not in rows:
                    row["jobs"], row["name"] = [], (queue.get("arrays") or {}).get(array_id)
                    rows[key] = row
                row["jobs"].append(job)
                continue
            row = self.rows.get(job.id) or self._make_row(job)
            row["job"] = job
            self._show(row)
            rows[job.id] = row
        for row in rows.values():
            if "jobs" in row:
                self._show_array(row)
        for job_id, row in self.rows.items():
            if job_id not in rows:
                row["box"].close()
        self.rows = rows
        self.jobs_box.children = [row["box"] for row in rows.values()] or [
            w.HTML("<i>no pending or running jobs</i>")
        ]
        self.cluster_html.value = cluster_html(data["cluster"], queue)
        stamp = time.strftime("%H:%M:%S", time.localtime(data["time"]))
        self.status_line.value = f"<small>updated {stamp} · every {self.interval:g} s</small>"

    def _make_row(self, job: Job) -> dict:
        """A job's line, after a Cancel button, or for a notebook server a link to the hub's
        home page (``cancel`` None; see the module docstring)."""
        line = w.HTML()
        if _is_server(job):
            hint = w.HTML(server_hint(job))
            hint.add_class("gpusched-server-hint")
            return {"job": job, "html": line, "cancel": None, "box": w.HBox([hint, line])}
        button = w.Button(description="Cancel", button_style="danger", tooltip=f"cancel {job.id}")
        button.layout.width, button.layout.flex = "auto", "0 0 auto"  # (80px cut it to "Can…")
        row = {"job": job, "html": line, "cancel": button}
        row["box"] = w.HBox([button, line])
        button.on_click(lambda _button, job_id=job.id: self.cancel(job_id))
        return row

    def _make_array_row(self, array_id: str) -> dict:
        """A job array's line, after one Cancel button for all its elements."""
        button = w.Button(
            description="Cancel array", button_style="danger", tooltip=f"cancel {array_id}"
        )
        button.layout.width, button.layout.flex = "auto", "0 0 auto"  # its whole label
        row = {"array_id": array_id, "html": w.HTML(), "cancel": button, "jobs": []}
        row["box"] = w.HBox([button, row["html"]])
        button.on_click(lambda _button: self.cancel_array(array_id))
        return row

    @staticmethod
    def _show_array(row: dict) -> None:
        row["html"].value = array_line(row["array_id"], row["name"], row["jobs"])
        active = any(_cancellable(job) for job in row["jobs"])
        row["cancel"].layout.display = "" if active else "none"

    def cancel_array(self, array_id: str) -> None:
        """Cancel every pending and running element of my job array ``array_id``, and refresh."""
        row = self.rows.get(("array", array_id))
        if row is not None:
            row["cancel"].disabled = True
        try:
            self.client.cancel_array(array_id)
        except GPUSchedError as exc:
            self.status_line.value = f"<span style='color:#c62828'>{html.escape(str(exc))}</span>"
        if row is not None:
            row["cancel"].disabled = False
        self.refresh()

    @staticmethod
    def _show(row: dict) -> None:
        row["html"].value = job_line(row["job"])
        if row["cancel"] is not None:
            row["cancel"].layout.display = "" if _cancellable(row["job"]) else "none"

    def cancel(self, job_id: str) -> None:
        """Cancel one of my jobs (the cancel buttons call this) and refresh."""
        row = self.rows.get(job_id)
        if row is not None and row["cancel"] is not None:
            row["cancel"].disabled = True
        try:
            view = self.client.cancel(job_id)
        except GPUSchedError as exc:
            self.status_line.value = f"<span style='color:#c62828'>{html.escape(str(exc))}</span>"
            if row is not None and row["cancel"] is not None:
                row["cancel"].disabled = False
            return
        if row is not None:  # ended (or stopping) now, whatever the refresh finds
            row["job"].data = view
            self._show(row)
        self.refresh()


def _is_server(job: Job) -> bool:
    return job.data.get("kind") == "notebook"


def _cancellable(job: Job) -> bool:
    return not job.finished and not job.data.get("stopping")


def server_hint(job: Job) -> str:
    """What a notebook server's row says instead of a Cancel button."""
    name, env = job.data.get("server_name"), JobEnvironment.read()
    if job.id == env.job_id:  # the spawner sets it in the server
        what = "this notebook server (the one you are working in)"
    else:
        what = f"notebook server {name!r}" if name else "your notebook server"
    home = env.hub_base_url.rstrip("/") + "/hub/home"
    return (
        f"<small>{html.escape(what)}: stop it from the "
        f"<a href='{html.escape(home)}' target='_blank'>hub's home page</a></small>"
    )


class JobWidget(w.HBox):
    """One job: its state (refreshing until it ends) and a cancel button while it can be
    cancelled; a notebook server's job links to the hub's home page instead (``cancel_button``
    None)."""

    def __init__(self, job: Job, interval: float = 5, autostart=True):
        self.job = job
        self.html = w.HTML(job._repr_html_())
        self.cancel_button = None
        if _is_server(job):
            side = w.HTML(server_hint(job))
        else:
            side = self.cancel_button = w.Button(description="Cancel", button_style="danger")
            self.cancel_button.on_click(lambda _b: self.cancel())
        super().__init__([self.html, side])
        self._show_cancel()
        self._refresher = _Refresher(
            lambda: self.job.refresh(), self._render, interval, done=self._ended
        )
        if autostart and not job.finished:
            self._refresher.start()

    def _ended(self, data) -> bool:
        return not isinstance(data, GPUSchedError) and self.job.finished

    def _render(self, data) -> None:
        if isinstance(data, GPUSchedError):
            return
        self.html.value = self.job._repr_html_()
        self._show_cancel()

    def _show_cancel(self) -> None:
        if self.cancel_button is not None:
            self.cancel_button.layout.display = "" if _cancellable(self.job) else "none"

    def cancel(self) -> None:
        with contextlib.suppress(GPUSchedError):
            self.job.cancel()
        self._render(self.job)

    def close(self) -> None:
        self._refresher.stop()
        super().close()


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def job_widget_bundle(job: Job, bundle: dict) -> dict:
    """``bundle`` (text and HTML) plus a live :class:`JobWidget` view when in a kernel."""
    if not _in_kernel() or job.state in FINISHED:
        return bundle
    widget_bundle = JobWidget(job)._repr_mimebundle_()
    if isinstance(widget_bundle, tuple):
        widget_bundle = widget_bundle[0]
    return {**bundle, **(widget_bundle or {})}
