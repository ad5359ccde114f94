"""``/admin/v2/clusters``: list, get, create, update and delete clusters (Pulsar's ``Clusters`` resource).

As in Pulsar, create and update answer 200 with an empty body, delete answers 204.
"""

from __future__ import annotations

import logging
from typing import Any, Literal
from urllib.parse import urlsplit

from aiohttp import web
from pydantic import ConfigDict

from magnetar.broker.admin.api import (
    Routes,
    bad_request,
    conflict,
    json_body,
    json_response,
    not_found,
    precondition_failed,
    service_of,
)
from magnetar.broker.errors import InvalidTopicNameError
from magnetar.broker.policies import Policies, StrictModel, parse_stored
from magnetar.broker.resources import GLOBAL_CLUSTER
from magnetar.broker.topic_name import check_named_entity

log = logging.getLogger(__name__)
routes = Routes("clusters")

_CLUSTER = "/admin/v2/clusters/{cluster}"


class ClusterData(StrictModel):
    """Pulsar's ``ClusterData``: how to reach a cluster (URLs are checked when present)."""

    model_config = ConfigDict(extra="forbid", strict=True, title="ClusterData")
    empty_means_unset = frozenset({"proxyProtocol"})

    serviceUrl: str | None = None
    serviceUrlTls: str | None = None
    brokerServiceUrl: str | None = None
    brokerServiceUrlTls: str | None = None
    proxyServiceUrl: str | None = None
    authenticationPlugin: str | None = None
    authenticationParameters: str | None = None
    proxyProtocol: Literal["SNI"] | None = None
    peerClusterNames: list[str] | None = None
    brokerClientTlsEnabled: bool = False
    tlsAllowInsecureConnection: bool = False
    brokerClientTlsEnabledWithKeyStore: bool = False
    brokerClientTlsTrustStoreType: str | None = "JKS"
    brokerClientTlsTrustStore: str | None = None
    brokerClientTlsTrustStorePassword: str | None = None
    brokerClientTlsKeyStoreType: str | None = "JKS"
    brokerClientTlsKeyStore: str | None = None
    brokerClientTlsKeyStorePassword: str | None = None
    brokerClientTrustCertsFilePath: str | None = None
    brokerClientKeyFilePath: str | None = None
    brokerClientCertificateFilePath: str | None = None
    brokerClientTlsFactoryClassName: str | None = None
    brokerClientTlsFactoryConfig: str | None = None
    brokerClientSslFactoryPlugin: str | None = None
    brokerClientSslFactoryPluginParams: str | None = None
    listenerName: str | None = None


# (field, accepted schemes, Pulsar's message) as in ClusterDataImpl.checkPropertiesIfPresent
_URL_RULES = [
    ("serviceUrl", {"http"}, "Illegal service url, example: http://pulsar.example.com:8080"),
    ("serviceUrlTls", {"https"}, "Illegal service tls url, example: https://pulsar.example.com:8443"),
    ("brokerServiceUrl", {"pulsar"}, "Illegal broker service url, example: pulsar://pulsar.example.com:6650"),
    (
        "brokerServiceUrlTls",
        {"pulsar+ssl"},
        "Illegal broker service tls url, example: pulsar+ssl://pulsar.example.com:6651",
    ),
    (
        "proxyServiceUrl",
        {"pulsar", "pulsar+ssl"},
        "Illegal proxy service url, example: pulsar+ssl://ats-proxy.example.com:4443 "
        "or pulsar://ats-proxy.example.com:4080",
    ),
]


def _check_urls(data: ClusterData) -> None:
    for field, schemes, message in _URL_RULES:
        value = getattr(data, field)
        if value is None or not value.strip():
            continue
        try:
            parts = urlsplit(value.strip())
        except ValueError:
            raise bad_request(message) from None
        if parts.scheme not in schemes or not parts.netloc:
            raise bad_request(message)


def _check_name(cluster: str) -> None:
    try:
        check_named_entity("cluster", cluster)
    except InvalidTopicNameError:
        raise precondition_failed("Cluster name is not valid") from None


def _render(data: dict[str, Any]) -> dict[str, Any]:
    """Stored cluster data as Pulsar serialises it (defaults filled in, nulls omitted)."""
    return parse_stored(ClusterData, data).to_json()


@routes.get(
    "/admin/v2/clusters",
    summary="List clusters",
    responses={200: "Cluster names"},
)
async def list_clusters(request: web.Request) -> web.Response:
    return json_response(await service_of(request).resources.list_clusters())


@routes.get(
    _CLUSTER,
    summary="Get a cluster's configuration",
    responses={200: "ClusterData", 404: "Cluster does not exist"},
)
async def get_cluster(request: web.Request) -> web.Response:
    data = await service_of(request).resources.get_cluster(request.match_info["cluster"])
    if data is None:
        raise not_found("Cluster does not exist")
    return json_response(_render(data))


@routes.put(
    _CLUSTER,
    summary="Create a cluster",
    body=ClusterData,
    responses={
        200: "Cluster created",
        400: "Bad cluster data",
        409: "Cluster already exists",
        412: "Cluster name is not valid",
    },
)
async def create_cluster(request: web.Request) -> web.Response:
    cluster = request.match_info["cluster"]
    _check_name(cluster)
    data = await json_body(request, ClusterData, required=False)
    if data is None:
        raise bad_request("cluster data is required")
    _check_urls(data)
    if not await service_of(request).resources.create_cluster(cluster, data.to_json()):
        raise conflict("Cluster already exists")
    log.info("created cluster %s", cluster)
    return web.Response(status=200)


@routes.post(
    _CLUSTER,
    summary="Update a cluster's configuration",
    body=ClusterData,
    responses={200: "Cluster updated", 400: "Bad cluster data", 404: "Cluster does not exist"},
)
async def update_cluster(request: web.Request) -> web.Response:
    cluster = request.match_info["cluster"]
    data = await json_body(request, ClusterData, required=False)
    if data is None:
        raise bad_request("cluster data is required")
    _check_urls(data)
    if not await service_of(request).resources.update_cluster(cluster, data.to_json()):
        raise not_found("Cluster does not exist")
    return web.Response(status=200)


@routes.delete(
    _CLUSTER,
    summary="Delete a cluster",
    responses={204: "Cluster deleted", 404: "Cluster does not exist", 412: "Cluster not empty"},
)
async def delete_cluster(request: web.Request) -> web.Response:
    cluster = request.match_info["cluster"]
    resources = service_of(request).resources
    if cluster == GLOBAL_CLUSTER or await resources.get_cluster(cluster) is None:
        raise not_found("Cluster does not exist")
    # Pulsar refuses while namespaces are provisioned on the cluster: here, while any namespace
    # replicates to it (v2 namespaces are not stored under the cluster's name).
    for tenant in await resources.list_tenants():
        for ns in await resources.list_namespaces(tenant):
            data = await resources.get_policies(ns)
            if data is not None and cluster in parse_stored(Policies, data).replication_clusters:
                raise precondition_failed("Cluster not empty")
    if not await resources.delete_cluster(cluster):
        raise not_found("Cluster does not exist")
    log.info("deleted cluster %s", cluster)
    return web.Response(status=204)
