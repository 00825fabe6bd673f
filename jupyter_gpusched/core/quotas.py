"""The quota tree: org -> department -> team -> user queues, each with a guarantee and a limit.

A queue's ``running`` counts the GPUs of running jobs in its whole subtree; ``claimed`` counts GPUs
held for jobs that are waiting for their pre-emption victims to leave. Admission compares
``running + claimed + request`` with ``limit`` at the queue and at every ancestor. A queue may
also limit the CPUs and memory its subtree's running jobs ask for (``cpus: {limit: N}``,
``memory_gb: {limit: N}``; see :mod:`.resources`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from .durations import parse_duration
from .errors import ConfigError, line_of
from .resources import QUEUE_RESOURCES
from .user_limits import UserLimit, parse_user_limits

_NAME = re.compile(r"^[A-Za-z0-9_.\-@]+$")
_QUEUE_FIELDS = {
    "guaranteed",
    "limit",
    "weight",
    "children",
    "users",
    "groups",
    *QUEUE_RESOURCES,
}
ROOT = "root"


def valid_queue_path(path) -> bool:
    """Is ``path`` shaped like a queue path (``research/vision``: names of letters, digits,
    '_', '-', '.', '@', joined by '/')? Whether the queue exists is the queue file's to say."""
    return isinstance(path, str) and all(
        _NAME.match(part) and part not in (ROOT, ".", "..") for part in path.split("/")
    )


@dataclass(eq=False)
class Queue:
    name: str
    path: str  # "research/vision"; the implicit root is ""
    parent: Queue | None
    guaranteed: float
    limit: float  # math.inf when not given
    weight: float = 1.0
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    children: list[Queue] = field(default_factory=list)
    running: float = 0.0
    claimed: float = 0.0
    leaving: float = 0.0  # GPUs of signalled pre-emption victims, still running until killed
    tier1_running: float = 0.0  # tier-1 GPUs running or claimed in this queue itself
    cpu_limit: float = math.inf  # CPUs of running jobs in the subtree, at most
    memory_limit: float = math.inf  # GB of memory of running jobs in the subtree, at most
    cpus_running: float = 0.0
    memory_running: float = 0.0
    cpus_claimed: float = 0.0  # ... of jobs waiting for their pre-emption victims to leave
    memory_claimed: float = 0.0
    # decayed usage in GPU-seconds at ``usage_time``, and the GPUs running since then
    usage: float = 0.0
    usage_time: float = 0.0

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def in_use(self) -> float:
        """GPUs its subtree holds: running, and claimed for jobs whose victims are leaving."""
        return self.running + self.claimed

    @property
    def borrowed(self) -> float:
        """GPUs in use above its guarantee: what a reclaim may take back from it."""
        return max(0.0, self.in_use - self.guaranteed)

    def chain(self) -> tuple[Queue, ...]:
        """This queue and its ancestors up to (and including) the root (the tree is fixed once
        built, so this is computed once)."""
        cached = self.__dict__.get("_chain")
        if cached is None:
            node, out = self, []
            while node is not None:
                out.append(node)
                node = node.parent
            cached = self.__dict__["_chain"] = tuple(out)
        return cached

    def label(self) -> str:
        return self.path or ROOT


