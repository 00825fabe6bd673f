"""Gang placement: all of a job's GPUs at once, or nothing.

``topology=True`` (gpusched) keeps a job inside the tightest domain that fits: one NVLink domain,
then one PCIe switch, then one node, then one leaf switch, then one spine; among equally tight
candidates it takes the best fit (the node or leaf with the fewest free GPUs left), so small jobs
fill partly used nodes and leave whole nodes and whole leaves to the gangs that need them.
``topology=False`` is the topology-blind first fit of a default scheduler (the ``fifo`` baseline).

With a fragmentation model on the state (``state.fgd``, the ``gpusched`` policy), a share of a
GPU, and while the workload shares GPUs (:data:`SHARING_FOR_FGD`) any job that fits on one node,
goes where the cluster's expected fragmentation grows least (FGD, see :mod:`.fragmentation`); the
topology order above decides among equally good nodes.

Every function here reads a :class:`ClusterState` and returns a :class:`Placement` or None; none
changes anything.
"""

from __future__ import annotations

from bisect import bisect_left

from . import reasons
from .fragmentation import place_fractional
from .jobs import Job, Reason
from .resources import place_cpu_only
from .state import ClusterState, Part, Placement

#: FGD places whole-GPU jobs only while at least this share of the workload shares GPUs: without
#: shared GPUs there is little fragmentation for it to avoid, and best fit's consolidation frees
#: whole nodes and leaves for gangs (on Philly, FGD for every job made waits and locality worse).
SHARING_FOR_FGD = 0.05


def lowest_bits(mask: int, k: int) -> int:
    out = 0
    for _ in range(k):
        bit = mask & -mask
        out |= bit
        mask ^= bit
    return out


def pick_gpus(node, free_mask: int, k: int) -> tuple[int, int]:
    """Choose ``k`` free GPUs in one node: (mask, level) with level 0 = one NVLink domain,
    1 = one PCIe switch, 2 = spread over the node. Best fit inside each level."""
    for level, groups in enumerate((node.domains, node.pcie_groups)):
        best = None
        for group in groups:
            free = (free_mask & group).bit_count()
            if free >= k and (best is None or free < best[0]):
                best = (free, group)
        if best is not None:
            return lowest_bits(free_mask & best[1], k), level
    return lowest_bits(free_mask, k), 2


def find_placement(
    state: ClusterState,
    job: Job,
    *,
    topology: bool = True,
    exclude: frozenset = frozenset(),
    one_leaf: bool = False,
) -> Placement | None:
    """Where ``job`` can run now, or None. Nodes in ``exclude`` are not used; with
    ``one_leaf`` a multi-node job is placed under one leaf switch or not at all."""
    if job.fractional:
        return _fractional(state, job, exclude, topology)
    if job.gpus == 0:  # CPU-only: one node with the CPUs and memory (see .resources)
        return place_cpu_only(state, job, exclude)
    if not may_fit(state, job, exclude):
        return None
    per_node = job.gpus_per_node or job.gpus
    if per_node <= state.cluster.max_node_gpus and (job.gpus_per_node or 0) in (0, job.gpus):
        return _single_node(state, job, exclude, topology)
    return _multi_node(state, job, exclude, topology, one_leaf)


def placement_exists(state: ClusterState, job: Job, exclude: frozenset = frozenset()) -> bool:
    """True when ``job`` can be placed now, anywhere (keeping off ``exclude``): for a whole-GPU
    job that takes any model and asks for no labels, CPUs or memory, :func:`may_fit`'s count
    says it exactly; for others, a search."""
    plain = not (job.fractional or job.labels or job.cpus or job.memory_gb or job.gpu_models)
    if plain and job.gpus and len(exclude) <= 64:
        return may_fit(state, job, exclude)
    return find_placement(state, job, exclude=exclude) is not None


