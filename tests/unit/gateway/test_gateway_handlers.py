"""The gateway's own state on the fake runtime (libs/runtime/fake.py): API tokens and the audit log, written in one
transaction by the real HTTP handlers; the teams a token may name come from a served stand-in for quota over the
fake bus (the real `libs.bus.rpc.request`). The gateway consumes no events: its "applied once" is a repeated revoke,
which changes nothing. The SQL is tested against PostgreSQL in tests/integration/test_gateway*.py."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from gateway_fakes import FakeAuthenticator

from libs.contracts import subjects
from libs.contracts.commands import Empty, Reply
from libs.runtime.fake import FakeRuntime, FakeStore
from services.gateway import handlers, store
from services.gateway.bootstrap import create_app
from services.gateway.config import GatewaySettings

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


class FakeGatewayStore(FakeStore):
    """The gateway store functions the token handlers call, on dicts (as services.gateway.store)."""

    def __init__(self) -> None:
        super().__init__(store)
        self.tokens: dict[str, dict[str, Any]] = {}
        self.audit_log: list[dict[str, Any]] = []
        self.fail_audit = False

    async def insert_token(self, conn: Any, *, token_id: str, name: str, role: str, team: str | None,
                           secret_hash: str, created_by: str, expires_at: datetime | None) -> dict[str, Any]:
        self.tokens[token_id] = {"token_id": token_id, "name": name, "role": role, "team": team,
                                 "secret_hash": secret_hash, "created_by": created_by, "created_at": NOW,
                                 "expires_at": expires_at, "revoked_at": None, "last_used_at": None}
        return {k: v for k, v in self.tokens[token_id].items() if k != "secret_hash"}

    async def find_token(self, conn: Any, token_id: str) -> dict[str, Any] | None:
        return dict(self.tokens[token_id]) if token_id in self.tokens else None

    async def revoke_token(self, conn: Any, token_id: str) -> dict[str, Any] | None:
        row = self.tokens.get(token_id)
        if row is None:
            return None
        row["revoked_at"] = row["revoked_at"] or datetime.now(UTC)  # coalesce: the first revocation stands
        return {k: v for k, v in row.items() if k != "secret_hash"}

    async def audit(self, conn: Any, *, actor: str, actor_role: str, action: str, target: str | None,
                    before: Any, after: Any, trace_id: str | None) -> None:
        if self.fail_audit:
            raise RuntimeError("the audit log is unavailable")
        self.audit_log.append({"actor": actor, "action": action, "target": target, "before": before,
                               "after": after})


@pytest.fixture
async def gateway(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    fake = FakeGatewayStore()
    monkeypatch.setattr(handlers, "store", fake)
    rt = FakeRuntime("gateway", stores=(fake,))

    async def quota_teams(_: Empty) -> Reply:
        return Reply.success({"items": [{"team": "research", "org": "default"}], "next": None})
    await rt.serve(subjects.QUERY_QUOTA_LIST_TEAMS, Empty, quota_teams)
    app = create_app(GatewaySettings(environment="dev"))
    app.state.nc, app.state.pool, app.state.authenticator = rt.nc, rt.pool, FakeAuthenticator()
    return app, fake


def client(app: Any, token: str = "admin") -> httpx.AsyncClient:
    # an unexpected failure is answered (500), as it is to a caller, rather than raised into the test
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
                             base_url="http://gateway",
                             headers={"Authorization": f"Bearer {token}"})


async def test_a_token_is_created_for_a_known_team_with_its_audit_entry(gateway) -> None:  # type: ignore[no-untyped-def]
    app, fake = gateway
    async with client(app) as http:
        made = await http.post("/v1/tokens", json={"name": "alice-laptop", "role": "member", "team": "research"})
    assert made.status_code == 201, made.text
    body = made.json()
    assert body["token"] and body["team"] == "research" and "secret_hash" not in body
    assert fake.tokens[body["token_id"]]["created_by"] == "admin"
    [entry] = fake.audit_log
    assert (entry["action"], entry["target"], entry["after"]["role"]) == ("token.create", body["token_id"], "member")


async def test_an_unknown_team_a_missing_team_and_a_member_caller_are_refused_with_problems(gateway) -> None:  # type: ignore[no-untyped-def]
    app, fake = gateway
    async with client(app) as http:
        unknown = await http.post("/v1/tokens", json={"name": "x", "role": "member", "team": "nobody"})
        teamless = await http.post("/v1/tokens", json={"name": "x", "role": "member"})
    async with client(app, "alice") as http:
        member = await http.post("/v1/tokens", json={"name": "x", "role": "member", "team": "research"})
    assert [(r.status_code, r.json()["reason"]) for r in (unknown, teamless, member)] == [
        (422, "UnknownTeam"), (422, "TeamRequired"), (403, "Forbidden")]
    assert unknown.headers["content-type"].startswith("application/problem+json")
    assert fake.tokens == {} and fake.audit_log == []


async def test_a_token_whose_audit_entry_fails_is_not_kept(gateway) -> None:  # type: ignore[no-untyped-def]
    app, fake = gateway
    fake.fail_audit = True
    async with client(app) as http:
        failed = await http.post("/v1/tokens", json={"name": "x", "role": "viewer", "team": "research"})
    assert failed.status_code == 500
    assert fake.tokens == {}  # the token and its audit entry are one transaction


async def test_revoking_twice_keeps_the_first_revocation_and_an_unknown_token_is_not_found(gateway) -> None:  # type: ignore[no-untyped-def]
    app, fake = gateway
    async with client(app) as http:
        token_id = (await http.post("/v1/tokens", json={"name": "x", "role": "viewer", "team": "research"})
                    ).json()["token_id"]
        first = await http.delete(f"/v1/tokens/{token_id}")
        revoked_at = fake.tokens[token_id]["revoked_at"]
        second = await http.delete(f"/v1/tokens/{token_id}")
        missing = await http.delete("/v1/tokens/nope")
    assert (first.status_code, second.status_code) == (204, 204)
    assert revoked_at is not None and fake.tokens[token_id]["revoked_at"] == revoked_at
    assert [e["after"]["revoked_at"] for e in fake.audit_log[1:]] == [revoked_at.isoformat()] * 2
    assert (missing.status_code, missing.json()["reason"]) == (404, "TokenNotFound")
