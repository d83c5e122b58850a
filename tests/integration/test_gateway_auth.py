"""Gateway authentication against a real PostgreSQL: API tokens and OIDC/JWT tokens checked against a JWKS
served over HTTP on loopback (the same path a real identity provider takes)."""

from __future__ import annotations

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
    yield Authenticator(settings, pool)
    await pool.close()


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
    with pytest.raises(AuthError) as revoked:
        await auth.authenticate(token)
    assert revoked.value.reason == "TokenRevoked"

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
