"""The gateway's edges, attacked as issue #16 found them open: each case failed on the code before the fix.

Bodies are limited while they stream (before authentication), events reach only the teams they are about, an
Idempotency-Key belongs to its caller, request values are taken only as their own JSON type, dates carry a zone
and lie in the calendar, names that must exist are checked, a caller's event streams are bounded, and even a
request too malformed for the app is answered with a problem body.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest

from tests.e2e.support import eventually, finish_all, wait_state

pytestmark = pytest.mark.e2e

TEAMS = ("research", "inference")
ROLES = ("team-admin", "member", "viewer", "service")


def token(admin: httpx.Client, name: str, role: str, team: str | None) -> str:
    made = admin.post("/v1/tokens", json={"name": name, "role": role, "team": team})
    assert made.status_code == 201, made.text
    return made.json()["token"]


def is_problem(response: httpx.Response, status: int, reason: str | None = None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json"), response.headers
    body = response.json()
    assert body["status"] == status
    if reason is not None:
        assert body["reason"] == reason, body
    return body


def raw_exchange(gateway: str, data: bytes, *, then: bytes = b"", read_timeout: float = 10.0) -> bytes:
    """Send bytes on a fresh connection (and, if the server has not answered, more bytes); return what came
    back until the server closed the connection or went quiet."""
    url = urlsplit(gateway)
    with socket.create_connection((url.hostname, url.port), timeout=read_timeout) as sock:
        sock.sendall(data)
        if then:
            try:
                sock.sendall(then)
            except OSError:  # the server answered and closed while we were still sending: what we test for
                pass
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except (TimeoutError, ConnectionResetError):
            pass
    return b"".join(chunks)


def response_of(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


@pytest.fixture(scope="module")
def admin(platform) -> httpx.Client:  # type: ignore[no-untyped-def]
    with platform.client() as client:
        yield client


# --- bodies -------------------------------------------------------------------------------------------------------
def test_a_chunked_body_over_the_limit_is_refused_unread_before_authentication(platform) -> None:  # type: ignore[no-untyped-def]
    """Before: an unauthenticated chunked 300 MB body was buffered whole, then refused with 401. Now the gateway
    answers 413 once the body passes its limit (64 KiB), with the rest of the body never sent."""
    head = (b"POST /v1/jobs HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"x" * 70_000
    raw = raw_exchange(platform.gateway, head + b"%x\r\n" % len(chunk) + chunk + b"\r\n")  # no last chunk: open
    status, headers, body = response_of(raw)
    assert status == 413 and headers["content-type"].startswith("application/problem+json"), raw[:300]
    assert json.loads(body)["reason"] == "PayloadTooLarge"


def test_a_chunked_body_within_the_limit_is_read_as_usual(admin: httpx.Client) -> None:
    def body():  # type: ignore[no-untyped-def]
        yield json.dumps({"name": "chunked", "team": "research", "gpus": 1}).encode()

    made = admin.post("/v1/jobs", content=body(), headers={"Content-Type": "application/json"})
    assert made.status_code == 201, made.text
    assert admin.post(f"/v1/jobs/{made.json()['job_id']}/cancel").status_code == 200


def test_a_request_too_malformed_for_the_app_still_gets_a_problem_body(platform) -> None:  # type: ignore[no-untyped-def]
    """uvicorn answered these in plain text."""
    status, headers, body = response_of(raw_exchange(platform.gateway, b"NOT A REQUEST\x01\r\n\r\n"))
    assert status == 400 and headers["content-type"] == "application/problem+json"
    assert json.loads(body)["reason"] == "MalformedRequest"


# --- values ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("field", [
    {"gpus": True}, {"gpus": "2"}, {"gpus": 2.5}, {"gpus": 1, "exclusive": "yes"},
    {"gpus": 1, "command": ["true"], "limits": {"memory_mib": "512"}},
    {"gpus": 1, "command": ["true"], "restart": {"policy": "on_failure", "attempts": True}},
    {"gpus": 1, "max_runtime_s": "60"},
])
def test_a_value_is_taken_only_as_its_own_json_type(admin: httpx.Client, field: dict) -> None:
    """Before: `"gpus": true` asked for 1 GPU and `"gpus": "2"` for 2."""
    is_problem(admin.post("/v1/jobs", json={"name": "loose", "team": "research", **field}), 422, "InvalidRequest")


def test_a_whole_number_written_with_a_fraction_is_that_integer(admin: httpx.Client) -> None:
    """JSON Schema counts 2.0 as an integer, so a schema-valid request with it is accepted (Schemathesis'
    positive_data_acceptance): it asks for 2 GPUs, as `2` would."""
    made = admin.post("/v1/jobs", json={"name": "whole", "team": "research", "gpus": 2.0})
    assert made.status_code == 201, made.text
    job_id = made.json()["job_id"]
    assert admin.get(f"/v1/jobs/{job_id}").json()["gpus"] == 2
    assert admin.post(f"/v1/jobs/{job_id}/cancel").status_code == 200


def test_dates_need_a_zone_and_a_place_in_the_calendar(admin: httpx.Client) -> None:
    """Before: a naive `until` made /v1/quota-loans answer 500, and a price from year 1 made every report 500."""
    loan = {"path": "default/research", "gpus": 1, "reason": "deadline"}
    is_problem(admin.post("/v1/quota-loans", json={**loan, "until": "2026-12-24T00:00:00"}), 422)
    is_problem(admin.post("/v1/quota-loans", json={**loan, "until": "9999-12-24T00:00:00Z"}), 422)
    rate = {"gpu_model": "H100-80GB", "price_per_hour": 2.5}
    is_problem(admin.put("/v1/cost-rates", json={**rate, "effective_from": "0001-01-01T00:00:00Z"}), 422)
    is_problem(admin.put("/v1/cost-rates", json={**rate, "effective_from": "2026-01-01T00:00:00"}), 422)
    assert admin.get("/v1/reports/usage").status_code == 200


def test_names_that_must_exist_are_checked(admin: httpx.Client) -> None:
    """Before: quotas and tokens for teams nobody created were accepted."""
    is_problem(admin.put("/v1/quotas", json={"path": "default/nobody", "guaranteed": 1}), 422, "UnknownTeam")
    is_problem(admin.put("/v1/quotas", json={"path": "default/nobody/p", "guaranteed": 1}), 422, "UnknownTeam")
    is_problem(admin.put("/v1/quotas", json={"path": "nowhere", "guaranteed": 1}), 422, "UnknownOrg")
    is_problem(admin.put("/v1/quotas", json={"path": "nowhere/research", "guaranteed": 1}), 422, "UnknownOrg")
    is_problem(admin.post("/v1/tokens", json={"name": "ghost", "role": "member", "team": "nobody"}), 422,
               "UnknownTeam")
    assert admin.put("/v1/quotas", json={"path": "default/research/p1", "guaranteed": 0}).status_code == 200
    admin.request("DELETE", "/v1/quotas", params={"path": "default/research/p1"})


@pytest.mark.parametrize("rule, value", [("gpus_over", "-5"), ("gpus_over", "nan"), ("runtime_over_s", "inf"),
                                         ("gpus_over", "1e308"), ("priority_class", "Not A Class!")])
def test_approval_rules_take_only_sane_thresholds(admin: httpx.Client, rule: str, value: str) -> None:
    is_problem(admin.put(f"/v1/approval-rules/{rule}", json={"value": value}), 422, "InvalidRule")


# --- who owns a key ---------------------------------------------------------------------------------------------
def test_an_idempotency_key_belongs_to_its_caller(admin: httpx.Client, platform) -> None:  # type: ignore[no-untyped-def]
    """Before: keys were global, so another team's key collided (422) and told the caller that it was in use."""
    ours = token(admin, "idem-ours", "member", "research")
    theirs = token(admin, "idem-theirs", "member", "inference")
    key = {"Idempotency-Key": "nightly-2026-12-01"}
    with httpx.Client(base_url=platform.gateway, timeout=10) as api:
        first = api.post("/v1/jobs", headers={**key, "Authorization": f"Bearer {ours}"},
                         json={"name": "idem", "team": "research", "gpus": 1})
        other = api.post("/v1/jobs", headers={**key, "Authorization": f"Bearer {theirs}"},
                         json={"name": "idem-other", "team": "inference", "gpus": 2})
        again = api.post("/v1/jobs", headers={**key, "Authorization": f"Bearer {ours}"},
                         json={"name": "idem", "team": "research", "gpus": 1})
    assert first.status_code == 201 and other.status_code == 201, (first.text, other.text)
    assert other.json()["job_id"] != first.json()["job_id"]
    assert again.status_code == 200 and again.json()["job_id"] == first.json()["job_id"]
    for job in (first, other):
        admin.post(f"/v1/jobs/{job.json()['job_id']}/cancel")


