"""The idle-timeout what-if (sim/reaper_whatif.py, `jupyter gpusched reaper what-if`) on
hand-made notebook servers and utilization runs whose answer is known, and its samples file
(sim/utilization.py).

Unless a test says otherwise: tier-2 timeout 1 h, warning lead 10 min, idle threshold 5 %,
stale_after 2 min, unmonitored_after 5 min; each server busy until t=1000 s (so idle from there)
and ending at t=10000 s.
"""

from __future__ import annotations

import json

import pytest

from jupyter_gpusched.cli import main
from jupyter_gpusched.core.reaper_settings import DEFAULTS, validate
from jupyter_gpusched.sim.reaper_whatif import comparison, replay_server, what_if
from jupyter_gpusched.sim.trace import Recorded, TraceError, TraceJob, write_trace
from jupyter_gpusched.sim.utilization import (
    UtilizationRun,
    read_utilization,
    utilization_path,
    write_utilization,
)

BASE = {"timeout_tier_2": "1h", "warning_lead": "10m", "stale_after": 120, "unmonitored_after": 300}
END = 10_000.0


def settings(**changes) -> dict:
    return validate({**BASE, **changes})


def server(job_id="nb-1", tier=2, gpus=1, end=END, profile=None, outcome="completed", **kw):
    recorded = Recorded(0.0, end, end, 0, outcome, profile)
    return TraceJob(job_id, 0.0, end, gpus, tier=tier, kind="notebook", recorded=recorded, **kw)


def runs(job_id, *spans) -> list[UtilizationRun]:
    return [UtilizationRun(job_id, start, end, used) for start, end, used in spans]


BUSY_THEN_IDLE = ((0, 1000, 80), (1010, 9990, 0))  # idle from 1000 to the end


def test_an_idle_server_is_warned_a_lead_before_its_timeout_then_culled():
    outcome = replay_server(server(gpus=2), runs("nb-1", *BUSY_THEN_IDLE), settings())
    assert outcome.warned_at == 1000 + 3600 - 600
    assert outcome.culled_at == 1000 + 3600
    assert outcome.reason == "idle"
    assert outcome.gpu_hours_reclaimed == pytest.approx(2 * (END - 4600) / 3600)
    assert not outcome.used_after_cull


def test_an_idle_run_that_starts_as_the_busy_one_ends_is_idleness():
    # (the busy run's end, the same second, hid the idle run: no cull after 2.5 h idle)
    touching = ((0, 1000, 80), (1000, 9990, 0))
    outcome = replay_server(server(), runs("nb-1", *touching), settings())
    assert (outcome.warned_at, outcome.culled_at) == (1000 + 3600 - 600, 1000 + 3600)


def test_a_busy_server_is_never_warned():
    outcome = replay_server(server(), runs("nb-1", (0, 9990, 50)), settings())
    assert (outcome.warned_at, outcome.culled_at, outcome.gpu_hours_reclaimed) == (None, None, 0)


def test_a_run_below_the_threshold_is_idle_and_one_at_it_busy():
    spans = ((0, 1000, 80), (1010, 9990, 4.9))
    assert replay_server(server(), runs("nb-1", *spans), settings()).culled_at == 4600
    busy = replay_server(server(), runs("nb-1", *spans), settings(idle_threshold=4.9))
    assert busy.culled_at is None


def test_use_after_the_warning_cancels_it_and_no_cull_follows():
    spans = ((0, 1000, 80), (1010, 4200, 0), (4210, 5000, 90), (5010, 7000, 0))
    outcome = replay_server(server(end=7000.0), runs("nb-1", *spans), settings())
    assert outcome.warned_at == 4000  # warned, due at 4600, busy again at 4210
    assert outcome.culled_at is None
    # without that use, the same server is culled at 4600
    idle = replay_server(
        server(end=7000.0), runs("nb-1", (0, 1000, 80), (1010, 7000, 0)), settings()
    )
    assert idle.culled_at == 4600


