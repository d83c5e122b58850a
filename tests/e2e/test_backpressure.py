"""Admission back-pressure through real processes: with the queue's backlog limit set low, a submission beyond it
is refused with 429, an RFC 9457 problem naming the backlog and the limit, and a `Retry-After`; once placement
grants a waiting job, submissions are accepted again."""

from __future__ import annotations

import time

import pytest
from support import eventually, finish_all, submit, wait_state

pytestmark = pytest.mark.e2e

UP_ARGS = ["--env", "queue:MAX_BACKLOG=2", "--env", "queue:BACKLOG_REFRESH_S=0.1"]
WHOLE_NODE = {"gpu_models": ["H100-80GB"]}  # the fleet has one H100 node of 8 GPUs: one such job at a time


def test_a_full_queue_refuses_with_429_and_retry_after_until_a_grant_drains_it(platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as api:
        try:
            running = submit(api, "holder", "research", 8, **WHOLE_NODE)
            wait_state(api, running, "running")
            # between two counts (BACKLOG_REFRESH_S) the queue's estimate still holds the holder as waiting (it errs
            # towards refusing, never towards a longer queue): let one count pass, as CI once found it granted
            # within 0.1 s of its own admission and refused the second waiter
            time.sleep(0.3)
            waiting = [submit(api, f"waiter-{i}", "research", 8, **WHOLE_NODE) for i in range(2)]
            assert all(api.get(f"/v1/jobs/{j}").json()["state"] == "pending" for j in waiting)

            refused = api.post("/v1/jobs", json={"name": "one-too-many", "team": "research", "gpus": 8,
                                                 **WHOLE_NODE})
            assert refused.status_code == 429, refused.text
            assert refused.headers["content-type"].startswith("application/problem+json")
            problem = refused.json()
            assert problem["type"].endswith("/QueueFull") and problem["title"] == "Too Many Requests"
            assert (problem["backlog"], problem["max_backlog"]) == (2, 2)
            assert "at most 2" in problem["detail"]
            # one grant within the last minute: a place frees in about a minute at that rate
            assert refused.headers["Retry-After"] == str(problem["retry_after_s"])
            assert 1 <= problem["retry_after_s"] <= 60
            assert not [j for j in api.get("/v1/jobs", params={"state": "pending"}).json()["items"]
                        if j["name"] == "one-too-many"]

            assert api.post(f"/v1/jobs/{running}/complete").status_code == 200
            wait_state(api, waiting[0], "running")  # the backlog drained by one

            def accepted() -> str | None:
                resp = api.post("/v1/jobs", json={"name": "room-again", "team": "research", "gpus": 8,
                                                  **WHOLE_NODE})
                assert resp.status_code in (201, 429), resp.text
                return resp.json()["job_id"] if resp.status_code == 201 else None
            job_id = eventually(accepted, "a submission accepted once the backlog drained", timeout=10)
            assert api.get(f"/v1/jobs/{job_id}").json()["state"] == "pending"
        finally:
            finish_all(api)
