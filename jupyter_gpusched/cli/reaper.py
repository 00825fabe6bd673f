"""``jupyter-gpusched reaper show|set key=value ...``: the idle reaper's settings over the REST
API; ``reaper what-if TRACE``: other idle timeouts tried on an exported trace, offline.

The service's URL: ``--url``, else as :mod:`.connection` says; the token, as it says (never an
option; inside a single-user server, the server's). ``set`` needs an admin of the scheduler.

Values: JSON where it parses (``300``, ``null``, ``true``, ``["a","b"]``), else text (``30m``);
``exempt_*`` also take ``a,b``; ``off`` turns a timeout off; ``profile_timeouts.SLUG=15m`` sets one
profile's timeout.

``what-if`` needs no service when given a trace: it replays the notebook servers of a trace
written by ``export-trace`` (without one, it exports the service's last ``--since`` first, as an
admin) and their GPU utilization (``NAME-utilization.csv`` beside it) through the
reaper's own decision (``sim/reaper_whatif.py``), under the current settings (the policy file's
``reaper:`` section, else those in force at the export: ``NAME-reaper.json``, else the
defaults) and under the candidate (the current with the flags applied), and prints both side by
side per tier and profile.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .connection import DEFAULT_URL, request, service_token, service_url

LISTS = ("exempt_users", "exempt_groups", "exempt_profiles")


def add_parser(commands) -> None:
    reaper = commands.add_parser(
        "reaper",
        help="show or change the idle reaper's settings (through the service's REST API), or "
        "try other idle timeouts on an exported trace (what-if)",
        description="show: the settings in force and the sessions; set KEY=VALUE ...: change "
        "settings (admins), e.g. `set timeout_tier_2=20m warning_lead=5m exempt_users=alice`; "
        "what-if [TRACE]: what other settings would have done to the notebook servers of an export "
        "(without TRACE: of the service's last 30 days).",
    )
    _service_options(reaper, None)  # `reaper --url U show` as well as `reaper show --url U`
    actions = reaper.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = actions.add_parser("show", help="the settings in force and the sessions")
    show.add_argument("pairs", nargs="*", help=argparse.SUPPRESS)  # ignored, as always
    change = actions.add_parser("set", help="change settings (admins): KEY=VALUE ...")
    change.add_argument("pairs", nargs="*", metavar="KEY=VALUE")
    for parser in (show, change):
        _service_options(parser, argparse.SUPPRESS)
        parser.set_defaults(run=run)
    add_what_if_parser(actions)


def _service_options(parser, default) -> None:
    # the token comes from $GPUSCHED_SERVICE_TOKEN or $JUPYTERHUB_API_TOKEN, never an option:
    # a command line is visible to every user of the machine (ps)
    parser.add_argument("--url", default=default, help=f"the service's URL (default {DEFAULT_URL})")


def parse_pairs(pairs: list[str]) -> dict:
    changes: dict = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {pair!r}")
        if text.strip().lower() == "off":
            value = None
        else:
            try:
                value = json.loads(text)
            except ValueError:
                value = text
        if key in LISTS and isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if key.startswith("profile_timeouts."):
            changes.setdefault("profile_timeouts", {})[key.split(".", 1)[1]] = value
        else:
            changes[key] = value
    return changes


def run(args) -> int:
    base = service_url(args.url)
    url = base.rstrip("/") + "/api/reaper"
    token = service_token()
    try:
        if args.action == "set":
            if not args.pairs:
                print("jupyter-gpusched reaper set: nothing to set", file=sys.stderr)
                return 2
            status, data = request(url, token, "PUT", parse_pairs(args.pairs))
        else:
            status, data = request(url, token)
    except ValueError as exc:
        print(f"jupyter-gpusched reaper: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"jupyter-gpusched reaper: cannot reach {url}: {exc}", file=sys.stderr)
        return 1
    if status >= 400:
        field = f" ({data.get('field')})" if data.get("field") else ""
        print(f"jupyter-gpusched reaper: {status}: {data.get('error')}{field}", file=sys.stderr)
        return 2 if status == 400 else 1
    print(json.dumps(data, indent=2, sort_keys=True))
    return 0


# -- reaper what-if --------------------------------------------------------------------------
#: the flags of the candidate settings: flag -> the setting (also its argparse dest)
CANDIDATE_FLAGS = {
    "--timeout-tier-1": "timeout_tier_1",
    "--timeout-tier-2": "timeout_tier_2",
    "--timeout-tier-3": "timeout_tier_3",
    "--warning-lead": "warning_lead",
    "--idle-threshold": "idle_threshold",
}


def add_what_if_parser(actions) -> None:
    what_if = actions.add_parser(
        "what-if",
        help="replay a trace's notebook servers under other idle timeouts (offline)",
        description="Replay the notebook servers of TRACE (written by `export-trace`) and their "
        "measured GPU utilization through the idle reaper under the current settings (the "
        "--config file's reaper: section, else those in force at the export, NAME-reaper.json "
        "beside the trace, else the defaults) and under the candidate (the "
        "current with the flags below applied). Per tier and profile, current -> candidate: "
        "servers warned, culled, GPU-hours reclaimed before their recorded end, and culls of a "
        "server that was busy again later (the cost of a shorter timeout).",
        epilog="Durations: seconds, or 30m, 1h30m; `off` turns a timeout off. Kernel shutdowns "
        "(shutdown_kernels_first) cannot be replayed, nor servers without GPUs.",
    )
    what_if.add_argument(
        "trace",
        nargs="?",
        help="the trace file `export-trace` wrote (without it: the service's last --since, "
        "exported now; an admin's token, as for export-trace)",
    )
    what_if.add_argument(
        "--since", default="30d", help="without TRACE: how far back to export (default 30d)"
    )
    _service_options(what_if, argparse.SUPPRESS)
    what_if.add_argument(
        "--samples",
        metavar="FILE",
        help="the utilization samples (default: NAME-utilization.csv beside the trace)",
    )
    what_if.add_argument(
        "--config", metavar="POLICY.yaml", help="policy file whose reaper: section is current"
    )
    for flag, name in CANDIDATE_FLAGS.items():
        kind = "PCT" if name == "idle_threshold" else "D"
        what_if.add_argument(flag, dest=name, metavar=kind, help=f"candidate {name}")
    what_if.add_argument(
        "--profile-timeout",
        action="append",
        default=[],
        metavar="SLUG=D",
        help="candidate idle timeout of one hub profile (repeat for more; `off`: none)",
    )
    what_if.add_argument("--json", action="store_true", help="print the comparison as JSON")
    what_if.set_defaults(run=run_what_if)


def current_settings(policy_file: str | None, trace: str | None = None) -> dict:
    """The reaper settings of ``policy_file``'s ``reaper:`` section; without one, those the
    service had in force at the export (``NAME-reaper.json`` beside ``trace``), else the
    defaults. A bad section is a ConfigError naming ``reaper.<field>`` and its line."""
    from ..core import ConfigError
    from ..core.reaper_settings import DEFAULTS, validate, with_profile_idle_timeouts
    from ..files import check_reaper_section, read_yaml
    from .export import reaper_settings_path

    if policy_file is None:
        exported = reaper_settings_path(trace) if trace is not None else None
        if exported is None or not exported.is_file():
            return validate({}, DEFAULTS)
        try:
            data = json.loads(exported.read_text())
        except ValueError as exc:
            data = f"{exc}"
        if not isinstance(data, dict):
            message = f"not the reaper settings export-trace writes (a JSON object): {data}"
            raise ConfigError(message[:300], source=str(exported))
        profiles = data.pop("profile_idle_timeouts", {})
        try:
            return with_profile_idle_timeouts(validate(data), profiles)
        except ConfigError as exc:
            raise ConfigError(exc.message, source=str(exported), field=exc.field) from None
    data = read_yaml(policy_file)
    check_reaper_section(data, policy_file)
    section = data.get("reaper") if isinstance(data, dict) else None
    return validate(dict(section or {}))


def candidate_settings(current: dict, args) -> dict:
    """``current`` with the flags of ``args`` applied, each checked by the reaper's own rules;
    a bad value is a ConfigError naming its flag."""
    from ..core import ConfigError
    from ..core.reaper_settings import validate

    candidate = current
    for flag, name in CANDIDATE_FLAGS.items():
        value = getattr(args, name)
        if value is None:
            continue
        if name == "idle_threshold":
            try:
                value = float(value)
            except ValueError:
                raise ConfigError("must be a percentage from 0 to 100", field=flag) from None
        try:
            candidate = validate({name: value}, candidate)
        except ConfigError as exc:
            raise ConfigError(exc.message, field=flag) from None
    for pair in args.profile_timeout:
        slug, sep, value = pair.partition("=")
        if not sep or not slug.strip():
            raise ConfigError(f"expected SLUG=DURATION, got {pair!r}", field="--profile-timeout")
        timeouts = {**candidate["profile_timeouts"], slug.strip(): value.strip()}
        try:
            candidate = validate({"profile_timeouts": timeouts}, candidate)
        except ConfigError as exc:
            raise ConfigError(exc.message, field="--profile-timeout") from None
    return candidate


def run_what_if(args) -> int:
    if args.trace is not None:
        return what_if_on(args.trace, args)
    import tempfile

    from .export import ServiceFailed, fetch_export, write_export

    try:
        answer = fetch_export(getattr(args, "url", None), args.since)
    except ServiceFailed as exc:
        print(f"jupyter-gpusched reaper what-if: {exc}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="gpusched-what-if-") as folder:
        trace = Path(folder) / "trace.csv"
        write_export(answer, trace)
        return what_if_on(str(trace), args, f"the service's last {args.since}")


def what_if_on(trace_file: str, args, named: str | None = None) -> int:
    """The what-if on an exported trace (``named``: what to call it in the output)."""
    from ..core import ConfigError
    from ..sim.reaper_whatif import comparison, comparison_table
    from ..sim.trace import read_trace
    from ..sim.utilization import read_utilization, utilization_path

    args.trace = trace_file
    current = current_settings(args.config, args.trace)
    candidate = candidate_settings(current, args)
    samples = Path(args.samples) if args.samples else utilization_path(args.trace)
    if not samples.is_file():
        raise ConfigError(
            "no such samples file: `jupyter gpusched export-trace` writes it beside the trace "
            "(NAME-utilization.csv); give another with --samples",
            source=str(samples),
        )
    trace = read_trace(args.trace)
    result = comparison(trace, read_utilization(samples), current, candidate)
    if args.json:
        settings = {"current": current, "candidate": candidate}
        print(json.dumps({**result, "settings": settings}, indent=2, sort_keys=True))
        return 0
    replayed = result["total"]["servers"]
    where = named or f"{args.trace} ({samples})"
    print(f"idle-timeout what-if: {replayed} notebook servers of {where}")
    print("each figure current -> candidate\n")
    print(comparison_table(result))
    return 0
