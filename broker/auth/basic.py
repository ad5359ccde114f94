"""``basic`` authentication (Pulsar's ``AuthenticationProviderBasic``): user and password from an htpasswd file.

``basicAuthConf`` (a path, ``file:``, ``data:;base64,`` or ``env:``) holds ``user:hash`` lines. Hashes as
Pulsar checks them: ``$apr1$`` (Apache MD5) and what ``crypt`` knows (``$1$`` MD5, ``$5$`` SHA-256,
``$6$`` SHA-512, traditional DES); Magnetar also takes bcrypt (``$2y$``, ``htpasswd -B``), today's htpasswd
default. Clients send ``user:password`` as CONNECT ``auth_data`` or ``Authorization: Basic base64(...)``.
Hashing is slow by design, so it runs in a worker thread; successful checks are remembered (by a digest
of the password) so HTTP clients repeating the header do not pay it on every request.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
from collections import OrderedDict
from typing import ClassVar

import bcrypt
from passlib.hash import apr_md5_crypt, des_crypt, md5_crypt, sha256_crypt, sha512_crypt

from magnetar.broker.auth.keys import read_key_value
from magnetar.broker.auth.provider import Authenticated, AuthenticationData, AuthenticationProvider
from magnetar.broker.config import BrokerConfig
from magnetar.broker.errors import AuthenticationError

log = logging.getLogger(__name__)

_UNKNOWN = "Unknown user or invalid password"
_CACHE_SIZE = 1024


class BasicAuthenticationProvider(AuthenticationProvider):
    """Users and password hashes of an htpasswd file."""

    method: ClassVar[str] = "basic"

    def __init__(self, users: dict[str, str]) -> None:
        self.users = users
        self._verified: OrderedDict[tuple[str, bytes], str] = OrderedDict()

    @classmethod
    def from_config(cls, config: BrokerConfig) -> BasicAuthenticationProvider:
        if not config.basic_auth_conf.strip():
            raise ValueError("basicAuthConf is not set: the basic authentication provider needs an htpasswd file")
        return cls(parse_htpasswd(read_key_value(config.basic_auth_conf).decode("utf-8")))

    def accepts(self, data: AuthenticationData) -> bool:
        return data.command_data is not None or _authorization(data).upper().startswith("BASIC ")

    async def authenticate(self, data: AuthenticationData) -> Authenticated:
        user, password = _credentials(data)
        hashed = self.users.get(user)
        if hashed is None:
            raise AuthenticationError(_UNKNOWN)
        key = (user, hashlib.sha256(password.encode()).digest())
        if self._verified.get(key) == hashed:
            self._verified.move_to_end(key)
            return Authenticated(user)
        if not await asyncio.to_thread(verify_password, password, hashed):
            raise AuthenticationError(_UNKNOWN)
        self._verified[key] = hashed
        if len(self._verified) > _CACHE_SIZE:
            self._verified.popitem(last=False)
        return Authenticated(user)


def parse_htpasswd(text: str) -> dict[str, str]:
    """``user:hash`` lines (blank lines and ``#`` comments skipped) -> {user: hash}."""
    users = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, hashed = line.partition(":")
        if not sep or not user or not hashed or ":" in hashed:
            raise ValueError(f"The format of the password auth conf file is invalid (line {number})")
        users[user] = hashed
    return users


def verify_password(password: str, hashed: str) -> bool:
    """Whether ``password`` matches the htpasswd ``hashed`` (False for an unknown scheme)."""
    try:
        if hashed.startswith(("$2a$", "$2b$", "$2y$")):
            return bcrypt.checkpw(password.encode(), hashed.replace("$2y$", "$2b$", 1).encode())
        for scheme in (apr_md5_crypt, md5_crypt, sha256_crypt, sha512_crypt, des_crypt):
            if scheme.identify(hashed):
                return bool(scheme.verify(password, hashed))
    except ValueError as exc:  # a malformed hash in the file
        log.warning("cannot check a password against a malformed hash: %s", exc)
        return False
    return False  # an unknown scheme (or plain text) is never accepted


def _credentials(data: AuthenticationData) -> tuple[str, str]:
    if data.command_data is not None:
        text = data.command_data.decode("utf-8", errors="replace")
    elif data.http_headers is not None:
        header = _authorization(data)
        scheme, _, encoded = header.partition(" ")
        if scheme.upper() != "BASIC":
            raise AuthenticationError('Authentication token has to be started with "Basic "')
        if not encoded.strip():
            raise AuthenticationError("Base64 encoded token is not found")
        try:
            text = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
        except (binascii.Error, ValueError, UnicodeDecodeError) as exc:
            raise AuthenticationError(f"Base64 decoding is failure: {exc}") from None
    else:
        raise AuthenticationError("Authentication data source does not have data")
    user, sep, password = text.partition(":")
    if not sep or not user:
        raise AuthenticationError("Base64 decoded params are invalid")
    return user, password


def _authorization(data: AuthenticationData) -> str:
    return (data.http_headers or {}).get("Authorization", "")
