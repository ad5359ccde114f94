"""Certificates for tests, generated on the fly with ``cryptography`` (never committed).

:func:`make_pki` writes a CA, a server certificate for ``127.0.0.1``/``localhost`` and a client certificate
(CN = the role, for mTLS authentication) as PEM files; :func:`issue` signs more (rotation, other roles).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CertFiles:
    """A certificate and its key (PEM files) and the certificate's serial number."""

    cert: Path
    key: Path
    serial: int


@dataclass(frozen=True)
class Pki:
    """A test CA with one server and one client certificate."""

    ca: CertFiles
    server: CertFiles
    client: CertFiles

    @property
    def ca_cert(self) -> Path:
        return self.ca.cert


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> CertFiles:
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / f"{stem}.cert.pem", directory / f"{stem}.key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return CertFiles(cert_path, key_path, cert.serial_number)


def make_ca(directory: Path, cn: str = "magnetar-test-ca") -> CertFiles:
    """A self-signed CA certificate (``ca.cert.pem`` / ``ca.key.pem`` in ``directory``)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _write(directory, "ca", cert, key)


def issue(
    ca: CertFiles, directory: Path, stem: str, cn: str, *, server: bool, hosts: tuple[str, ...] = ()
) -> CertFiles:
    """A certificate signed by ``ca``: a server certificate for ``hosts`` (IP addresses or DNS names), or a
    client certificate whose common name is ``cn``."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
    )
    if hosts:
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    return _write(directory, stem, cert, key)


def make_pki(directory: Path, client_cn: str = "client-role") -> Pki:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate (CN ``client_cn``)."""
    ca = make_ca(directory)
    server = issue(ca, directory, "server", "localhost", server=True, hosts=("127.0.0.1", "localhost"))
    client = issue(ca, directory, "client", client_cn, server=False)
    return Pki(ca, server, client)


def serial_of(pem: bytes | str) -> int:
    """Serial number of a PEM (or DER) certificate, e.g. what ``ssl.get_server_certificate`` returned."""
    data = pem.encode() if isinstance(pem, str) else pem
    if data.lstrip().startswith(b"-----"):
        return x509.load_pem_x509_certificate(data).serial_number
    return x509.load_der_x509_certificate(data).serial_number
