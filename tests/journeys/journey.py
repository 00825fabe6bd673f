"""The journey suite's pieces: the demo hub, people in a browser, screenshots when one fails.

A journey is what a person of ``make demo`` does and sees: log in, pick a profile, wait in the
queue, open JupyterLab, run a cell, get warned, get culled, read why. Each module starts one hub
with the demo's own configuration (``hub_config/jupyterhub_config.py``, the demo cluster of
2 x 4 H100 and the demo queues, simulated GPUs: what ``make demo`` runs), changed only where
waiting would be idle time (the CI profile below: GPU samples every second, the spawn page asks
the queue twice a second, the reaper's run-time settings are the admin's to change in the
journey itself). The people are the demo's: alice and bob (group research: queues
research/vision and research/nlp), carol (ops) and admin (a hub admin and the scheduler's).

When a journey fails, every page still open is saved under ``test-output/journeys/<test>/``
(``<user>-<n>.png``), and the hub's log tail is printed.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import time
from pathlib import Path

import hub_harness
import pytest
import requests
import test_spawner as ts

from jupyter_gpusched.notebook.payloads import remove  # (a file, or a folder, not followed)

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
SHOTS = ROOT / "test-output" / "journeys"
BUILT = ROOT / "jupyter_gpusched" / "labextension" / "package.json"
TIMEOUT_MS = 60_000  # a page's own waits (the Lab asks for notices every 10 s)
DEMO_GPUS = 8  # hub_config/demo-cluster.yaml: 2 nodes x 4 H100

try:
    from playwright import sync_api
except ImportError:  # the test extra; MISSING says so
    sync_api = None

# Why the journeys cannot run here (each module skips with it), or None.
if not CHROMIUM.exists():
    MISSING = "/usr/bin/chromium is missing: run scripts/install-system.sh (apt-get chromium)"
elif sync_api is None:
    MISSING = "playwright is missing: pip install playwright (the test extra)"
elif not BUILT.exists():
    MISSING = "the lab extension is not built: run `make labextension`"
elif not hub_harness.CHP.exists():
    MISSING = "node_modules/.bin/configurable-http-proxy is missing: run `make node_modules`"
else:
    MISSING = None


def skip_if_missing() -> None:
    if MISSING:
        pytest.skip(MISSING, allow_module_level=True)


# The CI profile: the demo's configuration, with the waits that would be idle time shortened.
CI_POLICY = """\
# tests/journeys: the documented defaults, except what makes a journey wait for nothing
backfill: {interval: 1s}
tiers:
  3: {grace_period: 20s, minimum_run_time: 0}  # not 1 min; the Lab asks every 10 s
"""
CI_CONFIG = """
# -- added by tests/journeys (the CI profile)
c.GPUSchedSpawner.queue_poll_interval = 0.5
c.Spawner.args = ["--GPUMonitor.interval=1"]
c.Spawner.http_timeout = 90
# a CPU-only server's activity reaches the hub (and so the reaper) within a second, not a minute
c.JupyterHub.last_activity_interval = 1
c.Spawner.environment = {**c.Spawner.environment, "JUPYTERHUB_ACTIVITY_INTERVAL": "1"}
"""
# the service's own GPU samples, which the reaper decides on, its reads of the hub's activity
# (CPU-only servers) and its plays for expected starts, every second (defaults 10 s, 60 s, 10 s)
CI_SERVICE_ARGS = (
    "--GPUSchedService.gpu_sample_interval=1",
    "--GPUSchedService.hub_activity_interval=1",
    "--GPUSchedService.expected_start_interval=1",
)


@pytest.fixture(scope="module")
def demo():
    """A hub with the demo's configuration (``make demo``), on free ports, its state in /tmp."""
    env = {
        "GPUSCHED_CLUSTER_FILE": str(ROOT / "hub_config" / "demo-cluster.yaml"),
        "GPUSCHED_QUEUE_FILE": str(ROOT / "hub_config" / "demo-queues.yaml"),
        "GPUSCHED_GPU_BACKEND": "simulated",
        "GPUSCHED_SIM_CLUSTER": str(ROOT / "hub_config" / "demo-cluster.yaml"),
    }
    policy = Path(os.environ.get("TMPDIR", "/tmp")) / f"journeys-policy-{os.getpid()}.yaml"
    policy.write_text(CI_POLICY)
    policy.chmod(0o644)
    env["GPUSCHED_POLICY_FILE"] = str(policy)
    try:
        with hub_harness.running_hub(
            env=env, extra_config=CI_CONFIG, service_args=CI_SERVICE_ARGS
        ) as hub:
            for user in hub_harness.DEMO_USERS:
                hub_harness.no_news(hub.state_dir, user)
            since = time.time()
            yield hub
            stop_everything(hub)
            remove_what_was_written(since)
    finally:
        policy.unlink(missing_ok=True)


