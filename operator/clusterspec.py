"""Typed view of a ``MagnetarCluster`` spec and the names of the objects rendered from it.

Lenient like :mod:`magnetar.operator.specs` (the API server's schema and CEL rules are the strict check);
defaults live here, not in the CRD, so GitOps tools see no defaulting diffs.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: Pinned upstream etcd image (configurable per cluster with metadataStore.etcd.image).
DEFAULT_ETCD_IMAGE = "quay.io/coreos/etcd:v3.5.17"
#: UID/GID of the Magnetar image's user (Dockerfile); pods run as it by default.
IMAGE_UID = 10001

BROKER_PORT = 6650
BROKER_HTTP_PORT = 8080
BROKER_TLS_PORT = 6651
BROKER_HTTPS_PORT = 8443
BOOKIE_PORT = 3181
BOOKIE_HTTP_PORT = 8000
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380


class _Spec(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class Volume(_Spec):
    size: str
    storageClassName: str | None = None


class EtcdSpec(_Spec):
    replicas: int = 1
    image: str = DEFAULT_ETCD_IMAGE
    storage: Volume = Volume(size="1Gi")
    resources: dict[str, Any] | None = None


class ExternalEtcd(_Spec):
    endpoints: list[str]


class MetadataStore(_Spec):
    etcd: EtcdSpec | None = None
    external: ExternalEtcd | None = None


class BookieSpec(_Spec):
    replicas: int = 3
    journal: Volume = Volume(size="1Gi")
    ledgers: Volume = Volume(size="10Gi")
    resources: dict[str, Any] | None = None
    ensembleSize: int = 2
    writeQuorum: int = 2
    ackQuorum: int = 2


class ExternalListener(_Spec):
    type: Literal["LoadBalancer", "NodePort"] = "LoadBalancer"
    hostTemplate: str
    annotations: dict[str, str] = Field(default_factory=dict)


class BrokerSpec(_Spec):
    replicas: int = 1
    resources: dict[str, Any] | None = None
    config: dict[str, str] = Field(default_factory=dict)
    externalListener: ExternalListener | None = None


class AutoRecovery(_Spec):
    enabled: bool = True
    lostBookieDelaySeconds: int | None = None
    checkIntervalSeconds: int | None = None


class PodTemplate(_Spec):
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    affinity: dict[str, Any] | None = None
    tolerations: list[dict[str, Any]] | None = None
    nodeSelector: dict[str, str] | None = None
    topologySpreadConstraints: list[dict[str, Any]] | None = None
    securityContext: dict[str, Any] | None = None
    containerSecurityContext: dict[str, Any] | None = None
    serviceAccountName: str | None = None
    imagePullSecrets: list[dict[str, Any]] | None = None
    priorityClassName: str | None = None


class Toggle(_Spec):
    enabled: bool = True


class ServiceMonitorSpec(_Spec):
    enabled: bool = False
    interval: str = "30s"
    labels: dict[str, str] = Field(default_factory=dict)


class Monitoring(_Spec):
    serviceMonitor: ServiceMonitorSpec = ServiceMonitorSpec()


class SecretKeyRef(_Spec):
    """One key of a Secret in the cluster's namespace (like a container's ``secretKeyRef``)."""

    name: str
    key: str


class TlsSpec(_Spec):
    """TLS of brokers from a ``kubernetes.io/tls`` Secret (``tls.crt``, ``tls.key``, ``ca.crt``: what
    cert-manager's Certificate writes)."""

    secretName: str
    requireClientCert: bool = False
    #: plaintext ports (6650/8080) off
    tlsOnly: bool = False
    #: TLS on the bookie port from this kubernetes.io/tls Secret (brokers verify it with its ca.crt)
    bookieSecretName: str | None = None


class TokenAuth(_Spec):
    secretKey: SecretKeyRef | None = None
    publicKey: SecretKeyRef | None = None
    publicAlg: str | None = None


class BasicAuth(_Spec):
    htpasswd: SecretKeyRef


class AuthenticationSpec(_Spec):
    enabled: bool = True
    token: TokenAuth | None = None
    basic: BasicAuth | None = None
    #: TLS client certificates (the certificate's CN is the role)
    tlsClientCert: bool = False
    superUserRoles: list[str] = Field(default_factory=list)
    #: the operator's own admin token (default: the operator's configured Secret name, key ``token``)
    operatorTokenSecretRef: SecretKeyRef | None = None
    #: the token brokers present to each other (default: the operator's token)
    brokerClientTokenSecretRef: SecretKeyRef | None = None


class AuthorizationSpec(_Spec):
    enabled: bool = False


class SecuritySpec(_Spec):
    tls: TlsSpec | None = None
    authentication: AuthenticationSpec | None = None
    authorization: AuthorizationSpec | None = None

    @property
    def tls_on(self) -> bool:
        return self.tls is not None

    @property
    def auth_on(self) -> bool:
        return self.authentication is not None and self.authentication.enabled


class MagnetarClusterSpec(_Spec):
    image: str
    imagePullPolicy: str = "IfNotPresent"
    clusterName: str | None = None
    metadataStore: MetadataStore = MetadataStore(etcd=EtcdSpec())
    bookies: BookieSpec = BookieSpec()
    brokers: BrokerSpec = BrokerSpec()
    autoRecovery: AutoRecovery = AutoRecovery()
    podTemplate: PodTemplate = PodTemplate()
    podDisruptionBudget: Toggle = Toggle()
    monitoring: Monitoring = Monitoring()
    security: SecuritySpec = SecuritySpec()


class Names:
    """Object names and DNS names of one cluster (``<cluster>-<component>``)."""

    def __init__(self, name: str, namespace: str, domain: str = "svc") -> None:
        self.cluster = name
        self.namespace = namespace
        self.domain = domain
        self.etcd = f"{name}-etcd"
        self.etcd_headless = f"{name}-etcd-headless"
        self.bookie = f"{name}-bookie"
        self.bookie_headless = f"{name}-bookie-headless"
        self.broker = f"{name}-broker"
        self.broker_headless = f"{name}-broker-headless"
        self.init_job = f"{name}-init-metadata"

    def service_host(self, service: str) -> str:
        return f"{service}.{self.namespace}.{self.domain}"

    def pod_host(self, pod: str, headless: str) -> str:
        return f"{pod}.{headless}.{self.namespace}.{self.domain}"

    @property
    def service_url(self) -> str:
        return f"pulsar://{self.service_host(self.broker)}:{BROKER_PORT}"

    @property
    def admin_url(self) -> str:
        return f"http://{self.service_host(self.broker)}:{BROKER_HTTP_PORT}"

    @property
    def service_url_tls(self) -> str:
        return f"pulsar+ssl://{self.service_host(self.broker)}:{BROKER_TLS_PORT}"

    @property
    def admin_url_tls(self) -> str:
        return f"https://{self.service_host(self.broker)}:{BROKER_HTTPS_PORT}"

    def client_urls(self, spec: MagnetarClusterSpec) -> tuple[str, str]:
        """The binary and admin URLs clients (and the operator) use: TLS ones when TLS is on."""
        if spec.security.tls_on:
            return self.service_url_tls, self.admin_url_tls
        return self.service_url, self.admin_url

    def metadata_url(self, spec: MagnetarClusterSpec) -> str:
        if spec.metadataStore.external is not None:
            return "etcd://" + ",".join(spec.metadataStore.external.endpoints)
        return f"etcd://{self.service_host(self.etcd)}:{ETCD_CLIENT_PORT}"
