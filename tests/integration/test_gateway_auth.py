"""Gateway authentication against a real PostgreSQL: API tokens and OIDC/JWT tokens checked against a JWKS
served over HTTP on loopback (the same path a real identity provider takes)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from libs.store.database import create_pool
from libs.store.migrations import migrate, package_migrations, store_migrations
from services.gateway import store
from services.gateway.auth import Authenticator, AuthError
from services.gateway.config import GatewaySettings
from services.gateway.domain import mint_token

ISSUER, AUDIENCE = "https://idp.example.test", "gpupool"


@pytest.fixture(scope="module")
def signing_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def jwks_url(signing_key: rsa.RSAPrivateKey) -> Iterator[str]:
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(signing_key.public_key()))
    body = json.dumps({"keys": [{**public, "kid": "k1", "use": "sig", "alg": "RS256"}]}).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
    server.shutdown()


@pytest.fixture
async def auth(pg_database: str, jwks_url: str):  # type: ignore[no-untyped-def]
    pool = await create_pool(pg_database)
    await migrate(pool, store_migrations() + package_migrations("gateway", "services.gateway"))
    settings = GatewaySettings(admin_token="bootstrap-secret", oidc_issuer=ISSUER, oidc_audience=AUDIENCE,
                               oidc_jwks_url=jwks_url, database_url=pg_database)
    authenticator = Authenticator(settings, pool)
    await authenticator.start()
    yield authenticator
    await authenticator.close()
    await pool.close()


async def refused_within(auth: Authenticator, token: str, seconds: float = 5.0) -> AuthError:
    """The caching gateway learns of a change made elsewhere from PostgreSQL's announcement, moments later."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            await auth.authenticate(token)
        except AuthError as exc:
            return exc
        assert time.monotonic() < deadline, "the token still authenticates"
        await asyncio.sleep(0.01)


async def new_token(auth: Authenticator, **fields: object) -> tuple[str, str]:
    token_id, token, secret_hash = mint_token()
    values = {"name": "bob", "role": "member", "team": "research", "expires_at": None, **fields}
    async with auth.pool.acquire() as conn:
        await store.insert_token(conn, token_id=token_id, secret_hash=secret_hash, created_by="test",
                                 **values)  # type: ignore[arg-type]
    return token_id, token


def sign(key: rsa.RSAPrivateKey, **claims: object) -> str:
    now = int(time.time())
    base = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "iat": now, "exp": now + 300}
    return jwt.encode({**base, **claims}, key, algorithm="RS256", headers={"kid": "k1"})


async def test_bootstrap_token_is_a_platform_admin(auth) -> None:  # type: ignore[no-untyped-def]
    principal = await auth.authenticate("bootstrap-secret")
    assert (principal.role, principal.team, principal.via) == ("platform-admin", None, "bootstrap")


async def test_api_token_authenticates_until_revoked_or_expired(auth) -> None:  # type: ignore[no-untyped-def]
    token_id, token, secret_hash = mint_token()
    async with auth.pool.acquire() as conn:
        await store.insert_token(conn, token_id=token_id, name="bob", role="member", team="research",
                                 secret_hash=secret_hash, created_by="test", expires_at=None)
    principal = await auth.authenticate(token)
    assert (principal.subject, principal.role, principal.team) == ("bob", "member", "research")
    async with auth.pool.acquire() as conn:
        await store.revoke_token(conn, token_id)
    assert (await refused_within(auth, token)).reason == "TokenRevoked"

    old_id, old_token, old_hash = mint_token()
    async with auth.pool.acquire() as conn:
        await store.insert_token(conn, token_id=old_id, name="old", role="viewer", team="research",
                                 secret_hash=old_hash, created_by="test",
                                 expires_at=datetime.now(UTC) - timedelta(seconds=1))
    with pytest.raises(AuthError) as expired:
        await auth.authenticate(old_token)
    assert expired.value.reason == "TokenExpired"


async def test_a_token_with_a_wrong_secret_is_invalid_and_only_its_hash_is_stored(auth) -> None:  # type: ignore[no-untyped-def]
    token_id, token, secret_hash = mint_token()
    async with auth.pool.acquire() as conn:
        await store.insert_token(conn, token_id=token_id, name="eve", role="member", team="research",
                                 secret_hash=secret_hash, created_by="test", expires_at=None)
        stored = await conn.fetchval("SELECT secret_hash FROM api_tokens WHERE token_id = $1", token_id)
    assert token.split(".", 1)[1] not in stored
    with pytest.raises(AuthError) as bad:
        await auth.authenticate(token[:-3] + "abc")
    assert bad.value.reason == "InvalidToken"


async def test_oidc_token_from_the_configured_issuer_maps_role_and_team(auth, signing_key) -> None:  # type: ignore[no-untyped-def]
    principal = await auth.authenticate(sign(signing_key, gpupool_role="team-admin", gpupool_team="research"))
    assert (principal.subject, principal.role, principal.team, principal.via) == (
        "alice", "team-admin", "research", "oidc")


async def test_oidc_tokens_with_wrong_audience_issuer_signature_or_expiry_are_refused(auth, signing_key) -> None:  # type: ignore[no-untyped-def]
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cases = {
        "wrong audience": (sign(signing_key, aud="someone-else"), "InvalidToken"),
        "wrong issuer": (sign(signing_key, iss="https://evil.test"), "InvalidToken"),
        "wrong key": (sign(other_key), "InvalidToken"),
        "expired": (sign(signing_key, exp=int(time.time()) - 60), "TokenExpired"),
        "unknown role": (sign(signing_key, gpupool_role="god"), "InvalidToken"),
    }
    for name, (token, reason) in cases.items():
        with pytest.raises(AuthError) as refused:
            await auth.authenticate(token)
        assert refused.value.reason == reason, name


