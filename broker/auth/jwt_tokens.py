"""JSON Web Tokens as Pulsar makes and checks them (its ``AuthTokenUtils``), over PyJWT and ``cryptography``.

Both libraries are heavy (~10 MiB resident): only the token provider, once configured, and the ``tokens``
command import this module (the algorithm names are in :mod:`~magnetar.broker.auth.jwt_algorithms`).

Keys are Pulsar's formats: a secret key is raw bytes (HS256/384/512 by length, at least 256 bits); a key
pair is DER, the private key PKCS#8 and the public key X.509 SubjectPublicKeyInfo (PEM is accepted too).
Signing picks the algorithm from the key as Pulsar's JJWT does (a secret's length, an EC key's curve);
checking accepts every algorithm of the key's family and nothing else (never ``none``, never an HMAC
keyed with a public key), and reports failures with JJWT's wording, which Pulsar passes on.
"""

from __future__ import annotations

import base64
import json
import os
import time
from datetime import UTC, datetime
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from magnetar.broker.auth import jwt_algorithms
from magnetar.broker.auth.jwt_algorithms import KEY_PAIR_ALGORITHMS, RSA_ALGORITHMS, SECRET_ALGORITHMS

#: ECDSA algorithms and their curves.
EC_ALGORITHMS: dict[str, ec.EllipticCurve] = dict(
    zip(jwt_algorithms.EC_ALGORITHMS, (ec.SECP256R1(), ec.SECP384R1(), ec.SECP521R1()), strict=True)
)

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey
PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey


class TokenError(Exception):
    """A token that is malformed, badly signed, expired or not yet valid (message as JJWT's)."""


# ------------------------------------------------------------------------------------------- keys
def create_secret_key(algorithm: str = "HS256") -> bytes:
    """A new random secret key for ``algorithm`` (HS256: 32 bytes)."""
    if algorithm not in SECRET_ALGORITHMS:
        raise ValueError(f"{algorithm} is not an HMAC algorithm ({', '.join(SECRET_ALGORITHMS)})")
    return os.urandom(SECRET_ALGORITHMS[algorithm] // 8)


def create_key_pair(algorithm: str = "RS256") -> tuple[bytes, bytes]:
    """A new key pair for ``algorithm``: (PKCS#8 DER private key, X.509 DER public key)."""
    private: PrivateKey
    if algorithm in RSA_ALGORITHMS:
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    elif algorithm in EC_ALGORITHMS:
        private = ec.generate_private_key(EC_ALGORITHMS[algorithm])
    else:
        raise ValueError(f"The {algorithm} algorithm does not support Key Pairs.")
    private_der = private.private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_der = private.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private_der, public_der


def decode_secret_key(data: bytes) -> bytes:
    """A secret key from its raw bytes (JJWT refuses keys under 256 bits)."""
    if len(data) * 8 < 256:
        raise ValueError(f"The secret key is {len(data) * 8} bits, HMAC-SHA keys need at least 256 bits")
    return data


def decode_public_key(data: bytes) -> PublicKey:
    """An RSA or EC public key from DER (Pulsar's format) or PEM."""
    try:
        key = (
            serialization.load_pem_public_key(data)
            if data.lstrip().startswith(b"-----")
            else serialization.load_der_public_key(data)
        )
    except ValueError as exc:
        raise ValueError(f"Failed to decode public key: {exc}") from None
    if not isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey):
        raise ValueError("Failed to decode public key: only RSA and EC keys are supported")
    return key


def decode_private_key(data: bytes) -> PrivateKey:
    """An RSA or EC private key from PKCS#8 DER (Pulsar's format) or PEM."""
    try:
        key = (
            serialization.load_pem_private_key(data, password=None)
            if data.lstrip().startswith(b"-----")
            else serialization.load_der_private_key(data, password=None)
        )
    except (ValueError, TypeError) as exc:
        raise ValueError(f"Failed to decode private key: {exc}") from None
    if not isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
        raise ValueError("Failed to decode private key: only RSA and EC keys are supported")
    return key


def check_key_algorithm(key: PublicKey | PrivateKey, algorithm: str) -> None:
    """Refuse a key that cannot serve ``algorithm`` (``tokenPublicAlg``, ``--signature-algorithm``)."""
    if algorithm not in KEY_PAIR_ALGORITHMS:
        raise ValueError(f"invalid algorithm provided {algorithm}")
    family_rsa = algorithm in RSA_ALGORITHMS
    if family_rsa != isinstance(key, rsa.RSAPublicKey | rsa.RSAPrivateKey):
        raise ValueError(f"The key is not a{'n RSA' if family_rsa else 'n EC'} key, as {algorithm} needs")


