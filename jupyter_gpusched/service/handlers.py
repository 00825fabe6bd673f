"""The REST API for users: the cluster, the queue, and their own jobs.

Every handler is an :class:`.api_handler.APIHandler` (the caller identified before the method
runs, the body bounded, errors as JSON, others' jobs anonymised: see :mod:`.api_handler`).
Admin routes are in :mod:`.admin_handlers`; a path no route matches gets
:class:`NotFoundHandler`'s JSON 404.
"""

from __future__ import annotations

import os
import re

from tornado import web

from ..core.arrays import array_name
from ..core.fairshare import fair_share_rank
from ..core.jobs import JobState
from .api_handler import APIError, APIHandler, api, shown_reason
from .arrays import cancel_array, unfinished_elements
from .records import planned_view, reason_dict
from .requests import MAX_LIST_LIMIT, MAX_LOG_BYTES, parse_job_request, take_array
from .server_stops import MAX_REASON

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")  # Unicode's control characters (Cc)


class NotFoundHandler(web.RequestHandler):
    """Any path no route matches: a JSON 404 like the API's others (tornado's is an HTML page)."""

    def prepare(self):
        raise APIError(404, f"no such route: {self.request.path[:200]}")

    def check_xsrf_cookie(self):
        """Nothing to protect: every request is answered 404."""

    write_error = APIHandler.write_error


class MeHandler(APIHandler):
    """``GET api/me``: who the service takes the caller to be (``name``, ``admin``,
    ``groups``): the JupyterLab panel shows the admin-only parts (reaper settings) from it;
    ``queues``: the leaf queues the caller may submit to, with the GPUs in use there, the
    guarantee and the limit, ``default`` marking the one a job without a queue goes to (the
    spawn form lists them), and ``fair_share``: where the queue stands in the fair-share order
    (``rank`` 1 goes first, ``of`` ranks, its ``factor``; the web page shows it);
    ``idle_timeouts``: by hub profile, the idle timeout a new server of the caller's would have
    now, the admin's changes and exemptions included (null: never stopped for idleness), which
    the spawn form shows."""

    @api
    def get(self):
        who = self.identity
        engine = self.live.engine
        tree, factors = engine.tree, engine.priorities.factors
        default = tree.default_for(who.name, who.groups)
        queues = [
            {
                "path": queue.label(),
                "in_use": queue.in_use,
                "guaranteed": queue.guaranteed,
                "limit": None if queue.limit == float("inf") else queue.limit,
                "default": queue is default,
                "fair_share": _fair_share(factors, queue.path),
            }
            for queue in sorted(tree.queues_for(who.name, who.groups), key=lambda q: q.path)
        ]
        me = {"name": who.name, "admin": who.admin, "groups": sorted(who.groups), "queues": queues}
        if self.live.reaper is not None:
            me["idle_timeouts"] = self.live.reaper.promised_timeouts(who.name, who.groups)
        self.send(me)


def _fair_share(factors: dict, path: str) -> dict | None:
    rank = fair_share_rank(factors, path)
    if rank is None:
        return None
    return {"rank": rank[0], "of": rank[1], "factor": round(factors[path], 4)}


class ClusterHandler(APIHandler):
    @api
    def get(self):
        live, me = self.live, self.identity.name
        engine = live.engine
        state = engine.state
        nodes = []
        for node in live.cluster.nodes:
            gpus = [{"index": i, "jobs": []} for i in range(node.gpus)]
            for holding in engine.holdings(node.index):  # reserved: freed for a pre-emptor
                job_id, part = holding.job_id, holding.part
                job = engine.jobs.get(job_id)
                if job is None:
                    continue
                visible = self.admin or job.user == me
                for i in range(node.gpus):
                    if part.mask >> i & 1:
                        holder = {"job": job_id if visible else None, "fraction": part.fraction}
                        holder["user"] = job.user if visible else None
                        holder["tier"] = job.tier
                        holder["reserved"] = holding.reserved
                        gpus[i]["jobs"].append(holder)
            nodes.append(
                {
                    "name": node.name,
                    "gpu_model": node.gpu_model,
                    "gpus": node.gpus,
                    "free": state.free[node.index],
                    "state": state.node_state[node.index],
                    "maintenance": engine.maintenance.get(node.index),
                    "leaf": node.leaf,
                    "spine": node.spine,
                    "labels": node.labels,
                    "gpu_list": gpus,
                }
            )
        total = live.cluster.total_gpus
        busy = sum(job.amount for job in engine.running.values())
        self.send({"total_gpus": total, "allocated_gpus": busy, "nodes": nodes})


