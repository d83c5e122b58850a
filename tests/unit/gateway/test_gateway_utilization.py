"""GET /v1/jobs/{id}/utilization and /v1/teams/{team}/utilization against a fake bus: the range the gateway asks
accounting for (whole minutes, the job's life by default), who may read what, and problems for bad input."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from gateway_fakes import FakeAuthenticator, client, job_view

from libs.contracts import subjects
from libs.contracts.commands import Command, Reply
from libs.contracts.reports import UtilizationQuery
from services.gateway import handlers
from services.gateway.bootstrap import create_app
from services.gateway.config import GatewaySettings
from services.gateway.handlers import ApiError
from services.gateway.utilization import utilization_range


class Bus:
    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.asked: list[UtilizationQuery] = []

    async def request(self, nc: Any, subject: str, cmd: Command, *, timeout: float = 5.0) -> Reply:
        if subject == subjects.QUERY_QUEUE_GET_JOB:
            job = self.jobs.get(cmd.job_id)  # type: ignore[attr-defined]
            return Reply.success(job) if job else Reply.failure(404, "JobNotFound", "no such job")
        assert subject == subjects.QUERY_ACCOUNTING_UTILIZATION and isinstance(cmd, UtilizationQuery)
        self.asked.append(cmd)
        return Reply.success({
            "start": cmd.start.isoformat(), "end": cmd.end.isoformat(), "as_of": cmd.end.isoformat(),
            "step_s": cmd.step_s, "job_id": cmd.job_id, "team": cmd.team, "idle_util_pct": 5.0,
            "points": [{"start": cmd.start.isoformat(), "utilization_pct": 40.0, "max_utilization_pct": 50.0,
                        "idle_pct": 0.0, "gpus": 1.0, "allocations": 1}],
            "avg_utilization_pct": 40.0, "max_utilization_pct": 50.0, "idle_pct": 0.0, "measured_gpu_hours": 0.01})


@pytest.fixture
def bus(monkeypatch: pytest.MonkeyPatch) -> Bus:
    fake = Bus()
    monkeypatch.setattr(handlers, "request", fake.request)
    return fake


@pytest.fixture
def app(bus: Bus) -> Any:
    gateway = create_app(GatewaySettings(environment="dev"))
    gateway.state.nc = None
    gateway.state.authenticator = FakeAuthenticator()
    return gateway


def test_the_range_starts_on_a_whole_minute_and_the_step_keeps_to_a_chartable_number_of_buckets() -> None:
    end = datetime(2026, 1, 1, 12, 30, 40, 5, tzinfo=UTC)
    start, got_end, step = utilization_range(end, 3600, None)
    assert start == datetime(2026, 1, 1, 11, 30, tzinfo=UTC) and got_end == end and step == 60
    assert utilization_range(end, 86_400, None)[2] == 720  # a day in 120 buckets of 12 minutes
    assert utilization_range(end.replace(tzinfo=None), 600, 120)[0].tzinfo is not None
    with pytest.raises(ApiError) as bad_step:
        utilization_range(end, 3600, 90)
    assert bad_step.value.reason == "InvalidStep"
    with pytest.raises(ApiError) as too_many:
        utilization_range(end, 31 * 86_400, 60)
    assert too_many.value.reason == "InvalidRange"


async def test_a_job_is_asked_for_over_its_life_and_a_finished_one_up_to_its_end(app: Any, bus: Bus) -> None:
    now = datetime.now(UTC)
    bus.jobs["j1"] = job_view("j1", submitted_at=(now - timedelta(hours=2)).isoformat())
    bus.jobs["j2"] = job_view("j2", state="completed", submitted_at="2026-01-01T10:00:00+00:00",
                              finished_at="2026-01-01T10:03:30+00:00")
    async with client(app) as api:
        running = await api.get("/v1/jobs/j1/utilization")
        assert running.status_code == 200, running.text
        assert running.json()["points"][0]["utilization_pct"] == 40.0
        asked = bus.asked[-1]
        assert asked.job_id == "j1" and asked.team is None and asked.step_s == 60
        assert timedelta(hours=2) <= asked.end - asked.start <= timedelta(hours=2, minutes=2)
        assert (await api.get("/v1/jobs/j2/utilization")).status_code == 200
        asked = bus.asked[-1]  # a short finished job: at least 10 minutes, ending when it finished
        assert asked.end == datetime(2026, 1, 1, 10, 3, 30, tzinfo=UTC)
        assert asked.start == datetime(2026, 1, 1, 9, 53, tzinfo=UTC)
        explicit = await api.get("/v1/jobs/j1/utilization", params={
            "window_s": 7200, "step_s": 600, "to": "2026-01-01T12:00:00Z"})
        assert explicit.status_code == 200 and bus.asked[-1].step_s == 600
        assert bus.asked[-1].start == datetime(2026, 1, 1, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize("params, reason", [({"step_s": 90}, "InvalidStep"), ({"step_s": 30}, "InvalidRequest"),
                                            ({"window_s": 10}, "InvalidRequest"),
                                            ({"window_s": 2_000_000, "step_s": 60}, "InvalidRange"),
                                            ({"to": "not-a-time"}, "InvalidRequest"),
                                            ({"to": "0.5"}, "InvalidRequest"), ({"to": "1767261600"}, "InvalidRequest")])
async def test_bad_ranges_are_problems(app: Any, bus: Bus, params: dict, reason: str) -> None:
    bus.jobs["j1"] = job_view("j1")
    async with client(app) as api:
        for path in ("/v1/jobs/j1/utilization", "/v1/teams/research/utilization"):
            response = await api.get(path, params=params)
            assert response.status_code == 422, (path, response.text)
            assert response.headers["content-type"].startswith("application/problem+json")
            assert response.json()["reason"] == reason
    assert bus.asked == []


async def test_only_the_jobs_or_the_teams_own_members_read_it(app: Any, bus: Bus) -> None:
    bus.jobs["j1"] = job_view("j1", team="research")
    async with client(app, "alice") as alice, client(app, "bob") as bob:
        assert (await alice.get("/v1/jobs/j1/utilization")).status_code == 200
        assert (await alice.get("/v1/teams/research/utilization")).status_code == 200
        assert bus.asked[-1].team == "research" and bus.asked[-1].job_id is None
        assert bus.asked[-1].end - bus.asked[-1].start >= timedelta(hours=1)
        n = len(bus.asked)
        for response in (await bob.get("/v1/jobs/j1/utilization"), await bob.get("/v1/teams/research/utilization")):
            assert response.status_code == 403 and response.json()["reason"] == "Forbidden"
        missing = await alice.get("/v1/jobs/nope/utilization")
        assert missing.status_code == 404 and missing.json()["reason"] == "JobNotFound"
        bad_name = await alice.get("/v1/teams/Not_A_Team!/utilization")
        assert bad_name.status_code == 422
        assert len(bus.asked) == n
