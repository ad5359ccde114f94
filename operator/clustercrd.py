"""Schema of the ``MagnetarCluster`` kind (``magnetar.io/v1alpha1``), rendered into ``crds/`` by
:mod:`magnetar.operator.crdgen`.

Kubernetes-native blocks (resources, affinity, tolerations, security contexts...) are open objects
(``x-kubernetes-preserve-unknown-fields``): the API server validates them again where they land, in
the pod templates the operator writes. CEL rules refuse the changes the operator cannot carry out
safely: an etcd ensemble cannot be resized in place (membership changes), volume claim templates of
a StatefulSet are immutable, bookie quorums must satisfy E >= Qw >= Qa and fit the bookies.
"""

from __future__ import annotations

from typing import Any

from magnetar.operator.crdgen import (
    AGE,
    Schema,
    _bool,
    _int,
    _int32,
    _obj,
    _rule,
    _str,
    crd,
    ready_columns,
    status_block,
)

#: Labels, annotations and similar free-form string maps.
_STRING_MAP: Schema = {"type": "object", "additionalProperties": {"type": "string", "maxLength": 4096}}


def _open(description: str) -> Schema:
    """A Kubernetes type taken as is (validated where it lands, in the pod template)."""
    return {"type": "object", "description": description, "x-kubernetes-preserve-unknown-fields": True}


def _open_list(description: str) -> Schema:
    return {"type": "array", "description": description, "items": _open("One entry.")}


