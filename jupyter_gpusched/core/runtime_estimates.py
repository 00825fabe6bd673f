"""Learned run-time estimates: how long a job will run, from how long similar jobs ran.

Users rarely give a walltime, and those they give are limits rounded up (a run against real
Slurm found minute-rounded walltimes 4.4x the real run time on average). A planned run time far
too long keeps a job from starting in front of a reservation that it would end before, while
GPUs stay idle there.

:class:`RuntimeEstimates` is a small deterministic model, fitted on the runs that completed
(the live service also feeds it its stored history at start-up; a replay, the trace's earlier
jobs as they end). A job is matched with earlier runs by keys, most specific first:

1. (user, kind, GPUs, name), where the job's name (else its notebook, else its command) is known;
2. (user, kind, GPUs);
3. (queue, kind, GPUs).

The first key with at least ``min_samples`` runs gives the estimate: the ``quantile`` (linear
between closest ranks) of its last ``history`` run times, times ``margin``. No key with enough
runs: no estimate. Memory is bounded: ``history`` run times per key, at most ``max_keys`` keys
(the one observed least recently goes first).

:meth:`RuntimeEstimates.planned` is what the scheduler freezes on a job at submission
(``Job.planned_run_time``), per the policy file's ``walltime.estimate``:

- ``missing``: jobs without a walltime are planned with the estimate (else the default walltime);
  a user's walltime is kept as it is;
- ``always``: every job with an estimate is planned with it, never longer than its walltime;
- ``never``: walltimes and defaults only, as before estimates existed.

**Where the estimate plans, and where it does not.** A waiting job is planned with it: backfill's
test whether it ends before the reservation, the shortest-first order behind the reservation,
a deadline's latest start. The reservation's start is not: it is planned from the running
jobs' limits (their walltimes, else the policy's default; :meth:`.scheduler.Scheduler.
_end_by_limit`), as before estimates. Planning the reservation with the running jobs' estimates
too, as the engine first did, made waits longer on the synthetic workload of
``benchmarks/bench_estimates.py`` (mean 1.011x, p95 1.023x the walltimes' over 60 seeds): a
reservation planned sooner lets fewer jobs in front of it, so GPUs wait idle for it (Mu'alem and
Feitelson's finding for EASY backfill: overestimated running jobs leave holes that backfill
fills). With estimates for the waiting jobs only: mean 0.972x, p95 0.965x, gangs 1.005x
(docs/engine.md, "Learned run-time estimates").

Where a running job is *expected* to end (the expected start of every pending job,
:mod:`.plan`, and a deadline's earliest finish, :mod:`.estimate`), its estimate is used:
:func:`expected_ends`. A walltime stays the limit the user set; an estimate only plans: nothing
stops a job at it. The plan is frozen at submission, so a job's own run never feeds its own
estimate, and the pending queue, which finds a job by (planned run time, id), finds it until it
starts.
"""

from __future__ import annotations

from collections import OrderedDict

from .durations import describe_duration

MODES = ("missing", "always", "never")
MAX_NAME = 200  # characters of a name (or command) kept in a key
MAX_KEYS = 20_000  # keys kept (each holds at most ``history`` run times)


def run_name(name: str | None, notebook: str | None, command: str | None) -> str | None:
    """What names a run for matching with earlier runs: its name, else notebook, else command."""
    text = name or notebook or command
    return text[:MAX_NAME] if text else None


