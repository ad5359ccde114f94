"""An HTTPS server on loopback that records the credentials clients send (the ``Authorization`` header, the
client certificate's CN), for the admin client and CLI tests; certificates from tests/tlsutil.py."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.tlsutil import Pki


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
    ctx.load_cert_chain(pki.server.cert, pki.server.key)
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
