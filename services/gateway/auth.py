"""Authentication: who is calling. Three kinds of bearer token:

- the bootstrap admin token from settings (how the first admin gets in; rotate it by restarting with a new one),
- API tokens `gpt_<id>.<secret>` minted by `POST /v1/tokens` (hash stored, expiry, revocation),
- OIDC/JWT access tokens, validated against the configured issuer, audience and JWKS, when OIDC is configured.

Verified tokens are cached for `token_cache_s`, so a busy client costs no database round trip (API tokens) or
signature check in a thread (JWTs) per request. An API token's secret is still checked against its hash and its
expiry against the clock on every request. Revocation stays immediate: PostgreSQL announces every change that can
withdraw a token (migration 0002, whoever made it), each gateway drops its copy on the announcement, and while that
announcement channel is down nothing is cached. A change's announcement and a lookup in flight are ordered by a
generation counter, so a lookup that raced a revocation is never cached.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from libs.contracts.commands import NAME_PATTERN
from libs.store.database import Pool
from services.gateway import store
from services.gateway.config import GatewaySettings
from services.gateway.domain import ROLES, Principal, hash_secret, split_token

log = logging.getLogger(__name__)

TOUCH_EVERY_S = 60.0  # last_used_at is for people: at most one write a minute per token
CACHE_SIZE = 10_000
TEAM_NAME = re.compile(NAME_PATTERN)


class AuthError(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass(slots=True)
class _Verified:
    principal: Principal
    secret_hash: str
    expires_at: datetime | None
    fresh_until: float  # time.monotonic()
    touched_at: float


class Authenticator:
    def __init__(self, settings: GatewaySettings, pool: Pool) -> None:
        self.settings = settings
        self.pool = pool
        self.cache_s = settings.token_cache_s
        self.lookups = 0  # API-token lookups in the database (each cache miss): what the cache saves
        self._tokens: dict[str, _Verified] = {}
        self._jwts: dict[bytes, tuple[Principal, float]] = {}
        self._generation = 0  # bumped by every announced change: a lookup that spans one is not cached
        self._listener: Any = None  # the pooled connection that LISTENs, while it does
        self._stop_listening: Any = None
        self._reconnect: asyncio.Task[None] | None = None
        self._closed = False
        self._jwks = None
        if settings.oidc_jwks_url:
            import jwt

            self._jwks = jwt.PyJWKClient(settings.oidc_jwks_url, cache_keys=True, lifespan=300)

    # --- the change announcements --------------------------------------------------------------------------------
    async def start(self) -> None:
        """Listen for token changes; API tokens are cached only while this listens."""
        if self.cache_s <= 0:
            return
        try:
            await self._listen()
        except Exception as exc:  # the gateway still serves, uncached, and keeps trying
            log.warning("token_listener_failed", extra={"error": str(exc)})
            self._schedule_reconnect()

    async def _listen(self) -> None:
        conn = await self.pool.acquire()
        try:
            self._stop_listening = await store.listen_token_changes(conn, self.forget, self._lost)
        except BaseException:
            await self.pool.release(conn)
            raise
        self._listener = conn
        self._generation += 1

    def _lost(self) -> None:
        log.warning("token_listener_lost")
        dead, self._listener = self._listener, None
        self._invalidate_all()
        if dead is not None:  # its pool slot comes back once the pool sees it closed
            asyncio.get_running_loop().create_task(self._release_quietly(dead))
        if not self._closed:
            self._schedule_reconnect()

    def _schedule_reconnect(self) -> None:
        if self._reconnect is None or self._reconnect.done():
            self._reconnect = asyncio.get_running_loop().create_task(self._reconnect_loop())

    async def _release_quietly(self, conn: Any) -> None:
        with contextlib.suppress(Exception):
            await self.pool.release(conn)

    async def _reconnect_loop(self) -> None:
        delay = 0.5
        while not self._closed and self._listener is None:
            await asyncio.sleep(delay)
            try:
                await self._listen()
            except Exception as exc:
                log.warning("token_listener_failed", extra={"error": str(exc)})
                delay = min(delay * 2, 10.0)

    async def close(self) -> None:
        self._closed = True
        if self._reconnect is not None:
            self._reconnect.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconnect
        conn, self._listener = self._listener, None
        self._invalidate_all()
        if conn is not None:
            with contextlib.suppress(Exception):
                await self._stop_listening()
            with contextlib.suppress(Exception):
                await self.pool.release(conn)

    def forget(self, token_id: str) -> None:
        """Drop a token's cached verification (it was revoked or changed)."""
        self._generation += 1
        self._tokens.pop(token_id, None)

    def _invalidate_all(self) -> None:
        self._generation += 1
        self._tokens.clear()

    # --- verification ---------------------------------------------------------------------------------------------
    async def authenticate(self, token: str) -> Principal:
        if not token:
            raise AuthError("Unauthenticated", "send Authorization: Bearer <token>")
        bootstrap = self.settings.admin_token
        if bootstrap and hmac.compare_digest(token.encode(), bootstrap.encode()):
            return Principal(subject="bootstrap-admin", role="platform-admin", team=None, via="bootstrap")
        parts = split_token(token)
        if parts is not None:
            return await self._api_token(*parts)
        if self._jwks is not None and token.count(".") == 2:
            key = hashlib.sha256(token.encode()).digest()
            hit = self._jwts.get(key)
            if hit is not None and hit[1] > time.monotonic():
                return hit[0]
            principal, exp = await asyncio.to_thread(self._oidc, token)
            if self.cache_s > 0:
                # never past the token's own expiry (wall clock, read as a monotonic deadline)
                until = time.monotonic() + min(self.cache_s, exp - time.time())
                self._remember(self._jwts, key, (principal, until))
            return principal
        raise AuthError("InvalidToken", "the bearer token is not valid")

    async def _api_token(self, token_id: str, secret: str) -> Principal:
        now = time.monotonic()
        hit = self._tokens.get(token_id)
        if hit is not None and hit.fresh_until > now:
            if not hmac.compare_digest(hash_secret(secret), hit.secret_hash):
                raise AuthError("InvalidToken", "the bearer token is not valid")
            if hit.expires_at is not None and hit.expires_at <= datetime.now(UTC):
                self._tokens.pop(token_id, None)
                raise AuthError("TokenExpired", "this token has expired")
            if now - hit.touched_at >= TOUCH_EVERY_S:
                hit.touched_at = now
                async with self.pool.acquire() as conn:
                    await store.touch_token(conn, token_id)
            return hit.principal
        generation = self._generation if self._listener is not None else None
        self.lookups += 1
        async with self.pool.acquire() as conn:
            row = await store.find_token(conn, token_id)
            if row is None or not hmac.compare_digest(hash_secret(secret), row["secret_hash"]):
                raise AuthError("InvalidToken", "the bearer token is not valid")
            if row["revoked_at"] is not None:
                raise AuthError("TokenRevoked", "this token was revoked")
            if row["expires_at"] is not None and row["expires_at"] <= datetime.now(UTC):
                raise AuthError("TokenExpired", "this token has expired")
            await store.touch_token(conn, token_id)
        principal = Principal(subject=row["name"], role=row["role"], team=row["team"], via="token",
                              token_id=token_id)
        if generation is not None and generation == self._generation and self._listener is not None \
                and self.cache_s > 0:
            now = time.monotonic()
            self._remember(self._tokens, token_id, _Verified(principal, row["secret_hash"], row["expires_at"],
                                                             now + self.cache_s, now))
        return principal

    @staticmethod
    def _remember(cache: dict, key: Any, value: Any) -> None:
        if len(cache) >= CACHE_SIZE:
            cache.pop(next(iter(cache)))  # the oldest entry
        cache[key] = value

    def _oidc(self, token: str) -> tuple[Principal, float]:
        """The principal and the token's expiry (epoch seconds)."""
        import jwt

        s = self.settings
        assert self._jwks is not None
        try:
            key = self._jwks.get_signing_key_from_jwt(token)
            claims = jwt.decode(token, key.key, algorithms=["RS256", "ES256", "PS256", "EdDSA"],
                                audience=s.oidc_audience, issuer=s.oidc_issuer,
                                options={"require": ["exp", "iss", "sub"]})
        except jwt.ExpiredSignatureError as exc:
            raise AuthError("TokenExpired", "the identity token has expired") from exc
        except (jwt.PyJWTError, jwt.PyJWKClientError) as exc:
            log.info("oidc_token_rejected", extra={"error": str(exc)})
            raise AuthError("InvalidToken", "the identity token is not valid for this gateway") from exc
        return oidc_principal(claims, s), float(claims["exp"])


def oidc_principal(claims: dict[str, Any], s: GatewaySettings) -> Principal:
    """The principal a verified token's claims name. Malformed claims are refused, not guessed at: a role or team
    that is not one string of the right form, or a subject that is not a string. A token without a team claim
    gets a principal without a team, which sees nothing team-scoped unless its role is platform-wide."""
    role = claims.get(s.oidc_role_claim, s.oidc_default_role)
    if not isinstance(role, str) or role not in ROLES:
        raise AuthError("InvalidToken", f"the identity token carries an unknown role {str(role)[:64]!r}")
    team = claims.get(s.oidc_team_claim)
    if team is not None and not (isinstance(team, str) and TEAM_NAME.fullmatch(team)):
        raise AuthError("InvalidToken", f"the identity token's {s.oidc_team_claim} claim must be one team name")
    subject = claims["sub"]
    if not isinstance(subject, str) or not 0 < len(subject) <= 255:
        raise AuthError("InvalidToken", "the identity token's sub claim must be a string of 1–255 characters")
    return Principal(subject=subject, role=role, team=team, via="oidc")