def _array_names(pending) -> dict[str, str]:
    """Each job array among the ``pending`` jobs listed: the one row its pending elements are
    listed as, the command line's (``a-000012_[5-99%8]``, core/arrays.py)."""
    indices: dict[str, list[int]] = {}
    caps: dict[str, int | None] = {}
    for job in pending:
        if job.array_id is not None:
            indices.setdefault(job.array_id, []).append(job.array_index)
            caps[job.array_id] = job.array_max_running
    return {key: array_name(key, found, caps[key]) for key, found in indices.items()}


class QueueHandler(APIHandler):
    @api
    def get(self):
        engine, me = self.live.engine, self.identity.name
        limit = self.whole("limit", 1000, maximum=MAX_LIST_LIMIT)
        pending = engine.pending_jobs(0)[:limit]
        out = [self._entry(job, position, me) for position, job in enumerate(pending)]
        held = [job for job in engine.jobs.values() if job.held and job.state == JobState.PENDING]
        held = [self._entry(job, None, me) for job in held[:limit]]
        retrying = [self._entry(job, None, me) for job in engine.retrying_jobs()[:limit]]
        self.send(
            {
                "pending": len(engine.pending),
                "running": len(engine.running),
                "jobs": out,
                "held": held,
                "retrying": retrying,  # a refused launch's back-off: reason and ETA say when
                "arrays": _array_names(pending),
            }
        )

    def _entry(self, job, position, me) -> dict:
        visible = self.admin or job.user == me
        extra = self.live.extras.get(job.id)
        # "alice already runs 8 GPUs" reads "its owner already runs 8 GPUs" to others
        reason = reason_dict(job.reason, hide_users=not visible and bool(job.user))
        reason = shown_reason(self.live, job.id, reason)
        return {
            "position": position,
            "id": job.id,
            "mine": job.user == me,
            "user": job.user if visible else None,
            "name": extra.name if visible and extra else None,
            "queue": job.queue,
            "tier": job.tier,
            "gpus": job.gpus,
            "gpu_fraction": job.gpu_fraction,
            "submit_time": job.submit_time,
            "deadline": job.deadline,
            "deadline_missed": job.deadline_missed,
            "reason": reason,
            # a job array's element (core/arrays.py): listed as one row of its array by the CLI
            "array_id": job.array_id,
            "array_index": job.array_index,
            "array_max_running": job.array_max_running,
        }


def job_request(handler: APIHandler, data: dict | None = None):
    """The body of ``POST api/jobs`` (or ``api/estimate``; ``data``: the body already read) as
    a JobRequest: a 400 naming the field for anything wrong, and a notebook profile the reaper
    refuses."""
    request = parse_job_request(handler.body() if data is None else data)
    live = handler.live
    if request.kind == "notebook" and live.reaper is not None:
        live.reaper.check_profile(request, live.default_tier)
    return request


class EstimateHandler(APIHandler):
    """``POST api/estimate``: what the job in the body (``POST api/jobs``'s fields, refused
    as a submission would be) would meet if submitted now, from the engine's own pass on a
    copy of its state (core/estimate.py). Nothing is queued, stored or audited, so a browser
    session's cookie is enough (the service's page asks it)."""

    reads_only = True

    @api
    def post(self):
        answer, finish = self.live.estimate(self.identity, job_request(self))
        reason = reason_dict(answer.reason)  # the caller's own job: nothing hidden
        self.send(
            {
                "start_now": answer.start_now,
                "eta": answer.eta,
                "reason": reason,
                "queue": answer.job.queue,
                "position": answer.position,
                "earliest_finish": finish,  # with a deadline only (service/deadlines.py)
                "planned_run_time": planned_view(answer.job, reason),  # estimate, walltime...
            }
        )


