"""A secured MagnetarCluster (``spec.security``): what it renders into (Secrets mounted as projected volumes,
Pulsar's TLS/authentication/authorization settings, TLS ports, probes that work in every mode), what its CRD
refuses, and its status while a referenced Secret is missing or unreadable (the real reconciler against the
emulated Kubernetes API)."""

from __future__ import annotations

import argparse
import base64
import copy
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
import yaml

from magnetar.cli import bookie as bookie_cli
from magnetar.cli import initialize
from magnetar.operator.clusteraccess import ClusterAccess, required_secret_keys
from magnetar.operator.clusterhandlers import ClusterHandlers
from magnetar.operator.clusterobjects import AUTH_DIR, BOOKIE_TLS_DIR, TEMPLATE_HASH, TLS_DIR, ClusterRenderer
from magnetar.operator.clusterops import READY, ClusterReconciler, status_of
from magnetar.operator.config import OperatorConfig
from magnetar.operator.kube import KubeClient, KubeError
from tests.deploy import tools
from tests.harness.controllers import register_types
from tests.operator import crdcheck
from tests.operator.kubeemu import EmulatorThread

TOKEN_CLASS = "org.apache.pulsar.broker.authentication.AuthenticationProviderToken"
BASIC_CLASS = "org.apache.pulsar.broker.authentication.AuthenticationProviderBasic"
TLS_CLASS = "org.apache.pulsar.broker.authentication.AuthenticationProviderTls"

SECURITY: dict[str, Any] = {
    "tls": {"secretName": "demo-tls"},
    "authentication": {
        "token": {"secretKey": {"name": "demo-token-key", "key": "secret.key"}},
        "basic": {"htpasswd": {"name": "demo-htpasswd", "key": "htpasswd"}},
        "superUserRoles": ["operator", "admin"],
        "operatorTokenSecretRef": {"name": "demo-operator-token", "key": "token"},
    },
    "authorization": {"enabled": True},
}

BODY: dict[str, Any] = {
    "apiVersion": "magnetar.io/v1alpha1",
    "kind": "MagnetarCluster",
    "metadata": {"name": "demo", "namespace": "prod", "uid": "0f0e0d0c-1111-2222-3333-444455556666"},
    "spec": {
        "image": "registry.example.com/magnetar:1.0",
        "metadataStore": {"external": {"endpoints": ["etcd.example:2379"]}},
        "bookies": {"replicas": 2},
        "brokers": {"replicas": 2},
        "monitoring": {"serviceMonitor": {"enabled": True}},
        "security": SECURITY,
    },
}


