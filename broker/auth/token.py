"""``token`` authentication (Pulsar's ``AuthenticationProviderToken``): a JWT names the role.

The token comes as CONNECT/AUTH_RESPONSE ``auth_data`` or as ``Authorization: Bearer <jwt>``. It is
checked against ``tokenSecretKey`` (HMAC) or ``tokenPublicKey`` (RSA/EC, family from ``tokenPublicAlg``);
the role is the ``tokenAuthClaim`` claim (``sub``; a list gives its first string); ``exp`` bounds the
credentials (a binary connection is challenged once it passes); with ``tokenAudienceClaim`` the token must
name ``tokenAudience``. Failures read as Pulsar's: ``Failed to authentication token: <JJWT's reason>``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, ClassVar

from magnetar.broker.auth import jwt_tokens
from magnetar.broker.auth.keys import read_key_value
from magnetar.broker.auth.provider import Authenticated, AuthenticationData, AuthenticationProvider
from magnetar.broker.config import BrokerConfig
from magnetar.broker.errors import AuthenticationError

_BEARER = "Bearer "
_CACHE_SIZE = 1024


class TokenAuthenticationProvider(AuthenticationProvider):
    """JWT bearer tokens."""

    method: ClassVar[str] = "token"

    def __init__(
        self,
        key: bytes | jwt_tokens.PublicKey,
        role_claim: str = "sub",
        audience_claim: str = "",
        audience: str = "",
    ) -> None:
        if audience_claim and not audience:
            raise ValueError(
                f"Token Audience Claim [{audience_claim}] configured, but Audience stands for this broker not."
            )
        self.key = key
        self.role_claim = role_claim or "sub"
        self.audience_claim = audience_claim
        self.audience = audience
        self._verified: OrderedDict[str, dict[str, Any]] = OrderedDict()

    @classmethod
    def from_config(cls, config: BrokerConfig) -> TokenAuthenticationProvider:
        """The provider ``tokenSecretKey`` / ``tokenPublicKey`` describe (``ValueError`` if neither works)."""
        key: bytes | jwt_tokens.PublicKey
        if config.token_secret_key.strip():
            key = jwt_tokens.decode_secret_key(read_key_value(config.token_secret_key))
        elif config.token_public_key.strip():
            key = jwt_tokens.decode_public_key(read_key_value(config.token_public_key))
            jwt_tokens.check_key_algorithm(key, config.token_public_alg.strip() or "RS256")
        else:
            raise ValueError("No secret key was provided for token authentication (tokenSecretKey or tokenPublicKey)")
        return cls(key, config.token_auth_claim.strip(), config.token_audience_claim.strip(), config.token_audience)

    def accepts(self, data: AuthenticationData) -> bool:
        return data.command_data is not None or _authorization(data).startswith(_BEARER)

    async def authenticate(self, data: AuthenticationData) -> Authenticated:
        if data.command_data is not None:
            token = data.command_data.decode("utf-8", errors="replace")
        elif data.http_headers is not None:
            header = _authorization(data)
            if not header.startswith(_BEARER):
                raise AuthenticationError("Invalid HTTP Authorization header")
            token = header[len(_BEARER) :]
        else:
            raise AuthenticationError("No token credentials passed")
        if not token.strip():
            raise AuthenticationError("Blank token found")
        try:
            claims = self._verified_claims(token)
        except jwt_tokens.TokenError as exc:
            raise AuthenticationError(f"Failed to authentication token: {exc}") from None
        self._check_audience(claims)
        role = claims.get(self.role_claim)
        if isinstance(role, list):
            role = next((r for r in role if isinstance(r, str)), None)
        if not isinstance(role, str) or not role:
            raise AuthenticationError(f"Failed to authentication token: no role in claim '{self.role_claim}'")
        exp = claims.get("exp")
        return Authenticated(role, float(exp) if exp is not None else None)

    def _verified_claims(self, token: str) -> dict[str, Any]:
        """The claims of ``token`` once its signature checked out (remembered: checking costs ~0.2-0.4 ms,
        and HTTP clients send the same token with every request); expiry is checked at every use."""
        claims = self._verified.get(token)
        if claims is None:
            _header, claims = jwt_tokens.parse_token(token, self.key)
            self._verified[token] = claims
            if len(self._verified) > _CACHE_SIZE:
                self._verified.popitem(last=False)
        else:
            self._verified.move_to_end(token)
            jwt_tokens.check_expiry(claims)
        return claims

    def _check_audience(self, claims: dict[str, object]) -> None:
        if not self.audience_claim:
            return
        value = claims.get(self.audience_claim)
        if value is None:
            raise AuthenticationError(
                f"Failed to authentication token: Found null Audience in token, for claimed field: "
                f"{self.audience_claim}"
            )
        audiences = value if isinstance(value, list) else [value]
        if not all(isinstance(a, str) for a in audiences):
            raise AuthenticationError(f"Audiences in token is not in expected format: {value}")
        if self.audience not in audiences:
            raise AuthenticationError(
                f"Audiences in token: [{', '.join(audiences)}] not contains this broker: {self.audience}"  # type: ignore[arg-type]
            )


def _authorization(data: AuthenticationData) -> str:
    return (data.http_headers or {}).get("Authorization", "")
