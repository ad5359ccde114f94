"""``magnetar tokens``: make and inspect JWTs as ``pulsar tokens`` does.

``create-secret-key`` writes a raw HMAC key (or its base64 with ``--base64``) to ``--output`` or stdout;
``create-key-pair`` writes a DER private key (PKCS#8) and public key (X.509); ``create`` prints a token
signed with ``--secret-key`` or ``--private-key`` (``file:///...``, ``data:;base64,...``, ``env:VAR``, a
path or base64); ``show`` prints a token's header and claims; ``validate`` checks a token against a key
and prints its claims as Pulsar does (``{sub=admin}``). Keys are what the broker's ``tokenSecretKey`` /
``tokenPublicKey`` read.
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
import time
from pathlib import Path
from typing import Any

from magnetar.broker.auth import jwt_algorithms
from magnetar.broker.auth.keys import read_key_value
from magnetar.cli.admin.values import parse_relative_time


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tokens", help="create keys and JSON Web Tokens (as `pulsar tokens`)")
    commands = p.add_subparsers(dest="tokens_command", required=True, metavar="COMMAND")

    c = commands.add_parser("create-secret-key", help="Create a new secret key")
    c.add_argument("-a", "--signature-algorithm", default="HS256", choices=sorted(jwt_algorithms.SECRET_ALGORITHMS))
    c.add_argument("-o", "--output", help="Write the secret key to a file instead of stdout")
    c.add_argument("-b", "--base64", action="store_true", help="Encode the key in base64")
    c.set_defaults(run=_create_secret_key)

    c = commands.add_parser("create-key-pair", help="Create a new pair of keys public/private")
    c.add_argument("-a", "--signature-algorithm", default="RS256", choices=jwt_algorithms.KEY_PAIR_ALGORITHMS)
    c.add_argument("--output-private-key", required=True, help="File where to write the private key")
    c.add_argument("--output-public-key", required=True, help="File where to write the public key")
    c.set_defaults(run=_create_key_pair)

    c = commands.add_parser("create", help="Create a new token")
    c.add_argument(
        "-a",
        "--signature-algorithm",
        default=None,
        choices=jwt_algorithms.RSA_ALGORITHMS,
        help="Algorithm for an RSA private key (default RS256; EC keys and secret keys imply theirs)",
    )
    c.add_argument("-s", "--subject", required=True, help="The 'subject' or 'principal' of the token")
    c.add_argument("-e", "--expiry-time", help="Relative expiry time (eg: 1h, 3d, 10y; m=minutes). Default: none")
    c.add_argument("-sk", "--secret-key", help="Secret key to sign with (data:, file:, env:, path or base64)")
    c.add_argument("-pk", "--private-key", help="Private key to sign with (data:, file:, env:, path or base64)")
    c.add_argument(
        "-hs", "--headers", action="append", default=[], metavar="KEY=VALUE", help="Additional header (repeatable)"
    )
    c.set_defaults(run=_create)

    for name, help_text in (("show", "Show the content of token"), ("validate", "Validate a token against a key")):
        c = commands.add_parser(name, help=help_text)
        c.add_argument("token", nargs="?", help="The token string")
        c.add_argument("-i", "--stdin", action="store_true", help="Read token from standard input")
        c.add_argument("-f", "--token-file", help="Read token from a file")
        if name == "validate":
            c.add_argument("-a", "--signature-algorithm", default="RS256", choices=jwt_algorithms.KEY_PAIR_ALGORITHMS)
            c.add_argument("-sk", "--secret-key", help="Secret key to validate with (data:, file:, ...)")
            c.add_argument("-pk", "--public-key", help="Public key to validate with (data:, file:, ...)")
            c.set_defaults(run=_validate)
        else:
            c.set_defaults(run=_show)


def _fail(message: str) -> int:
    print(message, file=sys.stderr)
    return 1


def _create_secret_key(args: argparse.Namespace) -> int:
    from magnetar.broker.auth import jwt_tokens  # PyJWT and cryptography: only for these commands

    key = jwt_tokens.create_secret_key(args.signature_algorithm)
    if args.base64:
        key = base64.b64encode(key)
    if args.output:
        Path(args.output).write_bytes(key)
        os.chmod(args.output, 0o600)
    else:
        sys.stdout.buffer.write(key)
        sys.stdout.flush()
    return 0


def _create_key_pair(args: argparse.Namespace) -> int:
    from magnetar.broker.auth import jwt_tokens

    private, public = jwt_tokens.create_key_pair(args.signature_algorithm)
    Path(args.output_public_key).write_bytes(public)
    Path(args.output_private_key).write_bytes(private)
    os.chmod(args.output_private_key, 0o600)
    return 0


def _create(args: argparse.Namespace) -> int:
    from magnetar.broker.auth import jwt_tokens

    if (args.secret_key is None) == (args.private_key is None):
        return _fail("Exactly one of --secret-key and --private-key needs to be passed for signing a token")
    headers: dict[str, Any] = {}
    for item in args.headers:
        name, sep, value = item.partition("=")
        if not sep or not name:
            return _fail(f"invalid header {item!r}: use KEY=VALUE")
        headers[name] = value
    try:
        expires_at = time.time() + parse_relative_time(args.expiry_time) if args.expiry_time else None
        key: bytes | jwt_tokens.PrivateKey
        if args.private_key is not None:
            key = jwt_tokens.decode_private_key(read_key_value(args.private_key))
        else:
            key = jwt_tokens.decode_secret_key(read_key_value(args.secret_key))
        print(jwt_tokens.create_token(key, args.subject, expires_at, headers, args.signature_algorithm))
    except ValueError as exc:
        return _fail(str(exc))
    return 0


def _read_token(args: argparse.Namespace) -> str | None:
    if args.token:
        return args.token
    if args.stdin:
        return sys.stdin.readline().strip()
    if args.token_file:
        return Path(args.token_file).read_text().strip()
    return os.environ.get("TOKEN")


_NO_TOKEN = (
    "Token needs to be either passed as an argument or through `--stdin`, `--token-file` or by the `TOKEN` "
    "environment variable"
)


def _show(args: argparse.Namespace) -> int:
    from magnetar.broker.auth import jwt_tokens

    token = _read_token(args)
    if token is None:
        return _fail(_NO_TOKEN)
    try:
        header, payload = jwt_tokens.decode_unverified(token)
    except (ValueError, UnicodeDecodeError) as exc:
        return _fail(f"invalid token: {exc}")
    print(header)
    print("---")
    print(payload)
    return 0


def _validate(args: argparse.Namespace) -> int:
    from magnetar.broker.auth import jwt_tokens

    if (args.secret_key is None) == (args.public_key is None):
        return _fail("Exactly one of --secret-key and --public-key needs to be passed for validating a token")
    token = _read_token(args)
    if token is None:
        return _fail(_NO_TOKEN)
    try:
        key: bytes | jwt_tokens.PublicKey
        if args.public_key is not None:
            key = jwt_tokens.decode_public_key(read_key_value(args.public_key))
            jwt_tokens.check_key_algorithm(key, args.signature_algorithm)
        else:
            key = jwt_tokens.decode_secret_key(read_key_value(args.secret_key))
        _header, claims = jwt_tokens.parse_token(token, key)
    except (ValueError, jwt_tokens.TokenError) as exc:
        return _fail(str(exc))
    print(jwt_tokens.claims_text(claims))
    return 0