def body_with(security: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    body = copy.deepcopy(BODY)
    if security is not None:
        body["spec"]["security"] = security
    body["spec"].update(spec)
    return body


def by(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def broker_parts(body: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """broker.conf as a dict, the broker container, the pod spec, all objects."""
    objs = ClusterRenderer(copy.deepcopy(body)).all_objects()
    text = by(objs, "ConfigMap", "demo-broker")["data"]["broker.conf"]
    conf = dict(line.split("=", 1) for line in text.splitlines())
    pod = by(objs, "StatefulSet", "demo-broker")["spec"]["template"]["spec"]
    return conf, pod["containers"][0], pod, objs


def ports_of(obj: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p.get("port", p.get("containerPort")) for p in obj["ports"]}


# ---------------------------------------------------------------------------------------------- rendering
def test_secured_cluster_renders_pulsar_settings() -> None:
    conf, _, _, _ = broker_parts(BODY)
    assert conf["brokerServicePortTls"] == "6651" and conf["webServicePortTls"] == "8443"
    assert conf["tlsCertificateFilePath"] == f"{TLS_DIR}/tls.crt"
    assert conf["tlsKeyFilePath"] == f"{TLS_DIR}/tls.key"
    assert conf["tlsTrustCertsFilePath"] == f"{TLS_DIR}/ca.crt"
    assert conf["tlsRequireTrustedClientCertOnConnect"] == "false"
    # Both kinds of ports unless TLS-only.
    assert conf["brokerServicePort"] == "6650" and conf["webServicePort"] == "8080"
    assert conf["authenticationEnabled"] == "true"
    assert conf["authenticationProviders"] == f"{TOKEN_CLASS},{BASIC_CLASS}"
    assert conf["tokenSecretKey"] == f"file://{AUTH_DIR}/token-secret-key"
    assert "tokenPublicKey" not in conf
    assert conf["basicAuthConf"] == f"{AUTH_DIR}/htpasswd"
    assert conf["superUserRoles"] == "operator,admin"
    assert conf["authorizationEnabled"] == "true"
    assert conf["brokerClientAuthenticationPlugin"] == "org.apache.pulsar.client.impl.auth.AuthenticationToken"
    assert conf["brokerClientAuthenticationParameters"] == f"file://{AUTH_DIR}/broker-client-token"


def test_secrets_are_read_only_projected_volumes() -> None:
    _, container, pod, _ = broker_parts(BODY)
    volumes = {v["name"]: v for v in pod["volumes"]}
    # Projected (not subPath) mounts: the kubelet refreshes them when cert-manager renews the certificate.
    assert volumes["tls"]["projected"]["sources"] == [{"secret": {"name": "demo-tls"}}]
    assert volumes["auth"]["projected"]["sources"] == [
        {"secret": {"name": "demo-token-key", "items": [{"key": "secret.key", "path": "token-secret-key"}]}},
        {"secret": {"name": "demo-htpasswd", "items": [{"key": "htpasswd", "path": "htpasswd"}]}},
        # Brokers call each other (bundle unloads) with a superuser token: the operator's unless one is named.
        {"secret": {"name": "demo-operator-token", "items": [{"key": "token", "path": "broker-client-token"}]}},
    ]
    assert all(volumes[n]["projected"]["defaultMode"] == 0o440 for n in ("tls", "auth"))
    # Without fsGroup the root-owned files must stay readable by the broker's (non-root) user.
    custom = body_with(podTemplate={"securityContext": {"runAsNonRoot": True, "runAsUser": 1000}})
    _, _, pod, _ = broker_parts(custom)
    assert {v["projected"]["defaultMode"] for v in pod["volumes"] if "projected" in v} == {0o444}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["tls"] == {"name": "tls", "mountPath": TLS_DIR, "readOnly": True}
    assert mounts["auth"] == {"name": "auth", "mountPath": AUTH_DIR, "readOnly": True}
    assert all("subPath" not in m for m in container["volumeMounts"])
    security = copy.deepcopy(SECURITY)
    security["authentication"]["brokerClientTokenSecretRef"] = {"name": "demo-broker-token", "key": "jwt"}
    _, _, pod, _ = broker_parts(body_with(security))
    auth = next(v for v in pod["volumes"] if v["name"] == "auth")
    assert auth["projected"]["sources"][-1] == {
        "secret": {"name": "demo-broker-token", "items": [{"key": "jwt", "path": "broker-client-token"}]}
    }
    assert "demo-operator-token" not in yaml.safe_dump(pod)


def test_tls_ports_on_services_and_containers_and_probes_without_credentials() -> None:
    _, container, _, objs = broker_parts(BODY)
    want = {"pulsar": 6650, "http": 8080, "pulsarssl": 6651, "https": 8443}
    assert ports_of(container) == want
    assert ports_of(by(objs, "Service", "demo-broker")["spec"]) == want
    assert ports_of(by(objs, "Service", "demo-broker-headless")["spec"]) == want
    # Authentication on: admin paths need credentials the kubelet does not have; Pulsar's status page.
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"] == {"path": "/status.html", "port": "http"}


def test_tls_only_turns_plaintext_off_and_probes_over_https() -> None:
    security = copy.deepcopy(SECURITY)
    security["tls"]["tlsOnly"] = True
    del security["authentication"], security["authorization"]
    body = body_with(security)
    conf, container, _, objs = broker_parts(body)
    assert conf["brokerServicePort"] == "" and conf["webServicePort"] == ""
    assert ports_of(container) == {"pulsarssl": 6651, "https": 8443}
    assert ports_of(by(objs, "Service", "demo-broker")["spec"]) == {"pulsarssl": 6651, "https": 8443}
    assert container["readinessProbe"]["httpGet"] == {"path": "/admin/v2/brokers/ready", "port": "https",
                                                      "scheme": "HTTPS"}  # fmt: skip
    assert container["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    monitor = next(o for o in objs if o["kind"] == "ServiceMonitor")
    https = [e for e in monitor["spec"]["endpoints"] if e["port"] == "https"]
    assert https[0]["scheme"] == "https" and https[0]["tlsConfig"]["ca"]["secret"] == {"name": "demo-tls",
                                                                                        "key": "ca.crt"}  # fmt: skip
    r = ClusterRenderer(copy.deepcopy(body))
    assert r.names.client_urls(r.spec) == ("pulsar+ssl://demo-broker.prod.svc:6651",
                                           "https://demo-broker.prod.svc:8443")  # fmt: skip


@pytest.mark.parametrize("tls_only", [False, True])
def test_init_job_registers_the_tls_urls(tls_only: bool) -> None:
    security = {"tls": {"secretName": "demo-tls", "tlsOnly": tls_only}}
    args = ClusterRenderer(body_with(security)).init_job()["spec"]["template"]["spec"]["containers"][0]["args"]
    urls = [a for a in args if "-url" in a and "metadata" not in a]
    tls = ["--web-service-url-tls=https://demo-broker.prod.svc:8443",
           "--broker-service-url-tls=pulsar+ssl://demo-broker.prod.svc:6651"]  # fmt: skip
    plain = ["--web-service-url=http://demo-broker.prod.svc:8080",
             "--broker-service-url=pulsar://demo-broker.prod.svc:6650"]  # fmt: skip
    assert urls == (tls if tls_only else plain + tls)
    # The arguments are initialize-cluster-metadata's.
    parser = argparse.ArgumentParser()
    initialize.add_parser(parser.add_subparsers())
    assert parser.parse_args(args).web_service_url_tls == "https://demo-broker.prod.svc:8443"


def test_bookie_tls_from_its_own_secret() -> None:
    security = {"tls": {"secretName": "demo-tls", "bookieSecretName": "demo-bookie-tls"}}
    body = body_with(security)
    objs = ClusterRenderer(copy.deepcopy(body)).all_objects()
    bookie = by(objs, "StatefulSet", "demo-bookie")["spec"]["template"]["spec"]
    args = bookie["containers"][0]["args"]
    assert {f"--tlsCertificatePath={BOOKIE_TLS_DIR}/tls.crt", f"--tlsKeyStore={BOOKIE_TLS_DIR}/tls.key"} <= set(args)
    # The bookie CLI takes them (BookKeeper's names).
    parser = argparse.ArgumentParser()
    bookie_cli.add_parser(parser.add_subparsers())
    parsed = parser.parse_args(args)
    assert parsed.tls_certificate_path == f"{BOOKIE_TLS_DIR}/tls.crt" and parsed.tls_key_store.endswith("tls.key")
    assert bookie["volumes"] == [{"name": "bookie-tls", "projected": {"defaultMode": 0o440, "sources": [
        {"secret": {"name": "demo-bookie-tls"}}]}}]  # fmt: skip
    mounts = bookie["containers"][0]["volumeMounts"]
    assert {"name": "bookie-tls", "mountPath": BOOKIE_TLS_DIR, "readOnly": True} in mounts
    conf, _, pod, _ = broker_parts(body)
    assert conf["bookkeeperTLSClientAuthentication"] == "true"
    assert conf["bookkeeperTLSTrustCertsFilePath"] == f"{BOOKIE_TLS_DIR}/ca.crt"
    # Brokers get the bookies' CA only, never their key.
    volume = next(v for v in pod["volumes"] if v["name"] == "bookie-tls")
    assert volume["projected"]["sources"] == [
        {"secret": {"name": "demo-bookie-tls", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}
    ]
    spec = ClusterRenderer(body).spec
    assert ("demo-bookie-tls", "ca.crt") in [(n, k) for n, k, _ in required_secret_keys(spec, OperatorConfig())]
    assert crdcheck.validate(body) == []
    # Without it the bookies are rendered as before.
    plain = by(ClusterRenderer(body_with({})).all_objects(), "StatefulSet", "demo-bookie")["spec"]["template"]["spec"]
    assert "volumes" not in plain and not any(a.startswith("--tls") for a in plain["containers"][0]["args"])


def test_tls_only_with_client_certificates_probes_the_port() -> None:
    token = {"publicKey": {"name": "issuer", "key": "public.pem"}, "publicAlg": "ES256"}
    security = {"tls": {"secretName": "demo-tls", "tlsOnly": True, "requireClientCert": True},
                "authentication": {"token": token, "tlsClientCert": True, "superUserRoles": ["op"]}}  # fmt: skip
    body = body_with(security)
    assert crdcheck.validate(body) == []
    conf, container, pod, _ = broker_parts(body)
    assert conf["tlsRequireTrustedClientCertOnConnect"] == "true"
    assert conf["authenticationProviders"] == f"{TOKEN_CLASS},{TLS_CLASS}"
    assert conf["tokenPublicKey"] == f"file://{AUTH_DIR}/token-public-key" and conf["tokenPublicAlg"] == "ES256"
    # The kubelet has no client certificate: a TCP check.
    assert container["readinessProbe"]["tcpSocket"] == {"port": "https"}
    auth = next(v for v in pod["volumes"] if v["name"] == "auth")
    assert auth["projected"]["sources"][0]["secret"]["items"] == [{"key": "public.pem", "path": "token-public-key"}]


def test_external_listener_advertises_tls_urls() -> None:
    body = body_with(brokers={"replicas": 1, "externalListener": {"type": "NodePort", "hostTemplate": "b{index}.ex"}})
    _, container, _, objs = broker_parts(body)
    env = {e["name"]: e.get("value") for e in container["env"]}
    me = "$(POD_NAME).demo-broker-headless.prod.svc"
    assert env["MAGNETAR_advertisedListeners"].split(",") == [
        f"internal:pulsar://{me}:6650", f"internal:pulsar+ssl://{me}:6651",
        "external:pulsar://b$(POD_INDEX).ex:6650", "external:pulsar+ssl://b$(POD_INDEX).ex:6651",
    ]  # fmt: skip
    assert ports_of(by(objs, "Service", "demo-broker-0-external")["spec"]) == {"pulsar": 6650, "pulsarssl": 6651}


def test_secured_objects_validate_against_kubernetes_schemas() -> None:
    for security in (SECURITY, {"tls": {"secretName": "t", "tlsOnly": True, "requireClientCert": True,
                                        "bookieSecretName": "b"}}):  # fmt: skip
        objs = ClusterRenderer(body_with(copy.deepcopy(security))).all_objects()
        builtin = [o for o in objs if tools.is_builtin(o) and o["kind"] != "ServiceMonitor"]
        assert tools.validate_builtin(builtin) == []


def test_security_change_rolls_the_brokers_but_not_the_bookies() -> None:
    def hashes(body: dict[str, Any]) -> tuple[str, str]:
        objs = ClusterRenderer(body).all_objects()
        annotations = [by(objs, "StatefulSet", f"demo-{c}")["spec"]["template"]["metadata"]["annotations"]
                       for c in ("broker", "bookie")]  # fmt: skip
        return annotations[0][TEMPLATE_HASH], annotations[1][TEMPLATE_HASH]

    plain, secured = hashes(body_with({})), hashes(body_with(copy.deepcopy(SECURITY)))
    assert plain[0] != secured[0] and plain[1] == secured[1]


def test_unsecured_cluster_renders_as_before() -> None:
    conf, container, pod, _ = broker_parts(body_with({}))
    assert not any(k.startswith(("tls", "authentication", "token", "authorization")) for k in conf)
    assert ports_of(container) == {"pulsar": 6650, "http": 8080}
    assert [v["name"] for v in pod["volumes"]] == ["config"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/admin/v2/brokers/ready", "port": "http"}


# ---------------------------------------------------------------------------------------------- CRD
def test_secured_spec_is_valid() -> None:
    assert crdcheck.validate(BODY) == []


@pytest.mark.parametrize(
    ("security", "error"),
    [
        ({"tls": {}}, "secretName"),
        ({"tls": {"secretName": "t", "tlsOnly": "yes"}}, "tlsOnly"),
        ({"authentication": {"superUserRoles": ["a"]}}, "needs the token provider"),
        ({"authentication": {"token": {}}}, "exactly one of secretKey and publicKey"),
        ({"authentication": {"token": {"secretKey": {"name": "a", "key": "k"},
                                       "publicKey": {"name": "b", "key": "k"}}}}, "exactly one"),
        ({"authentication": {"token": {"secretKey": {"name": "a", "key": "k"}, "publicAlg": "RS256"}}},
         "publicAlg needs"),
        ({"authentication": {"token": {"secretKey": {"name": "a"}}}}, "key"),
        ({"authentication": {"token": {"secretKey": {"name": "a", "key": "k/x"}}}}, "key"),
        ({"authentication": {"token": {"publicKey": {"name": "a", "key": "k"}, "publicAlg": "none"}}}, "publicAlg"),
        ({"authorization": {"enabled": True}}, "authorization needs authentication"),
        ({"authentication": {"enabled": False}, "authorization": {"enabled": True}},
         "authorization needs authentication"),
        ({"authentication": {"token": {"secretKey": {"name": "a", "key": "k"}}, "tlsClientCert": True}},
         "tlsClientCert needs tls"),
        ({"authentication": {"token": {"secretKey": {"name": "a", "key": "k"}},
                             "operatorTokenSecretRef": {"name": "op"}}}, "key"),
    ],
)  # fmt: skip
def test_invalid_security_is_refused(security: dict[str, Any], error: str) -> None:
    problems = crdcheck.validate(body_with(security))
    assert problems and any(error in p for p in problems), problems


def test_authentication_can_be_switched_off_without_a_provider() -> None:
    assert crdcheck.validate(body_with({"authentication": {"enabled": False}})) == []


# ---------------------------------------------------------------------------------------------- status
@pytest.fixture(scope="module")
def emu() -> Iterator[EmulatorThread]:
    thread = EmulatorThread().start()
    thread.call(register_types, thread.emulator)
    yield thread
    thread.stop()


def _secret(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "type": "Opaque",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}  # fmt: skip


class Loop:
    """The reconciler, the handlers' backoff and a KubeClient against the emulator, as the operator has them."""

    def __init__(self, emu: EmulatorThread, namespace: str) -> None:
        self.emu = emu
        self.ns = namespace
        self.kube = KubeClient()
        self.kube.set_credentials(kopf.ConnectionInfo(server=emu.url, token="emulator-does-not-check"))
        self.config = OperatorConfig(backoff_base=1, backoff_cap=8)
        self.reconciler = ClusterReconciler(self.kube, config=self.config)
        self.events: list[tuple[str, str, str]] = []

    async def api(self, method: str, path: str, body: Any = None, ctype: str | None = None) -> Any:
        return await self.kube.request(method, path, body, content_type=ctype)

    def path(self, plural: str, name: str = "") -> str:
        core = plural in ("secrets", "pods")
        prefix = "/api/v1" if core else "/apis/magnetar.io/v1alpha1"
        return f"{prefix}/namespaces/{self.ns}/{plural}" + (f"/{name}" if name else "")

    async def body(self) -> dict[str, Any]:
        return await self.api("GET", self.path("magnetarclusters", "demo"))

    async def pass_(self) -> tuple[dict[str, Any], Any]:
        """One reconcile pass, its status written through /status as kopf would."""
        body = await self.body()
        result = await self.reconciler.reconcile(body, lambda *e: self.events.append(e))
        meta = body["metadata"]
        status = status_of(body.get("status") or {}, result, int(meta["generation"]), ClusterRenderer(body))
        await self.kube.patch_status("magnetar.io/v1alpha1", "magnetarclusters", self.ns, "demo", status)
        return (await self.body())["status"], result

    async def close(self) -> None:
        await self.reconciler.close()
        await self.kube.close()


async def _ready_bookies(loop: Loop) -> None:
    """Bookie pods that look Ready (nothing runs pods here) with the current template."""
    body = await loop.body()
    objs = ClusterRenderer(body).bookie_objects()
    sts = next(o for o in objs if o["kind"] == "StatefulSet")
    template = sts["spec"]["template"]
    for i in range(sts["spec"]["replicas"]):
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"demo-bookie-{i}", "labels": template["metadata"]["labels"],
                            "annotations": template["metadata"]["annotations"]},
               "spec": template["spec"]}  # fmt: skip
        await loop.api("POST", loop.path("pods"), pod)
        await loop.api("PATCH", loop.path("pods", f"demo-bookie-{i}") + "/status",
                       {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
                       "application/merge-patch+json")  # fmt: skip


def _ready(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == READY)


async def test_missing_and_unreadable_secrets_are_reported_in_status(emu: EmulatorThread) -> None:
    loop = Loop(emu, "secured")
    try:
        for doc in (yaml.safe_load(p.read_text()) for p in sorted(crdcheck.CRD_DIR.glob("magnetar.io_*.yaml"))):
            try:
                await loop.api("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc)
            except KubeError as exc:
                assert exc.status == 409
        body = body_with()
        body["metadata"] = {"name": "demo"}
        await loop.api("POST", loop.path("magnetarclusters"), body)
        await loop.kube.patch_status("magnetar.io/v1alpha1", "magnetarclusters", "secured", "demo",
                                     {"metadataInitialized": True})  # fmt: skip
        await _ready_bookies(loop)

        status, result = await loop.pass_()
        cond = _ready(status)
        assert cond["status"] == "False" and cond["reason"] == "SecretNotFound"
        assert "secured/demo-tls" in cond["message"] and status["phase"] == "WaitingForSecrets"
        # The brokers wait for their Secrets: nothing is created that could not start.
        with pytest.raises(KubeError) as missing:
            await loop.api("GET", "/apis/apps/v1/namespaces/secured/statefulsets/demo-broker")
        assert missing.value.status == 404
        warnings = [e for e in loop.events if e[1] == "SecretNotFound"]
        assert len(warnings) == 1 and warnings[0][0] == "Warning"
        # Retried with backoff (not the poll interval, not a hot loop), without a second Warning.
        handlers = ClusterHandlers(loop.config, loop.kube)
        assert [handlers.retry_delay(result.reason, n) for n in range(5)] == [1, 2, 4, 8, 8]
        await handlers.close()
        await loop.pass_()
        assert len([e for e in loop.events if e[1] == "SecretNotFound"]) == 1

        # A key missing from the Secret.
        await loop.api("POST", loop.path("secrets"), _secret("demo-tls", {"tls.crt": "CERT"}))
        status, _ = await loop.pass_()
        assert _ready(status)["reason"] == "SecretKeyMissing" and "'tls.key'" in _ready(status)["message"]
        await loop.api("PATCH", loop.path("secrets", "demo-tls"), _secret("demo-tls", {"tls.key": "KEY"}),
                       "application/merge-patch+json")  # fmt: skip
        for name, data in (("demo-token-key", {"secret.key": "k"}), ("demo-htpasswd", {"htpasswd": "u:x"})):
            await loop.api("POST", loop.path("secrets"), _secret(name, data))
        status, _ = await loop.pass_()
        assert _ready(status)["reason"] == "SecretNotFound" and "demo-operator-token" in _ready(status)["message"]
        assert "operator admin token" in _ready(status)["message"]

        # A Secret the operator may not read (RBAC): SecretUnreadable.
        await loop.api("POST", loop.path("secrets"), _secret("demo-operator-token", {"token": "t"}))
        emulator = emu.emulator
        assert emulator is not None
        emulator.forbidden.add(("secrets", "secured", "demo-operator-token"))
        status, _ = await loop.pass_()
        assert _ready(status)["reason"] == "SecretUnreadable" and "403" in _ready(status)["message"]
        emulator.forbidden.clear()

        # Everything there: the brokers are created with the Secrets mounted; the status URLs are the TLS ones.
        # The operator's token is not a superuser's: a Warning (once), not a blocked cluster.
        claims = base64.urlsafe_b64encode(b'{"sub":"stranger"}').decode().rstrip("=")
        stranger = f"eyJhbGciOiJIUzI1NiJ9.{claims}.c2lnbmF0dXJl"  # read, never verified, by the operator
        op_token = _secret("demo-operator-token", {"token": stranger})
        await loop.api("PATCH", loop.path("secrets", "demo-operator-token"), op_token, "application/merge-patch+json")
        status, _ = await loop.pass_()
        await loop.pass_()
        warned = [e for e in loop.events if e[1] == "OperatorNotSuperUser"]
        assert len(warned) == 1 and "'stranger'" in warned[0][2] and warned[0][0] == "Warning"
        assert _ready(status)["reason"] == "WaitingForBrokers", status
        assert status["serviceUrl"] == "pulsar+ssl://demo-broker.secured.svc:6651"
        assert status["adminUrl"] == "https://demo-broker.secured.svc:8443"
        sts = await loop.api("GET", "/apis/apps/v1/namespaces/secured/statefulsets/demo-broker")
        assert {v["name"] for v in sts["spec"]["template"]["spec"]["volumes"]} == {"config", "tls", "auth"}
    finally:
        await loop.close()


def test_cluster_access_for_clusterref_resources() -> None:
    config = OperatorConfig()
    spec = ClusterRenderer(copy.deepcopy(BODY)).spec
    access = ClusterAccess.of(spec, True, config)
    assert access == ClusterAccess(True, True, "demo-operator-token", "token", "demo-tls")
    assert ClusterAccess.from_index(access.as_index()) == access
    # No operatorTokenSecretRef: the operator's configured Secret (chart operatorToken.secretName).
    security = copy.deepcopy(SECURITY)
    del security["authentication"]["operatorTokenSecretRef"]
    spec = ClusterRenderer(body_with(security)).spec
    assert ClusterAccess.of(spec, True, config).token_secret == "magnetar-operator-token"
    assert ClusterAccess.of(ClusterRenderer(body_with({})).spec, False, config) == ClusterAccess(False)
    assert config.cluster_url("prod", "demo", tls=True) == "https://demo-broker.prod.svc:8443"


def test_every_referenced_secret_key_is_checked() -> None:
    config = OperatorConfig()
    security = copy.deepcopy(SECURITY)
    security["tls"]["requireClientCert"] = True
    security["authentication"]["brokerClientTokenSecretRef"] = {"name": "demo-broker-token", "key": "jwt"}
    spec = ClusterRenderer(body_with(security)).spec
    assert [(name, key) for name, key, _ in required_secret_keys(spec, config)] == [
        ("demo-tls", "tls.crt"), ("demo-tls", "tls.key"), ("demo-tls", "ca.crt"),
        ("demo-token-key", "secret.key"), ("demo-htpasswd", "htpasswd"),
        ("demo-operator-token", "token"), ("demo-broker-token", "jwt"),
    ]  # fmt: skip
    assert required_secret_keys(ClusterRenderer(body_with({})).spec, config) == []


def test_docs_example_is_valid_and_renders() -> None:
    """docs/operator.md, "Securing a cluster": its MagnetarCluster passes the CRD and renders TLS-only brokers."""
    text = (crdcheck.CRD_DIR.parent / "docs" / "operator.md").read_text()
    section = text.split("\n## Securing a cluster\n", 1)[1].split("\n## ", 1)[0]
    blocks = [yaml.safe_load(b.split("```", 1)[0]) for b in section.split("```yaml\n")[1:]]
    (mc,) = [b for b in blocks if b["kind"] == "MagnetarCluster"]
    assert crdcheck.validate(mc) == []
    conf, container, _, _ = broker_parts({**mc, "metadata": {**mc["metadata"], "name": "demo"}})
    assert conf["webServicePort"] == "" and conf["authorizationEnabled"] == "true"
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"


def test_every_rendered_setting_is_a_broker_setting() -> None:
    """The broker knows every name the operator writes (an unknown one would only be logged and ignored)."""
    from magnetar.broker.config import BrokerConfig

    security = copy.deepcopy(SECURITY)
    security["tls"].update(tlsOnly=True, requireClientCert=True, bookieSecretName="demo-bookie-tls")
    security["authentication"]["tlsClientCert"] = True
    conf, _, _, _ = broker_parts(body_with(security))
    config = BrokerConfig()
    assert config.apply(conf) == []
    assert config.broker_service_port is None and config.web_service_port is None
    assert config.super_user_roles == "operator,admin" and config.authorization_enabled
    assert config.tls_require_trusted_client_cert_on_connect and config.bookkeeper_tls_client_authentication