# --- events -----------------------------------------------------------------------------------------------------
def collect(url: str, bearer: str, out: list[dict], ready: threading.Event, seconds: int) -> None:
    with httpx.stream("GET", f"{url}/v1/events", params={"max_seconds": seconds},
                      headers={"Authorization": f"Bearer {bearer}"}, timeout=seconds + 20) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            ready.set()
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))


def test_every_role_of_two_teams_sees_no_foreign_event(admin: httpx.Client, platform) -> None:  # type: ignore[no-untyped-def]
    """Before: team-scoped callers received other teams' `job.started` (it carried no team). Each role of each
    team streams while both teams' jobs run to the end; no stream may carry an event about the other team's work,
    and each sees its own job start."""
    streams: dict[tuple[str, str], list[dict]] = {}
    readers = []
    for team in TEAMS:
        for role in ROLES:
            bearer = token(admin, f"sse-{role}-{team}", role, team)
            seen: list[dict] = []
            ready = threading.Event()
            reader = threading.Thread(target=collect, args=(platform.gateway, bearer, seen, ready, 12), daemon=True)
            reader.start()
            assert ready.wait(10)
            streams[(team, role)] = seen
            readers.append(reader)
    time.sleep(0.3)
    jobs = {team: admin.post("/v1/jobs", json={"name": f"sse-{team}", "team": team, "gpus": 1,
                                                "command": ["true"]}).json()["job_id"] for team in TEAMS}
    for job_id in jobs.values():
        wait_state(admin, job_id, "completed", timeout=30)
    for reader in readers:
        reader.join(timeout=30)
    public = ("io.gpupool.node.", "io.gpupool.gpu.health_changed.", "io.gpupool.gpu.sharing_set.",
              "io.gpupool.telemetry.", "io.gpupool.quota.set.", "io.gpupool.quota.priority_class_set.",
              "io.gpupool.quota.team_created.", "io.gpupool.usage.rate_set.")
    for (team, role), seen in streams.items():
        foreign = jobs[TEAMS[1] if team == TEAMS[0] else TEAMS[0]]
        about_work = [e for e in seen if not e["type"].startswith(public)]
        assert all(e["data"].get("team") == team for e in about_work), (team, role, [
            (e["type"], e["data"].get("team")) for e in about_work if e["data"].get("team") != team][:5])
        assert not any(foreign in json.dumps(e) for e in seen), (team, role)
        started = [e for e in seen if e["type"] == "io.gpupool.job.started.v1"]
        assert [e["data"]["job_id"] for e in started] == [jobs[team]], (team, role, started)
        assert not any(e["type"].startswith("io.gpupool.decision.") for e in seen), (team, role)


