"""The REST API for admins (quotas, holds, priorities, nodes, maintenance) and for everyone's
records (the audit log, usage, the history as a trace), plus the OpenAPI document."""

from __future__ import annotations

import asyncio
import datetime
import json

from ..core.jobs import JobState
from ..core.quotas import QueueTree
from .api_handler import APIError, APIHandler, api
from .export import MAX_EXPORT_SPAN, ExportTooLarge, export, pseudonym_key
from .openapi import openapi_document
from .requests import MAX_EVENTS_LIMIT, MAX_WHOLE, check_document, whole_number

USAGE_KEYS = ("queue", "user", "gpu_model")


def pending_gpus(engine) -> dict[int, float]:
    """GPUs the waiting jobs ask for, by ``id()`` of each queue on their queues' paths up to
    the root (the pending queue's jobs: not held ones)."""
    out: dict[int, float] = {}
    tree = engine.tree
    for items in engine.pending.lists.values():
        for _, job_id in items:
            job = engine.jobs[job_id]
            queue = tree.get(job.queue) or tree.root
            for node in queue.chain():
                out[id(node)] = out.get(id(node), 0.0) + job.amount
    return out


QUEUE_DOCUMENT = "the queue document"  # (where a refused PUT api/quotas says the fault is)


class QuotasHandler(APIHandler):
    """``GET api/quotas``: every queue (parents too) with its guarantee, limit and weight, the
    GPUs its running jobs hold (``running``), those held for its jobs whose pre-emption victims
    are leaving (``claimed``), the two together (``in_use``), what of that is above its
    guarantee (``borrowed``: what a reclaim may take back), and those its waiting jobs ask for
    (``pending``; held jobs are not waiting): a parent's figures are its queues' sums.
    ``PUT``: an admin replaces the quotas."""

    @api
    def get(self):
        live = self.live
        engine = live.engine
        pending = pending_gpus(engine)
        queues = []
        for _, queue in sorted(engine.tree.by_path.items()):
            queues.append(
                {
                    "path": queue.label(),
                    "guaranteed": queue.guaranteed,
                    "limit": None if queue.limit == float("inf") else queue.limit,
                    "weight": queue.weight,
                    "running": queue.running,
                    "claimed": queue.claimed,
                    "in_use": queue.in_use,  # running + claimed
                    "borrowed": queue.borrowed,  # in use above the guarantee
                    "pending": pending.get(id(queue), 0.0),
                    # CPUs and memory its running jobs ask for, and the limits (None: none)
                    "cpus_running": queue.cpus_running,
                    "cpu_limit": None if queue.cpu_limit == float("inf") else queue.cpu_limit,
                    "memory_running": queue.memory_running,
                    "memory_limit": None
                    if queue.memory_limit == float("inf")
                    else queue.memory_limit,
                    "leaf": queue.is_leaf,
                    "users": list(queue.users),
                    "groups": list(queue.groups),
                }
            )
        self.send({"document": live.quota_document, "queues": queues})

    @api
    async def put(self):
        """Replace the quotas with a queue-file document (same schema; same queues)."""
        self.require_admin()
        document = self.body()
        check_document(document, QUEUE_DOCUMENT)
        try:
            tree = QueueTree.from_dict(document, self.live.cluster.total_gpus, QUEUE_DOCUMENT)
        except OverflowError:  # core/quotas.py: float() of an integer like 10**400
            raise APIError(400, "a number in the document is too large") from None
        self.live.update_quotas(tree, document, self.identity.name)
        await self.get()  # a coroutine: @api made it one


class HoldHandler(APIHandler):
    @api
    def post(self, job_id, action):
        self.require_admin()
        self.job_row(job_id)
        job = self.live.engine.jobs.get(job_id)
        if job is None:
            raise APIError(409, f"job {job_id} has ended", "id")
        if job.state != JobState.PENDING:  # a state the request conflicts with: 409, as ended
            verb = "held" if action == "hold" else "released"
            raise APIError(409, f"only a pending job can be {verb}; {job_id} is running", "id")
        self.live.hold(job_id, self.identity.name, hold=action == "hold")
        self.send(self.view(self.live.row(job_id)))


class PriorityHandler(APIHandler):
    @api
    def put(self, job_id):
        self.require_admin()
        self.job_row(job_id)
        if self.live.engine.jobs.get(job_id) is None:
            raise APIError(409, f"job {job_id} has ended", "id")
        priority = whole_number(self.body().get("priority"))
        if (
            isinstance(priority, bool)
            or not isinstance(priority, int)
            or not -MAX_WHOLE <= priority <= MAX_WHOLE
        ):
            raise APIError(
                400,
                f"'priority' must be a whole number from {-MAX_WHOLE} to {MAX_WHOLE} (higher "
                "goes first)",
                "priority",
            )
        self.live.set_priority(job_id, priority, self.identity.name)
        self.send(self.view(self.live.row(job_id)))


def known_node(handler: APIHandler, name: str) -> None:
    """404 (the path's ``name``) unless the cluster has this node."""
    if name not in handler.live.cluster.by_name:
        raise APIError(404, f"no node named {name[:100]!r} in the cluster", "name")


class NodeHandler(APIHandler):
    @api
    def post(self, name, action):
        self.require_admin()
        known_node(self, name)
        self.live.set_node(name, action, self.identity.name)
        self.send({"node": name, "state": self.live.node_state(name)})


