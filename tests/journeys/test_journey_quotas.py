"""Three teams share the demo's 8 GPUs: each person's work goes to their team's queue.

alice (research/vision, 3 guaranteed) takes the 4-GPU research profile and borrows one GPU;
bob (research/nlp) starts a 1-GPU server; carol (ops) an opportunistic 2-GPU one; the README's
curl job runs, as alice, and says so. alice's next job would pass her group's limit: her Lab
panel says so in words, at the default sidebar width. Then bob submits a 2-GPU job inside his
queue's guarantee while only one GPU is free: carol's opportunistic server gets the pre-emption
notice in her Lab and goes, and bob's job starts. Last, admin's start waits in a full cluster
(the spawn page says why), he clicks Stop, lands on the hub's home page and may start again.

In a second journey the cluster is full and alice's 4-GPU job waits for a node of its own: when
two GPUs free, her job planned for 1 min takes them before the one planned for 5 min that she
submitted first (shortest-first backfill, docs/engine.md), and her scheduler page says the big
job needs 4 GPUs with 0 free, and when it will start; and when the 5-min one is expected to.
"""

from __future__ import annotations

import re
import time

import test_spawner as ts
from journey import TIMEOUT_MS, jobs_of, service, shot, skip_if_missing, stop_everything, sync_api

skip_if_missing()
expect = sync_api.expect
TEST = "team-queues"


def _start_from_the_form(page, hub, profile: str) -> None:
    """What a person does: the home page's Start button, the profile, Start."""
    page.goto(f"{hub.url}/hub/home")
    page.locator("#start").click()
    page.wait_for_url(re.compile(r".*/hub/spawn.*"))
    page.check(f"#gpusched-profile-{profile}")


def _server_job(hub, user: str) -> dict:
    [job] = [j for j in jobs_of(hub, user, "pending", "running") if j["kind"] == "notebook"]
    return job


def _wait(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.2)
    return value


