"""A batch job as the notebook client sees it: :class:`Job` (its state, waiting for it, its
output, a ``function=`` job's result, its displays in a notebook) and the text the displays show.

Apart from :mod:`.client` (the HTTP conversation with the service, submitting): a Job only asks
its client for its latest view and its log, and the widgets (:mod:`.widgets`) build on it.
"""

from __future__ import annotations

import html
import os
import pickle
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from ..core.wording import gpus_text
from . import payloads
from .errors import GPUSchedError, JobFailedError

FINISHED = frozenset({"completed", "failed", "cancelled", "preempted", "rejected"})
ACTIVE = ("pending", "running")


def how_it_ended(view: dict) -> str | None:
    """A finished job's message (its view's), unless it only gives the exit code: "culled by
    the reaper: GPUs idle for ...", "cancelled by alice" (a server culled for idleness is
    ``completed`` with exit code 0, which alone does not say so)."""
    message = view.get("message")
    if view.get("state") in ACTIVE or message == f"exit code {view.get('exit_code')}":
        return None
    return message or None


MAX_LOG_BYTES = 1 << 20  # the most the service returns in one log request


class Job:
    """A job of mine. ``data`` is the service's last view of it (refreshed by :meth:`status`)."""

    # ``client``: the :class:`~jupyter_gpusched.notebook.client.Client` that made it (not
    # annotated: the client module imports this one, and the import rules allow no cycle)
    def __init__(self, client, job_id: str, data: dict | None = None, result_path=None):
        self.client = client
        self.id = job_id
        self.data = dict(data or {})
        self._result_path = result_path
        if result_path is None:
            self._result_path = payloads.result_path_from_command(self.data.get("command"))

    # -- state ---------------------------------------------------------------------------------
    @property
    def state(self) -> str | None:
        """The state as last seen (no request; :meth:`status` refreshes)."""
        return self.data.get("state")

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    def refresh(self) -> Job:
        self.data = self.client.request("GET", f"api/jobs/{self.id}")
        return self

    def status(self) -> str:
        """Refresh from the service; the state: pending, running, completed, failed,
        cancelled, preempted or rejected."""
        return self.refresh().state

    def wait(self, timeout: float | None = None, interval: float = 1.0) -> str:
        """Until the job ends; its final state. TimeoutError after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = min(0.1, interval)
        while self.status() not in FINISHED:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {self.id} is still {self.state} after {timeout:g} s")
            pause = delay if deadline is None else min(delay, max(0, deadline - time.monotonic()))
            time.sleep(pause)
            delay = min(interval, delay * 2)
        return self.state

    def cancel(self) -> str:
        """Cancel it (pending: dropped; running: signalled, then killed after the grace);
        the new state. GPUSchedError (409) if it has already ended."""
        self.data = self.client.cancel(self.id)
        return self.state

    # -- output --------------------------------------------------------------------------------
    def logs(self, follow: bool = False, file: IO[str] | None = None, interval: float = 0.5):
        """Without ``follow``: the end of the output (up to 1 MiB). With ``follow``: write the
        output to ``file`` (default stdout) as it comes, until the job ends; return all of it."""
        if not follow:
            return self.client.log(self.id, MAX_LOG_BYTES)
        out = file or sys.stdout
        seen = []
        for chunk in self.stream_logs(interval=interval):
            out.write(chunk)
            out.flush()
            seen.append(chunk)
        return "".join(seen)

    def stream_logs(self, interval: float = 0.5, timeout: float | None = None) -> Iterator[str]:
        """The job's output in pieces as it is written, until the job ends."""
        deadline = None if timeout is None else time.monotonic() + timeout
        previous = ""
        while True:
            ended = self.status() in FINISHED  # before reading: no output is missed at the end
            text = self.client.log(self.id, MAX_LOG_BYTES)
            new = _new_text(previous, text)
            if new:
                yield new
            previous = text
            if ended:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"job {self.id} is still {self.state} after {timeout:g} s")
            time.sleep(interval)

    def result(self, timeout: float | None = None) -> Any:
        """For a ``function=`` job: wait for it, then its function's return value. If the
        function raised, :class:`JobFailedError` with the job's traceback (its exception as
        ``__cause__``); the same if the job ended without a result (cancelled, killed)."""
        if self._result_path is None:
            raise GPUSchedError(f"job {self.id} was not submitted with function=", "function")
        state = self.wait(timeout)
        path = Path(self._result_path)
        if not path.exists():
            raise JobFailedError(
                f"job {self.id} ended {state} without a result; see job.logs()"
                + (f": {self.data.get('message')}" if self.data.get("message") else "")
            )
        if path.lstat().st_uid != os.geteuid():  # unpickling runs code: only the job's own
            raise JobFailedError(f"job {self.id}'s result {path} is not your file; not read")
        with path.open("rb") as f:
            outcome = pickle.load(f)
        if outcome["ok"]:
            return outcome["value"]
        error = JobFailedError(
            f"the function of job {self.id} raised {outcome['type']}: {outcome['message']}\n"
            f"--- traceback in the job ---\n{outcome['traceback']}",
            outcome["traceback"],
        )
        cause = None
        if outcome.get("exception") is not None:
            try:
                cause = pickle.loads(outcome["exception"])
            except Exception:
                cause = None
        raise error from cause

    # -- display -------------------------------------------------------------------------------
    def summary(self) -> dict[str, str]:
        """What the displays show, as text."""
        d = self.data
        reason = d.get("reason") or {}
        out = {
            "id": self.id,
            "name": d.get("name") or "",
            "state": (d.get("state") or "?")
            + (f" (stopping: {d['stopping']})" if d.get("stopping") else ""),
            "gpus": _gpus_text(d),
            "tier": str(d.get("tier", "")),
            "queue": d.get("queue") or "",
        }
        if d.get("deadline"):  # when it must have finished; "missed": it was unfinished then
            out["deadline"] = _clock(d["deadline"]) + (
                " (missed)" if d.get("deadline_missed") else ""
            )
        if d.get("state") == "pending":
            position = d.get("position")
            out["position"] = f"#{position + 1}" if position is not None else ""
            out["reason"] = reason.get("message") or reason.get("detail") or ""
            out["eta"] = _clock(reason.get("eta"))
        if d.get("planned_run_time"):  # what the engine plans it to run, and from what
            out["planned"] = d["planned_run_time"]["message"].removeprefix("planned to run ")
        if d.get("allocation"):
            out["where"] = ", ".join(_where(part) for part in d["allocation"])
        if d.get("state") == "running":
            out["utilization"] = utilization_text(d.get("utilization"))
        if d.get("state") in FINISHED and d.get("exit_code") is not None:
            out["exit code"] = str(d["exit_code"])
        if d.get("message") and d.get("state") in FINISHED:
            out["message"] = d["message"]
        return out

    def __repr__(self) -> str:
        s = self.summary()
        parts = [gpus_words(self.data), f"tier {s['tier']}", s["queue"]]
        if s.get("position"):
            parts.append(f"queued {s['position']}")
        if s.get("eta"):
            parts.append(f"ETA {s['eta']}")
        name = f" {s['name']!r}" if s["name"] else ""
        return f"<Job {self.id}{name} {s['state']}: {' · '.join(p for p in parts if p)}>"

    def _repr_html_(self) -> str:
        s = self.summary()
        colour = state_colour(s["state"])
        rows = "".join(
            f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(k)}</th>"
            f"<td style='text-align:left'>{html.escape(v)}</td></tr>"
            for k, v in s.items()
            if v and k not in ("id", "state")
        )
        return (
            f"<div class='gpusched-job'><b>Job {html.escape(self.id)}</b> "
            f"<span style='color:{colour};font-weight:bold'>{html.escape(s['state'])}</span>"
            f"<table style='font-size:90%'>{rows}</table></div>"
        )

    def _repr_mimebundle_(self, include=None, exclude=None):
        """Plain text and HTML; in a kernel with ipywidgets, a small live widget too (the state
        refreshing until the job ends, a cancel button)."""
        bundle = {"text/plain": repr(self), "text/html": self._repr_html_()}
        try:
            from .widgets import job_widget_bundle
        except ImportError:  # no ipywidgets
            return bundle
        return job_widget_bundle(self, bundle)


