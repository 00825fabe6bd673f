"""What the notebook's widgets say, as HTML (:mod:`.widgets`): a job's line, a job array's line
and the cluster's occupancy. Pure functions of the service's views."""

from __future__ import annotations

import html
import math
from collections import Counter

from .job import Job, gpus_words, state_colour
from .magics import node_usage

TIER_COLOURS = {1: "#1565c0", 2: "#2e7d32", 3: "#ef6c00"}


def job_line(job: Job) -> str:
    s = job.summary()
    state = s["state"]
    status = f"<span style='color:{state_colour(state)}'>{html.escape(state)}</span>"
    parts = _opening(job.id, s, status, job.data)
    if job.data.get("deadline"):  # as the scheduler's page says it
        missed = job.data.get("deadline_missed")
        due = html.escape(s["deadline"].removesuffix(" (missed)"))
        parts.append(
            f"<span class='gpusched-deadline' style='color:{state_colour('failed')}'>"
            f"missed its deadline {due}</span>"
            if missed
            else f"<span class='gpusched-deadline'>due by {due}</span>"
        )
    if state == "pending":
        parts += _waiting(s, "queued")
        if s.get("planned"):  # what decides whether it may start in front of a reservation
            planned = html.escape(f"planned to run {s['planned']}")
            parts.append(f"<span class='gpusched-planned' style='color:#616161'>{planned}</span>")
    else:
        if s.get("where"):
            parts.append(f"on {html.escape(s['where'])}")
        if "utilization" in s:
            parts.append(
                f"<span class='gpusched-utilization' title='GPU utilization (mean over its "
                f"GPUs), as its notebook server last reported it'>GPU util "
                f"{html.escape(s['utilization'])}</span>"
            )
    return " · ".join(parts)


def array_line(array_id: str, name: str | None, elements: list[Job]) -> str:
    """A job array's line, as the Lab panel says it: its name as the queue gives it
    (``a-000012_[2-7%2]``), the job's name, "array of 8 jobs, 2 running, 6 pending", "1 GPU
    each", tier and queue, its cap, and its first waiting element's place, reason and ETA."""
    first = elements[0]
    s, count = first.summary(), Counter(job.state for job in elements)
    jobs = f"{len(elements)} job{'s' if len(elements) != 1 else ''}"
    status = f"array of {jobs}, {count['running']} running, {count['pending']} pending"
    parts = _opening(name or array_id, s, status, first.data, each=" each")
    if first.data.get("array_max_running"):
        parts.append(f"at most {first.data['array_max_running']} running")
    waiting = [job for job in elements if job.state == "pending"]
    if waiting:  # the next to start: first in line (api/jobs lists the newest first)
        next_up = min(waiting, key=lambda job: _or_inf(job.data.get("position")))
        parts += _waiting(next_up.summary(), "first waiting queued")
    return " · ".join(parts)


def _opening(title: str, s: dict, status: str, data: dict, each: str = "") -> list[str]:
    """A line's first parts: its title in bold, its name, ``status`` (HTML), what it asks for,
    its tier and queue."""
    parts = [f"<b>{html.escape(title)}</b>"]
    if s["name"]:
        parts.append(html.escape(s["name"]))
    parts.append(status)
    gpus = html.escape(gpus_words(data))
    parts.append(f"{gpus}{each} · tier {s['tier']} · {html.escape(s['queue'])}")
    return parts


def _waiting(s: dict, queued: str) -> list[str]:
    """A pending job's place ("queued #3"), reason and ETA, those it has."""
    parts = [f"{queued} {s['position']}"] if s.get("position") else []
    if s.get("reason"):
        parts.append(html.escape(s["reason"]))
    if s.get("eta"):
        parts.append(f"ETA {s['eta']}")
    return parts


def _or_inf(position: int | None) -> float:
    return math.inf if position is None else position


def cluster_html(cluster: dict, queue: dict) -> str:
    total_tiers: dict[int, float] = {}
    rows = []
    for node, used, tiers in node_usage(cluster):
        for tier, n in tiers.items():
            total_tiers[tier] = total_tiers.get(tier, 0) + n
        segments = "".join(
            f"<div title='tier {t}: {n:g} GPU' style='width:{100 * n / node['gpus']:.1f}%;"
            f"background:{TIER_COLOURS.get(t, '#757575')}'></div>"
            for t, n in sorted(tiers.items())
        )
        bar = (
            "<div style='display:flex;width:160px;height:10px;background:#e0e0e0;"
            f"border-radius:2px;overflow:hidden'>{segments}</div>"
        )
        state = "" if node["state"] == "up" else f" ({html.escape(str(node['state']))})"
        rows.append(
            f"<tr><td>{html.escape(node['name'])}{state}</td>"
            f"<td>{html.escape(node['gpu_model'] or '')}</td><td>{bar}</td>"
            f"<td>{used:g}/{node['gpus']}</td></tr>"
        )
    summary = ", ".join(f"tier {t}: {n:g}" for t, n in sorted(total_tiers.items())) or "idle"
    head = (
        f"{cluster['allocated_gpus']:g} of {cluster['total_gpus']} GPUs allocated ({summary}); "
        f"queue: {queue['pending']} pending, {queue['running']} running"
    )
    return f"<div>{head}</div><table style='font-size:90%'>{''.join(rows)}</table>"