def verification_algorithms(key: bytes | PublicKey) -> list[str]:
    """The algorithms a token checked with ``key`` may use."""
    if isinstance(key, bytes):
        return [alg for alg, bits in SECRET_ALGORITHMS.items() if len(key) * 8 >= bits]
    if isinstance(key, rsa.RSAPublicKey):
        return list(RSA_ALGORITHMS)
    return [alg for alg, curve in EC_ALGORITHMS.items() if key.curve.name == curve.name]


def signing_algorithm(key: bytes | PrivateKey, requested: str | None = None) -> str:
    """The algorithm to sign with ``key``: the strongest HMAC its length allows, the EC key's curve's, or
    ``requested`` (default RS256) for an RSA key."""
    if isinstance(key, bytes):
        return max(
            (alg for alg, bits in SECRET_ALGORITHMS.items() if len(key) * 8 >= bits),
            key=lambda alg: SECRET_ALGORITHMS[alg],
        )
    if isinstance(key, ec.EllipticCurvePrivateKey):
        for alg, curve in EC_ALGORITHMS.items():
            if key.curve.name == curve.name:
                return alg
        raise ValueError(f"unsupported EC curve {key.curve.name}")
    alg = requested or "RS256"
    check_key_algorithm(key, alg)
    return alg


# ------------------------------------------------------------------------------------------- tokens
def create_token(
    key: bytes | PrivateKey,
    subject: str,
    expires_at: float | None = None,
    headers: dict[str, Any] | None = None,
    algorithm: str | None = None,
) -> str:
    """A signed token for ``subject`` (claims ``sub`` and, with ``expires_at``, ``exp`` in epoch seconds)."""
    claims: dict[str, Any] = {"sub": subject}
    if expires_at is not None:
        claims["exp"] = int(expires_at)
    # JJWT's header: no "typ" unless asked for (PyJWT adds one by default).
    header: dict[str, Any] = {"typ": None, **(headers or {})}
    return jwt.encode(claims, key, algorithm=signing_algorithm(key, algorithm), headers=header)


def parse_token(token: str, key: bytes | PublicKey, now: float | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Check ``token``'s signature and times against ``key``: (header, claims), or :class:`TokenError`."""
    token = token.strip()
    if token.count(".") != 2:
        raise TokenError(f"JWT strings must contain exactly 2 period characters. Found: {token.count('.')}")
    try:
        header = jwt.get_unverified_header(token)
        claims = jwt.decode(
            token,
            key,
            algorithms=verification_algorithms(key),
            options={"verify_exp": False, "verify_aud": False, "verify_iss": False},
        )
    except jwt.InvalidSignatureError:
        raise TokenError(
            "JWT signature does not match locally computed signature. "
            "JWT validity cannot be asserted and should not be trusted."
        ) from None
    except jwt.InvalidAlgorithmError:
        raise TokenError("JWT signature algorithm is not supported by the configured key") from None
    except jwt.ImmatureSignatureError as exc:
        raise TokenError(f"JWT must not be accepted before the time in its 'nbf' claim ({exc})") from None
    except jwt.DecodeError as exc:
        raise TokenError(f"Malformed JWT: {exc}") from None
    except jwt.InvalidTokenError as exc:
        raise TokenError(str(exc)) from None
    check_expiry(claims, now)
    return header, claims


def check_expiry(claims: dict[str, Any], now: float | None = None) -> None:
    """:class:`TokenError` (JJWT's message) if the ``exp`` claim has passed."""
    exp = claims.get("exp")
    if exp is None:
        return
    if not isinstance(exp, int | float):
        raise TokenError("Malformed JWT: the 'exp' claim is not a number")
    current = time.time() if now is None else now
    if exp <= current:
        raise TokenError(
            f"JWT expired at {_iso(exp)}. Current time: {_iso(current)}, a difference of "
            f"{int((current - exp) * 1000)} milliseconds.  Allowed clock skew: 0 milliseconds."
        )


def decode_unverified(token: str) -> tuple[str, str]:
    """The header and payload JSON texts of ``token``, unchecked (``pulsar tokens show``)."""
    parts = token.strip().split(".")
    if len(parts) < 2:
        raise ValueError("not a JWT (no '.')")
    return _b64url_text(parts[0]), _b64url_text(parts[1])


def _b64url_text(part: str) -> str:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)).decode()


def claims_text(claims: dict[str, Any]) -> str:
    """``claims`` printed as Pulsar's ``tokens validate`` prints them (a Java map: ``{sub=admin, exp=...}``)."""
    return "{" + ", ".join(f"{k}={_java_value(v)}" for k, v in claims.items()) + "}"


def _java_value(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_java_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return claims_text(value)
    if isinstance(value, bool):
        return str(value).lower()
    return json.dumps(value) if value is None else str(value)


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(int(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