# -- helpers ---------------------------------------------------------------------------------
class JobArray:
    """The jobs of one job array (``client.submit(..., array=range(100), max_running=8)``), in
    index order: iterate over it, index it (``array[0]``: its first element), :meth:`cancel` it
    whole. ``id``: the array's (``a-...``)."""

    def __init__(self, client, array_id: str, jobs: list[Job]):
        self.client, self.id, self.jobs = client, array_id, list(jobs)

    def __iter__(self) -> Iterator[Job]:
        return iter(self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)

    def __getitem__(self, i: int) -> Job:
        return self.jobs[i]

    def cancel(self) -> list[dict]:
        """Cancel every element still pending or running; their views. GPUSchedError (404)
        when none is left."""
        return self.client.cancel_array(self.id)["jobs"]

    def __repr__(self) -> str:
        return f"<JobArray {self.id}: {len(self.jobs)} jobs>"


def _new_text(previous: str, text: str) -> str:
    """What ``text`` (a fresh tail of the log) adds to ``previous`` (the last tail)."""
    if text.startswith(previous):
        return text[len(previous) :]
    # the tail window moved past the start: find where the old end is in the new text
    anchor = previous[-4096:]
    index = text.rfind(anchor) if anchor else -1
    return text[index + len(anchor) :] if index >= 0 else text


