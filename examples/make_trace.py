"""Write examples/trace.csv: a deterministic two-day mixed workload for the demo cluster.

    python examples/make_trace.py > examples/trace.csv
"""

import csv
import random
import sys

QUEUES = ["research/vision", "research/nlp", "prod", "scratch"]


def main(seed: int = 7, jobs: int = 400) -> None:
    rng = random.Random(seed)
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["job_id", "submit_time", "duration", "gpus", "tier", "queue", "user", "kind",
                  "gpus_per_node", "gpu_model", "walltime"])
    t = 0.0
    for i in range(jobs):
        t += rng.expovariate(1 / 420)
        queue = rng.choices(QUEUES, weights=[4, 4, 1, 2])[0]
        tier = 1 if queue == "prod" else rng.choices([2, 3], weights=[3, 1])[0]
        kind = "notebook" if rng.random() < 0.2 else "batch"
        gpus = rng.choices([1, 2, 4, 8, 16], weights=[50, 15, 15, 12, 8])[0]
        if kind == "notebook":
            gpus = min(gpus, 2)
        if tier == 1:
            gpus = min(gpus, 4)
        per_node = 8 if gpus == 16 else ""
        model = "A100-80GB" if gpus >= 8 else rng.choice(["", "", "L40S|A100-80GB"])
        duration = round(rng.lognormvariate(8, 1.1))
        walltime = round(duration * rng.uniform(1.2, 3)) if kind == "batch" else ""
        out.writerow([f"job{i:04d}", round(t), duration, gpus, tier, queue,
                      f"user{rng.randrange(12)}", kind, per_node, model, walltime])


if __name__ == "__main__":
    main()
