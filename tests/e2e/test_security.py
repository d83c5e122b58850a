"""Every endpoint × every role against the permission matrix below, through the real gateway and services.

The matrix is written out by hand on purpose: it is the specification people agreed on, not a copy of the code's
policy table, so a change to either shows up here.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

pytestmark = pytest.mark.e2e

ROLES = ("platform-admin", "operator", "team-admin", "member", "viewer", "service")
OWN, OTHER = "research", "inference"

#                                  admin oper  t-adm member viewer service
MATRIX: dict[str, tuple[int, ...]] = {
    "submit a job for own team":      (1, 0, 1, 1, 0, 1),
    "submit a job for another team":  (1, 0, 0, 0, 0, 0),
    "list jobs":                      (1, 1, 1, 1, 1, 1),
    "list another team's jobs":       (1, 1, 0, 0, 0, 0),
    "read own team's job":            (1, 1, 1, 1, 1, 1),
    "read another team's job":        (1, 1, 0, 0, 0, 0),
    "read own team's job logs":       (1, 1, 1, 1, 1, 1),
    "read another team's job logs":   (1, 1, 0, 0, 0, 0),
    "cancel own team's job":          (1, 1, 1, 1, 0, 1),
    "cancel another team's job":      (1, 1, 0, 0, 0, 0),
    "complete own team's job":        (1, 0, 1, 1, 0, 1),
    "complete another team's job":    (1, 0, 0, 0, 0, 0),
    "list nodes":                     (1, 1, 1, 1, 1, 1),
    "list allocations":               (1, 1, 1, 1, 1, 1),
    "list teams":                     (1, 1, 1, 1, 1, 1),
    "list reclamation trackers":      (1, 1, 1, 1, 1, 1),
    "read own team's usage":          (1, 1, 1, 1, 1, 1),
    "read another team's usage":      (1, 1, 0, 0, 0, 0),
    "create a token in own team":     (1, 0, 1, 0, 0, 0),
    "list tokens":                    (1, 0, 1, 0, 0, 0),
    "revoke a token in own team":     (1, 0, 1, 0, 0, 0),
    "read the audit log":             (1, 0, 0, 0, 0, 0),
    "ask who am I":                   (1, 1, 1, 1, 1, 1),
    "explain own team's job":         (1, 1, 1, 1, 1, 1),
    "explain another team's job":     (1, 1, 0, 0, 0, 0),
    "read the pool summary":          (1, 1, 1, 1, 1, 1),
    "stream events":                  (1, 1, 1, 1, 1, 1),
    "create a team":                  (1, 0, 0, 0, 0, 0),
    "list quotas":                    (1, 1, 1, 1, 1, 1),
    "set a quota":                    (1, 0, 0, 0, 0, 0),
    "list priority classes":          (1, 1, 1, 1, 1, 1),
    "set a priority class":           (1, 0, 0, 0, 0, 0),
    "list approval requests":         (1, 1, 1, 1, 1, 1),
    "approve own team's request":     (1, 0, 1, 0, 0, 0),
    "approve another team's request": (1, 0, 0, 0, 0, 0),
    "set an approval rule":           (1, 0, 0, 0, 0, 0),
    "list scheduling decisions":      (1, 1, 0, 0, 0, 0),
    "read own team's usage report":   (1, 1, 1, 1, 1, 1),
    "read another team's report":     (1, 1, 0, 0, 0, 0),
    "read the capacity report":       (1, 1, 1, 1, 1, 1),
    "list cost rates":                (1, 1, 1, 1, 1, 1),
    "set a cost rate":                (1, 0, 0, 0, 0, 0),
    "read a node":                    (1, 1, 1, 1, 1, 1),
    "cordon a node":                  (1, 1, 0, 0, 0, 0),
    "uncordon a node":                (1, 1, 0, 0, 0, 0),
    "set a GPU's sharing mode":       (1, 1, 0, 0, 0, 0),
    "list orphans":                   (1, 1, 1, 1, 1, 1),
    "ask for a quota loan for own team": (1, 0, 1, 0, 0, 0),
    "list quota loans":               (1, 1, 1, 1, 1, 1),
}


@pytest.fixture(scope="module")
def admin(platform) -> httpx.Client:  # type: ignore[no-untyped-def]
    with platform.client() as client:
        yield client


@pytest.fixture(scope="module")
def tokens(admin: httpx.Client) -> dict[str, str]:
    out = {}
    for role in ROLES:
        team = None if role in ("platform-admin", "operator") else OWN
        response = admin.post("/v1/tokens", json={"name": f"matrix-{role}", "role": role, "team": team})
        assert response.status_code == 201, response.text
        out[role] = response.json()["token"]
    return out


def pending_job(admin: httpx.Client, team: str) -> str:
    """A job that stays pending (no T4 in the fleet), so cancel and complete hit real state, not 404."""
    response = admin.post("/v1/jobs", json={"name": "matrix", "team": team, "gpus": 1, "gpu_models": ["T4"]})
    assert response.status_code == 201, response.text
    return response.json()["job_id"]


def approval_request(admin: httpx.Client, team: str) -> str:
    """A submission that needs approval: more GPUs than the (admin-set) rule allows."""
    admin.put("/v1/approval-rules/gpus_over", json={"value": "100"})
    response = admin.post("/v1/jobs", json={"name": "needs-ok", "team": team, "gpus": 200, "gpu_models": ["T4"]})
    assert response.status_code == 201 and response.json()["state"] == "awaiting_approval", response.text
    return response.json()["approval_id"]


def member_token_id(admin: httpx.Client) -> str:
    response = admin.post("/v1/tokens", json={"name": "to-revoke", "role": "member", "team": OWN})
    return response.json()["token_id"]


def a_node(admin: httpx.Client) -> str:
    return admin.get("/v1/nodes").json()["items"][0]["node"]


def calls(admin: httpx.Client) -> dict[str, Callable[[httpx.Client], httpx.Response]]:
    job = {"name": "matrix", "gpus": 1, "gpu_models": ["T4"]}
    return {
        "submit a job for own team": lambda c: c.post("/v1/jobs", json={**job, "team": OWN}),
        "submit a job for another team": lambda c: c.post("/v1/jobs", json={**job, "team": OTHER}),
        "list jobs": lambda c: c.get("/v1/jobs"),
        "list another team's jobs": lambda c: c.get("/v1/jobs", params={"team": OTHER}),
        "read own team's job": lambda c: c.get(f"/v1/jobs/{pending_job(admin, OWN)}"),
        "read another team's job": lambda c: c.get(f"/v1/jobs/{pending_job(admin, OTHER)}"),
        # allowed: 404 NoLogs (a pending job without a command has none); denied: 403 before anything is read
        "read own team's job logs": lambda c: c.get(f"/v1/jobs/{pending_job(admin, OWN)}/logs"),
        "read another team's job logs": lambda c: c.get(f"/v1/jobs/{pending_job(admin, OTHER)}/logs"),
        "cancel own team's job": lambda c: c.post(f"/v1/jobs/{pending_job(admin, OWN)}/cancel"),
        "cancel another team's job": lambda c: c.post(f"/v1/jobs/{pending_job(admin, OTHER)}/cancel"),
        "complete own team's job": lambda c: c.post(f"/v1/jobs/{pending_job(admin, OWN)}/complete"),
        "complete another team's job": lambda c: c.post(f"/v1/jobs/{pending_job(admin, OTHER)}/complete"),
        "list nodes": lambda c: c.get("/v1/nodes"),
        "list allocations": lambda c: c.get("/v1/allocations"),
        "list teams": lambda c: c.get("/v1/teams"),
        "list reclamation trackers": lambda c: c.get("/v1/reclamation/tracked"),
        "read own team's usage": lambda c: c.get("/v1/usage", params={"team": OWN}),
        "read another team's usage": lambda c: c.get("/v1/usage", params={"team": OTHER}),
        "create a token in own team": lambda c: c.post("/v1/tokens", json={"name": "m", "role": "member", "team": OWN}),
        "list tokens": lambda c: c.get("/v1/tokens"),
        "revoke a token in own team": lambda c: c.delete(f"/v1/tokens/{member_token_id(admin)}"),
        "read the audit log": lambda c: c.get("/v1/audit"),
        "list scheduling decisions": lambda c: c.get("/v1/decisions"),
        "read own team's usage report": lambda c: c.get("/v1/reports/usage", params={"team": OWN}),
        "read another team's report": lambda c: c.get("/v1/reports/efficiency", params={"team": OTHER}),
        "read the capacity report": lambda c: c.get("/v1/reports/capacity"),
        "list cost rates": lambda c: c.get("/v1/cost-rates"),
        "set a cost rate": lambda c: c.put("/v1/cost-rates", json={
            "gpu_model": "H100-80GB", "effective_from": "2026-01-01T00:00:00Z", "price_per_hour": 2.5}),
        "read a node": lambda c: c.get(f"/v1/nodes/{a_node(admin)}"),
        "cordon a node": lambda c: c.post(f"/v1/nodes/{a_node(admin)}/cordon"),
        "uncordon a node": lambda c: c.post(f"/v1/nodes/{a_node(admin)}/uncordon"),
        "set a GPU's sharing mode": lambda c: c.put(f"/v1/nodes/{a_node(admin)}/gpus/0/sharing",
                                                    json={"mode": "exclusive"}),
        "list orphans": lambda c: c.get("/v1/orphans"),
        "ask for a quota loan for own team": lambda c: c.post("/v1/quota-loans", json={
            "path": f"default/{OWN}", "gpus": 1, "until": "2099-01-01T00:00:00Z", "reason": "matrix"}),
        "list quota loans": lambda c: c.get("/v1/quota-loans"),
        "ask who am I": lambda c: c.get("/v1/whoami"),
        "explain own team's job": lambda c: c.get(f"/v1/jobs/{pending_job(admin, OWN)}/explain"),
        "explain another team's job": lambda c: c.get(f"/v1/jobs/{pending_job(admin, OTHER)}/explain"),
        "read the pool summary": lambda c: c.get("/v1/pool"),
        "stream events": lambda c: c.get("/v1/events", params={"max_seconds": 1}),
        "create a team": lambda c: c.post("/v1/teams", json={"team": "matrix-team"}),
        "list quotas": lambda c: c.get("/v1/quotas"),
        "set a quota": lambda c: c.put("/v1/quotas", json={"path": "default/platform", "guaranteed": 0}),
        "list priority classes": lambda c: c.get("/v1/priority-classes"),
        "set a priority class": lambda c: c.put("/v1/priority-classes/matrix-class",
                                                json={"value": 1, "preemptible": True}),
        "list approval requests": lambda c: c.get("/v1/approvals"),
        "approve own team's request": lambda c: c.post(f"/v1/approvals/{approval_request(admin, OWN)}/approve"),
        "approve another team's request": lambda c: c.post(
            f"/v1/approvals/{approval_request(admin, OTHER)}/approve"),
        "set an approval rule": lambda c: c.put("/v1/approval-rules/priority_class",
                                                json={"value": "matrix-class", "enabled": False}),
    }


def test_every_endpoint_answers_every_role_as_the_matrix_says(platform, admin, tokens) -> None:
    actions = calls(admin)
    assert set(actions) == set(MATRIX)
    wrong = []
    for action, allowed_by_role in MATRIX.items():
        for role, allowed in zip(ROLES, allowed_by_role, strict=True):
            with httpx.Client(base_url=platform.gateway, timeout=10,
                              headers={"Authorization": f"Bearer {tokens[role]}"}) as client:
                response = actions[action](client)
            denied = response.status_code == 403
            if denied:
                assert response.json()["reason"] == "Forbidden"
            assert response.status_code not in (401, 500, 503), (action, role, response.text)
            if bool(allowed) == denied:
                wrong.append(f"{role:<15} {action:<32} expected {'allowed' if allowed else 'denied'}, "
                             f"got {response.status_code} {response.text[:120]}")
    assert wrong == [], "\n" + "\n".join(wrong)


def test_team_scoped_roles_only_ever_see_their_own_team(platform, admin, tokens) -> None:
    pending_job(admin, OTHER)
    pending_job(admin, OWN)
    for role in ("team-admin", "member", "viewer", "service"):
        with httpx.Client(base_url=platform.gateway, headers={"Authorization": f"Bearer {tokens[role]}"}) as c:
            teams = {j["team"] for j in c.get("/v1/jobs").json()["items"]}
            usage_teams = {u["team"] for u in c.get("/v1/usage").json()["items"]}
        assert teams == {OWN}, role
        assert usage_teams <= {OWN}, role


def test_token_secret_is_shown_once_and_a_revoked_token_stops_working(platform, admin) -> None:
    created = admin.post("/v1/tokens", json={"name": "short-lived", "role": "viewer", "team": OWN}).json()
    secret = created["token"]
    listed = admin.get("/v1/tokens").json()["items"]
    assert any(t["token_id"] == created["token_id"] for t in listed)
    assert all("token" not in t and "secret_hash" not in t for t in listed)
    assert secret not in admin.get("/v1/tokens").text
    headers = {"Authorization": f"Bearer {secret}"}
    assert httpx.get(f"{platform.gateway}/v1/whoami", headers=headers).json()["role"] == "viewer"
    assert admin.delete(f"/v1/tokens/{created['token_id']}").status_code == 204
    after = httpx.get(f"{platform.gateway}/v1/whoami", headers=headers)
    assert after.status_code == 401 and after.json()["reason"] == "TokenRevoked"
    forged = httpx.get(f"{platform.gateway}/v1/whoami", headers={"Authorization": f"Bearer {secret[:-2]}xx"})
    assert forged.status_code == 401 and forged.json()["reason"] == "InvalidToken"


def test_administrative_actions_are_audited_with_who_what_and_before_after(platform, admin) -> None:
    created = admin.post("/v1/tokens", json={"name": "audited", "role": "member", "team": OWN}).json()
    admin.delete(f"/v1/tokens/{created['token_id']}")
    job_id = pending_job(admin, OWN)
    admin.post(f"/v1/jobs/{job_id}/cancel", json={"reason": "audit me"})
    entries = admin.get("/v1/audit", params={"limit": 50}).json()["items"]
    by_target = {(e["action"], e["target"]): e for e in entries}
    create = by_target[("token.create", created["token_id"])]
    assert create["actor"] == "bootstrap-admin" and create["after"]["role"] == "member"
    assert create["before"] is None and "token" not in create["after"]
    revoke = by_target[("token.revoke", created["token_id"])]
    assert revoke["before"] == {"revoked_at": None} and revoke["after"]["revoked_at"]
    cancel = by_target[("job.cancel", job_id)]
    assert cancel["before"] == {"state": "pending"} and cancel["after"]["state"] == "cancelled"


def test_a_team_admin_cannot_mint_admin_tokens_or_tokens_for_other_teams(platform, tokens) -> None:
    with httpx.Client(base_url=platform.gateway, headers={"Authorization": f"Bearer {tokens['team-admin']}"}) as c:
        escalate = c.post("/v1/tokens", json={"name": "x", "role": "platform-admin"})
        other = c.post("/v1/tokens", json={"name": "x", "role": "member", "team": OTHER})
    assert escalate.status_code == 403 and other.status_code == 403


def test_oversized_bodies_are_refused_before_anything_else(platform, admin) -> None:
    huge = {"name": "x", "team": OWN, "gpus": 1, "pad": "y" * 100_000}
    response = admin.post("/v1/jobs", json=huge)
    assert response.status_code == 413 and response.json()["reason"] == "PayloadTooLarge"