def _volume(what: str) -> Schema:
    return _obj(
        f"The {what} volume: one PersistentVolumeClaim per pod (a volumeClaimTemplate).",
        {
            "size": _str("Requested size, e.g. 10Gi.", pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$"),
            "storageClassName": _str("StorageClass of the claim; the cluster default when left out.", maxLength=253),
        },
        ["size"],
    )


def _replicas(description: str, minimum: int = 0, **extra: Any) -> Schema:
    return _int32(description, minimum=minimum, maximum=1000, **extra)


def _pod_template() -> Schema:
    return _obj(
        "Overrides applied to every pod the operator creates (etcd, bookies, brokers, the init Job).",
        {
            "labels": {**_STRING_MAP, "description": "Extra pod labels."},
            "annotations": {**_STRING_MAP, "description": "Extra pod annotations."},
            "affinity": _open("Pod affinity (replaces the default soft anti-affinity per component)."),
            "tolerations": _open_list("Pod tolerations."),
            "nodeSelector": {**_STRING_MAP, "description": "Node selector."},
            "topologySpreadConstraints": _open_list("Topology spread constraints."),
            "securityContext": _open("Pod securityContext (default: non-root UID/GID 10001, fsGroup 10001)."),
            "containerSecurityContext": _open(
                "Container securityContext (default: no privilege escalation, all capabilities dropped)."
            ),
            "serviceAccountName": _str("Service account of the pods.", maxLength=253),
            "imagePullSecrets": _open_list("Image pull secrets ({name: ...})."),
            "priorityClassName": _str("Priority class of the pods.", maxLength=253),
        },
    )


def _secret_key_ref(description: str) -> Schema:
    return _obj(
        description,
        {
            "name": _str("Name of the Secret (in the cluster's namespace).", minLength=1, maxLength=253),
            "key": _str("Key in the Secret.", minLength=1, maxLength=253, pattern=r"^[-._a-zA-Z0-9]+$"),
        },
        ["name", "key"],
    )


def _security() -> Schema:
    """TLS, authentication and authorization of the brokers, all from Secrets (cert-manager friendly)."""
    tls = _obj(
        "TLS on the binary protocol (6651, pulsar+ssl://) and HTTPS on the admin API (8443) from a Secret of type "
        "kubernetes.io/tls (tls.crt, tls.key, ca.crt: what a cert-manager Certificate writes). The Secret is "
        "mounted as a projected volume, so a renewed certificate reaches the brokers without a restart.",
        {
            "secretName": _str("The kubernetes.io/tls Secret.", minLength=1, maxLength=253),
            "requireClientCert": _bool(
                "Refuse clients without a certificate signed by ca.crt (tlsRequireTrustedClientCertOnConnect)."
            ),
            "tlsOnly": _bool("Turn the plaintext ports 6650/8080 off (default false: both are served)."),
            "bookieSecretName": _str(
                "TLS on the bookie port (3181) from this kubernetes.io/tls Secret: its certificate must name "
                "*.<cluster>-bookie-headless.<namespace>.svc; brokers verify it with its ca.crt "
                "(bookkeeperTLSClientAuthentication, bookkeeperTLSTrustCertsFilePath). A change rolls bookies and "
                "brokers.",
                minLength=1,
                maxLength=253,
            ),
        },
        ["secretName"],
    )
    token = _obj(
        "JWT tokens (AuthenticationProviderToken): the role is the token's 'sub'. Exactly one key.",
        {
            "secretKey": _secret_key_ref("Symmetric (HS256) key: tokenSecretKey."),
            "publicKey": _secret_key_ref("Public key (RS256/ES256...) of the token issuer: tokenPublicKey."),
            "publicAlg": _str("Algorithm of publicKey (tokenPublicAlg, default RS256).", maxLength=16,
                              enum=["RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384",
                                    "PS512"]),
        },
        **{"x-kubernetes-validations": [
            _rule("has(self.secretKey) != has(self.publicKey)", "token needs exactly one of secretKey and publicKey"),
            _rule("!has(self.publicAlg) || has(self.publicKey)", "token.publicAlg needs token.publicKey"),
        ]},
    )  # fmt: skip
    authentication = _obj(
        "Who clients are (authenticationEnabled). The operator authenticates with a token, so the token "
        "provider is required.",
        {
            "enabled": _bool("Require authentication (default true when this block is present)."),
            "token": token,
            "basic": _obj(
                "Basic auth against an htpasswd file (AuthenticationProviderBasic, basicAuthConf).",
                {"htpasswd": _secret_key_ref("The htpasswd file (bcrypt or apr1 entries).")},
                ["htpasswd"],
            ),
            "tlsClientCert": _bool("TLS client certificates (AuthenticationProviderTls; the CN is the role)."),
            "superUserRoles": {
                "type": "array",
                "description": "Roles allowed everything (superUserRoles); must include the operator token's role.",
                "items": _str("A role.", minLength=1, maxLength=253),
                "maxItems": 64,
                "x-kubernetes-list-type": "set",
            },
            "operatorTokenSecretRef": _secret_key_ref(
                "The operator's own admin token (sent as 'Authorization: Bearer'). Default: the operator's "
                "configured Secret (chart operatorToken.secretName, key operatorToken.key)."
            ),
            "brokerClientTokenSecretRef": _secret_key_ref(
                "The token brokers present to each other's admin API (bundle unloads, load shedding): "
                "brokerClientAuthenticationPlugin/Parameters. Its role must be a superuser. Default: the "
                "operator's token."
            ),
        },
        **{"x-kubernetes-validations": [
            _rule("(has(self.enabled) && !self.enabled) || has(self.token)",
                  "authentication needs the token provider (the operator authenticates with a token)"),
        ]},
    )  # fmt: skip
    return _obj(
        "Securing the cluster: TLS, authentication, authorization (see docs/operator.md, 'Securing a cluster').",
        {
            "tls": tls,
            "authentication": authentication,
            "authorization": _obj(
                "Role-based authorization (authorizationEnabled; needs authentication).",
                {"enabled": _bool("Check every operation against the role's permissions.")},
            ),
        },
        **{"x-kubernetes-validations": [
            _rule("!has(self.authorization) || !has(self.authorization.enabled) || !self.authorization.enabled || "
                  "(has(self.authentication) && (!has(self.authentication.enabled) || self.authentication.enabled))",
                  "authorization needs authentication"),
            _rule("!has(self.authentication) || !has(self.authentication.tlsClientCert) || "
                  "!self.authentication.tlsClientCert || has(self.tls)",
                  "authentication.tlsClientCert needs tls"),
        ]},
    )  # fmt: skip


def magnetar_cluster_crd() -> dict[str, Any]:
    etcd = _obj(
        "An etcd ensemble run by the operator (a StatefulSet).",
        {
            "replicas": _int32(
                "Members: 1, 3 or 5. Immutable (changing membership needs etcd's member API).",
                enum=[1, 3, 5],
                **{"x-kubernetes-validations": [_rule("self == oldSelf", "etcd replicas are immutable")]},
            ),
            "image": _str("etcd image (pinned).", maxLength=512),
            "storage": _volume("etcd data"),
            "resources": _open("Container resources (requests/limits)."),
        },
        **{"x-kubernetes-validations": [_rule("!has(oldSelf.storage) || self.storage == oldSelf.storage",
                                              "etcd storage is immutable (a volumeClaimTemplate)")]},
    )  # fmt: skip
    metadata_store = _obj(
        "Where the cluster keeps its metadata: an etcd ensemble the operator runs, or an external one.",
        {
            "etcd": etcd,
            "external": _obj(
                "An etcd the operator does not run.",
                {
                    "endpoints": {
                        "type": "array",
                        "description": "Client endpoints, host:port.",
                        "items": _str("host:port", maxLength=512, pattern=r"^[^\s:/]+:[0-9]+$"),
                        "minItems": 1,
                        "maxItems": 16,
                    }
                },
                ["endpoints"],
            ),
        },
        **{
            "x-kubernetes-validations": [
                _rule("!(has(self.etcd) && has(self.external))", "set either metadataStore.etcd or .external"),
                _rule("has(self.external) == has(oldSelf.external)", "the metadata store kind is immutable"),
            ]
        },
    )
    bookies = _obj(
        "Bookies (storage nodes): a StatefulSet with separate journal and ledger volumes.",
        {
            "replicas": _replicas("Number of bookies; scaling down decommissions the highest ordinals first.", 1),
            "journal": _volume("journal"),
            "ledgers": _volume("entry log and index"),
            "resources": _open("Container resources (requests/limits)."),
            "ensembleSize": _int32("Default ensemble size E of new ledgers.", minimum=1),
            "writeQuorum": _int32("Default write quorum Qw.", minimum=1),
            "ackQuorum": _int32("Default ack quorum Qa.", minimum=1),
        },
        ["replicas"],
        **{
            "x-kubernetes-validations": [
                _rule("(has(self.ensembleSize) ? self.ensembleSize : 2) >= (has(self.writeQuorum) ? "
                      "self.writeQuorum : 2) && (has(self.writeQuorum) ? self.writeQuorum : 2) >= "
                      "(has(self.ackQuorum) ? self.ackQuorum : 2)", "bookies need ensembleSize >= writeQuorum >= "
                      "ackQuorum"),
                _rule("self.replicas >= (has(self.ensembleSize) ? self.ensembleSize : 2)",
                      "bookies.replicas must be at least the ensemble size"),
                _rule("!has(oldSelf.journal) || self.journal == oldSelf.journal",
                      "bookies.journal is immutable (a volumeClaimTemplate)"),
                _rule("!has(oldSelf.ledgers) || self.ledgers == oldSelf.ledgers",
                      "bookies.ledgers is immutable (a volumeClaimTemplate)"),
            ]
        },
    )  # fmt: skip
    brokers = _obj(
        "Brokers (stateless serving nodes): a StatefulSet behind the <cluster>-broker Service.",
        {
            "replicas": _replicas("Number of brokers.", 1),
            "resources": _open("Container resources (requests/limits)."),
            "config": {
                "type": "object",
                "description": "Broker settings under Pulsar's names (e.g. brokerDeduplicationEnabled: 'true'), "
                "written to broker.conf in a ConfigMap; a change rolls the brokers.",
                "additionalProperties": {"type": "string", "maxLength": 4096},
                "maxProperties": 512,
            },
            "externalListener": _obj(
                "Expose every broker outside Kubernetes: one Service per broker and an 'external' entry in "
                "advertisedListeners (clients pick it with listenerName='external').",
                {
                    "type": _str("Service type.", enum=["LoadBalancer", "NodePort"]),
                    "hostTemplate": _str(
                        "Advertised host of broker N ('{index}' and '{name}' are replaced), e.g. "
                        "broker-{index}.magnetar.example.com. Required for NodePort.",
                        maxLength=253,
                    ),
                    "annotations": {**_STRING_MAP, "description": "Annotations of the per-broker Services."},
                },
                ["type", "hostTemplate"],
            ),
        },
        ["replicas"],
    )
    spec = _obj(
        "Desired state of a Magnetar cluster: etcd, bookies and brokers, started in that order and rolled "
        "one pod at a time.",
        {
            "image": _str("The Magnetar image every broker and bookie runs.", minLength=1, maxLength=512),
            "imagePullPolicy": _str("Pull policy of the Magnetar image.", enum=["Always", "IfNotPresent", "Never"]),
            "clusterName": _str(
                "Pulsar cluster name (defaults to metadata.name). Immutable.",
                maxLength=253,
                pattern=r"^[-.A-Za-z0-9_]+$",
            ),
            "metadataStore": metadata_store,
            "bookies": bookies,
            "brokers": brokers,
            "autoRecovery": _obj(
                "Re-replication of the ledgers of lost or decommissioned bookies (runs inside the brokers).",
                {
                    "enabled": _bool("Whether auto-recovery runs (default true)."),
                    "lostBookieDelaySeconds": _int32("How long a bookie must be gone before recovery.", minimum=0),
                    "checkIntervalSeconds": _int32("Seconds between auditor passes.", minimum=1),
                },
            ),
            "podTemplate": _pod_template(),
            "security": _security(),
            "podDisruptionBudget": _obj(
                "A PodDisruptionBudget per component allowing one voluntary disruption at a time.",
                {"enabled": _bool("Whether the PDBs are created (default true).")},
            ),
            "monitoring": _obj(
                "Prometheus scraping.",
                {
                    "serviceMonitor": _obj(
                        "A ServiceMonitor (Prometheus Operator) for brokers and bookies.",
                        {
                            "enabled": _bool("Create the ServiceMonitor."),
                            "interval": _str("Scrape interval, e.g. 30s.", maxLength=32),
                            "labels": {**_STRING_MAP, "description": "Labels Prometheus selects it by."},
                        },
                    )
                },
            ),
        },
        ["image", "metadataStore", "bookies", "brokers"],
        **{
            "x-kubernetes-validations": [
                _rule("has(self.clusterName) == has(oldSelf.clusterName) && "
                      "(!has(self.clusterName) || self.clusterName == oldSelf.clusterName)",
                      "clusterName is immutable"),
                _rule("has(self.metadataStore.etcd) || has(self.metadataStore.external)",
                      "metadataStore needs etcd or external"),
            ]
        },
    )  # fmt: skip
    replicas = _obj(
        "Ready / desired pods of one component.",
        {"desired": _int32("Desired replicas."), "ready": _int32("Ready replicas."),
         "updated": _int32("Replicas running the current pod template.")},
    )  # fmt: skip
    status = status_block(
        {
            "serviceUrl": _str("Binary protocol URL of the broker Service (pulsar://<cluster>-broker.<ns>.svc:6650)."),
            "adminUrl": _str("Admin REST URL of the broker Service."),
            "phase": _str(
                "Current step: Creating, Initializing, Running, RollingUpdate, Decommissioning.", maxLength=64
            ),
            "rollout": _obj(
                "The rollout in progress.",
                {
                    "component": _str("etcd, bookies or brokers.", maxLength=32),
                    "pod": _str("The pod being replaced.", maxLength=253),
                    "step": _str("What the operator waits for.", maxLength=256),
                },
            ),
            "decommission": _obj(
                "The bookie being decommissioned (scale-down).",
                {
                    "pod": _str("The bookie's pod.", maxLength=253),
                    "bookieId": _str("The bookie id (host:port) ledgers refer to.", maxLength=512),
                    "since": _int("When its pod was removed (Unix seconds)."),
                },
            ),
            "metadataInitialized": _bool("Whether the metadata init Job has succeeded (it is not run again)."),
            "etcd": replicas,
            "bookies": replicas,
            "brokers": replicas,
        }
    )
    columns = [
        {"name": "Brokers", "type": "integer", "jsonPath": ".status.brokers.ready"},
        {"name": "Bookies", "type": "integer", "jsonPath": ".status.bookies.ready"},
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        *ready_columns(),
        {"name": "Service", "type": "string", "jsonPath": ".status.serviceUrl", "priority": 1},
        AGE,
    ]
    return crd(
        "MagnetarCluster", "magnetarclusters", ["mc", "mcluster"],
        "A Magnetar cluster: etcd, bookies and brokers run and rolled by the operator.",
        spec, status, columns,
    )  # fmt: skip
