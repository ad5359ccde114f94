"""``/admin/v2/clusters`` over real HTTP against the session's standalone broker."""

from __future__ import annotations

import uuid

import pytest

from tests.admin.rest import call
from tests.conftest import StandaloneProcess

DATA = {"serviceUrl": "http://c.example.com:8080", "brokerServiceUrl": "pulsar://c.example.com:6650"}


@pytest.fixture
def base(standalone: StandaloneProcess) -> str:
    return f"{standalone.http_url}/admin/v2"


@pytest.fixture
def cluster(base: str) -> str:
    name = f"c-{uuid.uuid4().hex[:8]}"
    yield name
    call("DELETE", f"{base}/clusters/{name}")


def test_standalone_cluster_exists(base: str, standalone: StandaloneProcess) -> None:
    listed = call("GET", f"{base}/clusters")
    assert listed.status == 200 and "standalone" in listed.json
    got = call("GET", f"{base}/clusters/standalone")
    assert got.status == 200
    assert got.json["serviceUrl"].startswith("http://")
    assert got.json["brokerServiceUrl"].startswith("pulsar://")
    # Pulsar serialises primitive defaults too.
    assert got.json["brokerClientTlsEnabled"] is False
    assert got.json["brokerClientTlsTrustStoreType"] == "JKS"


def test_create_get_update_delete(base: str, cluster: str) -> None:
    url = f"{base}/clusters/{cluster}"
    created = call("PUT", url, DATA)
    assert created.status == 200 and created.body == b""
    assert cluster in call("GET", f"{base}/clusters").json
    got = call("GET", url).json
    assert got["serviceUrl"] == DATA["serviceUrl"] and got["brokerServiceUrl"] == DATA["brokerServiceUrl"]

    again = call("PUT", url, DATA)
    assert again.status == 409 and again.reason == "Cluster already exists"

    updated = call("POST", url, {"serviceUrl": "http://d.example.com:8080", "peerClusterNames": ["x"]})
    assert updated.status == 200
    got = call("GET", url).json
    assert got["serviceUrl"] == "http://d.example.com:8080" and got["peerClusterNames"] == ["x"]
    assert "brokerServiceUrl" not in got  # an update replaces the whole record, as in Pulsar

    assert call("DELETE", url).status == 204
    missing = call("GET", url)
    assert missing.status == 404 and missing.reason == "Cluster does not exist"
    assert cluster not in call("GET", f"{base}/clusters").json


def test_missing_cluster(base: str) -> None:
    url = f"{base}/clusters/no-such-cluster"
    for method, body in (("GET", None), ("POST", DATA), ("DELETE", None)):
        reply = call(method, url, body)
        assert reply.status == 404 and reply.reason == "Cluster does not exist", method


def test_go_client_cluster_data(base: str, cluster: str) -> None:
    # pulsar-client-go sends every field, blank strings and nulls included.
    body = {**DATA, "serviceUrlTls": "", "brokerServiceUrlTls": "", "peerClusterNames": None,
            "authenticationPlugin": "", "authenticationParameters": "", "brokerClientTrustCertsFilePath": "",
            "brokerClientTlsEnabled": False}  # fmt: skip
    assert call("PUT", f"{base}/clusters/{cluster}", body).status == 200
    got = call("GET", f"{base}/clusters/{cluster}").json
    assert got["serviceUrl"] == DATA["serviceUrl"] and "peerClusterNames" not in got


@pytest.mark.parametrize(
    ("raw", "status", "reason_part"),
    [
        (b"", 400, "cluster data is required"),
        (b"{not json", 400, "Invalid JSON"),
        (b'{"serviceUrl": 5}', 400, "serviceUrl"),
        (b'{"unknownField": "x"}', 400, "unknownField"),
        (b'["a"]', 400, "Invalid request body"),
        (b'{"serviceUrl": "ftp://x:1"}', 400, "Illegal service url"),
        (b'{"brokerServiceUrl": "http://x:1"}', 400, "Illegal broker service url"),
        (b'{"serviceUrlTls": "http://x:1"}', 400, "Illegal service tls url"),
        (b'{"brokerServiceUrlTls": "pulsar://x:1"}', 400, "Illegal broker service tls url"),
        (b'{"proxyServiceUrl": "http://x:1"}', 400, "Illegal proxy service url"),
        (b'{"proxyProtocol": "HTTP"}', 400, "proxyProtocol"),
        (b'{"brokerClientTlsEnabled": "yes"}', 400, "brokerClientTlsEnabled"),
    ],
)
def test_create_rejects_bad_bodies(base: str, cluster: str, raw: bytes, status: int, reason_part: str) -> None:
    reply = call("PUT", f"{base}/clusters/{cluster}", raw=raw)
    assert reply.status == status and reason_part in reply.reason
    assert call("GET", f"{base}/clusters/{cluster}").status == 404


def test_update_rejects_bad_bodies(base: str, cluster: str) -> None:
    url = f"{base}/clusters/{cluster}"
    assert call("PUT", url, DATA).status == 200
    for raw in (b"", b"{", b'{"bogus": 1}', b'{"serviceUrl": "pulsar://x:1"}'):
        assert call("POST", url, raw=raw).status == 400, raw
    assert call("GET", url).json["serviceUrl"] == DATA["serviceUrl"]


@pytest.mark.parametrize("name", ["bad%20name", "a$b", "x%2Fy"])
def test_invalid_cluster_name(base: str, name: str) -> None:
    reply = call("PUT", f"{base}/clusters/{name}", DATA)
    assert reply.status == 412 and reply.reason == "Cluster name is not valid"


def test_delete_refused_while_a_namespace_uses_it(base: str, cluster: str) -> None:
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    assert call("PUT", f"{base}/clusters/{cluster}", DATA).status == 200
    assert call("PUT", f"{base}/tenants/{tenant}", {"allowedClusters": [cluster, "standalone"]}).status == 204
    assert call("PUT", f"{base}/namespaces/{tenant}/ns", {"replication_clusters": [cluster]}).status == 204
    refused = call("DELETE", f"{base}/clusters/{cluster}")
    assert refused.status == 412 and refused.reason == "Cluster not empty"
    assert call("DELETE", f"{base}/namespaces/{tenant}/ns").status == 204
    assert call("DELETE", f"{base}/clusters/{cluster}").status == 204
    assert call("DELETE", f"{base}/tenants/{tenant}").status == 204
