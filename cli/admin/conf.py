"""pulsar-admin's connection settings: global flags over a ``client.conf`` (Java properties) over defaults.

Flags: ``--admin-url``, ``--auth-plugin``, ``--auth-params``, ``--tls-trust-cert-path``, ``--tls-allow-insecure``,
``--tls-enable-hostname-verification``. ``--conf`` (default ``$PULSAR_CLIENT_CONF``, as pulsar-admin) names a
``client.conf`` whose ``webServiceUrl``, ``authPlugin``, ``authParams``, ``tlsTrustCertsFilePath``,
``tlsAllowInsecureConnection`` and ``tlsEnableHostnameVerification`` apply when the flag is not given.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from magnetar.admin_client.auth import AuthConfigError, ClientSecurity

DEFAULT_ADMIN_URL = "http://localhost:8080"
#: Environment variable that overrides the default admin URL (a ``--conf`` file's ``webServiceUrl`` wins over it).
ADMIN_URL_ENV = "MAGNETAR_ADMIN_URL"
#: pulsar-admin's variable naming the ``client.conf`` to read.
CLIENT_CONF_ENV = "PULSAR_CLIENT_CONF"


def read_properties(path: str) -> dict[str, str]:
    """A Java ``.properties`` file as pulsar's ``client.conf`` uses it: ``key=value`` (or ``key: value``), ``#``/``!``
    comments; empty values count as unset."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise AuthConfigError(f"cannot read client configuration {path}: {exc.strerror or exc}") from None
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
        if cut < 0:
            continue
        key, value = line[:cut].strip(), line[cut + 1 :].strip()
        if value:
            out[key] = value
    return out


def add_connection_options(p: argparse.ArgumentParser, defaults: bool) -> None:
    """The global flags; leaf parsers get them without defaults so a value before the group is kept."""

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    p.add_argument(
        "--admin-url",
        default=default(None),
        help=f"admin API base URL (default: --conf's webServiceUrl, ${ADMIN_URL_ENV} or {DEFAULT_ADMIN_URL})",
    )
    p.add_argument(
        "--conf",
        default=default(None),
        help=f"client.conf to read webServiceUrl, authPlugin, authParams, tls* from (default ${CLIENT_CONF_ENV})",
    )
    p.add_argument(
        "--auth-plugin",
        default=default(None),
        help="authentication plugin class (org.apache.pulsar.client.impl.auth.AuthenticationToken|"
        "AuthenticationBasic|AuthenticationTls, or token|basic|tls)",
    )
    p.add_argument(
        "--auth-params",
        default=default(None),
        help='its parameters, e.g. token:<jwt>, file:///path/token, {"userId":"u","password":"p"}, '
        "tlsCertFile:/c.pem,tlsKeyFile:/k.pem",
    )
    p.add_argument("--tls-trust-cert-path", default=default(None), help="PEM file of the CAs trusted for https")
    p.add_argument(
        "--tls-allow-insecure",
        action="store_const",
        const=True,
        default=default(None),
        help="accept any server certificate",
    )
    p.add_argument(
        "--tls-enable-hostname-verification",
        action="store_const",
        const=True,
        default=default(None),
        help="check that the server certificate names the host",
    )


def resolve(args: argparse.Namespace) -> tuple[str, ClientSecurity]:
    """The admin URL and client security from flags, the client.conf and the environment.

    Raises :class:`AuthConfigError` for unreadable files and unusable auth settings.
    """
    conf_path = args.conf or os.environ.get(CLIENT_CONF_ENV)
    conf = read_properties(conf_path) if conf_path else {}

    def pick(flag: object, key: str) -> object:
        return flag if flag is not None else conf.get(key)

    url = args.admin_url or conf.get("webServiceUrl") or os.environ.get(ADMIN_URL_ENV) or DEFAULT_ADMIN_URL
    plugin = args.auth_plugin or conf.get("authPlugin") or conf.get("authPluginClassName")
    # Params belong to their plugin: a plugin given as a flag does not take the file's params.
    params = args.auth_params if (args.auth_params or args.auth_plugin) else conf.get("authParams")
    security = ClientSecurity.from_settings(
        str(plugin) if plugin else None,
        params,
        pick(args.tls_trust_cert_path, "tlsTrustCertsFilePath"),  # type: ignore[arg-type]
        pick(args.tls_allow_insecure, "tlsAllowInsecureConnection") or False,
        pick(args.tls_enable_hostname_verification, "tlsEnableHostnameVerification") or False,
    )
    return url, security
