"""Event-driven replay: a heap of events in simulated time, the live engine making every decision.

Events are submissions, job ends (at start + remaining run time) and pre-emption kills (at the
signal + the victim's grace period). All events at one instant are applied, then one scheduling
pass runs, so a job that fits starts at the instant it is submitted. A pre-empted job resumes
from its last checkpoint (``checkpoint`` in the policy file): with ``on_signal`` it saves at the
kill and loses nothing, otherwise it keeps only whole checkpoint intervals.
Walltimes are estimates: a job that outruns its walltime is not killed.
A submission the live service would refuse at the door (:func:`~..core.submission.check_submission`:
a GPU model the cluster lacks, the user's ``pending_jobs`` limit) is a rejected job here.
"""

from __future__ import annotations

import copy
import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..core import Cluster, Preempt, QueueTree, Scheduler, Start, Stop
from ..core.errors import ConfigError
from ..core.jobs import Job, JobState
from ..core.policies import Policy
from ..core.settings import PolicySettings
from ..core.submission import check_submission
from .trace import TraceJob

END, KILL, WAKE, SUBMIT = 0, 1, 2, 3  # at one instant: ends and kills, then submissions
QUEUE_SAMPLE_S = 300.0


@dataclass
class RunRecord:
    """What the replay saw of one job (the engine's Job holds the rest)."""

    remaining: float
    run: int = 0  # increments each start; stale END/KILL events carry an old number
    allocated_gpu_s: float = 0.0
    lost_gpu_s: float = 0.0


@dataclass
class ReplayResult:
    policy: str
    scheduler: Scheduler
    trace: list[TraceJob]
    records: dict[str, RunRecord]
    first_submit: float
    last_end: float
    busy_s: float  # time with a pending job waiting on capacity or placement
    busy_allocated_gpu_s: float
    wait_gpu_s_by_reason: dict[str, float]
    sim_wall_s: float
    preemptions: int = 0
    placements: dict[str, tuple] = field(default_factory=dict)
    # (time, allocated GPUs, pending GPUs waiting on capacity, placement, policy) at each change
    timeline: list[tuple] = field(default_factory=list)
    # queue path -> [(time, running GPUs)], sampled every QUEUE_SAMPLE_S
    queue_usage: dict[str, list] = field(default_factory=dict)
    # jobs refused at submission (core/submission.py), which never reached the engine
    refused: dict[str, Job] = field(default_factory=dict)
    # wait_gpu_s_by_reason per job class (tier, queue, kind): only when replay(by_class=True)
    wait_gpu_s_by_class: dict[tuple, dict[str, float]] | None = None
    # job id -> the start of the first reservation it held at the end of a pass
    first_reservation: dict[str, float] = field(default_factory=dict)

    def job(self, job_id: str) -> Job:
        """The engine's job, or the refused one."""
        refused = self.refused.get(job_id)
        return refused if refused is not None else self.scheduler.jobs[job_id]


