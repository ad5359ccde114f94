"""Test PKI made with ``cryptography`` (a CA, a server certificate for 127.0.0.1/localhost, a client certificate)
and an HTTPS server recording what clients send: never committed keys."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass
class Pki:
    """PEM files under one directory: ``ca``, ``server`` (SAN 127.0.0.1, localhost), ``client`` (CN ``role``)."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: Path, key: ec.EllipticCurvePrivateKey | None, cert: x509.Certificate | None) -> None:
    if key is not None:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    if cert is not None:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def make_pki(
    directory: Path, client_cn: str = "client-role", server_hosts: tuple[str, ...] = ("127.0.0.1", "localhost")
) -> Pki:
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("magnetar-test-ca"))
        .issuer_name(_name("magnetar-test-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(cn: str, sans: list[x509.GeneralName]) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(cn))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        return key, builder.sign(ca_key, hashes.SHA256())

    sans: list[x509.GeneralName] = []
    for host in server_hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    server_key, server = leaf("magnetar-test-server", sans)
    client_key, client = leaf(client_cn, [])
    pki = Pki(*(directory / n for n in ("ca.pem", "server.pem", "server-key.pem", "client.pem", "client-key.pem")))
    _write(pki.ca_cert, None, ca)
    _write(pki.server_cert, None, server)
    _write(pki.server_key, server_key, None)
    _write(pki.client_cert, None, client)
    _write(pki.client_key, client_key, None)
    return pki


@dataclass
class Recorder:
    """What the server saw: the ``Authorization`` header and the client certificate's CN of each request."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    #: Answer 401 unless the Authorization header equals this (None: accept anything).
    expect_authorization: str | None = None


@contextmanager
def https_server(pki: Pki, recorder: Recorder, require_client_cert: bool = False) -> Iterator[str]:
    """An HTTPS server on 127.0.0.1 answering ``{"ok": true}`` (or Pulsar's 401 JSON); yields its base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            peer = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
            cn = None
            for rdn in (peer or {}).get("subject", ()):
                for key, value in rdn:
                    if key == "commonName":
                        cn = value
            auth = self.headers.get("Authorization")
            recorder.requests.append({"path": self.path, "authorization": auth, "client_cn": cn})
            if recorder.expect_authorization is not None and auth != recorder.expect_authorization:
                status, body = 401, {"reason": "Authentication required"}
            else:
                status, body = 200, {"ok": True}
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki.server_cert, pki.server_key)
    ctx.load_verify_locations(pki.ca_cert)
    ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