class MaintenanceHandler(APIHandler):
    @api
    def put(self, name):
        """Body ``{"start": T}`` (epoch seconds or ISO 8601): from T the node is drained, and
        no job whose walltime runs past T starts there before."""
        self.require_admin()
        known_node(self, name)
        start = parse_time(self.body().get("start"), "start")
        self.live.set_maintenance(name, start, self.identity.name)
        self.send({"node": name, "maintenance": start})

    @api
    def delete(self, name):
        self.require_admin()
        known_node(self, name)
        self.live.set_maintenance(name, None, self.identity.name)
        self.send({"node": name, "maintenance": None})


class EventsHandler(APIHandler):
    @api
    def get(self):
        user = self.get_argument("user", None)
        if not self.admin:
            user = self.identity.name
        events = self.live.store.events(
            since=self.number("since"),
            until=self.number("until"),
            kind=self.get_argument("kind", None),
            job_id=self.get_argument("job_id", None),
            user=user,
            limit=self.whole("limit", 1000, minimum=1, maximum=MAX_EVENTS_LIMIT),
            before_id=self.whole("before", None),
        )
        self.send({"events": events})


class UsageHandler(APIHandler):
    @api
    def get(self):
        by = self.get_argument("by", "queue")
        if by not in USAGE_KEYS:
            raise APIError(400, f"'by' must be one of {', '.join(USAGE_KEYS)}", "by")
        since, until = self.period(30 * 86400)
        rows = self.live.store.usage(since, until, by=by)
        if by == "user" and not self.admin:
            rows = [r for r in rows if r["key"] == self.identity.name]
        prices = self.settings.get("gpusched_prices") or {}
        if by == "gpu_model" and prices:
            for row in rows:
                price = prices.get(row["key"])
                row["cost"] = None if price is None else row["gpu_hours"] * price
        self.send({"since": since, "until": until, "by": by, "usage": rows})


class RogueProcessesHandler(APIHandler):
    """``GET api/rogue-processes``: what the last check of the watched nodes found
    (service/rogue.py); empty when no node is watched."""

    @api
    def get(self):
        self.require_admin()
        watch = self.live.rogue_watch
        self.send(
            {
                "watched_nodes": sorted(watch.telemetries) if watch else [],
                "mode": self.live.reaper.settings()["rogue_processes"],
                "processes": watch.listing() if watch else [],
            }
        )


class OpenAPIHandler(APIHandler):
    authenticated = False  # the API's description is public

    def get(self):
        self.send(openapi_document(self.settings.get("gpusched_prefix", "/")))


LATEST = 253402300799.0  # 9999-12-31 23:59:59 UTC: later times cannot be written as dates


def parse_time(value, field: str) -> float:
    """Epoch seconds from a number or an ISO 8601 string, between 1970 and the year 9999."""
    moment = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        moment = value  # compared before float(): 10**400 has no float
    elif isinstance(value, str):
        try:
            parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            if parsed.tzinfo is None:
                parsed = parsed.replace(tzinfo=datetime.timezone.utc)
            moment = parsed.timestamp()
    if moment is not None and 0 <= moment <= LATEST:
        return float(moment)
    raise APIError(400, f"'{field}' must be epoch seconds or an ISO 8601 time, 1970 to 9999", field)


class ExportHandler(APIHandler):
    """``GET api/export?since=&until=&queue=&pseudonymize=``: the service's history as a trace
    (service/export.py), for ``jupyter gpusched export-trace``; admins only. A period of at most
    366 days (default: the last 30). The reading runs in a thread and the answer is written in
    chunks: a month of a busy cluster (100,000 jobs) takes seconds, which the scheduler's loop
    does not wait for."""

    @api
    async def get(self):
        self.require_admin()
        since, until = self.period(30 * 86400.0)
        if until - since > MAX_EXPORT_SPAN:
            raise APIError(400, "a period of at most 366 days, please", "since")
        queue = self.get_argument("queue", None) or None
        if queue is not None and queue.strip("/") not in self.live.engine.tree.by_path:
            raise APIError(400, f"no queue {queue[:100]!r} (GET api/quotas lists them)", "queue")
        pseudonymize = self.get_argument("pseudonymize", "false")
        if pseudonymize not in ("true", "false"):
            raise APIError(400, "'pseudonymize' must be true or false", "pseudonymize")
        live = self.live
        key = pseudonym_key(live.store) if pseudonymize == "true" else None  # made here: a write
        reaper = None if live.reaper is None else live.reaper.settings()
        queue = None if queue is None else queue.strip("/")
        document, settings = live.quota_document, live.engine.settings
        try:
            answer = await asyncio.to_thread(
                export, live.store, since, until, queue, key, document, settings, reaper
            )
        except ExportTooLarge as exc:
            raise APIError(400, str(exc), "since") from None
        self.set_header("Content-Type", "application/json")
        lists = {name: answer.pop(name) for name in ("jobs", "utilization")}
        self.write(json.dumps(answer)[:-1])  # the object, still open for the two lists
        for name, items in lists.items():
            self.write(f', "{name}": [')
            for first in range(0, len(items), EXPORT_CHUNK):
                chunk = items[first : first + EXPORT_CHUNK]
                self.write(("," if first else "") + ",".join(map(json.dumps, chunk)))
                await self.flush()  # and the loop serves others between two chunks
            self.write("]")
        self.finish("}")


# rows of api/export's lists encoded at a time: json.dumps holds the interpreter while it runs,
# so a month's export (80 MB) is written a few milliseconds of work at a time
EXPORT_CHUNK = 2000