def test_a_cull_followed_by_use_is_counted():
    spans = ((0, 1000, 80), (1010, 5000, 0), (6000, 7000, 90), (7010, 9990, 0))
    result = what_if([server()], {"nb-1": runs("nb-1", *spans)}, settings())
    (outcome,) = result.servers
    assert outcome.culled_at == 4600 and outcome.used_after_cull
    assert result.total.culls_followed_by_use == 1
    # busy only before the cull: not counted
    quiet = what_if([server()], {"nb-1": runs("nb-1", *BUSY_THEN_IDLE)}, settings())
    assert quiet.total.culled == 1 and quiet.total.culls_followed_by_use == 0


def test_a_shorter_timeout_culls_more_and_reclaims_more():
    trace = [server("nb-1"), server("nb-2")]
    samples = {
        "nb-1": runs("nb-1", *BUSY_THEN_IDLE),
        # idle 45 min (1000 to 3700), then busy again: a 30 min timeout culls it at 2800
        "nb-2": runs("nb-2", (0, 1000, 80), (1010, 3690, 0), (3700, 9990, 70)),
    }
    current, candidate = settings(), settings(timeout_tier_2="30m")
    now, then = what_if(trace, samples, current), what_if(trace, samples, candidate)
    assert (now.total.culled, then.total.culled) == (1, 2)
    assert then.total.gpu_hours_reclaimed > now.total.gpu_hours_reclaimed
    assert [s.culled_at for s in then.servers] == [1000 + 1800, 1000 + 1800]
    assert (now.total.culls_followed_by_use, then.total.culls_followed_by_use) == (0, 1)
    assert now.total.warned == 1 and then.total.warned == 2
    table = comparison(trace, samples, current, candidate)
    assert table["total"]["current"]["culled"] == 1
    assert table["total"]["candidate"]["culled"] == 2
    assert table["changed"] == {"timeout_tier_2": [3600.0, 1800.0]}


@pytest.mark.parametrize("mode", ["keep", "warn"])
def test_an_unmeasured_gap_is_not_idleness(mode):
    # measured until 1500, then nothing: stale after 1620, so the timeout passes unacted on
    spans = ((0, 1000, 80), (1010, 1500, 0))
    outcome = replay_server(server(), runs("nb-1", *spans), settings(unmonitored=mode))
    assert (outcome.warned_at, outcome.culled_at) == (None, None)


def test_an_unmeasured_gap_is_idleness_under_unmonitored_cull():
    spans = ((0, 1000, 80), (1010, 1500, 0))
    outcome = replay_server(server(), runs("nb-1", *spans), settings(unmonitored="cull"))
    assert outcome.warned_at == 4000 and outcome.culled_at == 4600
    assert outcome.reason == "unmonitored"


def test_unmonitored_cull_comes_when_the_server_becomes_unmonitored():
    # warned at 4000 while measured; due at 4600, when its last measurement (4400) is stale but
    # not yet 5 min old: left alone until it is unmonitored, at 4700
    spans = ((0, 1000, 80), (1010, 4400, 0))
    culled = replay_server(server(), runs("nb-1", *spans), settings(unmonitored="cull"))
    assert culled.warned_at == 4000
    assert culled.culled_at == pytest.approx(4700) and culled.culled_at > 4700
    assert culled.reason == "unmonitored"
    kept = replay_server(server(), runs("nb-1", *spans), settings(unmonitored="keep"))
    assert (kept.warned_at, kept.culled_at) == (4000, None)


def test_measured_again_after_a_gap_the_idle_server_is_warned_with_a_whole_lead():
    spans = ((0, 1000, 80), (1010, 1500, 0), (6000, 9990, 0))
    outcome = replay_server(server(), runs("nb-1", *spans), settings(unmonitored="keep"))
    assert outcome.warned_at == 6000 and outcome.culled_at == 6600


def test_an_exempt_profile_is_never_culled():
    trace = [server("nb-1", profile="big"), server("nb-2", profile="small")]
    samples = {j.id: runs(j.id, *BUSY_THEN_IDLE) for j in trace}
    result = what_if(trace, samples, settings(exempt_profiles=["big"]))
    assert [(s.job_id, s.culled_at) for s in result.servers] == [("nb-1", None), ("nb-2", 4600)]
    assert result.by_class[(2, "big")].culled == 0
    assert result.by_class[(2, "small")].culled == 1