def may_fit(state: ClusterState, job: Job, exclude: frozenset) -> bool:
    """False when the free GPUs cannot hold a whole-GPU ``job`` whatever its models, labels and
    topology (k GPUs on each of n nodes needs n nodes outside ``exclude`` with k free; a gang
    spread as it fits needs that many free in all): a count, before any search."""
    by_free = state.nodes_by_free
    free_total = state.free_total
    if len(exclude) > 64:
        return True  # (not worth counting)
    if exclude:
        by_free = list(by_free)
        for idx in exclude:
            if state.schedulable(idx):
                by_free[state.free[idx]] -= 1
                free_total -= state.free[idx]
    if job.gpus_per_node is None and job.gpus > state.cluster.max_node_gpus:
        return free_total >= job.gpus
    per_node = job.gpus_per_node or job.gpus
    if per_node >= len(by_free):
        return False
    return sum(by_free[per_node:]) >= job.gpus // per_node


def _fractional(state, job, exclude, topology) -> Placement | None:
    """A share of one GPU. Topology (best fit): the shared GPU with the least room that holds
    it; else a free GPU on the fullest node (see :func:`_single_node`), which becomes shared.
    Blind: the lowest node index, shared or free."""
    if topology and state.fgd is not None:
        return place_fractional(state, state.fgd, job, exclude, pick_gpus)
    fraction = job.gpu_fraction
    best = None  # (key, node, bit)
    for model in models_for(state, job):
        entries = state.shared_index[model]
        start = bisect_left(entries, (fraction - 1e-9,))
        for room, idx, bit in entries[start:]:
            if idx in exclude or not node_fits(state, job, idx, 1.0):
                continue
            key = (room, idx, bit) if topology else (idx, bit)
            if best is None or key < best[0]:
                best = (key, idx, bit)
            if topology:
                break  # the first eligible entry of this model is its tightest
    cpus, memory = job.cpus or 0.0, job.memory_gb or 0.0
    whole = None if topology and best is not None else _single_node(state, job, exclude, topology)
    if whole is not None and (best is None or whole.parts[0].node < best[1]):
        part = whole.parts[0]
        return Placement((Part(part.node, part.mask, cpus, memory, fraction),))
    if best is None:
        return None
    return Placement((Part(best[1], best[2], cpus, memory, fraction),))


def models_for(state: ClusterState, job: Job) -> list[str]:
    """The cluster's GPU models that ``job`` accepts."""
    if job.gpu_models is None:
        return state.cluster.gpu_models
    return [m for m in state.cluster.gpu_models if m in job.gpu_models]


def node_fits(state: ClusterState, job: Job, idx: int, share: float) -> bool:
    """Labels, CPUs and memory of node ``idx`` for ``share`` (0..1) of the job's CPUs/memory."""
    node = state.cluster.nodes[idx]
    if job.labels and any(node.labels.get(k) != v for k, v in job.labels.items()):
        return False
    if job.cpus and state.cpu_free[idx] < job.cpus * share - 1e-9:
        return False
    return not (job.memory_gb and state.mem_free[idx] < job.memory_gb * share - 1e-9)


def _part(state: ClusterState, job: Job, idx: int, mask: int, share: float) -> Part:
    return Part(idx, mask, (job.cpus or 0.0) * share, (job.memory_gb or 0.0) * share)


def level_floor(node, k: int) -> int:
    """The tightest level (see :func:`pick_gpus`) that ``k`` GPUs can ever have on ``node``."""
    if any(d.bit_count() >= k for d in node.domains):
        return 0
    return 1 if any(g.bit_count() >= k for g in node.pcie_groups) else 2


def _single_node(state, job, exclude, topology) -> Placement | None:
    """Best single node. Topology order: (level, GPUs left free on the node, free GPUs of its leaf,
    leaf, node index); blind order: node index. With FGD: (level, fragmentation cost, ...): the
    classes of equal cost are tried cheapest first, until one offers the tightest level."""
    fgd = state.fgd if topology else None
    if fgd is not None and fgd.workload.sharing < SHARING_FOR_FGD:
        fgd = None  # whole GPUs only: best fit keeps nodes and leaves whole for the gangs
    if fgd is None:
        best = _best_node(state, job, exclude, topology)
    else:
        best, floor = None, fgd.min_level(job.gpus, level_floor)
        for tier in fgd.tiers(state, job):
            classes = {cid for _, _, cid in tier}
            counts = {fgd.free_count(cid) for cid in classes}
            found = _best_node(state, job, exclude, topology, classes, counts)
            if found is not None and (best is None or found[0][0] < best[0][0]):
                best = found
                if found[0][0] <= floor:
                    break
    if best is None:
        return None
    idx = best[0][-1]
    return Placement((_part(state, job, idx, best[1], 1.0),))


