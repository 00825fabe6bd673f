"""What the web page's history costs: recording a row, and answering ``GET api/history`` for the
page's 24 hours and an admin's 8 days, from a SQLite store holding a full retention (8 days of
rows every 60 s, the defaults: 11,520 rows, 20 queues each).

In this process, no HTTP: :meth:`Store.add_history` (insert plus the retention's delete) and
:meth:`Store.history` + :func:`service.history.visible` (read, cut to a user's queues or not,
the GPU-hours waited, thinned to 2,000 rows) are what a request does besides JSON. Reported:
median and max milliseconds of each, over ``--repeat`` runs, and the answer's JSON size. Prints
JSON.

    python benchmarks/bench_history.py [--repeat 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from types import SimpleNamespace

from jupyter_gpusched.core.quotas import QueueTree
from jupyter_gpusched.service.history import visible
from jupyter_gpusched.service.models import history_table
from jupyter_gpusched.service.page import MAX_HISTORY_READ
from jupyter_gpusched.service.store import Store

INTERVAL, DAYS, QUEUES = 60.0, 8, 20


def _row(t: float, i: int) -> dict:
    return {
        "time": t,
        "total_gpus": 512,
        "allocated": {"1": 100.0 + i % 7, "2": 200.0, "3": 50.0 + i % 13},
        "queues": {f"team{q}": float((i + q) % 32) for q in range(QUEUES)},
        "pending": {"capacity": i % 17, "placement": i % 3, "policy": i % 11},
        "measured": {"2": {"gpus": 40.0, "utilization": 35.5}},
    }


def _timed(fn, repeat: int) -> tuple[dict, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(1000 * (time.perf_counter() - start))
    return {"median_ms": round(statistics.median(times), 2), "max_ms": round(max(times), 2)}, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Store(f"sqlite:///{tmp}/h.sqlite") as store:
        now = time.time()
        rows = int(DAYS * 86400 / INTERVAL)
        start = now - rows * INTERVAL
        with store.engine.begin() as conn:  # the filling is not what is measured
            conn.execute(
                history_table.insert(),
                [
                    {"time": r["time"], "data": {k: v for k, v in r.items() if k != "time"}}
                    for r in (_row(start + i * INTERVAL, i) for i in range(rows))
                ],
            )
        queues = {f"team{q}": {"guaranteed": 1, "users": ["u"]} for q in range(QUEUES)}
        document = {"queues": queues}
        tree = QueueTree.from_dict(document, 512, "bench")
        live = SimpleNamespace(engine=SimpleNamespace(tree=tree), history=None)
        user = SimpleNamespace(name="u", admin=False, groups=frozenset())
        admin = SimpleNamespace(name="a", admin=True, groups=frozenset())
        counter = iter(range(10**9))
        record, _ = _timed(
            lambda: store.add_history(_row(now + next(counter), 0), keep_after=now - DAYS * 86400),
            args.repeat,
        )

        def answer(who, days):
            since = now - days * 86400
            read = store.history(since, now + 10**6, MAX_HISTORY_READ)
            return visible(live, read, who, since, now)

        page, day = _timed(lambda: answer(user, 1), args.repeat)
        week, eight = _timed(lambda: answer(admin, DAYS), args.repeat)
        size = os.path.getsize(f"{tmp}/h.sqlite")
    print(
        json.dumps(
            {
                "rows_stored": rows,
                "database_bytes": size,
                "record_one_row": record,
                "user_24h": {**page, "rows": len(day["rows"]), "json_bytes": len(json.dumps(day))},
                "admin_8_days": {
                    **week,
                    "rows": len(eight["rows"]),
                    "json_bytes": len(json.dumps(eight)),
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