def _where(part: dict) -> str:
    """``gpu1:0,1``; a part without GPUs (a CPU-only job) is its node alone."""
    gpus = ",".join(map(str, part["gpus"]))
    return f"{part['node']}:{gpus}" if gpus else part["node"]


def _gpus_text(d: dict) -> str:
    gpus, fraction = d.get("gpus"), d.get("gpu_fraction") or 1.0
    if gpus is None:
        return ""
    if gpus == 0:  # a CPU-only job: its table's row reads "gpus  none", not "gpus  0"
        return "none"
    text = f"{fraction:g}" if fraction < 1 else f"{gpus:g}"
    if d.get("gpu_models"):
        text += "x " + "|".join(d["gpu_models"])
    return text


def gpus_words(d: dict) -> str:
    """What a job asks for, in words: "8x H100", "1x H100 or L40S", "2 GPUs", "1 GPU", "0.5 of
    a GPU", "no GPU" (the widget's line; summary()'s ``gpus`` is the table column's "1x
    H100|L40S", "2")."""
    gpus, fraction = d.get("gpus"), d.get("gpu_fraction") or 1.0
    if gpus is None:
        return ""
    if gpus == 0:
        return "no GPU"
    count = fraction if fraction < 1 else gpus
    if d.get("gpu_models"):
        return f"{count:g}x " + " or ".join(d["gpu_models"])
    return f"{count:g} of a GPU" if fraction < 1 else gpus_text(gpus)


UNKNOWN = "\u2014"  # an em dash: what a display shows for a figure nobody measured


def utilization_text(utilization: dict | None) -> str:
    """A running job's ``utilization`` (the service's job view) as text: ``"63% at 14:02:05"``
    (the mean over its GPUs, and when its notebook server's GPU monitor measured it), or an em
    dash when unknown (a batch job, or a server that has not reported)."""
    if not utilization or utilization.get("percent") is None:
        return UNKNOWN
    text = f"{utilization['percent']:.0f}%"
    measured = utilization.get("measured_at")
    if measured:
        text += " at " + datetime.fromtimestamp(measured).strftime("%H:%M:%S")
    return text


def _clock(epoch: float | None) -> str:
    if not epoch:
        return ""
    moment = datetime.fromtimestamp(epoch)
    if moment.date() == datetime.now().date():
        return moment.strftime("%H:%M")
    return moment.strftime("%Y-%m-%d %H:%M")


# A job's state in colour (not the tier colours, which mean tiers only: widget_lines.TIER_COLOURS)
STATE_COLOURS = {"running": "#00695c", "pending": "#6d4c41", "completed": "#455a64"}


def state_colour(state: str) -> str:
    return STATE_COLOURS.get(state, "#c62828" if state in ("failed", "rejected") else "#616161")
