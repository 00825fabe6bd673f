"""bob asks when he would start, runs a sweep from a shell in his server, and follows it on the
scheduler's page; admin reads the page's admin part.

bob opens the spawn form: each profile says when it would start ("starts now": the cluster is
empty); he starts the 4-GPU one. In his notebook, shell lines (``!``, the environment his
server's terminals have) run ``jupyter gpusched submit --array 0-3%1 ...`` (no token, no URL:
the server's), ``jupyter gpusched queue --me`` (the array is one row, ``a-N_[1-3%1]``; typed
into a terminal of his server too) and
``jupyter gpusched estimate --gpus 8`` (research/nlp would pass its limit). From the hub's
Services menu he opens the scheduler's page: his server and the array (one row, with its
reason), his queue's bar at his 5 GPUs, the same estimate in the same words from the page's
form; he cancels the array there, and the CLI's ``jobs`` says so. admin's page has the showback,
the reaper's forms and the nodes' drain buttons; bob's page has none of them.

admin then replays the cluster from a notebook of his own server: ``jupyter gpusched
export-trace`` (no token, no URL: his server's, which carries his admin scope) writes every job
that ran, carol's 1-GPU server included, with the files beside it readable by him alone; ``replay``
with the demo's cluster and the exported queues shows the recorded outcome beside the replayed
one; ``reaper what-if`` tries a shorter idle timeout on the servers' recorded GPU use. alice's
token gets a 403 for the same export.
"""

from __future__ import annotations

import asyncio
import json
import re
from concurrent.futures import ThreadPoolExecutor

import test_spawner as ts
from journey import (
    ROOT,
    TIMEOUT_MS,
    jobs_of,
    service,
    shot,
    skip_if_missing,
    stop_everything,
    sync_api,
)
from kernel_ws import terminal_output
from lab import open_notebook, output_text, run_cell, write_file, write_notebook

skip_if_missing()
expect = sync_api.expect
TEST = "page"

CELLS = [
    "!jupyter gpusched submit --gpus 1 --array 0-3%1 --name sweep -- sleep 600",
    "!jupyter gpusched queue --me",
    "!jupyter gpusched estimate --gpus 8",
    "!jupyter gpusched jobs --json",
]


