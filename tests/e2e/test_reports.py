"""Reports on a real `gpupool up`: the usage report for a scripted scenario equals the GPU-seconds and cost computed
by hand from the allocation events any subscriber sees; the CSV export is a plain RFC 4180 table; bad ranges and
groupings are problem bodies; team-scoped callers see only their team; capacity weighs demand against the fleet;
and the ledger stays exact when accounting, placement and queue are SIGKILLed while allocations come and go."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import signal
import time
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import httpx
import pytest
from support import AllocationWatcher, finish_all, wait_state

from libs.cli.main import main
from libs.client import GpupoolClient
from libs.contracts.events import AllocationGranted, AllocationReleased

pytestmark = pytest.mark.e2e
FLEET_NODES = 2
UP_ARGS = ["--fleet", "H100-80GB*4;L40S*4"]
HOUR_US = Decimal(3600 * 10**6)


def q6(value: Decimal) -> float:
    return float(value.quantize(Decimal("0.000001")))


def us(a: datetime, b: datetime) -> int:
    return (b - a) // timedelta(microseconds=1)


def token(api: httpx.Client, name: str, role: str, team: str | None) -> str:
    response = api.post("/v1/tokens", json={"name": name, "role": role, "team": team})
    assert response.status_code == 201, response.text
    return response.json()["token"]


def as_(platform, secret: str) -> httpx.Client:  # type: ignore[no-untyped-def]
    return httpx.Client(base_url=platform.gateway, timeout=10, headers={"Authorization": f"Bearer {secret}"})


def submit(client: httpx.Client, name: str, team: str, gpus: int, model: str, kind: str = "training") -> str:
    response = client.post("/v1/jobs", json={"name": name, "team": team, "gpus": gpus, "gpu_models": [model],
                                             "kind": kind})
    assert response.status_code == 201, response.text
    return response.json()["job_id"]


def wait_ledger(api: httpx.Client, allocation_ids: set[str], timeout: float = 60) -> list[dict]:
    """Accounting has written a ledger row for every one of these allocations."""
    deadline = time.monotonic() + timeout
    rows: list[dict] = []
    while time.monotonic() < deadline:
        rows = []
        cursor = None
        while True:
            response = api.get("/v1/usage", params={"limit": 1000, **({"cursor": cursor} if cursor else {})})
            if response.status_code == 503:  # accounting is restarting after a kill
                break
            assert response.status_code == 200, response.text
            rows += response.json()["items"]
            if not (cursor := response.json()["next"]):
                break
        if allocation_ids <= {r["allocation_id"] for r in rows}:
            return rows
        time.sleep(0.2)
    raise AssertionError(f"ledger rows missing for {allocation_ids - {r['allocation_id'] for r in rows}}")


def released_by_allocation(watcher: AllocationWatcher, job_ids: list[str]) -> dict[str, AllocationReleased]:
    out: dict[str, AllocationReleased] = {}
    for job_id in job_ids:
        for _, _, data in watcher.of(AllocationReleased, job_id):
            out[data.allocation_id] = data  # a republished event (same allocation) says the same
    return out


async def test_usage_report_equals_hand_computed_gpu_seconds_and_cost_and_exports_csv(platform) -> None:  # type: ignore[no-untyped-def]
    run = uuid.uuid4().hex[:6]
    alice, bob = f"alice-{run}", f"bob-{run}"
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            start = datetime.now(UTC)
            change = start + timedelta(seconds=3)  # H100 gets dearer while the jobs run
            for body in ({"gpu_model": "H100-80GB", "effective_from": "2020-01-01T00:00:00Z", "price_per_hour": 2.5},
                         {"gpu_model": "H100-80GB", "effective_from": change.isoformat(), "price_per_hour": 3.75},
                         {"gpu_model": "L40S", "effective_from": "2020-01-01T00:00:00Z", "price_per_hour": 0.9}):
                assert api.put("/v1/cost-rates", json=body).status_code == 200
            with as_(platform, token(api, alice, "member", "research")) as a, \
                    as_(platform, token(api, bob, "member", "inference")) as b:
                jobs = {"big": submit(a, "big", "research", 2, "H100-80GB"),
                        "small": submit(a, "small", "research", 1, "L40S", kind="dev"),
                        "serve": submit(b, "serve", "inference", 1, "L40S", kind="inference"),
                        "gone": submit(b, "gone", "inference", 1, "H100-80GB")}
                for job_id in jobs.values():
                    await watcher.wait_for(AllocationGranted, job_id)
                await asyncio.sleep(1.0)
                assert b.post(f"/v1/jobs/{jobs['gone']}/cancel", json={"reason": "wrong data"}).status_code == 200
                await asyncio.sleep(3.0)  # past the price change
                for name in ("big", "small"):
                    assert a.post(f"/v1/jobs/{jobs[name]}/complete").status_code == 200
                assert b.post(f"/v1/jobs/{jobs['serve']}/complete").status_code == 200
            for job_id in jobs.values():
                await watcher.wait_for(AllocationReleased, job_id)
            released = released_by_allocation(watcher, list(jobs.values()))
            wait_ledger(api, set(released))

            expected: dict[tuple[str, str], list[Decimal]] = {}
            for r in released.values():
                share = Decimal(sum(g.share_milli for g in r.gpus)) / 1000
                seconds = Decimal(us(r.granted_at, r.released_at)) * share / 10**6
                if r.gpus[0].model == "H100-80GB":
                    cut = min(max(change, r.granted_at), r.released_at)
                    cost = (Decimal(us(r.granted_at, cut)) * Decimal("2.5")
                            + Decimal(us(cut, r.released_at)) * Decimal("3.75")) * share / HOUR_US
                else:
                    cost = Decimal(us(r.granted_at, r.released_at)) * Decimal("0.9") * share / HOUR_US
                user = alice if r.team == "research" else bob
                totals = expected.setdefault((r.team, user), [Decimal(0), Decimal(0)])
                totals[0] += seconds
                totals[1] += cost

            params = {"from": (start - timedelta(minutes=1)).isoformat(),
                      "to": (datetime.now(UTC) + timedelta(minutes=1)).isoformat(),
                      "group_by": "team,user", "user": [alice, bob]}
            report = api.get("/v1/reports/usage", params=params)
            assert report.status_code == 200, report.text
            got = {(r["team"], r["user"]): r for r in report.json()["rows"]}
            assert set(got) == set(expected)
            for key, (seconds, cost) in expected.items():
                assert got[key]["gpu_seconds"] == q6(seconds), key
                assert got[key]["cost"] == q6(cost), key
            assert got[("research", alice)]["allocations"] == 2 and got[("inference", bob)]["jobs"] == 2

            exported = api.get("/v1/reports/usage", params={**params, "format": "csv"})
            assert exported.headers["content-type"] == "text/csv; charset=utf-8"
            assert exported.headers["content-disposition"].startswith('attachment; filename="gpupool-usage-')
            assert exported.text.endswith("\r\n")
            table = list(csv.DictReader(io.StringIO(exported.text, newline="")))
            assert list(table[0])[:3] == ["team", "user", "gpu_seconds"]
            assert {(r["team"], r["user"]): (float(r["gpu_seconds"]), float(r["cost"]), r["currency"])
                    for r in table} == {k: (v["gpu_seconds"], v["cost"], "USD") for k, v in got.items()}
            by_accept = api.get("/v1/reports/usage", params=params, headers={"Accept": "text/csv"})
            assert by_accept.text == exported.text

            eff = api.get("/v1/reports/efficiency", params={**params, "group_by": "team"}).json()
            assert {r["team"] for r in eff["rows"]} == {"research", "inference"}
            assert all(r["allocated_gpu_hours"] > 0 for r in eff["rows"])


def test_bad_ranges_and_groupings_are_problem_bodies(platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as api:
        cases = [
            ({"from": "2026-03-02T00:00:00Z", "to": "2026-03-01T00:00:00Z"}, "InvalidRange"),
            ({"from": "2020-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z"}, "InvalidRange"),
            ({"group_by": "team,colour"}, "InvalidGroupBy"),
            ({"group_by": "team,team"}, "InvalidGroupBy"),
            ({"from": "yesterday"}, "InvalidRequest"),
            ({"format": "xlsx"}, "InvalidRequest"),
        ]
        for params, reason in cases:
            response = api.get("/v1/reports/usage", params=params)
            assert response.status_code == 422, (params, response.text)
            assert response.headers["content-type"] == "application/problem+json"
            assert response.json()["reason"] == reason, (params, response.json())
        capacity = api.get("/v1/reports/capacity", params={"from": "2026-01-01T00:00:00Z",
                                                           "to": "2026-03-01T00:00:00Z", "bucket_s": 60})
        assert capacity.status_code == 422 and capacity.json()["reason"] == "InvalidRange"
        missing = api.delete("/v1/cost-rates", params={"gpu_model": "B200", "effective_from": "2020-01-01T00:00:00Z"})
        assert missing.status_code == 404 and missing.json()["reason"] == "CostRateNotFound"
    assert httpx.get(f"{platform.gateway}/v1/reports/usage").status_code == 401


def test_team_scoped_callers_see_only_their_team_and_only_admins_set_prices(platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as api:
        run = uuid.uuid4().hex[:6]
        viewer = token(api, f"viewer-{run}", "viewer", "research")
        member = token(api, f"member-{run}", "member", "research")
        team_admin = token(api, f"tadmin-{run}", "team-admin", "research")
        team_service = token(api, f"svc-{run}", "service", "research")
        operator = token(api, f"op-{run}", "operator", None)
        job = submit(api, f"scoped-{run}", "inference", 1, "L40S")
        wait_state(api, job, "running")
        api.post(f"/v1/jobs/{job}/complete")
        reports = ("usage", "efficiency", "waste", "capacity")
        for secret in (viewer, member, team_admin, team_service):
            with as_(platform, secret) as c:
                for name in reports:
                    assert c.get(f"/v1/reports/{name}").status_code == 200, name
                teams = {r["team"] for r in c.get("/v1/reports/usage").json()["rows"]}
                assert teams <= {"research"}
                for name in ("usage", "efficiency", "waste"):
                    refused = c.get(f"/v1/reports/{name}", params={"team": "inference"})
                    assert refused.status_code == 403 and refused.json()["reason"] == "Forbidden", name
                assert c.get("/v1/reports/capacity", params={"team": "inference"}).status_code == 403
                assert c.get("/v1/cost-rates").status_code == 200
                put = c.put("/v1/cost-rates", json={"gpu_model": "L40S", "effective_from": "2021-01-01T00:00:00Z",
                                                    "price_per_hour": 0.1})
                assert put.status_code == 403
        deadline = time.monotonic() + 20
        with as_(platform, operator) as c:
            while "inference" not in {r["team"] for r in c.get("/v1/reports/usage").json()["rows"]}:
                assert time.monotonic() < deadline, "the operator never saw inference's usage"
                time.sleep(0.2)
            assert c.put("/v1/cost-rates", json={"gpu_model": "L40S", "effective_from": "2021-01-01T00:00:00Z",
                                                 "price_per_hour": 0.1}).status_code == 403
        naive = api.put("/v1/cost-rates", json={"gpu_model": "L40S", "mig_profile": "", "price_per_hour": 0.75,
                                                "effective_from": "2021-06-01T00:00:00"})
        assert naive.status_code == 422, "a time without a zone is ambiguous: refused, not taken as UTC"
        set_ = api.put("/v1/cost-rates", json={"gpu_model": "L40S", "mig_profile": "", "price_per_hour": 0.75,
                                               "effective_from": "2021-06-01T02:00:00+02:00"})
        assert set_.status_code == 200
        assert datetime.fromisoformat(set_.json()["effective_from"]) == datetime(2021, 6, 1, tzinfo=UTC)
        assert api.delete("/v1/cost-rates", params={"gpu_model": "L40S",
                                                    "effective_from": "2021-06-01T00:00:00Z"}).status_code == 204
        audit = api.get("/v1/audit", params={"limit": 50}).json()["items"]
        actions = [(e["action"], e["target"]) for e in audit]
        assert ("cost_rate.set", "L40S@2021-06-01T00:00:00+00:00") in actions
        assert ("cost_rate.delete", "L40S@2021-06-01T00:00:00+00:00") in actions
        entry = next(e for e in audit if e["action"] == "cost_rate.set")
        assert entry["before"] is None and entry["after"]["price_per_hour"] == 0.75


def test_capacity_weighs_waiting_and_running_demand_against_the_fleet(platform) -> None:  # type: ignore[no-untyped-def]
    with platform.client() as api:
        finish_all(api)
        start = datetime.now(UTC)
        running = submit(api, "cap-run", "research", 2, "H100-80GB")
        wait_state(api, running, "running")
        waiting = submit(api, "cap-wait", "inference", 4, "H100-80GB")  # only two H100s are left
        time.sleep(1.5)
        report = api.get("/v1/reports/capacity", params={"from": start.isoformat(), "bucket_s": 300,
                                                         "gpu_model": "H100-80GB"})
        assert report.status_code == 200, report.text
        (h100,) = report.json()["models"]
        assert h100["supply_gpus"] == 4
        assert h100["demand"]["pending_gpus"] == 4.0
        assert h100["demand"]["peak_demand_gpus"] == 6.0 and h100["demand"]["peak_allocated_gpus"] == 2.0
        assert h100["forecast"]["status"] == "exceeds"
        assert h100["trend"][-1]["supply_gpus"] == 4
        csv_rows = list(csv.DictReader(io.StringIO(api.get("/v1/reports/capacity", params={
            "from": start.isoformat(), "bucket_s": 300, "format": "csv"}).text)))
        assert {r["gpu_model"]: r["supply_gpus"] for r in csv_rows}["L40S"] == "4"
        api.post(f"/v1/jobs/{waiting}/cancel")
        api.post(f"/v1/jobs/{running}/complete")



def test_the_client_and_cli_read_every_report_and_manage_prices(platform, capsys) -> None:  # type: ignore[no-untyped-def]
    url, secret = platform.gateway, platform.run["admin_token"]

    def cli(*argv: str) -> tuple[int, str, str]:
        code = main([*argv, "--url", url, "--token", secret])
        out = capsys.readouterr()
        return code, out.out, out.err

    start = datetime.now(UTC) - timedelta(minutes=1)
    with GpupoolClient(url, secret) as gp:
        job = gp.submit_job(name="cli-report", team="research", gpus=1, gpu_models=["L40S"], kind="batch")
        with platform.client() as api:
            running = wait_state(api, job.job_id, "running")
            gp.complete_job(job.job_id)
            wait_ledger(api, {running["allocation_id"]})
        rate = gp.set_cost_rate("L40S", "1.5", datetime(2020, 1, 1, tzinfo=UTC))
        assert rate.price_per_hour == 1.5 and rate.mig_profile == ""
        assert [(r.gpu_model, r.price_per_hour) for r in gp.list_cost_rates("L40S")] == [("L40S", 1.5)]
        report = gp.report_usage(start, group_by=["team", "kind"], filters={"team": "research"})
        (row,) = [r for r in report.rows if r.dims(report.group_by) == {"team": "research", "kind": "batch"}]
        assert row.gpu_seconds and row.cost == pytest.approx(row.gpu_seconds / 3600 * 1.5, abs=1e-6)
        table = list(csv.DictReader(io.StringIO(gp.report_usage_csv(start, group_by=["team"]), newline="")))
        assert "research" in {r["team"] for r in table}
        assert {"H100-80GB", "L40S"} <= {m.gpu_model for m in gp.report_capacity(start, bucket_s=600).models}
        assert gp.report_waste(start, min_idle_fraction=0.9).min_idle_fraction == 0.9
        assert gp.report_efficiency(start).rows

    code, out, _ = cli("report", "usage", "--from", "1h", "--group-by", "team,user")
    assert code == 0 and out.splitlines()[0].split()[:3] == ["TEAM", "USER", "GPU-HOURS"]
    assert "total:" in out and "USD" in out
    code, out, _ = cli("report", "usage", "--from", "1h", "--team", "research", "--csv")
    assert code == 0 and out.splitlines()[0].startswith("team,gpu_seconds,gpu_hours,cost,currency")
    code, out, _ = cli("report", "efficiency", "--from", "1h", "--json")
    assert code == 0 and json.loads(out)["group_by"] == ["team"]
    code, out, _ = cli("report", "capacity", "--from", "1h", "--bucket", "10m")
    assert code == 0 and out.splitlines()[0].split()[:2] == ["MODEL", "SUPPLY"]
    code, out, _ = cli("report", "waste", "--from", "1h")
    assert code == 0 and out.startswith("idle GPU-hours:")
    code, out, _ = cli("cost-rates", "set", "B200", "9.5", "--from", "2020-01-01")
    assert (code, out) == (0, "B200: 9.5 per GPU-hour from 2020-01-01 00:00:00\n")
    code, out, _ = cli("cost-rates", "list", "--model", "B200")
    assert code == 0 and "9.5" in out
    code, _, err = cli("cost-rates", "delete", "B200", "--from", "2020-01-01")
    assert code == 0
    code, _, err = cli("report", "usage", "--group-by", "colour")
    assert code == 2 and err.startswith("error: unknown --group-by colour")
    code, _, err = cli("report", "usage", "--from", "2026-03-02", "--to", "2026-03-01")
    assert code == 1 and err.startswith("error: InvalidRange:")

async def test_the_ledger_stays_exact_when_services_are_killed_mid_stream(platform) -> None:  # type: ignore[no-untyped-def]
    """SIGKILL accounting while a burst of grants and releases is being applied, then placement and queue while
    jobs finish, then accounting again: every allocation is in the ledger once, and each team's GPU-seconds equal
    Σ (release − grant) × GPUs over the allocations any subscriber saw."""
    run = uuid.uuid4().hex[:6]
    async with AllocationWatcher(platform.nats_url) as watcher:
        with platform.client() as api:
            finish_all(api)
            start = datetime.now(UTC)
            user = f"crash-{run}"
            with as_(platform, token(api, user, "service", None)) as svc:
                jobs = [submit(svc, f"k{i}", ("research", "inference")[i % 2], 2 if i == 5 else 1,
                               ("H100-80GB", "L40S")[i % 2]) for i in range(6)]  # 3 of 4 H100s, all 4 L40S
                for job_id in jobs:
                    await watcher.wait_for(AllocationGranted, job_id)

                def kill(service: str, *, wait_s: float = 0.0) -> None:
                    pid = platform.pid(service)
                    time.sleep(wait_s)
                    os.kill(pid, signal.SIGKILL)
                    os.kill(pid, signal.SIGCONT)
                    deadline = time.monotonic() + 30
                    while platform.pid(service) == pid:
                        assert time.monotonic() < deadline, f"{service} was not restarted"
                        time.sleep(0.1)

                accounting_pid = platform.pid("accounting")
                os.kill(accounting_pid, signal.SIGSTOP)  # releases pile up unconsumed ...
                for job_id in jobs[:3]:
                    assert svc.post(f"/v1/jobs/{job_id}/complete").status_code == 200
                for job_id in jobs[:3]:
                    await watcher.wait_for(AllocationReleased, job_id)
                os.kill(accounting_pid, signal.SIGCONT)  # ... it starts applying them ...
                await asyncio.sleep(0.05)
                kill("accounting")  # ... and dies mid-stream

                kill("placement")
                for job_id in jobs[3:5]:
                    assert svc.post(f"/v1/jobs/{job_id}/complete").status_code == 200
                kill("queue", wait_s=0.1)
                deadline = time.monotonic() + 30
                while svc.post(f"/v1/jobs/{jobs[5]}/cancel").status_code != 200:
                    assert time.monotonic() < deadline, "queue never came back"
                    await asyncio.sleep(0.2)
                for job_id in jobs[3:]:
                    await watcher.wait_for(AllocationReleased, job_id, timeout=40)
                kill("accounting", wait_s=0.05)

            released = released_by_allocation(watcher, jobs)
            assert {r.job_id for r in released.values()} == set(jobs)
            wait_ledger(api, set(released))
            want: dict[str, Decimal] = {}
            for r in released.values():
                want[r.team] = want.get(r.team, Decimal(0)) + Decimal(us(r.granted_at, r.released_at)) * len(r.gpus)
            report = api.get("/v1/reports/usage", params={
                "from": (start - timedelta(minutes=1)).isoformat(),
                "to": (datetime.now(UTC) + timedelta(minutes=1)).isoformat(), "user": user}).json()
            assert {r["team"]: r["gpu_seconds"] for r in report["rows"]} == \
                {team: q6(v / 10**6) for team, v in want.items()}
