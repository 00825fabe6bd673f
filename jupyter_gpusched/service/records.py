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
from ..core.jobspec import FIELDS, JobSpec, SpecField
from ..core.runtime_estimates import plan_source, planned_text, run_name
from ..core.state import Part, Placement


@dataclass
class Extra:
    """What the service keeps beside an engine job: the spec's fields that are not the engine's
    (``on_job`` False; ``tests/test_jobspec.py`` checks that they are these), and its run."""

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

    @classmethod
    def from_spec(cls, number: int, spec: JobSpec) -> Extra:
        return cls(number, **{f.name: getattr(spec, f.name) for f in _EXTRA_FIELDS})


# The spec's stored fields, by where a row's value lives: on the engine's Job or in Extra.
_STORED = tuple(f for f in FIELDS if f.spec.column is not None)
_JOB_FIELDS = tuple(f for f in _STORED if f.spec.on_job)
_EXTRA_FIELDS = tuple(f for f in _STORED if not f.spec.on_job)
_JOB_STATE_FIELDS = ("queue", "priority", "held")  # change while a job lives (state_fields)


def _to_row(spec_field: SpecField, value):
    """A value as its JSON or SQL column holds it: sets as sorted lists, mappings copied."""
    if isinstance(value, frozenset):
        return sorted(value)
    return dict(value) if isinstance(value, dict) else value


def _from_row(spec_field: SpecField, value):
    """The inverse of :func:`_to_row`; NULL is the field's default (rows of older versions)."""
    if value is None:
        return spec_field.default_value()
    if isinstance(value, list):
        return frozenset(value)
    return dict(value) if isinstance(value, dict) else value


def job_id_for(number: int) -> str:
    return f"j-{number:06d}"


def array_id_for(number: int) -> str:
    """A job array's id: "a-" and the number of its first job (j-000012's array: a-000012)."""
    return f"a-{number:06d}"


def row_for(job: Job, extra: Extra) -> dict:
    """The whole ``jobs`` row of a job."""
    row = {"id": job.id, "number": extra.number, "submit_time": job.submit_time}
    for spec_field in _STORED:
        holder = job if spec_field.spec.on_job else extra
        row[spec_field.column_name] = _to_row(spec_field, getattr(holder, spec_field.name))
    return {**row, **state_fields(job, extra)}


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
        "deadline_missed": job.deadline_missed,
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
    def value(spec_field: SpecField):
        return _from_row(spec_field, row.get(spec_field.column_name))

    job = Job(
        id=row["id"],
        submit_time=row["submit_time"],
        **{f.name: value(f) for f in _JOB_FIELDS},
    )
    job.queue, job.user = job.queue or "", job.user or ""  # the Job's "" where a row has None
    job.held = bool(job.held)
    job.start_time = row.get("start_time")
    job.first_start = row.get("first_start")
    job.runs = row.get("runs") or 0
    job.preemptions = row.get("preemptions") or 0
    job.deadline_missed = bool(row.get("deadline_missed"))  # NULL: a row from before deadlines
    job.run_name = run_name(row.get("name"), row.get("notebook"), row.get("command"))
    extra = Extra(
        number=row["number"],
        **{f.name: value(f) for f in _EXTRA_FIELDS},
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


# The job view: the spec's fields everyone sees, and those only the owner (and admins) see.
def view_columns(view: str, fields=FIELDS) -> tuple[str, ...]:
    """The columns of the spec's fields a job view of this kind (public, owner) shows."""
    return tuple(f.column_name for f in fields if f.spec.column and f.spec.view == view)


PUBLIC_VIEW, OWNER_VIEW = view_columns("public"), view_columns("owner")


def public_job(row: dict, *, mine: bool, full: bool, position: int | None = None) -> dict:
    """A job as a caller sees it. ``full``: the caller's own job, or the caller is an admin;
    otherwise the user, name, command, notebook, environment and directory are left out."""
    view = {"id": row["id"], "state": row["state"]}
    view.update((key, row[key]) for key in PUBLIC_VIEW)
    view.update(
        {
            "submit_time": row["submit_time"],
            "start_time": row["start_time"],
            "end_time": row["end_time"],
            "runs": row["runs"],
            "preemptions": row["preemptions"],
            "deadline_missed": bool(row.get("deadline_missed")),
            "reason": row["reason"],
            "position": position,
            "mine": mine,
        }
    )
    if full:
        view.update((key, row.get(key)) for key in OWNER_VIEW)
        view["exit_code"], view["message"] = row.get("exit_code"), row.get("message")
    return view


def planned_view(job: Job, reason: dict | None) -> dict | None:
    """What the engine plans an unfinished job to run (the job view's ``planned_run_time``):
    ``{"seconds", "from": estimate | walltime | default, "message"}``; None before the engine
    froze it (it does at submission: ``core/runtime_estimates.py``). ``reason``: the reason it
    is shown with (wire form); where it waits on GPUs, placement, a reservation or maintenance,
    its run time decides when it can start, and the default's message says to give a walltime
    (not under a quota, where a walltime changes nothing)."""
    seconds = job.planned_run_time
    if seconds is None:
        return None
    advise = reason is not None and (
        reason["family"] != "policy" or reason["detail"] in ("reservation", "maintenance")
    )
    return {"seconds": seconds, "from": plan_source(job), "message": planned_text(job, advise)}


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


def utilization_series(samples, gpus: float) -> list[list]:
    """``[time, percent]`` of each of a server's kept samples (oldest first; percent as
    :func:`utilization_view` reads it, None where a sample has no figure)."""
    series = []
    for sample in samples:
        view = utilization_view(sample, gpus)
        series.append([sample.get("time"), view["percent"] if view else None])
    return [point for point in series if point[0] is not None]
