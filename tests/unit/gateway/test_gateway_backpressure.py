"""A full queue through the real gateway app: the queue's 429 QueueFull refusal becomes an RFC 9457 problem with a
`Retry-After` header taken from the queue's hint (the queue answers over the fake bus, libs/runtime/fake.py)."""

from __future__ import annotations

import httpx
from gateway_fakes import FakeAuthenticator

from libs.contracts import subjects
from libs.contracts.commands import Reply, SubmitJob
from libs.runtime.fake import FakeRuntime
from services.gateway.bootstrap import create_app
from services.gateway.config import GatewaySettings


async def test_a_full_queue_answers_429_with_retry_after_and_a_problem_naming_the_limit() -> None:
    rt = FakeRuntime("gateway")

    async def full(cmd: SubmitJob) -> Reply:
        return Reply.failure(429, "QueueFull", "12 jobs are waiting for placement and the queue takes at most 10; "
                             "retry in 7 s (0.4 jobs/s granted lately)", backlog=12, max_backlog=10,
                             grants_per_s=0.4, retry_after_s=7)
    await rt.serve(subjects.CMD_QUEUE_SUBMIT_JOB, SubmitJob, full)
    app = create_app(GatewaySettings(environment="dev"))
    app.state.nc, app.state.pool, app.state.authenticator = rt.nc, rt.pool, FakeAuthenticator()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
                                 base_url="http://gateway", headers={"Authorization": "Bearer admin"}) as api:
        resp = await api.post("/v1/jobs", json={"name": "demo", "team": "research", "gpus": 1})
        spec = (await api.get("/openapi.json")).json()
    assert resp.status_code == 429 and resp.headers["Retry-After"] == "7"
    assert resp.headers["content-type"].startswith("application/problem+json")
    body = resp.json()
    assert body["type"].endswith("/QueueFull") and body["title"] == "Too Many Requests" and body["status"] == 429
    assert "at most 10" in body["detail"] and (body["backlog"], body["max_backlog"]) == (12, 10)
    assert "429" in spec["paths"]["/v1/jobs"]["post"]["responses"]