async def test_malformed_oidc_claims_are_refused_not_guessed_at(auth, signing_key) -> None:  # type: ignore[no-untyped-def]
    """A team claim given as a list once became "no team", which saw every team: now it is a 401."""
    cases = {
        "team as a list": sign(signing_key, gpupool_role="member", gpupool_team=["research", "inference"]),
        "team as a number": sign(signing_key, gpupool_role="member", gpupool_team=7),
        "team not a name": sign(signing_key, gpupool_role="member", gpupool_team="Research Team!"),
        "role as a list": sign(signing_key, gpupool_role=["platform-admin"]),
        "subject as a number": sign(signing_key, sub=42),
    }
    for name, token in cases.items():
        with pytest.raises(AuthError) as refused:
            await auth.authenticate(token)
        assert refused.value.reason == "InvalidToken", name


async def test_an_oidc_principal_without_a_team_sees_nothing_team_scoped(auth, signing_key) -> None:  # type: ignore[no-untyped-def]
    """Before: a member token without a team claim read every team's jobs, usage and approvals."""
    from services.gateway.domain import ANY, Action

    for role in ("team-admin", "member", "viewer", "service"):
        principal = await auth.authenticate(sign(signing_key, sub=f"no-team-{role}", gpupool_role=role))
        assert principal.team is None
        for action in (Action.JOB_READ, Action.USAGE_READ, Action.JOB_SUBMIT, Action.JOB_CANCEL):
            assert principal.scope(action) is None, (role, action)
            assert not principal.may(action) and not principal.may(action, "research"), (role, action)
        assert principal.may(Action.POOL_READ)  # what every role may read stays readable
    operator = await auth.authenticate(sign(signing_key, sub="ops", gpupool_role="operator"))
    assert operator.scope(Action.JOB_READ) == ANY  # a platform-wide role needs no team


async def test_a_verified_token_is_reused_without_a_lookup_but_its_secret_is_checked_every_time(auth) -> None:  # type: ignore[no-untyped-def]
    token_id, token = await new_token(auth)
    for _ in range(20):
        assert (await auth.authenticate(token)).subject == "bob"
    assert auth.lookups == 1
    with pytest.raises(AuthError) as bad:
        await auth.authenticate(token[:-3] + "abc")
    assert bad.value.reason == "InvalidToken"


async def test_a_revocation_made_in_sql_reaches_a_gateway_that_cached_the_token(auth) -> None:  # type: ignore[no-untyped-def]
    token_id, token = await new_token(auth)
    await auth.authenticate(token)
    await auth.authenticate(token)
    assert auth.lookups == 1  # cached
    async with auth.pool.acquire() as conn:
        await conn.execute("UPDATE api_tokens SET revoked_at = now() WHERE token_id = $1", token_id)
    assert (await refused_within(auth, token, seconds=2.0)).reason == "TokenRevoked"
    _, other = await new_token(auth, name="carol")
    await auth.authenticate(other)
    async with auth.pool.acquire() as conn:  # deleting a token withdraws it too
        await conn.execute("DELETE FROM api_tokens WHERE name = 'carol'")
    assert (await refused_within(auth, other, seconds=2.0)).reason == "InvalidToken"


async def test_a_cached_token_stops_working_when_it_expires(auth) -> None:  # type: ignore[no-untyped-def]
    _, token = await new_token(auth, expires_at=datetime.now(UTC) + timedelta(seconds=1.5))
    await auth.authenticate(token)
    await asyncio.sleep(1.6)
    with pytest.raises(AuthError) as expired:
        await auth.authenticate(token)
    assert expired.value.reason == "TokenExpired"
    assert auth.lookups == 1  # decided from the cached expiry, not a new lookup


async def test_without_the_change_announcements_nothing_is_cached_until_they_are_back(auth) -> None:  # type: ignore[no-untyped-def]
    token_id, token = await new_token(auth)
    await auth.authenticate(token)
    async with auth.pool.acquire() as conn:
        killed = await conn.fetchval(
            """SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
               WHERE datname = current_database() AND query LIKE 'LISTEN%'""")
    assert killed == 1
    deadline = time.monotonic() + 5
    while True:  # the listening connection dies; its replacement starts listening after a short back-off
        before = auth.lookups
        await auth.authenticate(token)
        if auth.lookups > before:
            break
        assert time.monotonic() < deadline, "the gateway kept using its cache after losing the announcements"
        await asyncio.sleep(0.01)
    deadline = time.monotonic() + 10
    while True:  # back to cached once the listener is back
        await auth.authenticate(token)
        before = auth.lookups
        await auth.authenticate(token)
        if auth.lookups == before:
            break
        assert time.monotonic() < deadline, "the gateway did not listen again"
        await asyncio.sleep(0.1)
    async with auth.pool.acquire() as conn:
        await store.revoke_token(conn, token_id)
    assert (await refused_within(auth, token, seconds=2.0)).reason == "TokenRevoked"


async def test_a_verified_oidc_token_is_reused_until_it_expires(auth, signing_key) -> None:  # type: ignore[no-untyped-def]
    token = sign(signing_key, exp=int(time.time()) + 2)
    assert (await auth.authenticate(token)).subject == "alice"
    assert (await auth.authenticate(token)).subject == "alice"
    await asyncio.sleep(2.2)
    with pytest.raises(AuthError) as expired:
        await auth.authenticate(token)
    assert expired.value.reason == "TokenExpired"