def quantile(ordered: tuple[float, ...] | list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of sorted ``ordered``, linear between closest ranks."""
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


class RuntimeEstimates:
    def __init__(
        self,
        quantile: float = 0.9,
        margin: float = 1.2,
        history: int = 20,
        min_samples: int = 3,
        max_keys: int = MAX_KEYS,
    ):
        self.quantile, self.margin = quantile, margin
        self.history, self.min_samples, self.max_keys = history, min_samples, max_keys
        # key -> (its last run times, oldest first; the estimate they give, or None). Values
        # are tuples, replaced on each observation: a copy of the dict is a whole copy
        self._by_key: OrderedDict[tuple, tuple[tuple[float, ...], float | None]] = OrderedDict()
        self.observed = 0  # runs observed in all

    @classmethod
    def from_settings(cls, settings) -> RuntimeEstimates:
        return cls(
            settings.estimate_quantile,
            settings.estimate_margin,
            settings.estimate_history,
            settings.estimate_min_samples,
        )

    def __deepcopy__(self, memo):  # (core/estimate.py's snapshot: values are immutable)
        new = object.__new__(RuntimeEstimates)
        memo[id(self)] = new
        new.__dict__.update(self.__dict__)
        new._by_key = OrderedDict(self._by_key)
        return new

    def __len__(self) -> int:
        return len(self._by_key)

    @staticmethod
    def keys(job) -> list[tuple]:
        """The keys ``job`` is matched by, most specific first."""
        keys = []
        if job.run_name is not None:
            keys.append(("user", job.user, job.kind, job.gpus, job.run_name))
        keys.append(("user", job.user, job.kind, job.gpus))
        keys.append(("queue", job.queue, job.kind, job.gpus))
        return keys

    def observe(self, job, run_time: float) -> None:
        """``job`` completed a run of ``run_time`` seconds."""
        run_time = max(float(run_time), 0.0)
        self.observed += 1
        by_key = self._by_key
        for key in self.keys(job):
            found = by_key.pop(key, None)  # (re-inserted last: the most recently observed)
            runs = (found[0] if found else ()) + (run_time,)
            if len(runs) > self.history:
                runs = runs[-self.history :]
            value = None
            if len(runs) >= self.min_samples:
                value = quantile(sorted(runs), self.quantile) * self.margin
            by_key[key] = (runs, value)
        while len(by_key) > self.max_keys:
            by_key.popitem(last=False)

    def estimate(self, job) -> float | None:
        """The run time ``job`` is expected to stay within, or None without enough history."""
        found = self._matched(job)
        return None if found is None else found[1]

    def _matched(self, job) -> tuple[tuple, float] | None:
        """The first of ``job``'s keys with an estimate, and that estimate."""
        by_key = self._by_key
        for key in self.keys(job):
            found = by_key.get(key)
            if found is not None and found[1] is not None:
                return key, found[1]
        return None

    def completed(self, job, now: float) -> None:
        """``job``'s run completed at ``now``: observed unless an earlier run of it was
        pre-empted (this run then resumed part of the work)."""
        if not job.preemptions:
            self.observe(job, now - job.start_time)

    def runs(self, key: tuple) -> tuple[float, ...]:
        """The run times kept for ``key`` (oldest first)."""
        found = self._by_key.get(key)
        return found[0] if found else ()

    def planned(self, job, settings) -> tuple[float, str | None]:
        """What the engine plans ``job`` to run, and where an estimate it is, what it learned
        from: ``user`` (the job's user's runs) or ``queue`` (its queue's runs of its kind and
        size, anyone's); None: a walltime or the default. See the module's text for the modes
        (``settings.estimate``)."""
        mode = settings.estimate
        if mode == "never" or (mode == "missing" and job.walltime):
            return settings.walltime(job), None
        matched = self._matched(job)
        if matched is None:
            return settings.walltime(job), None
        key, estimate = matched
        if job.walltime and job.walltime <= estimate:
            return job.walltime, None  # the limit is shorter: it stands
        return estimate, key[0]

    def frozen_plan(self, settings, job) -> float:
        """The run time the engine plans ``job`` with (:meth:`planned`), frozen on the job at the
        first ask (the scheduler asks at submission) and the same from then until it ends."""
        planned = job.planned_run_time
        if planned is None:
            planned, job.estimated_from = self.planned(job, settings)
            job.planned_run_time = planned
        return planned


PLAN_SOURCES = ("estimate", "walltime", "default")


def plan_source(job) -> str:
    """Where ``job``'s frozen planned run time came from: ``estimate`` (learned from earlier
    runs), ``walltime`` (its own) or ``default`` (the policy's, for a job without one)."""
    if job.estimated:
        return "estimate"
    return "walltime" if job.walltime else "default"


def planned_text(job, advise: bool = False) -> str:
    """``job``'s frozen planned run time in words, as the job view's
    ``planned_run_time.message`` and ``POST api/estimate`` give it: how long, and from what.
    ``advise``: it waits where its run time decides (GPUs, placement, a reservation): the
    default then says that a walltime may start it sooner."""
    run = describe_duration(job.planned_run_time)
    source = plan_source(job)
    if source == "estimate" and job.estimated_from == "queue":
        return f"planned to run {run}, estimated from its queue's earlier runs of its size"
    if source == "estimate":
        return f"planned to run {run}, estimated from earlier runs like it"
    if source == "walltime":
        return f"planned to run {run}, its walltime"
    text = f"planned to run {run}, the default for a job without a walltime"
    return f"{text}: give one if it runs less, and it may start sooner" if advise else text


def overrun_end(settings, job, now: float) -> float:
    """When running ``job``, past its learned estimate at ``now``, is planned to end: it runs as
    long again as it has run, but not past its walltime (else the policy's default)."""
    limit = job.start_time + settings.walltime(job)
    return max(now, min(limit, job.start_time + 2 * (now - job.start_time)))


def expected_ends(ends: list, jobs: dict, now: float, settings) -> list[tuple[float, str]]:
    """The running jobs' (expected end, id), soonest first, from ``ends``, the ledger's (end by
    limit, id): a job planned with a learned estimate is expected to end at it, and once it has
    outrun it, to run as long again as it has run, within its limit (:func:`overrun_end`; as
    Tsafrir, Etsion and Feitelson, 2007, raise a prediction found too short). Other jobs are
    expected at their limit, as the ledger has them."""
    if not any(jobs[job_id].estimated for _, job_id in ends):
        return ends
    expected = []
    for end, job_id in ends:
        job = jobs[job_id]
        if job.estimated:
            end = job.start_time + job.planned_run_time
            if end < now:
                end = overrun_end(settings, job, now)
        expected.append((end, job_id))
    expected.sort()
    return expected