WRITTEN: set[tuple[str, str]] = set()  # (user, path in their home) the journeys wrote there


def remove_what_was_written(since: float) -> None:
    """Leave the demo users' homes as the module found them: remove the files and folders its
    journeys wrote there (:data:`WRITTEN`, through their servers' contents API) and the job
    payloads of the cells and functions they submitted (``~/.gpusched``, made since
    ``since``)."""
    homes = {user: Path(pwd.getpwnam(user).pw_dir) for user in hub_harness.DEMO_USERS}
    for user, path in sorted(WRITTEN, key=lambda written: -len(written[1])):  # files first
        written = homes[user] / path
        remove(written)
        checkpoints = written.parent / ".ipynb_checkpoints"  # (the server's copy of a file)
        remove(checkpoints / f"{written.stem}-checkpoint{written.suffix}")
        with contextlib.suppress(OSError):
            checkpoints.rmdir()  # once empty
    WRITTEN.clear()
    for home in homes.values():
        payloads = home / ".gpusched"
        for entry in payloads.glob("*") if payloads.is_dir() else ():
            if entry.stat().st_mtime >= since:
                remove(entry)


@pytest.fixture(scope="module")
def chromium():
    from browser_helpers import launched_chromium  # here: a module without Chromium skips first

    with launched_chromium() as browser:
        yield browser


class People:
    """The people of one journey, each logged in in a browser context of their own."""

    def __init__(self, hub, browser):
        self.hub, self.browser = hub, browser
        self.pages: dict[str, object] = {}

    def __call__(self, user: str, width: int = 1400, height: int = 900):
        """``user``'s page, logged in to the hub (the same page on a second call)."""
        if user in self.pages:
            return self.pages[user]
        context = self.browser.new_context(viewport={"width": width, "height": height})
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(f"{self.hub.url}/hub/login")
        page.fill("input[name=username]", user)
        page.fill("input[name=password]", self.hub.password)
        page.click("input[type=submit], button[type=submit]")
        page.wait_for_url(re.compile(r".*/hub/home.*"))
        self.pages[user] = page
        return page

    def save_screenshots(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        for user, page in self.pages.items():
            for n, open_page in enumerate(page.context.pages):
                with contextlib.suppress(Exception):
                    open_page.screenshot(path=str(folder / f"{user}-{n}.png"), full_page=True)

    def close(self) -> None:
        for page in self.pages.values():
            with contextlib.suppress(Exception):
                page.context.close()


@pytest.fixture
def people(request, demo, chromium):
    crowd = People(demo, chromium)
    yield crowd
    report = getattr(request.node, "journey_report", None)
    if report is not None and report.failed:
        crowd.save_screenshots(SHOTS / request.node.name)
        print(f"--- {demo.log_path} (tail) ---\n{demo.log_tail(120)}")
    crowd.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.journey_report = report
    return report


def shot(page, test: str, name: str) -> None:
    """A screenshot a person would rather look at (kept, passing or not)."""
    folder = SHOTS / test
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"{name}.png"))


# -- what a journey asks the scheduler (tests/test_spawner.py has the hub's side) -----------------
def service(hub, method: str, path: str, user: str, **kwargs) -> requests.Response:
    return hub.service(method, path, hub.token(user), **kwargs)


def jobs_of(hub, user: str, *states: str) -> list[dict]:
    query = "&".join(f"state={s}" for s in states)
    response = service(hub, "GET", "api/jobs" + (f"?{query}" if query else ""), user)
    assert response.status_code == 200, response.text
    return response.json()["jobs"]


def stop_everything(hub) -> None:
    """Stop every server and cancel every job (between journeys of one module), until all the
    demo's 8 GPUs are free."""
    ts.stop_every_server(hub)
    for job in jobs_of(hub, "admin", "pending", "running"):
        service(hub, "DELETE", f"api/jobs/{job['id']}", "admin")
    ts.wait_free(hub, DEMO_GPUS, timeout=60)
