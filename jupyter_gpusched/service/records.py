"""Between the engine's objects and the service's rows and JSON views.

- a job row (the ``jobs`` table) <-> an engine :class:`~..core.jobs.Job` plus :class:`Extra`,
  what only the service needs (command, environment, the launcher's handle);
- a placement <-> ``allocations`` rows (node names and GPU indices, not engine indices);
- the JSON a caller sees: their own jobs in full; other users' jobs anonymised.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core import reasons
from ..core.cluster import Cluster
from ..core.jobs import Job, JobState, Reason
from ..core.state import Part, Placement


@dataclass
class Extra:
    """What the service keeps beside an engine job."""

    number: int
    command: str | None = None
    notebook: str | None = None
    name: str | None = None
    server_name: str | None = None  # a notebook server's hub name
    profile: str | None = None  # a notebook server's hub profile (slug), as its spawner said
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    handle: dict | None = None  # the launcher's, for the current run
    exit_code: int | None = None
    message: str | None = None


def job_id_for(number: int) -> str:
    return f"j-{number:06d}"


def row_for(job: Job, extra: Extra) -> dict:
    """The whole ``jobs`` row of a job."""
    return {
        "id": job.id,
        "number": extra.number,
        "user": job.user,
        "queue": job.queue,
        "tier": job.tier,
        "kind": job.kind,
        "gpus": job.gpus,
        "gpus_per_node": job.gpus_per_node,
        "gpu_models": sorted(job.gpu_models) if job.gpu_models is not None else None,
        "gpu_fraction": job.gpu_fraction,
        "cpus": job.cpus,
        "memory_gb": job.memory_gb,
        "walltime": job.walltime,
        "labels": dict(job.labels),
        "command": extra.command,
        "notebook": extra.notebook,
        "name": extra.name,
        "server_name": extra.server_name,
        "profile": extra.profile,
        "env": dict(extra.env),
        "cwd": extra.cwd,
        "submit_time": job.submit_time,
        **state_fields(job, extra),
    }


def state_fields(job: Job, extra: Extra) -> dict:
    """The columns that change while a job lives."""
    reason = job.reason
    if job.state == JobState.REJECTED:
        reason = reasons.CANNOT_RUN.reason(message=job.reject_reason or "")
    return {
        "queue": job.queue,
        "state": job.state.value,
        "priority": job.priority,
        "held": job.held,
        "reason": reason_dict(reason)
        if job.state in (JobState.PENDING, JobState.REJECTED)
        else None,
        "start_time": job.start_time,
        "first_start": job.first_start,
        "end_time": job.end_time,
        "runs": job.runs,
        "preemptions": job.preemptions,
        "exit_code": extra.exit_code,
        "message": extra.message,
        "handle": extra.handle,
    }


def reason_dict(reason: Reason | None, hide_users: bool = False) -> dict | None:
    """The wire and database form of a reason; ``hide_users``: "its owner" in the message
    where it names a user (the catalogue, core/reasons.py, says which arguments do)."""
    if reason is None:
        return None
    return {
        "family": reason.family,
        "detail": reason.detail,
        "message": reason.render(hide_users),
        "eta": reason.eta,
    }


def job_from_row(row: dict) -> tuple[Job, Extra]:
    models = row.get("gpu_models")
    job = Job(
        id=row["id"],
        gpus=row["gpus"],
        submit_time=row["submit_time"],
        tier=row["tier"],
        queue=row["queue"] or "",
        user=row["user"] or "",
        kind=row["kind"],
        gpus_per_node=row.get("gpus_per_node"),
        gpu_models=frozenset(models) if models is not None else None,
        labels=dict(row.get("labels") or {}),
        cpus=row.get("cpus"),
        memory_gb=row.get("memory_gb"),
        walltime=row.get("walltime"),
        gpu_fraction=row.get("gpu_fraction") or 1.0,
        priority=row.get("priority") or 0,
        held=bool(row.get("held")),
    )
    job.start_time = row.get("start_time")
    job.first_start = row.get("first_start")
    job.runs = row.get("runs") or 0
    job.preemptions = row.get("preemptions") or 0
    extra = Extra(
        number=row["number"],
        command=row.get("command"),
        notebook=row.get("notebook"),
        name=row.get("name"),
        server_name=row.get("server_name"),
        profile=row.get("profile"),
        env=dict(row.get("env") or {}),
        cwd=row.get("cwd"),
        handle=row.get("handle"),
        exit_code=row.get("exit_code"),
        message=row.get("message"),
    )
    return job, extra


def gpu_indices(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


def allocation_rows(job: Job, placement: Placement, cluster: Cluster, start: float) -> list:
    rows = []
    for part in placement.parts:
        node = cluster.nodes[part.node]
        rows.append(
            {
                "job_id": job.id,
                "run": job.runs,
                "node": node.name,
                "gpu_indices": gpu_indices(part.mask),
                "gpu_model": node.gpu_model,
                "gpus": part.gpus * part.fraction,
                "cpus": part.cpus,
                "memory_gb": part.memory_gb,
                "queue": job.queue,
                "user": job.user,
                "tier": job.tier,
                "start": start,
                "end": None,
            }
        )
    return rows


def placement_from_rows(rows: list[dict], cluster: Cluster) -> Placement:
    """The placement stored as ``allocations`` rows; ConfigError if a node is gone."""
    parts = []
    for row in rows:
        node = cluster.node(row["node"])
        mask = 0
        for index in row["gpu_indices"]:
            mask |= 1 << index
        gpus = len(row["gpu_indices"])
        fraction = min(1.0, row["gpus"] / gpus) if gpus else 1.0  # no GPU: a CPU-only job
        parts.append(
            Part(node.index, mask, row.get("cpus") or 0.0, row.get("memory_gb") or 0.0, fraction)
        )
    return Placement(tuple(parts))


def placement_view(placement: Placement, cluster: Cluster) -> list[dict]:
    return [
        {
            "node": cluster.nodes[part.node].name,
            "gpus": gpu_indices(part.mask),
            "gpu_fraction": part.fraction,
        }
        for part in placement.parts
    ]


def public_job(row: dict, *, mine: bool, full: bool, position: int | None = None) -> dict:
    """A job as a caller sees it. ``full``: the caller's own job, or the caller is an admin;
    otherwise the user, name, command, notebook, environment and directory are left out."""
    view = {
        "id": row["id"],
        "state": row["state"],
        "kind": row["kind"],
        "queue": row["queue"],
        "tier": row["tier"],
        "gpus": row["gpus"],
        "gpu_fraction": row["gpu_fraction"],
        "gpus_per_node": row["gpus_per_node"],
        "gpu_models": row["gpu_models"],
        "walltime": row["walltime"],
        "priority": row["priority"],
        "held": row["held"],
        "submit_time": row["submit_time"],
        "start_time": row["start_time"],
        "end_time": row["end_time"],
        "runs": row["runs"],
        "preemptions": row["preemptions"],
        "reason": row["reason"],
        "position": position,
        "mine": mine,
    }
    if full:
        for key in ("user", "name", "command", "notebook", "env", "cwd", "exit_code", "message"):
            view[key] = row.get(key)
        for key in ("server_name", "profile"):
            view[key] = row.get(key)
        view["cpus"], view["memory_gb"] = row.get("cpus"), row.get("memory_gb")
    return view


def utilization_view(sample: dict | None, gpus: float) -> dict | None:
    """A notebook server's latest GPU-monitor sample (as the reaper keeps it) as the job view's
    ``utilization``: ``{"percent", "measured_at", "devices"}``. ``percent`` is the mean over the
    server's GPUs (each device's utilization; without device figures, the server's total, which
    is in percent of one GPU, over its GPUs); None when the sample has no figure. None without a
    sample."""
    if not sample:
        return None
    devices = [
        {"index": d.get("index"), "utilization": d.get("utilization")}
        for d in sample.get("devices") or []
    ]
    known = [d["utilization"] for d in devices if d["utilization"] is not None]
    if known:
        percent = sum(known) / len(known)
    elif sample.get("utilization") is not None:
        percent = sample["utilization"] / max(gpus or 1.0, 1.0)
    else:
        percent = None
    return {
        "percent": None if percent is None else round(min(percent, 100.0), 1),
        "measured_at": sample.get("time"),
        "devices": devices,
    }
