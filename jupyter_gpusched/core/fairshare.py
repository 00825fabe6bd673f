"""Fair share across the quota tree (Slurm's Fair Tree).

For every queue, with ``U`` its decayed usage as a fraction of its siblings' total decayed usage
and ``S = weight / sum(sibling weights)`` its share::

    level_fs = S / U            (infinite when U = 0: an idle queue goes first)

Siblings are ranked by ``level_fs``, highest first, and the tree is walked depth first in that
order, so a team of a department that used less of its share goes before every team of a
department that used more. Leaves get ranks in the order visited (equal ranks for leaves whose
``level_fs`` path is equal), and the fair-share factor of the leaf ranked ``r`` (0 = first) out of
``n`` distinct ranks is ``F = (n - r) / n``, in (0, 1]. Guarantees play no part; queues that
guarantee nothing take part like any other. Usage decays with a half-life (see
:func:`~jupyter_gpusched.core.quotas.settle_usage`).
"""

from __future__ import annotations

import math

from .quotas import Queue, QueueTree, decayed_usage


def fair_share_factors(tree: QueueTree, now: float, half_life: float) -> dict[str, float]:
    """The fair-share factor of every leaf queue (by path), in (0, 1]."""
    usage = {path: decayed_usage(q, now, half_life) for path, q in tree.by_path.items()}
    ordered: list[tuple[tuple[float, ...], str]] = []
    _walk(tree.root, (), usage, ordered)
    ordered.sort()  # the keys sort in depth-first order, and equal paths of level_fs sort together
    factors: dict[str, float] = {}
    distinct = len({key for key, _ in ordered}) or 1
    rank, previous = -1, None
    for key, path in ordered:
        if key != previous:
            rank += 1
            previous = key
        factors[path] = (distinct - rank) / distinct
    return factors


def _walk(queue: Queue, key: tuple, usage: dict[str, float], out: list) -> None:
    if queue.is_leaf:
        out.append((key, queue.path))
        return
    total_usage = sum(usage[c.path] for c in queue.children)
    total_weight = sum(c.weight for c in queue.children)

    def level(child: Queue) -> float:
        share = child.weight / total_weight
        used = usage[child.path] / total_usage if total_usage > 0 else 0.0
        return math.inf if used <= 0 else share / used

    for child in queue.children:
        _walk(child, (*key, -level(child)), usage, out)


def fair_share_rank(factors: dict[str, float], path: str) -> tuple[int, int] | None:
    """Where the leaf queue ``path`` stands in the fair-share order: (rank, out of how many
    leaves), 1 = goes first; leaves with equal factors share a rank and the next rank is skipped,
    as in a race (1st, 2nd, 2nd, 4th of 4). None before the factors are computed (or for a queue
    they do not cover)."""
    if path not in factors:
        return None
    mine = factors[path]
    return 1 + sum(factor > mine for factor in factors.values()), len(factors)
