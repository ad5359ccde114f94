"""The Kubernetes objects a ``MagnetarCluster`` becomes (pure functions of the spec: no API calls).

Per component a StatefulSet with stable pod DNS names through a headless Service: etcd (members
``<c>-etcd-N``), bookies (bookie id = the pod's DNS name, so cookies and ledger metadata survive
restarts and rescheduling), brokers (advertised address = the pod's DNS name); a client Service
``<c>-broker`` (6650/8080) that ``clusterRef`` resolves to; the idempotent metadata init Job; the
broker configuration as a ConfigMap (``broker.conf``); PodDisruptionBudgets; optional per-broker
external Services and a ServiceMonitor.

Bookie and broker StatefulSets use ``updateStrategy: OnDelete``: the operator replaces pods itself,
one at a time and health-gated (:mod:`magnetar.operator.clusterops`). Every pod template carries the
hash of its own content (``magnetar.io/template-hash``) so the operator can tell outdated pods.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from magnetar.operator.clusteraccess import broker_client_token_ref
from magnetar.operator.clusterspec import (
    BOOKIE_HTTP_PORT,
    BOOKIE_PORT,
    BROKER_HTTP_PORT,
    BROKER_HTTPS_PORT,
    BROKER_PORT,
    BROKER_TLS_PORT,
    ETCD_CLIENT_PORT,
    ETCD_PEER_PORT,
    IMAGE_UID,
    MagnetarClusterSpec,
    Names,
    Volume,
)
from magnetar.operator.config import GROUP, VERSION, OperatorConfig

Obj = dict[str, Any]

#: Where the brokers see their Secrets (projected volumes: the kubelet refreshes them when a Secret changes,
#: e.g. a certificate renewed by cert-manager; the broker reloads its certificates itself).
TLS_DIR = "/var/run/secrets/magnetar/tls"
AUTH_DIR = "/var/run/secrets/magnetar/auth"
#: the bookies' TLS Secret: in bookies the whole Secret, in brokers only its ca.crt
BOOKIE_TLS_DIR = "/var/run/secrets/magnetar/bookie-tls"
#: authenticationProviders entries (Pulsar's class names)
PROVIDER_CLASSES = {
    "token": "org.apache.pulsar.broker.authentication.AuthenticationProviderToken",
    "basic": "org.apache.pulsar.broker.authentication.AuthenticationProviderBasic",
    "tls": "org.apache.pulsar.broker.authentication.AuthenticationProviderTls",
}
#: brokerClientAuthenticationPlugin of brokers calling each other
BROKER_CLIENT_AUTH = "org.apache.pulsar.client.impl.auth.AuthenticationToken"
#: Pulsar's unauthenticated status page (what its Helm chart probes): admin paths need credentials once
#: authentication is on, and the kubelet has none.
STATUS_PATH = "/status.html"

TEMPLATE_HASH = f"{GROUP}/template-hash"
APPLIED_HASH = f"{GROUP}/applied-hash"
COMPONENT = "app.kubernetes.io/component"
INSTANCE = "app.kubernetes.io/instance"


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


class ClusterRenderer:
    """Renders the objects of one MagnetarCluster (``body`` is the custom resource)."""

    def __init__(self, body: Obj, spec: MagnetarClusterSpec | None = None,
                 config: OperatorConfig | None = None) -> None:  # fmt: skip
        meta = body["metadata"]
        self.name: str = meta["name"]
        self.namespace: str = meta.get("namespace") or "default"
        self.uid: str = meta.get("uid", "")
        self.spec = spec or MagnetarClusterSpec.model_validate(body.get("spec") or {})
        self.names = Names(self.name, self.namespace)
        self.cluster_name = self.spec.clusterName or self.name
        #: the operator's settings (the default operator token the brokers present to each other)
        self.config = config or OperatorConfig()

    # ------------------------------------------------------------------------------------------ common
    def labels(self, component: str) -> dict[str, str]:
        return {
            "app.kubernetes.io/name": "magnetar",
            INSTANCE: self.name,
            COMPONENT: component,
            "app.kubernetes.io/managed-by": "magnetar-operator",
        }

    def selector(self, component: str) -> dict[str, str]:
        return {INSTANCE: self.name, COMPONENT: component}

    def meta(self, name: str, component: str, **extra: Any) -> Obj:
        return {
            "name": name,
            "namespace": self.namespace,
            "labels": self.labels(component),
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/{VERSION}",
                    "kind": "MagnetarCluster",
                    "name": self.name,
                    "uid": self.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            **extra,
        }

    def _pod_spec(self, component: str, containers: list[Obj], **extra: Any) -> Obj:
        tpl = self.spec.podTemplate
        spec: Obj = {
            "securityContext": tpl.securityContext
            or {"runAsNonRoot": True, "runAsUser": IMAGE_UID, "runAsGroup": IMAGE_UID, "fsGroup": IMAGE_UID},
            "containers": containers,
            **extra,
        }
        spec["affinity"] = tpl.affinity or {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "labelSelector": {"matchLabels": self.selector(component)},
                            "topologyKey": "kubernetes.io/hostname",
                        },
                    }
                ]
            }
        }
        for key in ("tolerations", "nodeSelector", "topologySpreadConstraints", "serviceAccountName",
                    "imagePullSecrets", "priorityClassName"):  # fmt: skip
            value = getattr(tpl, key)
            if value:
                spec[key] = value
        for container in containers:
            container["securityContext"] = tpl.containerSecurityContext or {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            }
        return spec

    def _template(self, component: str, pod_spec: Obj, annotations: dict[str, str] | None = None) -> Obj:
        tpl = self.spec.podTemplate
        template: Obj = {
            "metadata": {
                "labels": {**tpl.labels, **self.labels(component)},
                "annotations": {**tpl.annotations, **(annotations or {})},
            },
            "spec": pod_spec,
        }
        template["metadata"]["annotations"][TEMPLATE_HASH] = digest(template)
        return template

    @staticmethod
    def _claim(name: str, volume: Volume, component_labels: dict[str, str]) -> Obj:
        spec: Obj = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": volume.size}}}
        if volume.storageClassName:
            spec["storageClassName"] = volume.storageClassName
        return {"metadata": {"name": name, "labels": component_labels}, "spec": spec}

    @staticmethod
    def _http_probe(path: str, port: str, period: int, failures: int, delay: int = 0) -> Obj:
        probe: Obj = {
            "httpGet": {"path": path, "port": port},
            "periodSeconds": period,
            "timeoutSeconds": 5,
            "failureThreshold": failures,
        }
        if delay:
            probe["initialDelaySeconds"] = delay
        return probe

    def _env(self) -> list[Obj]:
        return [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        ]

    def _statefulset(self, name: str, component: str, headless: str, replicas: int, template: Obj,
                     claims: list[Obj], on_delete: bool) -> Obj:  # fmt: skip
        spec: Obj = {
            "serviceName": headless,
            "replicas": replicas,
            "selector": {"matchLabels": self.selector(component)},
            # Members of an ensemble must come up together; bookies and brokers are independent.
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "OnDelete"} if on_delete else {"type": "RollingUpdate"},
            "template": template,
            "volumeClaimTemplates": claims,
            # PVCs outlive the StatefulSet (Kubernetes' default): data survives deleting the cluster.
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
        }
        return {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": self.meta(name, component), "spec": spec}

    def _service(self, name: str, component: str, ports: list[tuple[str, int]], headless: bool = False,
                 selector: dict[str, str] | None = None, **spec_extra: Any) -> Obj:  # fmt: skip
        spec: Obj = {
            "selector": selector or self.selector(component),
            "ports": [{"name": n, "port": p, "targetPort": p, "protocol": "TCP"} for n, p in ports],
            **spec_extra,
        }
        if headless:
            spec["clusterIP"] = "None"
            # Members resolve each other before they are ready (etcd peers, bookie ids).
            spec["publishNotReadyAddresses"] = True
        return {"apiVersion": "v1", "kind": "Service", "metadata": self.meta(name, component), "spec": spec}

    def _pdb(self, component: str) -> Obj:
        return {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": self.meta(f"{self.name}-{component}", component),
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": self.selector(component)}},
        }

    # ------------------------------------------------------------------------------------------ etcd
    def etcd_objects(self) -> list[Obj]:
        etcd = self.spec.metadataStore.etcd
        if etcd is None or self.spec.metadataStore.external is not None:
            return []
        n = self.names
        peers = ",".join(
            f"{n.etcd}-{i}=http://{n.pod_host(f'{n.etcd}-{i}', n.etcd_headless)}:{ETCD_PEER_PORT}"
            for i in range(etcd.replicas)
        )
        me = n.pod_host("$(POD_NAME)", n.etcd_headless)
        container: Obj = {
            "name": "etcd",
            "image": etcd.image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["etcd"],
            "args": [
                "--name=$(POD_NAME)",
                "--data-dir=/var/lib/etcd/data",
                f"--listen-client-urls=http://0.0.0.0:{ETCD_CLIENT_PORT}",
                f"--advertise-client-urls=http://{me}:{ETCD_CLIENT_PORT}",
                f"--listen-peer-urls=http://0.0.0.0:{ETCD_PEER_PORT}",
                f"--initial-advertise-peer-urls=http://{me}:{ETCD_PEER_PORT}",
                f"--initial-cluster={peers}",
                "--initial-cluster-state=new",
                f"--initial-cluster-token={self.name}-{self.uid[:8]}",
                "--auto-compaction-mode=periodic",
                "--auto-compaction-retention=1h",
            ],
            "env": self._env(),
            "ports": [
                {"name": "client", "containerPort": ETCD_CLIENT_PORT},
                {"name": "peer", "containerPort": ETCD_PEER_PORT},
            ],
            "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"}],
            # /health answers 200 only with a leader and a working quorum.
            "readinessProbe": self._http_probe("/health", "client", 5, 3),
            "livenessProbe": self._http_probe("/health", "client", 10, 6),
            "startupProbe": self._http_probe("/health", "client", 2, 90),
        }
        if etcd.resources:
            container["resources"] = etcd.resources
        template = self._template("etcd", self._pod_spec("etcd", [container]))
        sts = self._statefulset(n.etcd, "etcd", n.etcd_headless, etcd.replicas, template,
                                [self._claim("data", etcd.storage, self.labels("etcd"))], on_delete=True)  # fmt: skip
        out = [
            self._service(n.etcd_headless, "etcd", [("client", ETCD_CLIENT_PORT), ("peer", ETCD_PEER_PORT)], True),
            self._service(n.etcd, "etcd", [("client", ETCD_CLIENT_PORT)]),
            sts,
        ]
        if self.spec.podDisruptionBudget.enabled:
            out.append(self._pdb("etcd"))
        return out

    # ------------------------------------------------------------------------------------------ init job
    def init_job(self) -> Obj:
        n = self.names
        container = {
            "name": "initialize",
            "image": self.spec.image,
            "imagePullPolicy": self.spec.imagePullPolicy,
            "args": [
                "initialize-cluster-metadata",
                f"--cluster={self.cluster_name}",
                f"--metadata-url={n.metadata_url(self.spec)}",
                *self._cluster_urls(),
            ],
        }
        pod_spec = self._pod_spec("init", [container], restartPolicy="OnFailure")
        return {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": self.meta(n.init_job, "init"),
            "spec": {
                "backoffLimit": 20,
                "template": {"metadata": {"labels": self.labels("init")}, "spec": pod_spec},
            },
        }

    def _cluster_urls(self) -> list[str]:
        """The cluster's registered service URLs: plaintext unless TLS-only, TLS ones with TLS."""
        n, tls = self.names, self.spec.security.tls
        urls = [] if tls is not None and tls.tlsOnly else [f"--web-service-url={n.admin_url}",
                                                            f"--broker-service-url={n.service_url}"]  # fmt: skip
        if tls is not None:
            urls += [f"--web-service-url-tls={n.admin_url_tls}", f"--broker-service-url-tls={n.service_url_tls}"]
        return urls

    # ------------------------------------------------------------------------------------------ bookies
    def bookie_objects(self, replicas: int | None = None) -> list[Obj]:
        """Bookie objects; ``replicas`` overrides the spec while a scale-down decommissions bookies."""
        n = self.names
        b = self.spec.bookies
        container: Obj = {
            "name": "bookie",
            "image": self.spec.image,
            "imagePullPolicy": self.spec.imagePullPolicy,
            "args": [
                "bookie",
                f"--metadata-url={n.metadata_url(self.spec)}",
                "--journal-dir=/var/lib/magnetar/journal",
                "--ledger-dirs=/var/lib/magnetar/ledgers",
                f"--port={BOOKIE_PORT}",
                f"--http-port={BOOKIE_HTTP_PORT}",
                # The bookie id: the pod's stable DNS name (cookies and ledger ensembles refer to it).
                f"--advertised-address={n.pod_host('$(POD_NAME)', n.bookie_headless)}",
                *self._bookie_tls_args(),
            ],
            "env": self._env(),
            "ports": [
                {"name": "bookie", "containerPort": BOOKIE_PORT},
                {"name": "http", "containerPort": BOOKIE_HTTP_PORT},
            ],
            "volumeMounts": [
                {"name": "journal", "mountPath": "/var/lib/magnetar/journal"},
                {"name": "ledgers", "mountPath": "/var/lib/magnetar/ledgers"},
                *self._bookie_tls_volume()[1],
            ],
            "readinessProbe": self._http_probe("/ready", "http", 5, 3),
            "livenessProbe": self._http_probe("/health", "http", 10, 6),
            "startupProbe": self._http_probe("/health", "http", 2, 150),
        }
        if b.resources:
            container["resources"] = b.resources
        tls_volumes = self._bookie_tls_volume()[0]
        extra: Obj = {"volumes": tls_volumes} if tls_volumes else {}
        template = self._template("bookie", self._pod_spec("bookie", [container], terminationGracePeriodSeconds=60,
                                                           **extra))  # fmt: skip
        claims = [
            self._claim("journal", b.journal, self.labels("bookie")),
            self._claim("ledgers", b.ledgers, self.labels("bookie")),
        ]
        out = [
            self._service(n.bookie_headless, "bookie", [("bookie", BOOKIE_PORT), ("http", BOOKIE_HTTP_PORT)], True),
            self._statefulset(
                n.bookie,
                "bookie",
                n.bookie_headless,
                b.replicas if replicas is None else replicas,
                template,
                claims,
                on_delete=True,
            ),
        ]
        if self.spec.podDisruptionBudget.enabled:
            out.append(self._pdb("bookie"))
        return out

    def _bookie_tls_args(self) -> list[str]:
        """TLS on the bookie port (BookKeeper's setting names), from ``security.tls.bookieSecretName``."""
        tls = self.spec.security.tls
        if tls is None or not tls.bookieSecretName:
            return []
        return [f"--tlsCertificatePath={BOOKIE_TLS_DIR}/tls.crt", f"--tlsKeyStore={BOOKIE_TLS_DIR}/tls.key"]

    def _bookie_tls_volume(self) -> tuple[list[Obj], list[Obj]]:
        """The bookies' TLS Secret as a projected volume (rotation reaches the files; the bookie reloads them)."""
        tls = self.spec.security.tls
        if tls is None or not tls.bookieSecretName:
            return [], []
        volume = {"name": "bookie-tls", "projected": {"defaultMode": self._secret_mode(), "sources": [
            {"secret": {"name": tls.bookieSecretName}}]}}  # fmt: skip
        return [volume], [{"name": "bookie-tls", "mountPath": BOOKIE_TLS_DIR, "readOnly": True}]

    def _secret_mode(self) -> int:
        """0440 with the pod's fsGroup (readable by the image's group only); 0444 when a custom securityContext
        sets no fsGroup (the files are root-owned then, and the process runs as another user)."""
        pod_security = self.spec.podTemplate.securityContext
        return 0o440 if pod_security is None or pod_security.get("fsGroup") is not None else 0o444

    # ------------------------------------------------------------------------------------------ brokers
    def broker_conf(self) -> dict[str, str]:
        """broker.conf of every broker: what the cluster needs, then the user's ``brokers.config``."""
        s = self.spec
        conf = {
            "clusterName": self.cluster_name,
            "metadataStoreUrl": self.names.metadata_url(s),
            "brokerServicePort": str(BROKER_PORT),
            "webServicePort": str(BROKER_HTTP_PORT),
            "managedLedgerDefaultEnsembleSize": str(s.bookies.ensembleSize),
            "managedLedgerDefaultWriteQuorum": str(s.bookies.writeQuorum),
            "managedLedgerDefaultAckQuorum": str(s.bookies.ackQuorum),
            "autoRecoveryDaemonEnabled": str(s.autoRecovery.enabled).lower(),
        }
        if s.autoRecovery.lostBookieDelaySeconds is not None:
            conf["lostBookieRecoveryDelay"] = str(s.autoRecovery.lostBookieDelaySeconds)
        if s.autoRecovery.checkIntervalSeconds is not None:
            conf["auditorPeriodicCheckInterval"] = str(s.autoRecovery.checkIntervalSeconds)
        conf.update(self._security_conf())
        conf.update(s.brokers.config)
        return conf

    def _security_conf(self) -> dict[str, str]:
        """TLS, authentication and authorization settings (Pulsar's names) for ``spec.security``."""
        sec = self.spec.security
        conf: dict[str, str] = {}
        if sec.tls is not None:
            conf.update({
                "brokerServicePortTls": str(BROKER_TLS_PORT),
                "webServicePortTls": str(BROKER_HTTPS_PORT),
                "tlsCertificateFilePath": f"{TLS_DIR}/tls.crt",
                "tlsKeyFilePath": f"{TLS_DIR}/tls.key",
                "tlsTrustCertsFilePath": f"{TLS_DIR}/ca.crt",
                "tlsRequireTrustedClientCertOnConnect": str(sec.tls.requireClientCert).lower(),
            })  # fmt: skip
            if sec.tls.tlsOnly:
                conf["brokerServicePort"] = ""
                conf["webServicePort"] = ""
            if sec.tls.bookieSecretName:
                conf["bookkeeperTLSClientAuthentication"] = "true"
                conf["bookkeeperTLSTrustCertsFilePath"] = f"{BOOKIE_TLS_DIR}/ca.crt"
        auth = sec.authentication
        if auth is not None and auth.enabled:
            providers = [kind for kind, on in (("token", auth.token is not None), ("basic", auth.basic is not None),
                                               ("tls", auth.tlsClientCert)) if on]  # fmt: skip
            conf["authenticationEnabled"] = "true"
            conf["authenticationProviders"] = ",".join(PROVIDER_CLASSES[p] for p in providers)
            if auth.token is not None:
                if auth.token.secretKey is not None:
                    conf["tokenSecretKey"] = f"file://{AUTH_DIR}/token-secret-key"
                else:
                    conf["tokenPublicKey"] = f"file://{AUTH_DIR}/token-public-key"
                    if auth.token.publicAlg:
                        conf["tokenPublicAlg"] = auth.token.publicAlg
            if auth.basic is not None:
                conf["basicAuthConf"] = f"{AUTH_DIR}/htpasswd"
            conf["superUserRoles"] = ",".join(auth.superUserRoles)
            # Brokers call each other's admin API (bundle unloads, load shedding) with a superuser token.
            conf["brokerClientAuthenticationPlugin"] = BROKER_CLIENT_AUTH
            conf["brokerClientAuthenticationParameters"] = f"file://{AUTH_DIR}/broker-client-token"
        if sec.authorization is not None and sec.authorization.enabled:
            conf["authorizationEnabled"] = "true"
        return conf

    def _broker_ports(self) -> list[tuple[str, int]]:
        """The brokers' (name, port) pairs: plaintext unless TLS-only, TLS when on."""
        tls = self.spec.security.tls
        ports = [] if tls is not None and tls.tlsOnly else [("pulsar", BROKER_PORT), ("http", BROKER_HTTP_PORT)]
        if tls is not None:
            ports += [("pulsarssl", BROKER_TLS_PORT), ("https", BROKER_HTTPS_PORT)]
        return ports

    def _broker_probe(self, path: str, period: int, failures: int) -> Obj:
        """A probe that works in every security mode: HTTPS when TLS-only (the kubelet does not verify the
        certificate), a TCP check when TLS-only with required client certificates (the kubelet has none),
        Pulsar's unauthenticated status page when authentication is on."""
        sec = self.spec.security
        if sec.auth_on:
            path = STATUS_PATH
        if sec.tls is None or not sec.tls.tlsOnly:
            return self._http_probe(path, "http", period, failures)
        if sec.tls.requireClientCert:
            return {"tcpSocket": {"port": "https"}, "periodSeconds": period, "timeoutSeconds": 5,
                    "failureThreshold": failures}  # fmt: skip
        probe = self._http_probe(path, "https", period, failures)
        probe["httpGet"]["scheme"] = "HTTPS"
        return probe

    def _secret_volumes(self) -> tuple[list[Obj], list[Obj]]:
        """Read-only projected volumes (and their mounts) of the Secrets ``spec.security`` names."""
        sec = self.spec.security
        volumes: list[Obj] = []
        mounts: list[Obj] = []
        mode = self._secret_mode()
        if sec.tls is not None:
            # Every key (tls.crt, tls.key, ca.crt): ca.crt may be absent with some issuers.
            volumes.append({"name": "tls", "projected": {"defaultMode": mode, "sources": [
                {"secret": {"name": sec.tls.secretName}}]}})  # fmt: skip
            mounts.append({"name": "tls", "mountPath": TLS_DIR, "readOnly": True})
            if sec.tls.bookieSecretName:
                # Only the CA: brokers verify the bookies, they need none of the bookies' keys.
                source = {"secret": {"name": sec.tls.bookieSecretName, "items": [{"key": "ca.crt", "path": "ca.crt"}]}}
                volumes.append({"name": "bookie-tls", "projected": {"defaultMode": mode, "sources": [source]}})
                mounts.append({"name": "bookie-tls", "mountPath": BOOKIE_TLS_DIR, "readOnly": True})
        auth = sec.authentication
        if auth is not None and auth.enabled:
            sources: list[Obj] = []
            if auth.token is not None:
                ref, path_ = ((auth.token.secretKey, "token-secret-key") if auth.token.secretKey is not None
                              else (auth.token.publicKey, "token-public-key"))  # fmt: skip
                assert ref is not None
                sources.append({"secret": {"name": ref.name, "items": [{"key": ref.key, "path": path_}]}})
            if auth.basic is not None:
                ref = auth.basic.htpasswd
                sources.append({"secret": {"name": ref.name, "items": [{"key": ref.key, "path": "htpasswd"}]}})
            client = broker_client_token_ref(self.spec, self.config)
            if client is not None:
                item = {"key": client[1], "path": "broker-client-token"}
                sources.append({"secret": {"name": client[0], "items": [item]}})
            if sources:
                volumes.append({"name": "auth", "projected": {"defaultMode": mode, "sources": sources}})
                mounts.append({"name": "auth", "mountPath": AUTH_DIR, "readOnly": True})
        return volumes, mounts

    def broker_configmap(self) -> Obj:
        text = "".join(f"{k}={v}\n" for k, v in sorted(self.broker_conf().items()))
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": self.meta(self.names.broker, "broker"),
            "data": {"broker.conf": text},
        }

    def broker_objects(self) -> list[Obj]:
        n = self.names
        b = self.spec.brokers
        configmap = self.broker_configmap()
        me = n.pod_host("$(POD_NAME)", n.broker_headless)
        env = self._env()
        args = ["broker", "--config=/etc/magnetar/broker.conf"]
        ext = b.externalListener
        if ext is None:
            args.append(f"--advertised-address={me}")
        else:
            # Kubernetes 1.28+ labels StatefulSet pods with their ordinal.
            index_label = "metadata.labels['apps.kubernetes.io/pod-index']"
            env.append({"name": "POD_INDEX", "valueFrom": {"fieldRef": {"fieldPath": index_label}}})
            host = ext.hostTemplate.replace("{index}", "$(POD_INDEX)").replace("{name}", "$(POD_NAME)")
            listeners = ",".join(self._listeners("internal", me) + self._listeners("external", host))
            env.append({"name": "MAGNETAR_advertisedListeners", "value": listeners})
            env.append({"name": "MAGNETAR_internalListenerName", "value": "internal"})
        secret_volumes, secret_mounts = self._secret_volumes()
        ports = self._broker_ports()
        container: Obj = {
            "name": "broker",
            "image": self.spec.image,
            "imagePullPolicy": self.spec.imagePullPolicy,
            "args": args,
            "env": env,
            "ports": [{"name": name, "containerPort": port} for name, port in ports],
            "volumeMounts": [{"name": "config", "mountPath": "/etc/magnetar", "readOnly": True}, *secret_mounts],
            "readinessProbe": self._broker_probe("/admin/v2/brokers/ready", 5, 3),
            "livenessProbe": self._broker_probe("/admin/v2/brokers/health", 10, 6),
            "startupProbe": self._broker_probe("/admin/v2/brokers/health", 2, 150),
        }
        if b.resources:
            container["resources"] = b.resources
        pod_spec = self._pod_spec(
            "broker", [container], terminationGracePeriodSeconds=60,
            volumes=[{"name": "config", "configMap": {"name": configmap["metadata"]["name"]}}, *secret_volumes],
        )  # fmt: skip
        # The configuration's hash is part of the template: a config change rolls the brokers.
        template = self._template("broker", pod_spec, {f"{GROUP}/config-hash": digest(configmap["data"])})
        out = [
            configmap,
            self._service(n.broker_headless, "broker", ports, True),
            self._service(n.broker, "broker", ports),
            self._statefulset(n.broker, "broker", n.broker_headless, b.replicas, template, [], on_delete=True),
        ]
        if ext is not None:
            for i in range(b.replicas):
                pod = f"{n.broker}-{i}"
                binary = [(name, port) for name, port in ports if name.startswith("pulsar")]
                svc = self._service(f"{pod}-external", "broker", binary,
                                    selector={"statefulset.kubernetes.io/pod-name": pod}, type=ext.type)  # fmt: skip
                if ext.annotations:
                    svc["metadata"]["annotations"] = dict(ext.annotations)
                out.append(svc)
        if self.spec.podDisruptionBudget.enabled:
            out.append(self._pdb("broker"))
        return out

    def _listeners(self, name: str, host: str) -> list[str]:
        """``advertisedListeners`` entries of one listener: plaintext unless TLS-only, ``pulsar+ssl`` with TLS."""
        tls = self.spec.security.tls
        out = [] if tls is not None and tls.tlsOnly else [f"{name}:pulsar://{host}:{BROKER_PORT}"]
        if tls is not None:
            out.append(f"{name}:pulsar+ssl://{host}:{BROKER_TLS_PORT}")
        return out

    # ------------------------------------------------------------------------------------------ monitoring
    def service_monitor(self) -> Obj | None:
        sm = self.spec.monitoring.serviceMonitor
        if not sm.enabled:
            return None
        meta = self.meta(self.name, "monitoring")
        meta["labels"].update(sm.labels)
        return {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": meta,
            "spec": {
                "selector": {
                    "matchLabels": {INSTANCE: self.name},
                    "matchExpressions": [{"key": COMPONENT, "operator": "In", "values": ["broker", "bookie"]}],
                },
                "endpoints": self._metrics_endpoints(sm.interval),
            },
        }

    def _metrics_endpoints(self, interval: str) -> list[Obj]:
        """Bookies (and brokers unless TLS-only) on ``http``; TLS-only brokers on ``https``, verified with the
        TLS Secret's ca.crt."""
        out: list[Obj] = [{"port": "http", "path": "/metrics", "interval": interval}]
        tls = self.spec.security.tls
        if tls is not None and tls.tlsOnly:
            out.append({
                "port": "https", "path": "/metrics", "interval": interval, "scheme": "https",
                "tlsConfig": {"ca": {"secret": {"name": tls.secretName, "key": "ca.crt"}},
                              "serverName": self.names.service_host(self.names.broker)},
            })  # fmt: skip
        return out

    # ------------------------------------------------------------------------------------------ all
    def all_objects(self) -> list[Obj]:
        """Everything, in start-up order (what ``helm template``-style rendering and tests look at)."""
        out = [*self.etcd_objects(), self.init_job(), *self.bookie_objects(), *self.broker_objects()]
        monitor = self.service_monitor()
        if monitor is not None:
            out.append(monitor)
        return [copy.deepcopy(o) for o in out]