class QueueTree:
    """All queues by path; the root is implicit and guarantees the whole cluster."""

    def __init__(
        self,
        root: Queue,
        half_life: float | None = None,
        default_queue: str = "",
        user_limits: dict[str, UserLimit] | None = None,
    ):
        self.root = root
        # per-user caps: a user's own entry, else "default" (absent: no cap)
        self.user_limits: dict[str, UserLimit] = user_limits or {}
        self.half_life = half_life  # None: the policy file's value applies
        self.by_path: dict[str, Queue] = {}
        stack = [root]
        while stack:
            queue = stack.pop()
            self.by_path[queue.path] = queue
            stack.extend(queue.children)
        self.default_queue = default_queue
        self.leaves = [q for q in self.by_path.values() if q.is_leaf]
        self._file_order = {path: i for i, path in enumerate(_preorder(root))}

    @classmethod
    def single(cls, cluster_gpus: int) -> QueueTree:
        """No queue file: one root queue that guarantees the whole cluster."""
        return cls(Queue(ROOT, "", None, float(cluster_gpus), math.inf))

    def user_limit(self, user: str) -> UserLimit | None:
        return self.user_limits.get(user) or self.user_limits.get("default")

    def queues_for(self, user: str, groups=()) -> list[Queue]:
        """Leaf queues ``user`` may submit to: those naming the user or one of the groups, on
        the queue or an ancestor; a queue tree that names nobody anywhere is open to all."""
        if not any(q.users or q.groups for q in self.by_path.values()):
            return list(self.leaves)
        groups = set(groups)
        return [
            leaf
            for leaf in self.leaves
            if any(user in q.users or groups & set(q.groups) for q in leaf.chain())
        ]

    def default_for(self, user: str, groups=()) -> Queue | None:
        """The queue a job of ``user`` goes to when it names none (None: the user may use no
        queue).

        The most specific leaf queue that names the user or one of ``groups``: a leaf is named
        for the user by the deepest entry on its chain (the leaf or an ancestor) listing the
        user or a group, and the leaf whose naming entry is deepest wins (a team's own queue
        before its department's). ``default_queue`` is a catch-all, not a team: it is chosen
        only when no other queue names the user. Ties go to the first queue in file order. A
        tree that names nobody sends everyone to ``default_queue`` (else its first leaf)."""
        allowed = self.queues_for(user, groups)
        catch_all = self.get("")
        groups = set(groups)

        def naming_depth(leaf: Queue) -> int:
            chain = leaf.chain()  # leaf first, root last
            for index, node in enumerate(chain):
                if user in node.users or groups & set(node.groups):
                    return len(chain) - 1 - index
            return 0  # a tree that names nobody

        named = [q for q in allowed if naming_depth(q) > 0 and q is not catch_all]
        if named:
            return min(named, key=lambda q: (-naming_depth(q), self._file_order[q.path]))
        if catch_all in allowed:
            return catch_all
        return min(allowed, key=lambda q: self._file_order[q.path], default=None)

    def adopt(self, other: QueueTree) -> None:
        """Take the settings (guarantees, limits, weights, members, user limits) of ``other``,
        a tree with the same queues, keeping this tree's running totals and usage."""
        if set(other.by_path) != set(self.by_path):
            added = sorted(set(other.by_path) - set(self.by_path))
            removed = sorted(set(self.by_path) - set(other.by_path))
            raise ConfigError(
                f"adding or removing queues needs a restart with the edited queue file "
                f"(added: {', '.join(added) or 'none'}; removed: {', '.join(removed) or 'none'})",
                field="queues",
            )
        for path, queue in self.by_path.items():
            new = other.by_path[path]
            queue.guaranteed, queue.limit, queue.weight = new.guaranteed, new.limit, new.weight
            queue.users, queue.groups = new.users, new.groups
            queue.cpu_limit, queue.memory_limit = new.cpu_limit, new.memory_limit
        self.half_life = other.half_life
        self.default_queue = other.default_queue
        self.user_limits = other.user_limits

    def get(self, path: str) -> Queue | None:
        if path and path != ROOT:
            queue = self.by_path.get(path)  # (a pass asks for each job's queue: its path, as is)
            if queue is not None:
                return queue
        path = (path or self.default_queue).strip("/")
        if path == ROOT:
            path = ""
        return self.by_path.get(path)

    def account(
        self,
        queue: Queue,
        gpus: float,
        now: float,
        half_life: float,
        cpus: float = 0.0,
        memory_gb: float = 0.0,
    ) -> None:
        """Add (or with negative figures remove) running GPUs, CPUs and memory along the chain,
        settling the decayed usage of each queue up to ``now`` first."""
        for node in queue.chain():
            settle_usage(node, now, half_life)
            node.running += gpus
            node.cpus_running += cpus
            node.memory_running += memory_gb

    def seed_usage(self, runs, now: float, half_life: float) -> None:
        """Set every queue's decayed usage at ``now`` from past runs ``(queue path, GPUs,
        start, end)`` (a restarted service rebuilds fair share from its allocations). A run
        of ``g`` GPUs over ``[s, e]`` adds ``g * h / ln 2 * (2^-(now-e)/h - 2^-(now-s)/h)``."""
        for queue in self.by_path.values():
            queue.usage, queue.usage_time = 0.0, now
        scale = half_life / math.log(2)
        for path, gpus, start, end in runs:
            queue = self.get(path)
            if queue is None or end <= start:
                continue
            end = min(end, now)
            used = (
                gpus
                * scale
                * (2.0 ** (-(now - end) / half_life) - 2.0 ** (-(now - start) / half_life))
            )
            for node in queue.chain():
                node.usage += max(0.0, used)

    def claim(self, queue: Queue, gpus: float, cpus: float = 0.0, memory_gb: float = 0.0) -> None:
        for node in queue.chain():
            node.claimed += gpus
            node.cpus_claimed += cpus
            node.memory_claimed += memory_gb

    @classmethod
    def from_dict(cls, data, cluster_gpus: int, source: str = "queue file") -> QueueTree:
        if not isinstance(data, dict) or not isinstance(data.get("queues"), dict):
            raise ConfigError("expected a mapping with a 'queues' mapping", source=source)
        for key in data:
            if key not in ("queues", "fair_share_half_life", "default_queue", "user_limits"):
                raise ConfigError(
                    f"unknown key {key!r} (expected queues, fair_share_half_life, "
                    "default_queue, user_limits)",
                    source=source,
                    field=key,
                    line=line_of(data, key),
                )
        half_life = None
        if "fair_share_half_life" in data:
            try:
                half_life = parse_duration(data["fair_share_half_life"])
            except ValueError as exc:
                raise ConfigError(
                    str(exc),
                    source=source,
                    field="fair_share_half_life",
                    line=line_of(data, "fair_share_half_life"),
                ) from None
            if half_life <= 0:
                raise ConfigError(
                    "must be longer than 0", source=source, field="fair_share_half_life"
                )
        root = Queue(ROOT, "", None, float(cluster_gpus), math.inf)
        _parse_children(root, data["queues"], source, data)
        if sum(c.guaranteed for c in root.children) > cluster_gpus + 1e-9:
            total = sum(c.guaranteed for c in root.children)
            raise ConfigError(
                f"the top-level queues guarantee {total:g} GPUs but the cluster has {cluster_gpus}",
                source=source,
                field="guaranteed",
                line=line_of(data, "queues"),
            )
        user_limits = parse_user_limits(data.get("user_limits"), source, data)
        default = str(data.get("default_queue") or "").strip("/")
        tree = cls(root, half_life, default, user_limits)
        if tree.default_queue and tree.get(tree.default_queue) is None:
            raise ConfigError(
                f"default_queue {tree.default_queue!r} is not a queue in this file",
                source=source,
                field="default_queue",
                line=line_of(data, "default_queue"),
            )
        if tree.default_queue and not tree.get(tree.default_queue).is_leaf:
            under = tree.get(tree.default_queue).path + "/"
            leaves = sorted(q.path for q in tree.leaves if q.path.startswith(under))[:3]
            raise ConfigError(
                f"default_queue {tree.default_queue!r} has queues under it; jobs go to a leaf "
                f"queue: name one, such as {', '.join(repr(p) for p in leaves)}",
                source=source,
                field="default_queue",
                line=line_of(data, "default_queue"),
            )
        return tree


