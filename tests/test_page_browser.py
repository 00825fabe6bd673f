"""The scheduler's web page (service/page.py) in Chromium, under a real hub.

Debian's Chromium (``/usr/bin/chromium``) driven by Playwright (never ``playwright install``),
the hub of ``tests/hub_harness.py`` (the demo's 24 GPUs and queues) with a history row every
second. bob fills the ``sandbox`` queue (its limit is 4 GPUs) and waits behind it, with a job
array too; alice runs a job in her team's queue and waits in sandbox too. alice opens the page
from the hub's Services menu: her jobs with their reasons and positions, her queues' bars saying
what api/me says, a grid with a cell for every GPU of the cluster and hers marked, the queue with
bob's name hidden, the utilization chart saying what api/history says; no admin section; a job
she submits after the page loaded appears without a reload; "when would I start?" answers in the
words of core/wording.py what POST api/estimate answers for the same body (starts now; waits,
with the reason's message; a 400's message next to its field), and the page's copy of those
words agrees with Python's on the same cases; her job array (POST api/jobs with "array") is one
row in her jobs and in the queue, named as the command line names it, and its button cancels it
(DELETE api/arrays/<id>). At 900 px nothing is wider than the window. admin sees the admin
sections too: waiting GPUs by reason and per-queue use (the figures api/history gives), every
queue with its guarantee, limit, use and waiting GPUs (api/quotas' figures) and a queue's weight
changed there (a guarantee above the limit refused), showback
(the keys api/usage gives), the reaper's events, drain and resume (carried out: api/cluster says
so) and the reaper settings (saved: api/reaper says so). Screenshots at 1280 px go to
docs/images/ (docs/dashboard.md shows them).

Skips when /usr/bin/chromium or Playwright is missing (tests/browser_helpers.py).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import hub_harness
import pytest
from browser_helpers import TIMEOUT_MS, browser_fixture, log_in, sync_api  # noqa: F401

from jupyter_gpusched.cli.listings import grouped
from jupyter_gpusched.core.wording import estimate_text

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "docs" / "images"
expect = sync_api.expect


@pytest.fixture(autouse=True)
def _patient_expect():
    """The page refreshes every 5 s: expectations wait through refreshes (Playwright's default
    is 5 s), in this module only."""
    expect.set_options(timeout=TIMEOUT_MS)
    yield
    expect.set_options(timeout=5_000)


@pytest.fixture(scope="module")
def hub():
    args = ("--GPUSchedService.history_interval=1",)
    with hub_harness.running_hub(service_args=args) as running:
        jobs: list[str] = []
        running.page_jobs = jobs
        try:
            yield running
        finally:
            admin = running.token("admin")
            for job_id in jobs:
                running.service("DELETE", f"api/jobs/{job_id}", admin)
            _wait(lambda: not _unfinished(running, admin), "the page's jobs to end")


def _unfinished(hub, token) -> list:
    answer = hub.service("GET", "api/jobs?state=pending&state=running", token).json()
    return answer["jobs"]


def _wait(predicate, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.2)


def _submit(hub, user: str, **body) -> dict:
    job = {"command": "sleep 600", **body}
    response = hub.service("POST", "api/jobs", hub.token(user), json=job)
    assert response.status_code == 201, response.text
    answer = response.json()
    jobs = answer["jobs"] if "array" in body else [answer]  # an array: its elements
    hub.page_jobs.extend(job["id"] for job in jobs)
    return answer


@pytest.fixture(scope="module")
def busy(hub):
    """bob fills sandbox and waits there; alice runs in research/vision and waits in sandbox."""
    _submit(hub, "bob", gpus=4, queue="sandbox", name="bob-fills-sandbox")
    bobs_wait = _submit(hub, "bob", gpus=2, queue="sandbox", name="bob-waits")
    running = _submit(hub, "alice", gpus=2, queue="research/vision", tier=3, name="train")
    waiting = _submit(hub, "alice", gpus=1, queue="sandbox", name="eval")
    _submit(hub, "bob", gpus=1, queue="sandbox", name="bob-sweep", array="0-2")
    admin = hub.token("admin")
    _wait(
        lambda: hub.service("GET", f"api/jobs/{running['id']}", admin).json()["state"] == "running",
        "alice's job to run",
    )
    return {"running": running["id"], "waiting": waiting["id"], "bobs": bobs_wait["id"]}


def _open_page(browser, hub, user: str):
    """Log ``user`` in to the hub and follow the Services menu to the page."""
    page = log_in(browser, hub, user, width=1280)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.click("a.dropdown-toggle:has-text('Services')")
    page.click(".dropdown-menu a[href$='/services/gpusched/']")
    page.wait_for_url(hub.service_url)
    expect(page.locator("#cluster .gpu-cell").first).to_be_visible()
    page.errors = errors
    return page


REAPER_ROWS = """() => {
  const event = (kind, data) => ({id: 1, time: Date.now() / 1000, kind, job_id: 'j-5',
    user: 'alice', actor: 'reaper', node: null, message: `${kind} of j-5`, data});
  drawReaperEvents([
    event('reaper-cull', {samples: [{time: 1, utilization: 0.5}], timeout: 2700}),
    event('reaper-settings', {changes: {}}),
    event('reaper-warning', null),
  ]);
  return [...document.querySelectorAll('#reaper-events tr.event')].map((row) => ({
    when: row.cells[0].innerText, kind: row.cells[1].innerText,
    evidence: row.querySelector('pre')?.textContent || ''}));
}"""


def _wait_for(page, script: str, arg=None):
    """Until ``script`` (a function of ``arg``) is true in the page, as it refreshes itself."""
    page.wait_for_function(script, arg=arg, timeout=TIMEOUT_MS)


def _shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def _estimate(page, hub, token, **fields) -> dict:
    """Fill and send the page's estimate form; what POST api/estimate answers for the body the
    page sent, whose words the page must show."""
    for name, value in fields.items():
        selector = f"#estimate-form [name={name}]"
        if name == "queue":
            page.select_option(selector, value)
        else:
            page.fill(selector, value)
    with page.expect_request(lambda r: r.url.endswith("api/estimate")) as sent:
        page.click("#estimate-form button[type=submit]")
    body = sent.value.post_data_json
    if "name" in fields:
        assert body["name"] == fields["name"], body
    answer = hub.service("POST", "api/estimate", token, json=body)
    assert answer.status_code == 200, answer.text
    answer = answer.json()
    reason = (answer["reason"] or {}).get("message")
    words = estimate_text(answer["start_now"], answer["eta"], reason, time.time())
    expect(page.locator("#estimate-answer .words")).to_have_text(words)
    return answer


def _array_states(hub, token, array_id: str) -> list[str]:
    jobs = hub.service("GET", "api/jobs?limit=500", token).json()["jobs"]
    return [job["state"] for job in jobs if job["array_id"] == array_id]


# (start_now, eta, reason, now, clock): core/wording.py estimate_text's cases, the halves
# Python's round() takes to the even neighbour among them (90 s: 2 min; 2 h 5 min: 2 h)
NOW = 1_764_633_600.0  # 2025-12-02 00:00 UTC
ESTIMATE_CASES = [
    (True, None, None, NOW, True),
    (False, None, "queue sandbox is at its limit of 4 GPUs", NOW, True),
    (False, None, None, NOW, True),
    *(
        (False, NOW + seconds, None, NOW + offset, clock)
        for seconds in (0, 29, 31, 90, 150, 3540, 3600, 3660, 7170, 7500, 8100, 47 * 3600)
        for offset, clock in ((0, True), (0, False), (-600.5, True))
    ),
    (False, NOW + 2.5 * 86400, None, NOW, True),
    (False, NOW + 3.5 * 86400, None, NOW, True),
    (False, NOW + 1800, None, NOW - 600, True),  # tomorrow's date: 23:50 -> 00:30
    (False, NOW + 1500, "queue sandbox is at its limit of 4 GPUs", NOW, True),  # both
    (False, NOW + 1500, "needs 4 GPUs; 0 free", NOW, False),
]
WORDS = "([startNow, at, reason, now, clock]) => estimateText(startNow, at, reason, now, clock)"


def _last_history(hub, token) -> dict:
    return hub.service("GET", "api/history", token).json()["rows"][-1]


def test_a_user_sees_their_jobs_queues_gpus_and_the_queue(hub, busy, browser):
    token = hub.token("alice")
    page = _open_page(browser, hub, "alice")
    # my jobs: both, the waiting one with its reason in words and its position
    waiting = page.locator(f"#my-jobs tr.job[data-id='{busy['waiting']}']")
    expect(waiting).to_contain_text("sandbox is at its limit")
    view = hub.service("GET", f"api/jobs/{busy['waiting']}", token).json()
    expect(waiting.locator("td").nth(7)).to_have_text(str(view["position"] + 1))
    # under the reason, what the scheduler plans it to run, and from what (its queue is full:
    # a walltime would not start it sooner, and the default's message does not say it would)
    assert view["planned_run_time"]["message"] == (
        "planned to run 1 d, the default for a job without a walltime"
    )
    planned = waiting.locator(".planned")
    expect(planned).to_have_text(view["planned_run_time"]["message"])
    expect(planned).to_have_attribute("data-from", view["planned_run_time"]["from"])
    expect(page.locator(f"#my-jobs tr.job[data-id='{busy['running']}']")).to_contain_text("running")
    # my queues: the bars say what api/me says
    me = hub.service("GET", "api/me", token).json()
    for queue in me["queues"]:
        row = f"#my-queues .queue-row[data-queue='{queue['path']}']"
        _wait_for(
            page,
            "([row, n]) => Number(document.querySelector(row).dataset.inUse) === n",
            [row, queue["in_use"]],
        )
        expect(page.locator(row)).to_contain_text(f"in use {queue['in_use']:g}")
    assert any(q["in_use"] == 2 for q in me["queues"])  # research/vision runs her 2 GPUs
    # the grid: a cell per GPU of the cluster, hers marked
    cluster = hub.service("GET", "api/cluster", token).json()
    cells = page.locator("#cluster .gpu-cell")
    expect(cells).to_have_count(cluster["total_gpus"])
    held = sum(
        any(holder["user"] == "alice" for holder in gpu["jobs"])
        for node in cluster["nodes"]
        for gpu in node["gpu_list"]
    )
    assert held == 2
    expect(page.locator("#cluster .gpu-cell.mine")).to_have_count(held)
    expect(page.locator("#cluster .gpu-cell.t3.mine")).to_have_count(2)  # her tier-3 job
    # the queue: positions and reasons, bob's name hidden as the API hides it
    queue = page.locator("#queue")
    expect(queue.locator(f"tr[data-id='{busy['bobs']}']")).to_contain_text("someone")
    expect(queue).not_to_contain_text("bob")
    # utilization over time: the figure api/history gives
    last = _last_history(hub, token)
    allocated = sum(last["allocated"].values())
    _wait_for(
        page,
        "n => document.querySelector('.utilization').dataset.allocatedNow == n",
        allocated,
    )
    assert page.locator(".utilization").get_attribute("data-total") == str(last["total_gpus"])
    assert page.locator("#utilization svg.chart polygon").count() >= 1
    # no admin section for a user
    for section in ("waiting", "queue-history", "showback", "reaper-events", "nodes-admin"):
        expect(page.locator(f"#{section}")).to_have_count(0)
    # it refreshes itself: a job submitted now appears without a reload
    later = _submit(
        hub, "alice", gpus=1, queue="research/vision", name="later", walltime="1h", deadline="6h"
    )
    row = page.locator(f"#my-jobs tr.job[data-id='{later['id']}']")
    expect(row).to_be_visible()
    expect(row.locator(".deadline")).to_contain_text("due by")  # its deadline, in local time
    # when would I start? The words POST api/estimate's answer makes for the same body
    answer = _estimate(page, hub, token, gpus="1", queue="research/vision")
    assert answer["start_now"] and answer["queue"] == "research/vision"
    expect(page.locator("#estimate-answer")).to_have_text("starts now (queue research/vision)")
    answer = _estimate(page, hub, token, gpus="1", queue="sandbox")
    assert not answer["start_now"] and "sandbox is at its limit" in answer["reason"]["message"]
    # ... and, as it would wait, the run time it would be planned with (no walltime: default)
    assert answer["planned_run_time"]["from"] == "default"
    planned = page.locator("#estimate-answer .planned")
    expect(planned).to_have_text(f"; {answer['planned_run_time']['message']}")
    # the form's name is the job's (learned estimates match earlier runs by it), sent as such
    answer = _estimate(page, hub, token, name="nightly", gpus="1", queue="sandbox", walltime="30m")
    assert answer["planned_run_time"]["from"] == "walltime"
    expect(planned).to_have_text("; planned to run 30 min, its walltime")
    # times as the Lab and the CLI say them: 24-hour, and another day's with its date
    times = page.evaluate("() => [clock(Date.now() / 1000), eta(Date.now() / 1000 + 30 * 3600)]")
    assert re.fullmatch(r"\d\d:\d\d", times[0]), times
    assert re.fullmatch(r"about .+ \(\d{4}-\d\d-\d\d \d\d:\d\d\)", times[1]), times
    # 0 GPUs is a CPU-only job, whose CPUs the form does not ask: the browser refuses it
    gpus = page.locator("#estimate-form input[name=gpus]")
    gpus.fill("0")
    assert gpus.evaluate("input => input.validity.rangeUnderflow")
    gpus.fill("1")
    # a 400: its message next to the field it names
    page.fill("#estimate-form input[name=walltime]", "soon")
    page.click("#estimate-form button[type=submit]")
    body = {"command": "true", "gpus": 1, "queue": "sandbox", "walltime": "soon"}
    refused = hub.service("POST", "api/estimate", token, json=body)
    assert refused.status_code == 400 and refused.json()["field"] == "walltime"
    expect(page.locator("#estimate-form .field-error[data-field=walltime]")).to_have_text(
        refused.json()["error"]
    )
    page.fill("#estimate-form input[name=walltime]", "")
    _estimate(page, hub, token, gpus="1", queue="sandbox")
    expect(page.locator("#estimate-form .field-error")).to_have_count(0)
    # the page's copy of core/wording.py's words agrees with it on the same cases
    for case in ESTIMATE_CASES:
        assert page.evaluate(WORDS, case) == estimate_text(*case), case
    # her job array: one row in her jobs and in the queue, named as the CLI's queue names it
    submitted = _submit(hub, "alice", gpus=1, queue="research/vision", name="sweep", array="0-5%2")
    array_id = submitted["array_id"]
    _wait(lambda: _array_states(hub, token, array_id).count("running") == 2, "two elements")
    queue = hub.service("GET", "api/queue", token).json()
    pending = [dict(e, state="pending") for e in queue["jobs"] if e["array_id"] == array_id]
    (row,) = grouped(pending)  # the command line's one row for them
    assert row["id"] == queue["arrays"][array_id] == f"{array_id}_[2-5%2]"
    mine = page.locator(f"#my-jobs tr.job[data-array='{array_id}']")
    expect(mine).to_have_count(1)
    expect(mine.locator("td").first).to_have_text(row["id"])
    expect(mine).to_contain_text("array of 6 jobs, 2 running, 4 pending")
    expect(mine).to_contain_text(f"array {array_id} is at its limit of 2 running")
    listed = page.locator(f"#queue tr[data-array='{array_id}']")
    expect(listed).to_have_count(1)
    expect(listed).to_contain_text(f"{row['id']} (4 pending)")
    first = str(min(entry["position"] for entry in pending) + 1)  # its place: its first's
    expect(listed.locator("td").first).to_have_text(first)
    expect(mine.locator("td").nth(7)).to_have_text(first)
    _shot(page, "dashboard-user")
    # at 1280 px the table of her jobs (the array's long row among them) fits its box: no
    # Cancel button scrolled out of sight
    fits = "(css) => { const box = document.querySelector(css); "
    fits += "return box.scrollWidth <= box.clientWidth; }"
    assert page.evaluate(fits, "#my-jobs .body")
    expect(mine.locator("button.array-cancel")).to_be_in_viewport()
    # its button asks first (a cancel cannot be taken back): dismissed, nothing changes
    questions = []
    page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.dismiss()))
    mine.locator("button.array-cancel").click()
    expect(mine).to_contain_text("array of 6 jobs, 2 running, 4 pending")
    assert questions == [
        f"Cancel {row['id']}? Its 4 pending jobs leave the queue; its 2 running jobs get the "
        "stop signal."
    ]
    assert sorted(_array_states(hub, token, array_id)) == ["pending"] * 4 + ["running"] * 2
    # one of a kind is said in the singular, none not at all
    said = page.evaluate(
        "() => [cancelQuestion('a', {pending: 1, running: 0}), "
        "cancelQuestion('a', {pending: 0, running: 1}), jobsText(1)]"
    )
    assert said == [
        "Cancel a? Its 1 pending job leaves the queue.",
        "Cancel a? Its 1 running job gets the stop signal.",
        "1 job",
    ]
    # accepted, it cancels the array: DELETE api/arrays/<id> with the page's XSRF token
    page.once("dialog", lambda dialog: dialog.accept())
    mine.locator("button.array-cancel").click()
    expect(mine).to_have_count(0)
    expect(listed).to_have_count(0)
    _wait(lambda: set(_array_states(hub, token, array_id)) == {"cancelled"}, "the cancel")
    # while its running elements stop, a cancelled array's row says so: no second Cancel
    element = "{id: 'j-9', array_id: 'a-9', array_index: 0, state: 'running', kind: 'batch', "
    element += "gpus: 1, tier: 2, queue: 'q', stopping: 'cancelled'}"
    shown = page.evaluate(
        f"() => {{ drawMyJobs([{element}], [], {{}}); const row = "
        "document.querySelector('#my-jobs tr.job'); return [row.querySelector('.stopping')?."
        "textContent, row.querySelector('button.array-cancel') === null]; }"
    )
    assert shown == ["stopping", True], shown
    # a single job's Cancel asks too: dismissed, it stays; accepted, DELETE api/jobs/<id>
    single = _submit(hub, "alice", gpus=1, queue="sandbox", name="one-off")["id"]
    row = page.locator(f"#my-jobs tr.job[data-id='{single}']")
    expect(row.locator("button.job-cancel")).to_be_visible()
    questions.clear()
    page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.dismiss()))
    row.locator("button.job-cancel").click()
    expect(row).to_contain_text("pending")
    assert questions == [f"Cancel {single} (one-off)? It leaves the queue."]
    assert hub.service("GET", f"api/jobs/{single}", token).json()["state"] == "pending"
    page.once("dialog", lambda dialog: dialog.accept())
    row.locator("button.job-cancel").click()
    expect(row).to_have_count(0)
    assert hub.service("GET", f"api/jobs/{single}", token).json()["state"] == "cancelled"
    running = page.locator(f"#my-jobs tr.job[data-id='{busy['running']}']")
    page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.dismiss()))
    running.locator("button.job-cancel").click()
    assert questions[-1] == f"Cancel {busy['running']} (train)? It gets the stop signal."
    # laptop width: nothing wider than the window
    page.set_viewport_size({"width": 900, "height": 900})
    assert page.evaluate("document.documentElement.scrollWidth") <= 900
    assert page.errors == []


def test_an_admin_sees_history_showback_the_reaper_and_changes_nodes_and_settings(
    hub, busy, browser
):
    token = hub.token("admin")
    page = _open_page(browser, hub, "admin")
    for section in ("waiting", "queue-history", "showback", "reaper-events", "nodes-admin"):
        expect(page.locator(f"#{section} .body > *").first).to_be_visible()
    expect(page.locator(f"#queue tr[data-id='{busy['bobs']}']")).to_contain_text("bob")
    # waiting GPUs by reason: the families' current figures are api/history's
    last = _last_history(hub, token)
    assert last["pending"]["policy"] >= 3  # bob's 2 and alice's 1 wait on sandbox's limit
    for family, gpus in last["pending"].items():
        _wait_for(
            page,
            "([f, n]) => document.querySelector(`#waiting .legend-item[data-key=${f}]`)"
            ".dataset.now == n",
            [family, gpus],
        )
    # the legends give the last sample's time, not "now": the page's live figures say now
    expect(page.locator("#waiting .legend-item").first).to_contain_text(" at ")
    legend = page.evaluate(
        "() => timeChart([{time: 0, n: 1}], [{key: 'n', label: 'policy', colour: '#000',"
        " value: (row) => row.n}], {until: 10, unit: 'GPUs waiting'})[1].textContent"
    )
    assert legend.startswith("policy: 1 GPU waiting at "), legend  # one GPU, in the singular
    expect(page.locator("#waiting .chart-legend")).not_to_contain_text(" now")
    # per-queue use over time: a line for each queue api/history names
    queues = hub.service("GET", "api/history", token).json()["rows"][-1]["queues"]
    for path, gpus in queues.items():
        key = path.replace("/", "_")
        _wait_for(
            page,
            "([k, n]) => document.querySelector(`#queue-history .legend-item[data-key='${k}']`)"
            "?.dataset.now == n",
            [key, gpus],
        )
    # showback: the queues and users api/usage reports
    usage = hub.service("GET", "api/usage?by=queue", token).json()["usage"]
    shown = page.locator("#showback [data-by=queue] tr[data-key]")
    expect(shown).to_have_count(len(usage))
    assert {shown.nth(i).get_attribute("data-key") for i in range(len(usage))} == {
        row["key"] for row in usage
    }
    # every queue, parents too, with api/quotas' figures: sandbox's waiting GPUs among them
    quotas = hub.service("GET", "api/quotas", token).json()["queues"]
    expect(page.locator("#queues-admin tr[data-queue]")).to_have_count(len(quotas))
    sandbox = next(q for q in quotas if q["path"] == "sandbox")
    assert sandbox["pending"] >= 3 and sandbox["running"] == 4, sandbox
    _wait_for(
        page,
        "([p, n]) => document.querySelector(`#queues-admin tr[data-queue='${p}']`)"
        "?.dataset.pending == n",
        ["sandbox", sandbox["pending"]],
    )
    row = page.locator("#queues-admin tr[data-queue='sandbox']")
    expect(row).to_have_attribute("data-in-use", "4")
    expect(row.locator("td.num").nth(2)).to_have_text("4")  # its limit
    expect(row.locator("td.num").nth(3)).to_have_text(f"{sandbox['borrowed']:g}")  # borrowing
    # ... and a queue's weight changed there (PUT api/quotas: the document with it changed),
    # after a question; a guarantee above the limit refused, the field named, nothing changed
    document = hub.service("GET", "api/quotas", token).json()["document"]
    page.select_option("#quota-form select[name=queue]", "research/nlp")
    expect(page.locator("#quota-form input[name=guaranteed]")).to_have_value("8")
    expect(page.locator("#quota-form input[name=weight]")).to_have_value("")  # the default
    page.fill("#quota-form input[name=weight]", "2")
    questions = []
    page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.accept()))
    page.click("#quota-form button[type=submit]")
    expect(page.locator("#quota-answer")).to_have_text("Saved.")
    assert questions[0].startswith("Change queue research/nlp: guaranteed 8, limit default")
    weights = {
        q["path"]: q["weight"] for q in hub.service("GET", "api/quotas", token).json()["queues"]
    }
    assert weights["research/nlp"] == 2 and weights["research/vision"] == 1
    nlp = page.locator("#queues-admin tr[data-queue='research/nlp'] td.num")
    expect(nlp.nth(5)).to_have_text("2")
    _estimate(page, hub, token, gpus="4", queue="research/nlp")  # any leaf queue, for an admin
    _shot(page, "dashboard-admin")  # (the change saved, before the refused one below)
    page.select_option("#quota-form select[name=queue]", "sandbox")
    page.fill("#quota-form input[name=guaranteed]", "9")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#quota-form button[type=submit]")
    expect(page.locator("#quota-answer")).to_contain_text("Not saved: queue sandbox, field ")
    after = hub.service("GET", "api/quotas", token).json()["queues"]
    assert {q["path"]: q["guaranteed"] for q in after}["sandbox"] == 0
    restore = hub.service("PUT", "api/quotas", token, json=document)
    assert restore.status_code == 200, restore.text
    # a queue written `name:` (no fields) in YAML is edited as an empty mapping
    entries = page.evaluate(
        "() => [queueEntry({queues: {a: null}}, 'a'), queueEntry({queues: {r: {children:"
        " {n: null}}}}, 'r/n'), queueEntry({queues: {a: {}}}, 'b')]"
    )
    assert entries == [{}, {}, None]
    # the reaper's warnings and culls with their evidence (events of api/events' shape; this
    # hub runs no notebook server to cull), settings changes left out
    shown = page.evaluate(REAPER_ROWS)
    assert len(shown) == 2 and shown[0]["kind"] == "cull" and shown[1]["kind"] == "warning"
    assert '"utilization": 0.5' in shown[0]["evidence"]
    # when, as the messages beside it say times (the service's: UTC, to the second)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", shown[0]["when"]), shown[0]
    # drain and resume, through the API by the browser's cookie and the page's XSRF token
    node = page.locator("#nodes-admin tr[data-node='l40s2']")
    questions = []
    page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.dismiss()))
    node.locator("button.node-drain").click()  # it asks first: dismissed, the node stays up
    expect(node).to_have_attribute("data-state", "up")
    assert questions and questions[0].startswith("Drain l40s2? Its running jobs go on")
    page.once("dialog", lambda dialog: dialog.accept())
    node.locator("button.node-drain").click()
    expect(node).to_have_attribute("data-state", "drain")
    states = {
        n["name"]: n["state"] for n in hub.service("GET", "api/cluster", token).json()["nodes"]
    }
    assert states["l40s2"] == "drain"
    node.locator("button.node-resume").click()
    expect(node).to_have_attribute("data-state", "up")
    # the reaper's settings
    before = hub.service("GET", "api/reaper", token).json()["settings"]["idle_threshold"]
    overridden_before = set(hub.service("GET", "api/reaper", token).json()["overrides"])
    page.fill("#reaper-form input[name=idle_threshold]", "7")
    page.click("#reaper-form button[type=submit]")
    expect(page.locator("#reaper-answer")).to_have_text("Saved.")
    expect(page.locator("#reaper-form input[name=idle_threshold]")).to_have_value("7")
    reaper = hub.service("GET", "api/reaper", token).json()
    assert reaper["settings"]["idle_threshold"] == 7
    # only what was changed is sent: the other fields keep following the policy file
    assert set(reaper["overrides"]) <= overridden_before | {"idle_threshold"}, reaper["overrides"]
    page.click("#reaper-form button[type=submit]")
    expect(page.locator("#reaper-answer")).to_have_text("Nothing changed.")
    restore = hub.service("PUT", "api/reaper", token, json={"idle_threshold": before})
    assert restore.status_code == 200, restore.text
    # each hub profile's timeout, which wins over its tier's: empty, the hub's applies
    settings = hub.service("GET", "api/reaper", token).json()["settings"]
    hub_timeouts = settings["profile_idle_timeouts"]
    assert hub_timeouts and settings["profile_timeouts"] == {}
    slug = sorted(hub_timeouts)[0]
    field = page.locator(f"#reaper-form input[name='profile:{slug}']")
    expect(field).to_have_value("")
    expect(field).to_have_attribute("placeholder", f"hub: {hub_timeouts[slug]:g} s")
    expect(page.locator("#reaper-form .form-note")).to_contain_text("wins over its tier's")
    field.fill("5m")
    page.click("#reaper-form button[type=submit]")
    expect(page.locator("#reaper-answer")).to_have_text("Saved.")
    expect(field).to_have_value("300")
    assert hub.service("GET", "api/reaper", token).json()["settings"]["profile_timeouts"] == {
        slug: 300
    }
    field.fill("")  # back to the hub's
    page.click("#reaper-form button[type=submit]")
    expect(page.locator("#reaper-answer")).to_have_text("Saved.")
    assert hub.service("GET", "api/reaper", token).json()["settings"]["profile_timeouts"] == {}
    page.fill("#reaper-form input[name=warning_lead]", "soon")
    page.click("#reaper-form button[type=submit]")
    # in the form's words (its label, not the API's field name), and next to the field
    said = 'Not saved: "warning lead (s or 10m)" must be'
    expect(page.locator("#reaper-answer")).to_contain_text(said)
    beside = page.locator("#reaper-form .field-error[data-field=warning_lead]")
    expect(beside).to_contain_text('"warning lead (s or 10m)" must be')
    expect(beside).not_to_contain_text("warning_lead")
    assert page.errors == [], json.dumps(page.errors)