def test_a_profile_timeout_overrides_the_tier():
    trace = [server("nb-1", tier=1, profile="short"), server("nb-2", tier=2, profile="short")]
    samples = {j.id: runs(j.id, *BUSY_THEN_IDLE) for j in trace}
    plain = what_if(trace, samples, settings())
    assert [s.culled_at for s in plain.servers] == [None, 4600]  # tier 1: no timeout
    short = what_if(trace, samples, settings(profile_timeouts={"short": "15m"}))
    assert [s.culled_at for s in short.servers] == [1900, 1900]
    assert [s.warned_at for s in short.servers] == [1300, 1300]


def test_max_lifetime_culls_even_a_busy_server():
    outcome = replay_server(server(), runs("nb-1", (0, 9990, 90)), settings(max_lifetime="1h"))
    assert (outcome.culled_at, outcome.reason) == (3600, "max-lifetime")
    assert outcome.used_after_cull  # busy after the cull, before its recorded end


def test_the_summary_counts_per_tier_and_profile_and_the_live_culls():
    trace = [
        server("nb-1", profile="gpu", outcome="culled"),
        server("nb-2", profile="gpu"),
        server("nb-3", tier=3),
        TraceJob("cpu-1", 0.0, END, 0, kind="notebook", cpus=2, recorded=Recorded(0.0, END)),
        TraceJob("old-1", 0.0, END, 1, kind="notebook"),  # no recorded start
        TraceJob("batch-1", 0.0, END, 1, recorded=Recorded(0.0, END)),
    ]
    samples = {
        "nb-1": runs("nb-1", *BUSY_THEN_IDLE),
        "nb-2": runs("nb-2", (0, 9990, 60)),
        "nb-3": runs("nb-3", *BUSY_THEN_IDLE),
        "gone": runs("gone", (0, 10, 0)),
    }
    result = what_if(list(reversed(trace)), samples, settings())
    assert list(result.by_class) == [(2, "gpu"), (3, "")]
    gpu = result.by_class[(2, "gpu")]
    assert (gpu.servers, gpu.warned, gpu.culled, gpu.live_culled) == (2, 1, 1, 1)
    tier_3 = result.by_class[(3, "")]
    assert tier_3.culled == 1 and tier_3.gpu_hours_reclaimed == pytest.approx((END - 2800) / 3600)
    assert result.total.servers == 3
    assert sorted(result.left_out.values()) == [1, 1, 1]  # the CPU server, the old one, "gone"
    assert result == what_if(trace, samples, settings())  # the trace's order does not matter


def test_what_cannot_be_replayed_exactly_is_said():
    result = what_if(
        [server()], {"nb-1": runs("nb-1", *BUSY_THEN_IDLE)}, settings(shutdown_kernels_first=True)
    )
    assert result.servers[0].culled_at == 4600
    assert any("shutdown_kernels_first" in note for note in result.notes)
    groups = what_if([server()], {}, settings(exempt_groups=["ops"]))
    assert any("exempt_groups" in note for note in groups.notes)
    assert not what_if([server()], {}, settings()).notes
    off_edge = what_if([server()], {}, settings(idle_threshold=3))
    assert any("not a band edge" in note for note in off_edge.notes)


# -- the samples file ------------------------------------------------------------------------
def test_the_samples_file_reads_back_what_was_written(tmp_path):
    written = runs("b", (5, 9, 3.5)) + runs("a", (20, 30, 0.0), (0, 10, 99.5))
    path = tmp_path / "x.csv"
    write_utilization(path, written)
    assert read_utilization(path) == {
        "a": runs("a", (0, 10, 99.5), (20, 30, 0.0)),
        "b": runs("b", (5, 9, 3.5)),
    }
    assert utilization_path(tmp_path / "trace.csv") == tmp_path / "trace-utilization.csv"