def _preorder(queue: Queue):
    """Queue paths in the order the file lists them (parents before their children)."""
    yield queue.path
    for child in queue.children:
        yield from _preorder(child)


def _parse_children(parent: Queue, entries, source: str, container) -> None:
    if not isinstance(entries, dict):
        raise ConfigError(
            "must map queue names to their settings",
            source=source,
            entry=parent.label(),
            field="children",
            line=line_of(container, "children"),
        )
    for name, spec in entries.items():
        path = f"{parent.path}/{name}" if parent.path else str(name)

        def fail(message, key, spec=spec, path=path, name=name):
            line = line_of(spec, key) if isinstance(spec, dict) else line_of(entries, name)
            raise ConfigError(message, source=source, entry=f"queue {path}", field=key, line=line)

        if not isinstance(name, str) or not _NAME.match(name) or name == ROOT:
            fail(f"queue name {name!r} must use letters, digits, '_', '-', '.', '@'", "name")
        spec = {} if spec is None else spec
        if not isinstance(spec, dict):
            fail("queue settings must be a mapping (guaranteed, limit, weight, ...)", "name")
        for key in spec:
            if key not in _QUEUE_FIELDS:
                fail(f"unknown field {key!r}; known: {', '.join(sorted(_QUEUE_FIELDS))}", key)
        guaranteed = _number(spec, "guaranteed", 0.0, fail)
        limit = _number(spec, "limit", math.inf, fail)
        weight = _number(spec, "weight", 1.0, fail)
        if weight <= 0:
            fail("'weight' must be greater than 0", "weight")
        if limit < guaranteed:
            fail(f"'limit' ({limit:g}) is below 'guaranteed' ({guaranteed:g})", "limit")
        users, groups = (_names(spec, key, fail) for key in ("users", "groups"))
        queue = Queue(str(name), path, parent, guaranteed, limit, weight, users, groups)
        for key, (attribute, unit) in QUEUE_RESOURCES.items():
            if key in spec:
                setattr(queue, attribute, _resource_limit(spec[key], key, unit, fail))
        parent.children.append(queue)
        if "children" in spec:
            _parse_children(queue, spec["children"], source, spec)
            total = sum(c.guaranteed for c in queue.children)
            if "guaranteed" not in spec:
                queue.guaranteed = total  # a parent without a figure guarantees its children's
            elif total > guaranteed + 1e-9:
                fail(
                    f"children guarantee {total:g} GPUs, more than this queue's {guaranteed:g}",
                    "guaranteed",
                )


