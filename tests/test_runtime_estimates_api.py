"""Learned run-time estimates in the live service (core/runtime_estimates.py): the policy file
turns them on, the jobs that complete teach them, and a waiting job planned with one starts in
front of a reservation that it ends before, while the reservation keeps the running jobs'
limits. Against an in-process service with real job processes.

Cluster: gpu1, gpu2 with 8 H100 each, l40s1, l40s2 with 4 L40S (hub_config/cluster.yaml).
"""

from __future__ import annotations

import pytest
from service_helpers import services, wait_job
from test_service_api import SLEEP, h100, submit


@pytest.fixture
async def service_factory(tmp_path):
    async with services(tmp_path) as make:
        yield make


async def a_reservation_and_alices_quick_job(service) -> tuple[dict, dict, dict]:
    """alice's three runs named "quick" complete; bob's 4-GPU and 8-GPU jobs (no walltime: the
    24 h default) fill one H100 node and half the other; carol's 8-GPU job reserves the node
    that frees first by their limits; then alice submits another "quick" job without a walltime.
    (bob's 4-GPU job, carol's, alice's new one.)"""
    alice, bob, carol = (service.client(user) for user in ("alice", "bob", "carol"))
    for _ in range(3):
        done = await submit(alice, h100(4, command="sleep 0.2", name="quick"))
        await wait_job(alice, done["id"], "completed")
    half = await submit(bob, h100(4))
    full = await submit(bob, h100(8))
    assert (half["state"], full["state"]) == ("running", "running")
    assert half["allocation"][0]["node"] != full["allocation"][0]["node"]
    # carol's idle private queue ranks first: she holds the reservation, on bob's 4-GPU node
    blocked = await submit(carol, h100(8, queue="private"))
    assert blocked["state"] == "pending"
    assert blocked["reason"]["eta"] == pytest.approx(half["start_time"] + 86_400, abs=1)
    quick = await submit(alice, h100(4, command=SLEEP, name="quick"))
    return half, blocked, quick


async def test_a_job_estimated_to_end_before_the_reservation_starts_in_front_of_it(
    service_factory,
):
    service = await service_factory(policy={"walltime": {"estimate": "missing"}})
    half, blocked, quick = await a_reservation_and_alices_quick_job(service)
    # planned with its estimate (under a second, from the three runs): it ends before carol's
    # start, so it starts now on the 4 GPUs free beside bob's job (the reserved node)
    assert quick["state"] == "running", quick["reason"]
    assert quick["allocation"][0]["node"] == half["allocation"][0]["node"]
    # the reservation still plans with the running jobs' limits, not their estimates
    _, view = await service.client("carol").get(f"api/jobs/{blocked['id']}")
    assert view["reason"]["eta"] == pytest.approx(half["start_time"] + 86_400, abs=1)
    # each owner sees what their job is planned with, and from what
    assert quick["planned_run_time"]["from"] == "estimate"
    assert quick["planned_run_time"]["seconds"] < 5  # 0.9 quantile of ~0.2 s runs, x 1.2
    assert quick["planned_run_time"]["message"].endswith("estimated from earlier runs like it")
    planned = view["planned_run_time"]
    assert (planned["from"], planned["seconds"]) == ("default", 86_400)
    assert planned["message"] == (
        "planned to run 1 d, the default for a job without a walltime: give one if it runs "
        "less, and it may start sooner"
    )
    # bob's 4-GPU job, with no runs of his own, is planned from his queue's (alice's runs)
    _, half = await service.client("bob").get(f"api/jobs/{half['id']}")
    assert half["planned_run_time"]["from"] == "estimate"
    assert half["planned_run_time"]["message"].endswith(
        "estimated from its queue's earlier runs of its size"
    )
    # ... and no one else sees a job's plan
    _, seen_by_alice = await service.client("alice").get(f"api/jobs/{blocked['id']}")
    assert "planned_run_time" not in seen_by_alice
    # "When would I start?" says what the job would be planned with: alice's next "quick" run
    # from her history, the same without a name (her 4-GPU runs), a 2-GPU job the default
    alice = service.client("alice")
    cases = (("quick", 4, "estimate"), (None, 4, "estimate"), (None, 2, "default"))
    for name, gpus, source in cases:
        request = h100(gpus, command="true", **({"name": name} if name else {}))
        _, answer = await alice.post("api/estimate", request)
        assert answer["planned_run_time"]["from"] == source, (name, gpus, answer)


async def test_without_estimates_the_same_job_waits_for_the_reservation(service_factory):
    service = await service_factory()  # walltime.estimate: never (the default)
    _, _, quick = await a_reservation_and_alices_quick_job(service)
    assert quick["state"] == "pending"  # planned 24 h: it would outlast carol's start
    assert quick["reason"]["detail"] == "reservation", quick["reason"]
    # what it is planned with says why, and what would let it start sooner
    assert quick["planned_run_time"] == {
        "seconds": 86_400,
        "from": "default",
        "message": "planned to run 1 d, the default for a job without a walltime: give one if "
        "it runs less, and it may start sooner",
    }
    _, answer = await service.client("alice").post(
        "api/estimate", h100(4, command="true", name="quick", walltime="10m")
    )
    assert answer["planned_run_time"]["from"] == "walltime"
    assert answer["planned_run_time"]["message"] == "planned to run 10 min, its walltime"