@pytest.mark.parametrize(
    ("text", "field", "line"),
    [
        ("a,10,5,3\n", "end", 3),
        ("a,0,5,101\n", "utilization", 3),
        ("a,0,inf,3\n", "end", 3),
        ("a,x,5,3\n", "start", 3),
        (",0,5,3\n", "job_id", 3),
        ("a,0,5,\n", "utilization", 3),
    ],
)
def test_a_bad_samples_row_names_the_file_line_and_field(tmp_path, text, field, line):
    path = tmp_path / "s.csv"
    path.write_text("job_id,start,end,utilization\na,0,1,0\n" + text)
    with pytest.raises(TraceError) as caught:
        read_utilization(path)
    assert (caught.value.source, caught.value.line, caught.value.field) == (str(path), line, field)


@pytest.mark.parametrize(
    ("header", "says"),
    [("job_id,start,end", "utilization"), ("job_id,start,end,utilization,x", "'x'")],
)
def test_a_samples_header_needs_its_columns_and_no_others(tmp_path, header, says):
    path = tmp_path / "s.csv"
    path.write_text(header + "\n")
    with pytest.raises(TraceError, match=says) as caught:
        read_utilization(path)
    assert caught.value.line == 1


# -- the command -----------------------------------------------------------------------------
@pytest.fixture
def exported(tmp_path):
    """A trace with two idle tier-2 servers (one 'gpu' profile, one none) and a busy one, its
    samples beside it, and a policy whose reaper timeout for tier 2 is 1 h."""
    trace = [server("nb-1", profile="gpu", outcome="culled"), server("nb-2"), server("nb-3")]
    samples = runs("nb-1", *BUSY_THEN_IDLE) + runs("nb-2", (0, 1000, 80), (1010, 3690, 0))
    samples += runs("nb-2", (3700, 9990, 70)) + runs("nb-3", (0, 9990, 90))
    path = tmp_path / "trace.csv"
    write_trace(path, trace)
    write_utilization(utilization_path(path), samples)
    policy = tmp_path / "policy.yaml"
    policy.write_text("reaper:\n  timeout_tier_2: 1h\n  warning_lead: 10m\n")
    return path, policy


def test_what_if_prints_current_and_candidate_per_tier_and_profile(exported, capsys):
    trace, policy = exported
    code = main(
        ["reaper", "what-if", str(trace), "--config", str(policy), "--timeout-tier-2", "30m"]
    )
    out = capsys.readouterr().out
    assert code == 0
    rows = {
        line.split()[0] + " " + line.split()[1]: line
        for line in out.splitlines()
        if line[:2] in ("2 ", "to")
    }
    assert "1 -> 1" in rows["2 gpu"]  # culled: 1 -> 1
    assert "0 -> 1" in rows["2 -"]  # nb-2 culled only by the shorter timeout, and busy again
    assert rows["total 3"].split()[2:5] == ["1", "->", "2"]  # warned
    assert "timeout_tier_2 1 h -> 30 min" in out


def test_what_if_json(exported, capsys):
    trace, policy = exported
    argv = ["reaper", "what-if", str(trace), "--config", str(policy), "--json"]
    assert main([*argv, "--profile-timeout", "gpu=15m", "--warning-lead", "5m"]) == 0
    result = json.loads(capsys.readouterr().out)
    gpu = next(c for c in result["classes"] if c["profile"] == "gpu")
    assert gpu["servers"] == 1 and gpu["live_culled"] == 1
    assert gpu["current"]["culled"] == gpu["candidate"]["culled"] == 1
    culls = {s["job_id"]: s["candidate"]["culled_at"] for s in result["servers"]}
    assert culls == {"nb-1": 1900.0, "nb-2": None, "nb-3": None}
    assert result["settings"]["candidate"]["profile_timeouts"] == {"gpu": 900.0}
    assert result["changed"]["warning_lead"] == [600.0, 300.0]
    assert result["changed"]["profile_timeouts.gpu"] == ["tier", 900.0]