def _number(spec, key, default, fail) -> float:
    value = spec.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        fail(f"'{key}' must be a number of GPUs >= 0, got {value!r}", key)
    try:
        return float(value)
    except OverflowError:
        fail(f"'{key}' is too large: {str(value)[:20]}...", key)


def _resource_limit(value, key, unit, fail) -> float:
    """A queue's ``cpus:`` / ``memory_gb:`` entry: ``{limit: N}`` (N {unit} at most)."""
    if not isinstance(value, dict) or set(value) - {"limit"} or "limit" not in value:
        fail(f"'{key}' must be a mapping with 'limit' ({unit} at most), e.g. {{limit: 16}}", key)
    number = value["limit"]
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not number >= 0:
        fail(f"'{key}.limit' must be a number of {unit} >= 0, got {number!r}", key)
    return float(number)


def _names(spec, key, fail) -> tuple[str, ...]:
    value = spec.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        fail(f"'{key}' must be a list of names", key)
    return tuple(value)


def settle_usage(queue: Queue, now: float, half_life: float) -> None:
    """Bring ``queue.usage`` (decayed GPU-seconds) up to ``now``.

    Between two changes the queue runs ``r`` GPUs, so with ``d = 2^(-(now - t0) / h)``:
    ``U(now) = U(t0) * d + r * h / ln 2 * (1 - d)``, exact for piecewise-constant ``r``.
    """
    elapsed = now - queue.usage_time
    if elapsed <= 0:
        return
    decay = 2.0 ** (-elapsed / half_life)
    queue.usage = queue.usage * decay + queue.running * half_life / math.log(2) * (1 - decay)
    queue.usage_time = now


def decayed_usage(queue: Queue, now: float, half_life: float) -> float:
    """``queue.usage`` as it will be at ``now``, without changing the queue."""
    elapsed = now - queue.usage_time
    if elapsed <= 0:
        return queue.usage
    decay = 2.0 ** (-elapsed / half_life)
    return queue.usage * decay + queue.running * half_life / math.log(2) * (1 - decay)