def _best_node(state, job, exclude, topology, classes=None, counts=None):
    """(key, mask) of the best node, or None; with ``classes`` (FGD classes of equal cost, with
    ``counts`` whole free GPUs) only nodes of those classes count."""
    k = job.gpus
    nodes = state.cluster.nodes
    class_of = state.fgd.class_of if classes is not None else None
    best = None  # (key, mask)
    for model in models_for(state, job):
        buckets = state.index[model]
        for count in range(k, len(buckets)):
            by_leaf = buckets[count]
            if not by_leaf or (counts is not None and count not in counts):
                continue
            found_tightest = False
            leaves = sorted(by_leaf, key=lambda leaf: (state.leaf_free[leaf], leaf))
            for leaf in leaves if topology else by_leaf:
                for idx in sorted(by_leaf[leaf]):
                    if classes is not None and class_of[idx] not in classes:
                        continue
                    if idx in exclude or not node_fits(state, job, idx, 1.0):
                        continue
                    if not topology:
                        if best is None or idx < best[0][0]:
                            best = ((idx,), lowest_bits(state.free_mask[idx], k))
                        break  # the lowest index of this leaf and bucket
                    mask, level = pick_gpus(nodes[idx], state.free_mask[idx], k)
                    key = (level, count - k, state.leaf_free[leaf], leaf, idx)
                    if best is None or key < best[0]:
                        best = (key, mask)
                    if level == level_floor(nodes[idx], k):
                        found_tightest = True
                        break  # later nodes of this leaf and bucket can only tie
                if found_tightest and level == 0:
                    break  # the fullest leaf with a single-domain fit wins this bucket
            if topology and best is not None and best[0][0] == 0:
                break  # a single-domain fit in the tightest bucket: nothing later is better
    return best


def _candidates(state, job, exclude, minimum: int, share: float | None):
    """Eligible nodes with at least ``minimum`` free GPUs, grouped by leaf: {leaf: [(free, idx)]}.
    ``share`` is the fraction of the job's CPUs/memory each node must hold (None: checked later)."""
    by_leaf: dict[str, list[tuple[int, int]]] = {}
    for model in models_for(state, job):
        buckets = state.index[model]
        for count in range(max(minimum, 1), len(buckets)):
            for leaf, members in buckets[count].items():
                for idx in members:
                    if idx in exclude or not node_fits(state, job, idx, share or 0.0):
                        continue
                    by_leaf.setdefault(leaf, []).append((count, idx))
    return by_leaf


def _leaf_candidates(state, job, exclude, minimum: int, share: float | None, leaf: str):
    """:func:`_candidates` of one leaf: [(free, idx)]."""
    out = []
    for model in models_for(state, job):
        buckets = state.index[model]
        for count in range(max(minimum, 1), len(buckets)):
            for idx in buckets[count].get(leaf, ()):
                if idx not in exclude and node_fits(state, job, idx, share or 0.0):
                    out.append((count, idx))
    return out