def test_three_teams_fill_the_cluster_and_a_guarantee_reclaims(demo, people):
    hub = demo
    # -- the README's curl job, as alice: it runs (in her team's queue) and says who it is --
    response = service(
        hub,
        "POST",
        "api/jobs",
        "alice",
        json={"command": "echo GPUs: $CUDA_VISIBLE_DEVICES; id -un", "gpus": 2},
    )
    assert response.status_code == 201, response.text
    readme_job = ts.wait_job(hub, "alice", response.json()["id"], {"completed", "failed"}, 60)
    assert readme_job["state"] == "completed" and readme_job["queue"] == "research/vision", (
        readme_job
    )
    log = service(hub, "GET", f"api/jobs/{readme_job['id']}/log", "alice").text
    assert "GPUs: " in log and "\nalice\n" in log, log

    # -- alice: the spawn form shows her team's queue; the 4-GPU profile starts in it --
    alice = people("alice")
    _start_from_the_form(alice, hub, "gpu-4")
    form = alice.locator("#spawn_form")
    expect(form).to_contain_text("research/vision")
    shot(alice, TEST, "1-alice-spawn-form")
    alice.get_by_role("button", name=re.compile("Start")).click()
    alice.wait_for_url(re.compile(r".*/user/alice/lab.*"), timeout=120_000)
    status = alice.locator(".jp-gpusched-status")
    expect(status).to_contain_text("4x H100", timeout=TIMEOUT_MS)
    job = _server_job(hub, "alice")
    assert job["queue"] == "research/vision" and job["state"] == "running", job
    shot(alice, TEST, "2-alice-lab-4-gpus")

    # -- bob (through the hub API, as a script would) lands in research/nlp --
    ts.start_server(hub, "bob", "gpu-1")
    assert _server_job(hub, "bob")["queue"] == "research/nlp"

    # -- carol: the opportunistic profile, in ops --
    carol = people("carol")
    _start_from_the_form(carol, hub, "gpu-2-opportunistic")
    expect(carol.locator("#spawn_form")).to_contain_text("ops")
    carol.get_by_role("button", name=re.compile("Start")).click()
    carol.wait_for_url(re.compile(r".*/user/carol/lab.*"), timeout=120_000)
    expect(carol.locator(".jp-gpusched-status")).to_contain_text("2x H100", timeout=TIMEOUT_MS)
    assert _server_job(hub, "carol")["queue"] == "ops"
    assert ts.free_gpus(hub) == 1  # 4 + 1 + 2 of 8

    # vision is borrowing: 4 running on a guarantee of 3
    queues = {q["path"]: q for q in service(hub, "GET", "api/quotas", "admin").json()["queues"]}
    assert queues["research/vision"]["running"] == 4 > queues["research/vision"]["guaranteed"]

    # -- alice asks for 4 more GPUs: research would pass its limit of 8; her Lab panel, at the
    # default sidebar width, says so in words (not only "policy"), nothing cut off --
    response = service(
        hub, "POST", "api/jobs", "alice", json={"command": "sleep 60", "gpus": 4, "name": "big"}
    )
    assert response.status_code == 201, response.text
    big = response.json()
    assert big["state"] == "pending", big
    reason = ts.service_job(hub, "alice", big["id"])["reason"]
    alice.locator(".jp-gpusched-status").click()
    panel = alice.locator("#jp-gpusched-panel")
    block = panel.locator(f'.jp-gpusched-job[data-job-id="{big["id"]}"]')
    expect(block).to_contain_text(reason["message"], timeout=TIMEOUT_MS)
    assert "1 GPUs" not in panel.inner_text()
    clipped = panel.evaluate(
        """panel => [...panel.querySelectorAll('*')].filter(e => e.offsetParent !== null
            && e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX !== 'visible'
        ).length"""
    )
    assert clipped == 0, f"{clipped} elements of the panel cut off at the default width"
    shot(alice, TEST, "3-alice-panel-pending-reason")
    # her jobs, newest first (as docs/service.md says)
    assert [j["id"] for j in jobs_of(hub, "alice")][:2] == [big["id"], job["id"]]
    service(hub, "DELETE", f"api/jobs/{big['id']}", "alice")

    # -- bob's 2-GPU job is inside nlp's guarantee (1 + 2 <= 3): carol's tier-3 server goes --
    response = service(
        hub, "POST", "api/jobs", "bob", json={"command": "sleep 120", "gpus": 2, "tier": 2}
    )
    assert response.status_code == 201, response.text
    bobs = response.json()
    expect(carol.get_by_text(re.compile("Pre-emption"))).to_be_visible(timeout=TIMEOUT_MS)
    shot(carol, TEST, "4-carol-preempted")
    ts.wait_job(hub, "bob", bobs["id"], {"running"}, timeout=60)
    ts.wait_gone(hub, "carol")
    assert [j for j in jobs_of(hub, "carol", "running") if j["kind"] == "notebook"] == []

    # -- admin: a start in a full cluster waits, says why; Stop leads home, Start again works --
    service(hub, "DELETE", f"api/jobs/{bobs['id']}", "bob")
    hold = service(
        hub, "POST", "api/jobs", "alice", json={"command": "sleep 300", "gpus": 3, "tier": 2}
    )
    assert hold.status_code == 201, hold.text
    _wait(lambda: ts.free_gpus(hub) == 0, 30, "the cluster did not fill")
    admin = people("admin")
    _start_from_the_form(admin, hub, "gpu-1")
    admin.get_by_role("button", name=re.compile("Start")).click()
    admin.wait_for_url(re.compile(r".*/hub/spawn-pending/admin.*"))
    expect(admin.locator("body")).to_contain_text(re.compile(r"queue|position|wait", re.I))
    assert "1 GPUs" not in admin.locator("body").inner_text()
    shot(admin, TEST, "5-admin-queued")
    # the hub's home page: Stop My Server on the queued start
    admin.goto(f"{hub.url}/hub/home")
    admin.locator("#stop").click()
    expect(admin.locator("#start")).to_have_text(re.compile(r"Start\s+My Server"))
    assert "Redirect loop" not in admin.content()
    admins = jobs_of(hub, "admin", "pending", "running")  # a scheduler admin sees everybody's
    assert [j for j in admins if j["kind"] == "notebook" and j["user"] == "admin"] == []
    shot(admin, TEST, "6-admin-stopped-the-queued-start")
    stop_everything(hub)


def _submit(hub, user: str, **body) -> str:
    response = service(hub, "POST", "api/jobs", user, json={"tier": 2, **body})
    assert response.status_code == 201, response.text
    return response.json()["id"]