def test_a_caller_may_hold_only_so_many_event_streams(admin: httpx.Client, platform) -> None:  # type: ignore[no-untyped-def]
    """Before: 500 streams on one token were all accepted. The limit is 8 per caller (GPUPOOL_GATEWAY_
    MAX_EVENT_STREAMS); the ninth gets 429 with Retry-After, and a closed stream's slot comes back."""
    bearer = token(admin, "sse-many", "viewer", "research")
    headers = {"Authorization": f"Bearer {bearer}"}
    with httpx.Client(base_url=platform.gateway, timeout=20, headers=headers,
                      limits=httpx.Limits(max_connections=20)) as api:
        opened = []
        for _ in range(8):
            response = api.send(api.build_request("GET", "/v1/events", params={"max_seconds": 30}), stream=True)
            assert response.status_code == 200
            opened.append(response)
        refused = api.get("/v1/events", params={"max_seconds": 1})
        body = is_problem(refused, 429, "TooManyStreams")
        assert refused.headers["retry-after"] and "8" in body["detail"]
        other = token(admin, "sse-other", "viewer", "research")  # another caller is not affected
        with httpx.stream("GET", f"{platform.gateway}/v1/events", params={"max_seconds": 1}, timeout=10,
                          headers={"Authorization": f"Bearer {other}"}) as response:
            assert response.status_code == 200
        opened.pop().close()

        def slot_back() -> bool:
            response = api.send(api.build_request("GET", "/v1/events", params={"max_seconds": 1}), stream=True)
            response.close()
            return response.status_code == 200

        eventually(slot_back, "a closed stream's slot to come back", timeout=10)
        for response in opened:
            response.close()
    finish_all(admin)