class JobsHandler(APIHandler):
    @api
    async def post(self):
        data = self.body()
        array = take_array(data)  # "array": "0-99%8": the jobs of an array (core/arrays.py)
        request = job_request(self, data)
        if array is not None:
            submissions = self.live.submissions
            array_id, jobs = submissions.submit_array(self.identity, request, array)
            await self._stored(submissions.saved_all(jobs))
            views = [self.view(self.live.row(job.id)) for job in jobs]
            self.send({"array_id": array_id, "jobs": views}, status=201)
            return
        job = self.live.submit(self.identity, request)
        await self._stored(self.live.saved(job.id))
        self.send(self.view(self.live.row(job.id)), status=201)

    @staticmethod
    async def _stored(saving) -> None:
        try:
            await saving
        except Exception as exc:
            raise APIError(503, f"the job could not be stored, please retry: {exc}") from None

    @api
    def get(self):
        user = self.get_argument("user", None)
        if not self.admin:
            user = self.identity.name
        states = self.get_arguments("state") or None
        if states and not set(states) <= {s.value for s in JobState}:
            raise APIError(
                400, "unknown state; use " + ", ".join(s.value for s in JobState), "state"
            )
        limit = self.whole("limit", 500, maximum=MAX_LIST_LIMIT)
        offset = self.whole("offset", 0)
        rows = self.live.store.jobs(
            states=states, user=user, limit=limit, offset=offset, newest_first=True
        )
        live = self.live  # unfinished jobs from memory; the rest as read (no query per row)
        rows = [live.row(r["id"]) if r["id"] in live.extras else r for r in rows]
        self.send({"jobs": [self.view(r) for r in rows]})


class JobHandler(APIHandler):
    @api
    def get(self, job_id):
        self.send(self.view(self.job_row(job_id)))

    @api
    def delete(self, job_id):
        row = self.job_row(job_id)
        if row["state"] not in ("pending", "running"):
            raise APIError(409, f"job {job_id} has already ended ({row['state']})", "id")
        gone = self.get_argument("server_gone", "false")
        if gone not in ("true", "false"):
            raise APIError(400, "'server_gone' must be true or false", "server_gone")
        reason = self.get_argument("reason", None)
        # no control characters (what the schema's pattern says too: a log line stays one line)
        if reason is not None and (len(reason) > MAX_REASON or _CONTROL.search(reason)):
            raise APIError(
                400,
                f"'reason' must be text of at most {MAX_REASON} characters, no control characters",
                "reason",
            )
        self.live.cancel(job_id, self.identity.name, server_gone=gone == "true", reason=reason)
        self.send(self.view(self.live.row(job_id)))


class ArrayHandler(APIHandler):
    """``DELETE api/arrays/<id>``: cancel every element of a job array still pending or
    running (as ``scancel`` of an array's id)."""

    @api
    def delete(self, array_id):
        live = self.live
        jobs = unfinished_elements(live, array_id, self.identity)
        if not jobs:
            raise APIError(
                404, f"no pending or running job of array {array_id} of yours", "array_id"
            )
        cancel_array(live, jobs, self.identity.name)
        self.send({"array_id": array_id, "jobs": [self.view(live.row(job.id)) for job in jobs]})


class JobLogHandler(APIHandler):
    @api
    def get(self, job_id):
        row = self.job_row(job_id)
        path = self.live.log_path(row)
        tail = self.whole("bytes", 64 * 1024, maximum=MAX_LOG_BYTES)
        if not os.path.exists(path):
            raise APIError(404, f"job {job_id} has no log yet", "id")
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - tail))
            data = f.read()
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(data)