def test_the_shorter_job_takes_the_hole_and_the_big_job_says_why_it_waits(demo, people):
    hub = demo
    # -- the 8 GPUs full, research at 2 of its limit of 8 (so alice's jobs below all fit under
    # it), two of carol's GPUs free in about 10 s, the rest in 10 min --
    fills = [
        ("bob", _submit(hub, "bob", command="sleep 600", gpus=2, walltime="10m")),
        ("carol", _submit(hub, "carol", command="sleep 10", gpus=2, walltime="1m")),
        ("carol", _submit(hub, "carol", command="sleep 600", gpus=2, walltime="10m")),
        ("admin", _submit(hub, "admin", command="sleep 600", gpus=2, walltime="10m")),
    ]
    for user, job_id in fills:
        ts.wait_job(hub, user, job_id, {"running"})
    assert ts.free_gpus(hub) == 0
    # -- alice: a 4-GPU job (first in her queue's order), then one planned for 5 min, then one
    # planned for 1 min (its walltime: what the scheduler plans by) --
    big = _submit(hub, "alice", command="sleep 2", gpus=4, walltime="1m", name="big")
    planned_5m = _submit(hub, "alice", command="sleep 2", gpus=2, walltime="5m", name="plan-5m")
    planned_1m = _submit(hub, "alice", command="sleep 20", gpus=2, walltime="1m", name="plan-1m")
    # carol's 2 GPUs free: no node has 4 free until 10 min from now, so the big job reserves
    # one, and the hole goes to the job that ends soonest, not to the one submitted first
    ts.wait_job(hub, "alice", planned_1m, {"running"}, timeout=60)
    assert ts.service_job(hub, "alice", planned_5m)["state"] == "pending"
    waiting = ts.service_job(hub, "alice", big)
    assert waiting["state"] == "pending", waiting
    assert waiting["reason"]["message"] == "needs 4 GPUs; 0 free", waiting["reason"]

    # -- alice's page says so: the big job needs 4 GPUs, 0 free, and when it starts --
    alice = people("alice")
    alice.goto(f"{hub.url}/services/gpusched/")
    row = alice.locator(f"#my-jobs tr.job[data-id='{big}']")
    expect(row.locator("td.reason .why")).to_have_text("needs 4 GPUs; 0 free", timeout=TIMEOUT_MS)
    # under it, how long it is planned to run: the walltime she gave, as the API says it
    assert waiting["planned_run_time"]["message"] == "planned to run 1 min, its walltime"
    expect(row.locator("td.reason .planned")).to_have_text("planned to run 1 min, its walltime")
    expect(row.locator("td").nth(8)).not_to_have_text("", timeout=TIMEOUT_MS)  # its start
    running = alice.locator(f"#my-jobs tr.job.running[data-id='{planned_1m}']")
    expect(running).to_contain_text("plan-1m", timeout=TIMEOUT_MS)
    # the job behind has its reason and its expected start too: when plan-1m's minute is up
    behind = alice.locator(f"#my-jobs tr.job.pending[data-id='{planned_5m}']")
    why = behind.locator("td.reason .why")  # (under it: how long it is planned to run)
    expect(why).to_have_text("needs 2 GPUs; 0 free", timeout=TIMEOUT_MS)
    expected_words = re.compile(r"^(about 1 min|any moment)")  # (the page refreshes every 5 s)
    expect(behind.locator("td").nth(8)).to_have_text(expected_words, timeout=TIMEOUT_MS)
    shown = ts.service_job(hub, "alice", planned_5m)["reason"]["eta"]
    expected = ts.service_job(hub, "alice", planned_1m)["start_time"] + 60
    assert shown == expected, (shown, expected)
    shot(alice, TEST, "7-alice-shorter-job-first")

    # -- when it ends, the 5-min job takes the same hole --
    done = ts.wait_job(hub, "alice", planned_5m, {"completed"}, timeout=90)
    first = ts.service_job(hub, "alice", planned_1m)
    assert first["start_time"] < done["start_time"], (first, done)
    stop_everything(hub)


def test_a_job_that_will_reclaim_says_when_and_admin_sees_the_borrowing(demo, people):
    """The cluster full of hour-long jobs: alice's 2 GPUs and bob's 4 and 2, so research holds
    8 on a guarantee of 6 and nlp 6 on 3. carol's 1-GPU job in ops (idle, 2 guaranteed) waits.
    Its reservation is at the first end (1 h), but the engine reclaims bob's 2-GPU job once its
    minimum run time (10 min) and grace (5 min) are over: her page says about 15 min, not about
    1 h. admin's queue table shows the borrowing as api/quotas gives it."""
    hub = demo
    fills = [("alice", 2), ("bob", 4), ("bob", 2)]
    jobs = [(u, _submit(hub, u, command="sleep 3600", gpus=n, walltime="1h")) for u, n in fills]
    started = [ts.wait_job(hub, user, job_id, {"running"})["start_time"] for user, job_id in jobs]
    assert ts.free_gpus(hub) == 0
    carols = _submit(hub, "carol", command="sleep 60", gpus=1, queue="ops", walltime="10m")
    reclaim = started[2] + 600 + 300  # bob's 2-GPU job: what the reclaim may take

    def expected():
        eta = (ts.service_job(hub, "carol", carols)["reason"] or {}).get("eta")
        return eta if eta is not None and abs(eta - reclaim) < 2 else None

    _wait(expected, 30, "carol's expected start is not the reclaim's")
    carol = people("carol")
    carol.goto(f"{hub.url}/services/gpusched/")
    row = carol.locator(f"#my-jobs tr.job[data-id='{carols}']")
    expect(row.locator("td").nth(8)).to_have_text(
        re.compile(r"^about 1[45] min \(\d\d:\d\d\)$"), timeout=TIMEOUT_MS
    )
    shot(carol, TEST, "8-carol-expected-at-the-reclaim")
    admin = people("admin")
    admin.goto(f"{hub.url}/services/gpusched/")
    nlp = admin.locator("#queues-admin tr[data-queue='research/nlp'] td.num")
    expect(nlp.nth(0)).to_have_text("6", timeout=TIMEOUT_MS)  # in use
    expect(nlp.nth(3)).to_have_text("3")  # borrowing: 6 on a guarantee of 3
    queues = service(hub, "GET", "api/quotas", "admin").json()["queues"]
    assert {q["path"]: q["borrowed"] for q in queues}["research/nlp"] == 3
    shot(admin, TEST, "9-admin-nlp-borrowing")
    stop_everything(hub)