def test_bob_asks_when_he_would_start_and_follows_a_sweep_on_the_page(demo, people):
    hub = demo
    bob = people("bob")
    bob.goto(f"{hub.url}/hub/home")
    bob.locator("#start").click()
    bob.wait_for_url(re.compile(r".*/hub/spawn.*"))
    for profile in ("gpu-1", "gpu-4", "cpu-only"):  # the cluster is empty
        expect(bob.locator(f"#gpusched-estimate-{profile}")).to_contain_text("starts now")
    # the form offers only GPU models the demo cluster has (all H100): none a start would refuse
    offered = bob.locator('select[name^="gpu_model:"] option').evaluate_all(
        "options => options.map(o => o.value)"
    )
    assert set(offered) <= {"any", "H100"}, offered
    # a profile of one model names it beside its GPUs, before the estimate, in one line
    expect(bob.locator("#spawn_form")).to_contain_text("4 GPUs on H100, tier 2")
    assert "L40S" not in bob.locator("form").first.inner_text()
    shot(bob, TEST, "1-bob-spawn-form-estimates")
    bob.check("#gpusched-profile-gpu-4")
    bob.get_by_role("button", name=re.compile("Start")).click()
    bob.wait_for_url(re.compile(r".*/user/bob/lab.*"), timeout=120_000)

    # -- a shell in his server: the CLI finds the service and his token by itself --
    write_notebook(hub, "bob", "journey-page.ipynb", CELLS)
    notebook = open_notebook(bob, hub, "bob", "journey-page.ipynb")
    submitted = output_text(run_cell(bob, notebook, 0, timeout_ms=60_000))
    match = re.search(r"(a-\d+) \(4 jobs\)", submitted)
    assert match, submitted
    array_id = match.group(1)
    listed = output_text(run_cell(bob, notebook, 1, timeout_ms=60_000))
    assert re.search(rf"{array_id}_\[1-3%1\]\s+bob\s+research/nlp", listed), listed
    # the same in a terminal of his server (JupyterLab's Terminal): its shell keeps the server's
    # PATH (a login shell's /etc/profile would set it anew: "jupyter: command not found")
    line = "jupyter gpusched queue --me; echo typed-$((40 + 2))"
    server = f"{hub.url}/user/bob/"
    typing = terminal_output(server, hub.token("bob"), line, r"typed-42", 60)
    with ThreadPoolExecutor(1) as thread:  # (this thread runs the browser's event loop)
        typed = thread.submit(asyncio.run, typing).result()
    assert re.search(rf"{array_id}_\[1-3%1\]\s+bob\s+research/nlp", typed), typed
    estimated = output_text(run_cell(bob, notebook, 2, timeout_ms=60_000)).strip()
    # when, once his jobs have run as planned (core/plan.py), and why it waits till then
    assert re.match(r"about .+ UTC\): queue research/nlp is at its limit of 8 GPUs", estimated), (
        estimated
    )
    shot(bob, TEST, "2-bob-cli-in-his-server")

    # -- the Services menu leads to the scheduler's page --
    bob.goto(f"{hub.url}/hub/home")
    bob.locator("a.dropdown-toggle", has_text="Services").click()
    bob.locator("a[href$='/services/gpusched/']").first.click()
    bob.wait_for_url(re.compile(r".*/services/gpusched/.*"))
    server = next(j for j in jobs_of(hub, "bob", "running") if j["kind"] == "notebook")
    server_row = bob.locator(f"#my-jobs tr.job[data-id='{server['id']}']")
    expect(server_row).to_contain_text("running")
    # no Cancel for his server: it is stopped where it was started, the hub's home page
    expect(server_row.locator("button")).to_have_count(0)
    stop = server_row.locator("a.server-stop")
    expect(stop).to_have_text("stop it on the hub home page")
    assert stop.evaluate("a => a.href") == f"{hub.url}/hub/home"
    row = bob.locator(f"#my-jobs tr.job[data-array='{array_id}']")
    expect(row).to_contain_text("array of 4 jobs, 1 running, 3 pending", timeout=TIMEOUT_MS)
    expect(row).to_contain_text(f"array {array_id} is at its limit of 1 running")
    queue = next(q for q in service(hub, "GET", "api/me", "bob").json()["queues"] if q["default"])
    assert queue["path"] == "research/nlp" and queue["in_use"] == 5, queue
    expect(bob.locator("#my-queues")).to_contain_text("in use 5 · guaranteed 3 · limit 8")
    # the page's form: the words the CLI printed (its queue and place aside)
    bob.fill("#estimate-form [name=gpus]", "8")
    bob.select_option("#estimate-form [name=queue]", "research/nlp")
    bob.click("#estimate-form button[type=submit]")
    words = estimated.rsplit(" (", 1)[0]
    expect(bob.locator("#estimate-answer .words")).to_have_text(words)
    for admin_part in ("#showback", "#reaper-form", "#nodes-admin"):
        assert bob.locator(admin_part).count() == 0, admin_part
    shot(bob, TEST, "3-bob-page")

    # -- he cancels the sweep from the page; the CLI in his server says so --
    bob.once("dialog", lambda dialog: dialog.accept())  # "Cancel a-...? Its 4 pending jobs ..."
    row.locator("button.array-cancel").click()
    expect(row).to_have_count(0, timeout=TIMEOUT_MS)
    notebook = open_notebook(bob, hub, "bob", "journey-page.ipynb")  # back in his Lab
    views = json.loads(output_text(run_cell(bob, notebook, 3, timeout_ms=60_000)))["jobs"]
    states = {v["state"] for v in views if v.get("array_id") == array_id}
    assert states == {"cancelled"}, views

    # -- admin: the page's admin part --
    admin = people("admin")
    admin.goto(f"{hub.url}/services/gpusched/")
    for admin_part in ("#showback", "#reaper-form", "#nodes-admin"):
        expect(admin.locator(admin_part)).to_be_visible()
    expect(admin.locator("#nodes-admin")).to_contain_text("gpu1")
    shot(admin, TEST, "4-admin-page")
    stop_everything(hub)