def _multi_node(state, job, exclude, topology, one_leaf=False) -> Placement | None:
    cluster = state.cluster
    shape = job.gpus_per_node
    count = job.gpus // shape if shape else None
    share = (1 / count) if count else None
    if not topology:
        by_leaf = _candidates(state, job, exclude, shape or 1, share)
        flat = sorted((c for cands in by_leaf.values() for c in cands), key=lambda c: c[1])
        return _build(state, job, _plan(state, job, flat, shape, count), shape, count)
    # 1. inside one leaf: best fit (fewest nodes, least waste, then the leaf with the fewest
    # free GPUs). Leaves are tried fullest first, so the first whose fit has the fewest nodes
    # possible and no waste wins: no later leaf can beat it
    fewest = count if shape else -(-job.gpus // cluster.max_node_gpus)
    best = None
    roomy = [(free, leaf) for leaf, free in state.leaf_free.items() if free >= job.gpus]
    # a leaf holds a gang of ``count`` x ``shape`` only with that many nodes with ``shape`` free
    counted, nodes_by_free, kept_off = shape and len(exclude) <= 64, state.leaf_nodes_by_free, {}
    if counted:
        for idx in exclude:
            if state.schedulable(idx) and state.free[idx] >= shape:
                leaf = cluster.nodes[idx].leaf
                kept_off[leaf] = kept_off.get(leaf, 0) + 1
    for _, leaf in sorted(roomy):
        if counted and sum(nodes_by_free[leaf][shape:]) - kept_off.get(leaf, 0) < count:
            continue
        cands = _leaf_candidates(state, job, exclude, shape or 1, share, leaf)
        plan = _plan(state, job, _order(cands, shape), shape, count)
        if plan is not None:
            waste = sum(state.free[idx] - take for idx, take in plan)
            key = (len(plan), waste, state.leaf_free[leaf], leaf)
            if best is None or key < best[0]:
                best = (key, plan)
            if key[0] == fewest and waste == 0:
                break
    if best is not None or one_leaf:
        return _build(state, job, best[1], shape, count) if best is not None else None
    # 2. inside one spine, then 3. anywhere: fill from the leaves with the most room first
    by_leaf = _candidates(state, job, exclude, shape or 1, share)
    for spine in sorted(cluster.spines):
        leaves = [leaf for leaf in cluster.spines[spine] if leaf in by_leaf]
        plan = _plan(state, job, _pooled(by_leaf, leaves, shape), shape, count)
        if plan is not None:
            return _build(state, job, plan, shape, count)
    plan = _plan(state, job, _pooled(by_leaf, list(by_leaf), shape), shape, count)
    return _build(state, job, plan, shape, count)


def _order(cands, shape):
    # shaped gangs take the tightest nodes; free-form gangs the emptiest (fewest nodes)
    return sorted(cands) if shape else sorted(cands, key=lambda c: (-c[0], c[1]))


def _pooled(by_leaf, leaves, shape):
    room = {
        leaf: (len(by_leaf[leaf]) if shape else sum(c[0] for c in by_leaf[leaf])) for leaf in leaves
    }
    out = []
    for leaf in sorted(leaves, key=lambda leaf: (-room[leaf], leaf)):
        out.extend(_order(by_leaf[leaf], shape))
    return out


def _plan(state, job, cands, shape, count) -> list[tuple[int, int]] | None:
    """Take nodes from ``cands`` (in order) until the job is whole: [(node, GPUs)], or None."""
    if shape:
        return [(idx, shape) for _, idx in cands[:count]] if len(cands) >= count else None
    need, taken = job.gpus, []
    for position, (free, idx) in enumerate(cands):
        take = min(free, need)
        if not node_fits(state, job, idx, take / job.gpus):
            continue
        if take < free:  # the last piece: use the tightest later node that holds it
            for later_free, later_idx in reversed(cands[position:]):
                if later_free >= need and node_fits(state, job, later_idx, need / job.gpus):
                    free, idx = later_free, later_idx
                    break
        taken.append((idx, take))
        need -= take
        if need == 0:
            break
    return None if need else taken


def _build(state, job, plan, shape, count) -> Placement | None:
    if plan is None:
        return None
    return Placement(
        tuple(
            _part(
                state, job, idx, _pick(state, idx, take), (1 / count) if shape else take / job.gpus
            )
            for idx, take in plan
        )
    )


def _pick(state, idx: int, k: int) -> int:
    return pick_gpus(state.cluster.nodes[idx], state.free_mask[idx], k)[0]


def shape_reason(cluster, job: Job, free: float) -> Reason:
    """Why ``job`` found no placement although ``free`` GPUs of its models are free."""
    if job.gpus_per_node and job.gpus_per_node < job.gpus:
        n = job.gpus // job.gpus_per_node
        return reasons.GANG_SHAPE.reason(free=free, nodes=n, per_node=job.gpus_per_node)
    if job.gpus <= cluster.max_node_gpus:
        return reasons.FRAGMENTED.reason(free=free, gpus=job.gpus)
    return reasons.CONSTRAINTS.reason(free=free)
