"""The policy file: one documented schema, read by ``replay --config`` and by the live service.

Every key is optional; the defaults below are the documented ones (see docs/files.md)::

    tiers:                         # per-tier pre-emption settings (tier 1 is never pre-empted)
      2: {grace_period: 5m, minimum_run_time: 10m}
      3: {grace_period: 1m, minimum_run_time: 0}
    preemption_signal: SIGTERM     # sent to victims; SIGKILL follows after the grace period
    checkpoint:
      interval: 30m                # a running job saves progress this often
      on_signal: false             # true: victims save at the signal and lose no work
    fair_share:
      half_life: 7d                # usage decay (a queue file may set its own)
      weight: 1.0                  # weight of the fair-share factor in the priority score
      recalc_interval: 5m          # fair-share factors are recomputed at most this often
    age:
      weight: 0.5                  # weight of the age factor, which grows linearly ...
      max_age: 7d                  # ... until a job has waited this long
    walltime:                      # used when a job gives no walltime estimate
      batch: 24h
      notebook: 12h                # what a notebook without a walltime is planned with
      estimate: never              # learned run-time estimates (core/runtime_estimates.py):
                                   # missing: plan jobs without a walltime with one; always:
                                   # every job (never past its walltime); never: walltimes and
                                   # the defaults above only (docs/engine.md: the figures)
      estimate_quantile: 0.9       # the quantile of similar jobs' recent run times ...
      estimate_margin: 1.2         # ... times this margin (>= 1)
      estimate_history: 20         # run times kept per key (user, kind, GPUs, name ...)
      estimate_min_samples: 3      # runs a key needs before it gives an estimate
    backfill:
      depth: 200                   # blocked jobs a deep pass examines for backfill (>= 1)
      interval: 30s                # deep passes (backfill, pre-emption) at most this often
      interval_fraction: 0.05      # ... and sooner while jobs are short: at most this fraction
                                   # of the median run time of the last 200 completed jobs,
                                   # at least 1 s (core/cadence.py; 0: always `interval`)
      order: shortest              # behind the reservation, start the shortest jobs first
                                   # (within a tier; core/shortest_first.py); priority: in
                                   # priority order, as Slurm's backfill does
    placement:
      leaf_patience: 3h            # a gang that fits one leaf switch waits this long for one
                                   # before it may span leaves
      leaf_reservation_slack: 7d   # such a gang reserves one leaf's nodes if that leaf frees
                                   # at most this long after GPUs enough free across leaves
                                   # (and then waits for it past its patience)
      fragmentation: true          # gpusched: single-node jobs go where the expected GPU
                                   # fragmentation grows least (FGD); false: best fit
      workload_half_life: 2000     # FGD's histogram of job shapes: a job's weight halves
                                   # after this many later submissions
    deadlines:                     # jobs with a deadline (core/deadlines.py)
      urgency: 1.0                 # urgent once its slack is at most this x its run time:
                                   # then ahead of its tier's other jobs, least slack first
      on_miss: keep                # unfinished at its deadline: keep (report it) or cancel
    launch:
      retry_delay: 30s             # a placement the launcher refused (e.g. Slurm) is retried
      max_retry_delay: 15m         # after this, doubled at each refusal up to the maximum
      max_refusals: 5              # refusals in a row after which the job fails
    reaper: {...}                  # idle-session timeouts, see jupyter_gpusched.service.reaper;
                                   # checked by files.load_policy (the settings are the
                                   # service's), with file, line and field like the rest
"""

from __future__ import annotations

import math
import signal as _signal
from dataclasses import dataclass, field, fields

from .durations import parse_duration
from .errors import ConfigError, line_of

# the policy file's top-level keys
SECTIONS = frozenset(
    {
        "tiers",
        "preemption_signal",
        "checkpoint",
        "fair_share",
        "age",
        "walltime",
        "backfill",
        "placement",
        "launch",
        "deadlines",
        "reaper",
    }
)


@dataclass(frozen=True)
class TierSettings:
    grace_period: float
    minimum_run_time: float