EXPORT_CELLS = [
    "!jupyter gpusched export-trace --since 1h --out history/trace.csv",
    "!jupyter gpusched replay history/trace.csv --cluster history/cluster.yaml "
    "--queues history/trace-queues.yaml --policy gpusched --out history/replay --quiet "
    "--no-report",
    "!jupyter gpusched reaper what-if history/trace.csv --timeout-tier-2 20m",
    "!stat -c '%a %n' history/trace*",
]


def test_admin_replays_the_cluster_from_a_notebook(demo, people):
    hub = demo
    # what ran (besides the journey above, when it ran first): a job of bob's, and carol's
    # 1-GPU server, started and stopped
    ran = service(hub, "POST", "api/jobs", "bob", json={"command": "true", "gpus": 1})
    assert ran.status_code == 201, ran.text
    ts.start_server(hub, "carol", "gpu-1")
    ts.stop_server(hub, "carol")
    admin = people("admin")
    admin.goto(f"{hub.url}/hub/home")
    admin.locator("#start").click()
    admin.wait_for_url(re.compile(r".*/hub/spawn.*"))
    admin.check("#gpusched-profile-cpu-only")
    admin.get_by_role("button", name=re.compile("Start")).click()
    admin.wait_for_url(re.compile(r".*/user/admin/lab.*"), timeout=120_000)
    write_file(hub, "admin", "history", None)
    write_notebook(hub, "admin", "replay-my-cluster.ipynb", EXPORT_CELLS)
    cluster = (ROOT / "hub_config" / "demo-cluster.yaml").read_text()
    write_file(hub, "admin", "history/cluster.yaml", cluster)
    notebook = open_notebook(admin, hub, "admin", "replay-my-cluster.ipynb")

    exported = output_text(run_cell(admin, notebook, 0, timeout_ms=60_000))
    match = re.search(r"wrote (\d+) jobs \((\d+) notebook servers\)", exported)
    assert match, exported
    # every job that started, carol's server and admin's own (still running) among them
    started = [j for j in jobs_of(hub, "admin") if j["start_time"] is not None]
    servers = [j for j in started if j["kind"] == "notebook"]
    assert (int(match.group(1)), int(match.group(2))) == (len(started), len(servers)), exported
    assert len(servers) >= 2 and len(started) >= 3, started
    replayed = output_text(run_cell(admin, notebook, 1, timeout_ms=120_000))
    # first the difference per job class against what was recorded, then the figures side by side
    assert replayed.lstrip().startswith("Difference per job class: gpusched vs recorded"), replayed
    assert any(line.split() == ["recorded", "gpusched"] for line in replayed.splitlines())
    shot(admin, TEST, "5-admin-exports-and-replays-the-cluster")
    what_if = output_text(run_cell(admin, notebook, 2, timeout_ms=60_000))
    assert "idle-timeout what-if:" in what_if and "timeout_tier_2 45 min -> 20 min" in what_if
    assert re.search(r"^2\s+gpu-1\s", what_if, re.M), what_if  # carol's server, by its profile
    modes = output_text(run_cell(admin, notebook, 3, timeout_ms=60_000))
    for name in ("trace.csv", "trace-utilization.csv", "trace-queues.yaml", "trace-reaper.json"):
        assert f"600 history/{name}" in modes, modes
    shot(admin, TEST, "6-admin-tries-a-shorter-idle-timeout")
    # a user's token: not an admin's export
    refused = service(hub, "GET", "api/export", "alice")
    assert refused.status_code == 403, refused.text
    stop_everything(hub)
