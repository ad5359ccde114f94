"""The JWT signature algorithms Pulsar's tokens use, by name only.

Kept apart from :mod:`magnetar.broker.auth.jwt_tokens` so that code needing just the names (the ``tokens``
command's options) does not load PyJWT and ``cryptography``, which cost megabytes of every process's memory.
"""

from __future__ import annotations

#: HMAC algorithms and the key size (bits) each needs.
SECRET_ALGORITHMS = {"HS256": 256, "HS384": 384, "HS512": 512}
RSA_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
#: ECDSA algorithms (curves P-256, P-384, P-521: ``jwt_tokens.EC_ALGORITHMS``).
EC_ALGORITHMS = ("ES256", "ES384", "ES512")
KEY_PAIR_ALGORITHMS = (*RSA_ALGORITHMS, *EC_ALGORITHMS)