def replay(
    trace: list[TraceJob],
    cluster: Cluster,
    queues: QueueTree | None,
    settings: PolicySettings,
    policy: Policy,
    progress: Callable[[int, int], None] | None = None,
    by_class: bool = False,
) -> ReplayResult:
    """Replay ``trace`` (sorted by submit time) until every admitted job has finished.
    ``by_class``: also integrate the GPUs waiting by reason per job class (tier, queue, kind),
    for the table per job class (:mod:`.classes`); off, the replay does not pay for it."""
    wall_start = time.perf_counter()
    scheduler = Scheduler(cluster, copy.deepcopy(queues), settings, policy, by_class)
    records = {t.id: RunRecord(remaining=t.duration) for t in trace}
    heap: list[tuple] = []
    seq = 0
    for t in trace:
        heap.append((t.submit_time, SUBMIT, seq, t.id, 0))
        seq += 1
    heapq.heapify(heap)
    by_id = {t.id: t for t in trace}
    now = trace[0].submit_time if trace else 0.0
    first_submit, last_end = now, now
    busy_s = busy_gpu_s = 0.0
    waits = dict.fromkeys(scheduler.pending_gpus_by_reason, 0.0)
    waits_by_class: dict[tuple, dict[str, float]] | None = {} if by_class else None
    allocated = 0  # GPUs held by running jobs
    preemptions = done = 0
    placements: dict[str, tuple] = {}
    started_at: dict[str, float] = {}
    woken = None
    timeline: list[tuple] = []
    queues_tracked = [q for q in scheduler.tree.by_path.values() if q.parent is not None]
    queue_usage: dict[str, list] = {q.path: [] for q in queues_tracked}
    next_sample = now
    refused: dict[str, Job] = {}
    first_reservation: dict[str, float] = {}

    def pending_of(user: str) -> int:  # only asked for users with a pending_jobs limit
        return sum(
            1 for j in scheduler.jobs.values() if j.user == user and j.state is JobState.PENDING
        )

    while heap:
        moment = heap[0][0]
        elapsed = moment - now
        if elapsed > 0:
            by_reason = scheduler.pending_gpus_by_reason
            for family, gpus in by_reason.items():
                waits[family] += gpus * elapsed
            if by_reason["capacity"] or by_reason["placement"]:
                busy_s += elapsed
                busy_gpu_s += allocated * elapsed
            if waits_by_class is not None:
                _integrate(waits_by_class, scheduler.pending_gpus_by_class, elapsed)
        now = moment
        while heap and heap[0][0] == now:
            _, kind, _, job_id, run = heapq.heappop(heap)
            if kind == WAKE:
                continue  # the pass below runs anyway
            record = records[job_id]
            if kind == SUBMIT:
                job = by_id[job_id].to_job()
                refusal = check_submission(job, cluster, scheduler.tree, pending_of)
                if refusal is not None:  # the service would answer 400 or 429: rejected
                    job.state, job.end_time = JobState.REJECTED, now
                    job.reject_reason, job.reject_field = refusal.message, refusal.field
                    refused[job_id] = job
                    continue
                try:
                    scheduler.submit(job, now)
                except ConfigError as exc:
                    raise ConfigError(f"job {job_id}: {exc}") from None
                continue
            if run != record.run or job_id not in scheduler.running:
                continue  # the run this event belonged to is already over
            job = scheduler.jobs[job_id]
            ran = now - started_at[job_id]
            record.allocated_gpu_s += ran * job.amount
            allocated -= job.amount
            if kind == END:
                record.remaining = 0.0
                scheduler.job_ended(job_id, now, "completed")
                last_end = max(last_end, now)
                done += 1
                if progress is not None and done % 1000 == 0:
                    progress(done, len(trace))
            else:
                saved = settings.saved_work(ran)
                record.remaining -= saved
                record.lost_gpu_s += (ran - saved) * job.amount
                preemptions += 1
                scheduler.job_ended(job_id, now, "preempted")
                last_end = max(last_end, now)
        for decision in scheduler.schedule(now):
            if isinstance(decision, Start):
                record = records[decision.job_id]
                record.run += 1
                job = scheduler.jobs[decision.job_id]
                allocated += job.amount
                started_at[decision.job_id] = now
                placements[decision.job_id] = decision.placement.nodes
                heapq.heappush(
                    heap, (now + record.remaining, END, seq, decision.job_id, record.run)
                )
            elif isinstance(decision, Preempt):
                record = records[decision.job_id]
                heapq.heappush(heap, (now + decision.grace, KILL, seq, decision.job_id, record.run))
            elif isinstance(decision, Stop) and not decision.ended:
                record = records[decision.job_id]
                heapq.heappush(heap, (now, END, seq, decision.job_id, record.run))
            seq += 1
        held = scheduler.reservation
        if held is not None and held.start is not None and held.job_id not in first_reservation:
            first_reservation[held.job_id] = held.start
        by_reason = scheduler.pending_gpus_by_reason
        point = (allocated, by_reason["capacity"], by_reason["placement"], by_reason["policy"])
        if not timeline or timeline[-1][1:] != point:
            timeline.append((now, *point))
        if now >= next_sample:
            for queue in queues_tracked:
                queue_usage[queue.path].append((now, queue.running))
            next_sample = now + QUEUE_SAMPLE_S
        wake = scheduler.next_wakeup()
        if wake is not None and wake > now and wake != woken:
            heapq.heappush(heap, (wake, WAKE, seq, "", 0))
            woken, seq = wake, seq + 1
    if progress is not None:
        progress(len(trace), len(trace))
    return ReplayResult(
        policy=policy.name,
        scheduler=scheduler,
        trace=trace,
        records=records,
        first_submit=first_submit,
        last_end=last_end,
        busy_s=busy_s,
        busy_allocated_gpu_s=busy_gpu_s,
        wait_gpu_s_by_reason=waits,
        sim_wall_s=time.perf_counter() - wall_start,
        preemptions=preemptions,
        placements=placements,
        timeline=timeline,
        queue_usage=queue_usage,
        refused=refused,
        wait_gpu_s_by_class=waits_by_class,
        first_reservation=first_reservation,
    )


def _integrate(waits_by_class: dict, pending_by_class: dict, elapsed: float) -> None:
    """Add ``elapsed`` seconds of each class's pending GPUs by reason to its GPU-seconds
    waited, as the replay does for the whole cluster's."""
    for key, counts in pending_by_class.items():
        into = waits_by_class.get(key)
        if into is None:
            into = waits_by_class[key] = dict.fromkeys(counts, 0.0)
        for family, gpus in counts.items():
            into[family] += gpus * elapsed