def test_without_flags_the_candidate_is_the_current(exported, capsys):
    trace, _ = exported
    assert main(["reaper", "what-if", str(trace), "--json"]) == 0  # the defaults: 45 min
    result = json.loads(capsys.readouterr().out)
    assert result["changed"] == {}
    assert result["total"]["current"] == result["total"]["candidate"]


def test_without_config_the_current_is_what_the_service_had_in_force(exported, capsys):
    """export-trace writes the reaper's settings in force beside the trace, the hub profiles'
    own idle timeouts included (which a policy file cannot hold): they are the current ones."""
    trace, _ = exported
    in_force = {**DEFAULTS, "timeout_tier_2": 3600.0, "profile_idle_timeouts": {"gpu": 600.0}}
    trace.with_name("trace-reaper.json").write_text(json.dumps(in_force))
    assert main(["reaper", "what-if", str(trace), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    current = result["settings"]["current"]
    assert current["timeout_tier_2"] == 3600.0 and current["profile_idle_timeouts"] == {"gpu": 600}
    culls = {s["job_id"]: s["current"]["culled_at"] for s in result["servers"]}
    assert culls["nb-1"] is not None and culls["nb-1"] < 3600  # its profile's 10 min
    trace.with_name("trace-reaper.json").write_text("[1, 2]")
    assert main(["reaper", "what-if", str(trace)]) == 2
    assert "trace-reaper.json" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "names"),
    [
        (["--timeout-tier-2", "soon"], "--timeout-tier-2"),
        (["--idle-threshold", "500"], "--idle-threshold"),
        (["--profile-timeout", "gpu"], "--profile-timeout"),
        (["--profile-timeout", "gpu=later"], "--profile-timeout"),
    ],
)
def test_a_bad_flag_is_exit_2_naming_it(exported, capsys, flags, names):
    trace, _ = exported
    assert main(["reaper", "what-if", str(trace), *flags]) == 2
    assert names in capsys.readouterr().err


def test_a_missing_samples_file_is_exit_2_saying_export_trace_writes_it(exported, capsys):
    trace, _ = exported
    utilization_path(trace).unlink()
    assert main(["reaper", "what-if", str(trace)]) == 2
    err = capsys.readouterr().err
    assert str(utilization_path(trace)) in err and "export-trace" in err


def test_a_bad_samples_row_or_policy_is_exit_2_naming_the_file(exported, tmp_path, capsys):
    trace, policy = exported
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,start,end,utilization\nnb-1,5,1,0\n")
    assert main(["reaper", "what-if", str(trace), "--samples", str(bad)]) == 2
    assert f"{bad}:2" in capsys.readouterr().err
    policy.write_text("reaper:\n  timeout_tier_2: soon\n")
    assert main(["reaper", "what-if", str(trace), "--config", str(policy)]) == 2
    assert "reaper.timeout_tier_2" in capsys.readouterr().err


def test_show_and_set_parse_as_before(monkeypatch, capsys):
    import jupyter_gpusched.cli.reaper as reaper

    sent = []

    def request(url, token, method="GET", body=None):
        sent.append((url, token, method, body))
        return 200, {"ok": True}

    monkeypatch.setattr(reaper, "request", request)
    monkeypatch.setenv("GPUSCHED_SERVICE_TOKEN", "t")
    assert main(["reaper", "show", "--url", "http://s/"]) == 0
    # no token on the command line, which every user of the machine sees (ps): refused
    with pytest.raises(SystemExit) as refused:
        main(["reaper", "show", "--url", "http://s/", "--token", "t"])
    assert refused.value.code == 2
    assert "unrecognized arguments: --token" in capsys.readouterr().err
    assert main(["reaper", "--url", "http://s/", "show"]) == 0
    assert main(["reaper", "set", "timeout_tier_2=20m", "--url", "http://s/"]) == 0
    assert main(["reaper", "set", "--url", "http://s/"]) == 2  # nothing to set
    assert sent == [
        ("http://s/api/reaper", "t", "GET", None),
        ("http://s/api/reaper", sent[1][1], "GET", None),
        ("http://s/api/reaper", sent[2][1], "PUT", {"timeout_tier_2": "20m"}),
    ]