@dataclass(frozen=True)
class PolicySettings:
    tiers: dict[int, TierSettings] = field(
        default_factory=lambda: {
            1: TierSettings(grace_period=0.0, minimum_run_time=0.0),
            2: TierSettings(grace_period=300.0, minimum_run_time=600.0),
            3: TierSettings(grace_period=60.0, minimum_run_time=0.0),
        }
    )
    preemption_signal: str = "SIGTERM"
    checkpoint_interval: float = 1800.0
    checkpoint_on_signal: bool = False
    fair_share_half_life: float = 7 * 86400.0
    fair_share_weight: float = 1.0
    fair_share_recalc_interval: float = 300.0
    age_weight: float = 0.5
    max_age: float = 7 * 86400.0
    walltime_batch: float = 86400.0
    walltime_notebook: float = 12 * 3600.0
    estimate: str = "never"  # learned run-time estimates: missing | always | never
    estimate_quantile: float = 0.9
    estimate_margin: float = 1.2
    estimate_history: int = 20
    estimate_min_samples: int = 3
    backfill_depth: int = 200
    backfill_interval: float = 30.0
    backfill_interval_fraction: float = 0.05
    backfill_order: str = "shortest"  # shortest | priority (core/shortest_first.py)
    leaf_patience: float = 3 * 3600.0
    leaf_reservation_slack: float = 7 * 86400.0
    fragmentation: bool = True
    workload_half_life: float = 2000.0
    launch_retry_delay: float = 30.0
    launch_max_retry_delay: float = 900.0
    launch_max_refusals: int = 5
    deadline_urgency: float = 1.0
    deadline_on_miss: str = "keep"  # keep | cancel
    reaper: dict = field(default_factory=dict)

    def default_walltime(self, kind: str) -> float:
        """What the engine plans with for a job without a walltime; an estimate, never enforced
        (a notebook server's lifetime: ``core/reaper.py``)."""
        return self.walltime_notebook if kind == "notebook" else self.walltime_batch

    def walltime(self, job) -> float:
        """What the engine plans with for ``job``: its own walltime, else the default."""
        return job.walltime or self.default_walltime(job.kind)

    def saved_work(self, ran: float) -> float:
        """What a pre-empted run of ``ran`` seconds keeps (the ``checkpoint`` model): all of it
        when jobs save at the signal, else its whole checkpoint intervals. The replay resumes a
        victim from there; ``export-trace`` counts a job's work with it."""
        if self.checkpoint_on_signal:
            return ran
        return (ran // self.checkpoint_interval) * self.checkpoint_interval

    def replace(self, **changes) -> PolicySettings:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return PolicySettings(**values)

    @classmethod
    def from_dict(cls, data, source: str = "policy file") -> PolicySettings:
        """Parse the policy file; an error names the file, line and field to fix."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ConfigError("expected a mapping of settings", source=source)
        reader = _Reader(data, source)
        defaults = cls()
        tiers = dict(defaults.tiers)
        if not isinstance(data.get("tiers") or {}, dict):
            reader.fail("must map tiers (2, 3) to grace_period and minimum_run_time", "tiers")
        for key, spec in (data.get("tiers") or {}).items():
            where = f"tiers.{key}"
            if key not in (2, 3, "2", "3"):
                reader.fail("only tiers 2 and 3 can be pre-empted; tier 1 has no settings", where)
            tier = int(key)
            if not isinstance(spec, dict):
                reader.fail("must be a mapping with grace_period and minimum_run_time", where)
            unknown = set(spec) - {"grace_period", "minimum_run_time"}
            if unknown:
                reader.fail(f"unknown field {sorted(unknown)[0]!r}", where)
            old = tiers[tier]
            tiers[tier] = TierSettings(
                grace_period=reader.duration(spec, "grace_period", old.grace_period, where),
                minimum_run_time=reader.duration(
                    spec, "minimum_run_time", old.minimum_run_time, where
                ),
            )
        checkpoint = reader.section("checkpoint", {"interval", "on_signal"})
        fair = reader.section("fair_share", {"half_life", "weight", "recalc_interval"})
        age = reader.section("age", {"weight", "max_age"})
        walltime = reader.section("walltime", {"batch", "notebook", *ESTIMATE_FIELDS})
        backfill = reader.section("backfill", {"depth", "interval", "interval_fraction", "order"})
        backfill_order = backfill.get("order", "shortest")
        if backfill_order not in ("shortest", "priority"):
            reader.fail(f"must be shortest or priority, got {backfill_order!r}", "backfill.order")
        placement = reader.section(
            "placement",
            {"leaf_patience", "leaf_reservation_slack", "fragmentation", "workload_half_life"},
        )
        fragmentation = placement.get("fragmentation", True)
        if not isinstance(fragmentation, bool):
            reader.fail(f"must be true or false, got {fragmentation!r}", "placement.fragmentation")
        on_signal = checkpoint.get("on_signal", False)
        if not isinstance(on_signal, bool):  # ("false" in quotes would read as true)
            reader.fail(f"must be true or false, got {on_signal!r}", "checkpoint.on_signal")
        launch = reader.section("launch", {"retry_delay", "max_retry_delay", "max_refusals"})
        deadlines = reader.section("deadlines", {"urgency", "on_miss"})
        on_miss = deadlines.get("on_miss", "keep")
        if on_miss not in ("keep", "cancel"):
            reader.fail(f"must be keep or cancel, got {on_miss!r}", "deadlines.on_miss")
        signal_name = str(data.get("preemption_signal", defaults.preemption_signal)).upper()
        if not signal_name.startswith("SIG"):
            signal_name = "SIG" + signal_name
        if not hasattr(_signal, signal_name):
            reader.fail(
                f"{signal_name} is not a signal name (e.g. SIGTERM, SIGUSR1)", "preemption_signal"
            )
        reaper = data.get("reaper", {})
        if not isinstance(reaper, dict):
            reader.fail("must be a mapping", "reaper")
        unknown = set(data) - SECTIONS
        if unknown:
            known = ", ".join(sorted(SECTIONS))
            reader.fail(
                f"unknown section; the sections are {known} (docs/files.md, 'Policy file')",
                sorted(unknown)[0],
            )
        settings = cls(
            tiers=tiers,
            preemption_signal=signal_name,
            checkpoint_interval=reader.duration(checkpoint, "interval", 1800.0, "checkpoint"),
            checkpoint_on_signal=on_signal,
            fair_share_half_life=reader.duration(fair, "half_life", 7 * 86400.0, "fair_share"),
            fair_share_weight=reader.number(fair, "weight", 1.0, "fair_share"),
            fair_share_recalc_interval=reader.duration(
                fair, "recalc_interval", 300.0, "fair_share"
            ),
            age_weight=reader.number(age, "weight", 0.5, "age"),
            max_age=reader.duration(age, "max_age", 7 * 86400.0, "age"),
            walltime_batch=reader.duration(walltime, "batch", 86400.0, "walltime"),
            walltime_notebook=reader.duration(walltime, "notebook", 12 * 3600.0, "walltime"),
            **_estimate_settings(reader, walltime, defaults),
            backfill_depth=int(reader.number(backfill, "depth", 200, "backfill")),
            backfill_interval=reader.duration(backfill, "interval", 30.0, "backfill"),
            backfill_interval_fraction=reader.number(
                backfill, "interval_fraction", 0.05, "backfill"
            ),
            backfill_order=backfill_order,
            leaf_patience=reader.duration(placement, "leaf_patience", 3 * 3600.0, "placement"),
            leaf_reservation_slack=reader.duration(
                placement, "leaf_reservation_slack", 7 * 86400.0, "placement"
            ),
            fragmentation=fragmentation,
            workload_half_life=reader.number(placement, "workload_half_life", 2000, "placement"),
            launch_retry_delay=reader.duration(launch, "retry_delay", 30.0, "launch"),
            launch_max_retry_delay=reader.duration(launch, "max_retry_delay", 900.0, "launch"),
            launch_max_refusals=int(reader.number(launch, "max_refusals", 5, "launch")),
            deadline_urgency=reader.number(deadlines, "urgency", 1.0, "deadlines"),
            deadline_on_miss=on_miss,
            reaper=dict(reaper),
        )
        if settings.fair_share_half_life <= 0:
            reader.fail("must be longer than 0", "fair_share.half_life")
        if settings.max_age <= 0:
            reader.fail("must be longer than 0", "age.max_age")
        if settings.launch_retry_delay <= 0:
            reader.fail("must be longer than 0", "launch.retry_delay")
        if settings.launch_max_retry_delay < settings.launch_retry_delay:
            reader.fail("must not be shorter than launch.retry_delay", "launch.max_retry_delay")
        if settings.workload_half_life < 1:
            reader.fail("must be at least 1 (jobs)", "placement.workload_half_life")
        if settings.checkpoint_interval <= 0:
            reader.fail("must be longer than 0", "checkpoint.interval")
        if settings.backfill_depth < 1:  # 0 stopped a pass before its first job: none started
            reader.fail(
                "must be at least 1 (1: a pass stops at the first blocked job, no backfill)",
                "backfill.depth",
            )
        if not 0 <= settings.backfill_interval_fraction <= 1:
            reader.fail(
                "must be between 0 and 1 (0: deep passes every backfill.interval)",
                "backfill.interval_fraction",
            )
        return settings


ESTIMATE_FIELDS = (
    "estimate",
    "estimate_quantile",
    "estimate_margin",
    "estimate_history",
    "estimate_min_samples",
)


def _estimate_settings(reader: _Reader, section: dict, defaults: PolicySettings) -> dict:
    """The ``walltime.estimate*`` fields (learned run-time estimates), checked."""
    mode = section.get("estimate", defaults.estimate)
    if mode is False:  # YAML 1.1 reads ``off`` and ``no`` as false
        mode = "never"
    if mode not in ("missing", "always", "never"):
        reader.fail(f"must be missing, always or never, got {mode!r}", "walltime.estimate")
    q = reader.number(section, "estimate_quantile", defaults.estimate_quantile, "walltime")
    if not 0 < q <= 1:
        reader.fail(f"must be above 0 and at most 1, got {q!r}", "walltime.estimate_quantile")
    margin = reader.number(section, "estimate_margin", defaults.estimate_margin, "walltime")
    if margin < 1:
        reader.fail(f"must be at least 1, got {margin!r}", "walltime.estimate_margin")
    counts = {}
    for key, least in (("estimate_history", 1), ("estimate_min_samples", 1)):
        value = reader.number(section, key, getattr(defaults, key), "walltime")
        if value != int(value) or value < least:
            reader.fail(
                f"must be a whole number >= {least}, got {section[key]!r}", f"walltime.{key}"
            )
        counts[key] = int(value)
    if counts["estimate_min_samples"] > counts["estimate_history"]:
        reader.fail(
            "must not exceed walltime.estimate_history (the run times kept)",
            "walltime.estimate_min_samples",
        )
    return {
        "estimate": mode,
        "estimate_quantile": q,
        "estimate_margin": margin,
        **counts,
    }


def policy_error(data: dict, source: str, message: str, where: str) -> ConfigError:
    """The error for ``where`` (``section.field``, e.g. ``reaper.timeout_tier_2``) of a policy
    file read with line numbers: the line is that of the deepest part of ``where`` found."""
    line, node = None, data
    for part in where.split("."):
        key = part if part in node else int(part) if part.isdigit() else None
        if key not in node:
            break
        line = line_of(node, key) or line
        node = node[key]
        if not isinstance(node, dict):
            break
    return ConfigError(message, source=source, field=where, line=line)


class _Reader:
    def __init__(self, data: dict, source: str):
        self.data, self.source = data, source

    def fail(self, message: str, where: str):
        """Raise for ``where`` (``section.field``), with the line of the deepest part found."""
        raise policy_error(self.data, self.source, message, where)

    def section(self, name: str, allowed: set[str]) -> dict:
        value = self.data.get(name) or {}
        if not isinstance(value, dict):
            self.fail("must be a mapping", name)
        unknown = set(value) - allowed
        if unknown:
            self.fail(
                f"unknown field {sorted(unknown)[0]!r}; known: {', '.join(sorted(allowed))}",
                f"{name}.{sorted(unknown)[0]}",
            )
        return value

    def duration(self, section: dict, key: str, default: float, where: str) -> float:
        if key not in section:
            return default
        try:
            return parse_duration(section[key])
        except (ValueError, OverflowError) as exc:
            self.fail(str(exc), f"{where}.{key}")

    def number(self, section: dict, key: str, default: float, where: str) -> float:
        value = section.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            self.fail(f"must be a number >= 0, got {value!r}", f"{where}.{key}")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            self.fail(f"must be a finite number, got {value!r}", f"{where}.{key}")
        return number
