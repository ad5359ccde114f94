"""Advertised listeners (Pulsar's ``advertisedListeners`` / ``internalListenerName`` / ``bindAddresses``).

A listener is a named route to this broker: ``internal:pulsar://broker-0.svc:6650,external:pulsar://1.2.3.4:30650``.
Clients pick one with ``listener_name`` (LOOKUP's ``advertised_listener_name``, HTTP lookup's ``listenerName``
query parameter or ``X-Pulsar-ListenerName`` header) and are given that listener's URLs. The internal listener
(``internalListenerName``, by default the first one) gives the broker's own URLs. ``bindAddresses``
(``name:pulsar://host:port,...``, PIP-95; ``pulsar+ssl://`` for a TLS socket with the broker's certificate) opens
extra sockets whose connections use that listener when a lookup names none. Validation follows Pulsar's
``MultipleListenerValidator``; errors are :class:`ConfigError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from magnetar.broker.config import BrokerConfig

#: Host in this broker's URLs when neither advertisedAddress nor advertisedListeners says one.
DEFAULT_ADVERTISED_HOST = "localhost"


class ConfigError(ValueError):
    """An invalid listener configuration (the broker refuses to start)."""


@dataclass(frozen=True, slots=True)
class AdvertisedListener:
    """The URLs clients are given for one listener (``None``: the listener has no such endpoint)."""

    broker_service_url: str | None = None
    broker_service_url_tls: str | None = None


@dataclass(frozen=True, slots=True)
class BindAddress:
    """An extra socket to listen on, and the listener its connections default to."""

    listener_name: str
    host: str
    port: int
    #: A ``pulsar+ssl://`` socket (TLS with the broker's certificate).
    tls: bool = False


@dataclass(frozen=True, slots=True)
class Listeners:
    """The validated listener configuration of a broker."""

    advertised: dict[str, AdvertisedListener]
    internal_name: str
    bind_addresses: tuple[BindAddress, ...]

    @property
    def internal(self) -> AdvertisedListener | None:
        return self.advertised.get(self.internal_name)


def parse_listeners(config: BrokerConfig) -> Listeners:
    """Validate ``advertisedListeners``, ``internalListenerName`` and ``bindAddresses`` as Pulsar does."""
    advertised = _parse_advertised(config)
    internal = config.internal_listener_name.strip()
    if advertised:
        internal = internal or next(iter(advertised))
        if internal not in advertised:
            raise ConfigError(
                f"the `advertisedListeners` configure do not contain `internalListenerName` entry ({internal!r})"
            )
    return Listeners(advertised, internal, _parse_bind_addresses(config, advertised))


def uses_tls(config: BrokerConfig) -> bool:
    """Whether any listener of the broker is TLS (then its certificate settings are needed)."""
    return (
        config.broker_service_port_tls is not None
        or config.web_service_port_tls is not None
        or any(b.tls for b in parse_listeners(config).bind_addresses)
    )


def advertised_host(config: BrokerConfig) -> str:
    """Host name in this broker's own URLs: ``advertisedAddress``, else the internal listener's host
    (Pulsar's ``getAppliedAdvertisedAddress``), else ``localhost``."""
    if config.advertised_address:
        return config.advertised_address
    if config.advertised_listeners.strip():
        listener = parse_listeners(config).internal
        url = listener and (listener.broker_service_url or listener.broker_service_url_tls)
        if url:
            return urlsplit(url).hostname or DEFAULT_ADVERTISED_HOST
    return DEFAULT_ADVERTISED_HOST


def own_broker_service_url(config: BrokerConfig, listeners: Listeners, port: int | None) -> str:
    """This broker's ``brokerServiceUrl``: the internal listener's, else ``pulsar://<advertised host>:<port>``
    ("" in TLS-only mode: no plaintext port)."""
    internal = listeners.internal
    return _own_url(config, internal.broker_service_url if internal is not None else "", "pulsar", port)


def own_broker_service_url_tls(config: BrokerConfig, listeners: Listeners, tls_port: int | None) -> str:
    """This broker's ``brokerServiceUrlTls``: the internal listener's ``pulsar+ssl://`` URL, else
    ``pulsar+ssl://<advertised host>:<brokerServicePortTls>`` ("" when there is no TLS port)."""
    internal = listeners.internal
    return _own_url(config, internal.broker_service_url_tls if internal is not None else "", "pulsar+ssl", tls_port)


def _own_url(config: BrokerConfig, from_listener: str | None, scheme: str, port: int | None) -> str:
    if from_listener:
        return from_listener
    if port is None:
        return ""
    return f"{scheme}://{advertised_host(config)}:{port}"


def own_web_service_urls(config: BrokerConfig) -> tuple[str, str]:
    """``webServiceUrl`` and ``webServiceUrlTls`` ("" for a listener that is off)."""
    host = advertised_host(config)
    plain = f"http://{host}:{config.web_service_port}" if config.web_service_port is not None else ""
    tls = f"https://{host}:{config.web_service_port_tls}" if config.web_service_port_tls is not None else ""
    return plain, tls


def web_address(config: BrokerConfig) -> str:
    """``host:port`` identifying this broker (Pulsar's lookup service address): the HTTP port, else the HTTPS one."""
    port = config.web_service_port if config.web_service_port is not None else config.web_service_port_tls
    return f"{advertised_host(config)}:{port}"


def _parse_advertised(config: BrokerConfig) -> dict[str, AdvertisedListener]:
    text = config.advertised_listeners.strip()
    if not text:
        return {}
    if config.advertised_address.strip():
        raise ConfigError("`advertisedListeners` and `advertisedAddress` must not appear together")
    urls: dict[str, list[str]] = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        name, sep, url = entry.partition(":")
        if not sep or not name.strip():
            raise ConfigError(
                f"the configure entry `advertisedListeners` is invalid. because {entry} do not contain listener name"
            )
        urls.setdefault(name.strip(), []).append(url.strip())
    owners: dict[str, str] = {}  # host:port -> listener name
    result: dict[str, AdvertisedListener] = {}
    for name, values in urls.items():
        by_scheme: dict[str, str] = {}
        for url in values:
            scheme, host, port = _split_url(url, "advertisedListeners")
            if scheme not in ("pulsar", "pulsar+ssl"):
                raise ConfigError(
                    f"the value {url} in the `advertisedListeners` configure is invalid: "
                    "the scheme must be pulsar or pulsar+ssl"
                )
            if scheme in by_scheme:
                raise ConfigError(f"there are redundant configure for listener `{name}`")
            by_scheme[scheme] = url
            host_port = f"{host}:{port}"
            if owners.setdefault(host_port, name) != name:
                raise ConfigError(
                    f"the value {url} in the `advertisedListeners` configure is invalid: "
                    f"must not specify `{host_port}` to different listener."
                )
        result[name] = AdvertisedListener(by_scheme.get("pulsar"), by_scheme.get("pulsar+ssl"))
    return result


def _parse_bind_addresses(config: BrokerConfig, advertised: dict[str, AdvertisedListener]) -> tuple[BindAddress, ...]:
    out: list[BindAddress] = []
    for entry in filter(None, (e.strip() for e in config.bind_addresses.split(","))):
        name, sep, url = entry.partition(":")
        if not sep or not name.strip():
            raise ConfigError(
                f"the configure entry `bindAddresses` is invalid: {entry} does not contain a listener name"
            )
        scheme, host, port = _split_url(url.strip(), "bindAddresses")
        if scheme not in ("pulsar", "pulsar+ssl"):
            raise ConfigError(
                f"the value {url} in the `bindAddresses` configure is invalid: the scheme must be pulsar or pulsar+ssl"
            )
        if name.strip() not in advertised:
            raise ConfigError(f"the `bindAddresses` entry {entry} names a listener that `advertisedListeners` lacks")
        out.append(BindAddress(name.strip(), host, port, scheme == "pulsar+ssl"))
    return tuple(out)


def _split_url(url: str, setting: str) -> tuple[str, str, int]:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        port = None
        parts = None
    if parts is None or not parts.scheme or not parts.hostname or port is None:
        raise ConfigError(f"the value {url} in the `{setting}` configure is invalid")
    return parts.scheme.lower(), parts.hostname, port
