"""Authentication: who is calling. Three kinds of bearer token:

- the bootstrap admin token from settings (how the first admin gets in; rotate it by restarting with a new one),
- API tokens `gpt_<id>.<secret>` minted by `POST /v1/tokens` (hash stored, expiry, revocation),
- OIDC/JWT access tokens, validated against the configured issuer, audience and JWKS, when OIDC is configured.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from datetime import UTC, datetime

from libs.store.database import Pool
from services.gateway import store
from services.gateway.config import GatewaySettings
from services.gateway.domain import ROLES, Principal, secret_matches, split_token

log = logging.getLogger(__name__)


class AuthError(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class Authenticator:
    def __init__(self, settings: GatewaySettings, pool: Pool) -> None:
        self.settings = settings
        self.pool = pool
        self._jwks = None
        if settings.oidc_jwks_url:
            import jwt

            self._jwks = jwt.PyJWKClient(settings.oidc_jwks_url, cache_keys=True, lifespan=300)

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
            return await asyncio.to_thread(self._oidc, token)
        raise AuthError("InvalidToken", "the bearer token is not valid")

    async def _api_token(self, token_id: str, secret: str) -> Principal:
        async with self.pool.acquire() as conn:
            row = await store.find_token(conn, token_id)
            if row is None or not secret_matches(secret, row["secret_hash"]):
                raise AuthError("InvalidToken", "the bearer token is not valid")
            if row["revoked_at"] is not None:
                raise AuthError("TokenRevoked", "this token was revoked")
            if row["expires_at"] is not None and row["expires_at"] <= datetime.now(UTC):
                raise AuthError("TokenExpired", "this token has expired")
            await store.touch_token(conn, token_id)
        return Principal(subject=row["name"], role=row["role"], team=row["team"], via="token", token_id=token_id)

    def _oidc(self, token: str) -> Principal:
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
        role = claims.get(s.oidc_role_claim, s.oidc_default_role)
        if role not in ROLES:
            raise AuthError("InvalidToken", f"the identity token carries an unknown role {role!r}")
        team = claims.get(s.oidc_team_claim)
        return Principal(subject=str(claims["sub"]), role=role, team=team if isinstance(team, str) else None,
                         via="oidc")
