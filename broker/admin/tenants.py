"""``/admin/v2/tenants``: list, get, create, update and delete tenants (Pulsar's ``Tenants`` resource)."""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web
from pydantic import ConfigDict

from magnetar.broker.admin.api import (
    RestError,
    Routes,
    conflict,
    json_body,
    json_response,
    no_content,
    not_found,
    precondition_failed,
    query_bool,
    service_of,
)
from magnetar.broker.admin.namespaces import delete_namespace_records
from magnetar.broker.errors import InvalidTopicNameError
from magnetar.broker.policies import Policies, StrictModel, parse_stored
from magnetar.broker.resources import GLOBAL_CLUSTER, Resources
from magnetar.broker.topic_name import check_named_entity

log = logging.getLogger(__name__)
routes = Routes("tenants")

_TENANT = "/admin/v2/tenants/{tenant}"


class TenantInfo(StrictModel):
    """Pulsar's ``TenantInfo``: admin roles and the clusters the tenant may use."""

    model_config = ConfigDict(extra="forbid", strict=True, title="TenantInfo")

    adminRoles: list[str] = []
    allowedClusters: list[str] = []


async def _validated(resources: Resources, info: TenantInfo | None) -> TenantInfo:
    # Pulsar's TenantsBase.validateClusters: at least one, none blank, all known (or "global").
    if info is None or not info.allowedClusters or any(not c.strip() for c in info.allowedClusters):
        raise precondition_failed("Clusters can not be empty")
    known = set(await resources.list_clusters())
    if any(c not in known and c != GLOBAL_CLUSTER for c in info.allowedClusters):
        raise precondition_failed("Clusters do not exist")
    return info


def _normalised(info: TenantInfo) -> dict[str, Any]:
    # Pulsar stores sets: duplicates collapse.
    return {
        "adminRoles": sorted(set(info.adminRoles)),
        "allowedClusters": sorted(set(info.allowedClusters)),
    }


@routes.get("/admin/v2/tenants", summary="List tenants", responses={200: "Tenant names"})
async def list_tenants(request: web.Request) -> web.Response:
    return json_response(sorted(await service_of(request).resources.list_tenants()))


@routes.get(
    _TENANT,
    summary="Get a tenant's configuration",
    responses={200: "TenantInfo", 404: "Tenant does not exist"},
)
async def get_tenant(request: web.Request) -> web.Response:
    data = await service_of(request).resources.get_tenant(request.match_info["tenant"])
    if data is None:
        raise not_found("Tenant does not exist")
    return json_response(parse_stored(TenantInfo, data).to_json())


@routes.put(
    _TENANT,
    summary="Create a tenant",
    body=TenantInfo,
    responses={
        204: "Tenant created",
        400: "Malformed body",
        409: "Tenant already exists",
        412: "Tenant name is not valid, clusters empty or unknown",
    },
)
async def create_tenant(request: web.Request) -> web.Response:
    tenant = request.match_info["tenant"]
    resources = service_of(request).resources
    info = await _validated(resources, await json_body(request, TenantInfo, required=False))
    try:
        check_named_entity("tenant", tenant)
    except InvalidTopicNameError:
        raise precondition_failed("Tenant name is not valid") from None
    if not await resources.create_tenant(tenant, _normalised(info)):
        raise conflict("Tenant already exist")
    log.info("created tenant %s", tenant)
    return no_content()


@routes.post(
    _TENANT,
    summary="Update a tenant's admin roles and allowed clusters",
    body=TenantInfo,
    responses={
        204: "Tenant updated",
        400: "Malformed body",
        404: "Tenant does not exist",
        412: "Clusters empty or unknown, or a removed cluster still has namespaces",
    },
)
async def update_tenant(request: web.Request) -> web.Response:
    tenant = request.match_info["tenant"]
    resources = service_of(request).resources
    info = await _validated(resources, await json_body(request, TenantInfo, required=False))
    old = await resources.get_tenant(tenant)
    if old is None:
        raise not_found(f"Tenant {tenant} not found")
    removed = set(old.get("allowedClusters", [])) - set(info.allowedClusters) - {GLOBAL_CLUSTER}
    if removed:
        # Pulsar's canUpdateCluster: a cluster still used by the tenant's namespaces stays.
        for ns in await resources.list_namespaces(tenant):
            data = await resources.get_policies(ns)
            if data is not None and removed & set(parse_stored(Policies, data).replication_clusters):
                raise precondition_failed("Active namespaces")
    if not await resources.update_tenant(tenant, _normalised(info)):
        raise not_found(f"Tenant {tenant} not found")
    return no_content()


@routes.delete(
    _TENANT,
    summary="Delete a tenant (force=true also deletes its namespaces and their topics)",
    query={"force": bool},
    responses={
        204: "Tenant deleted",
        404: "Tenant does not exist",
        405: "Forced deletion of tenants is disabled",
        409: "The tenant still has active namespaces",
    },
)
async def delete_tenant(request: web.Request) -> web.Response:
    tenant = request.match_info["tenant"]
    force = query_bool(request, "force")
    service = service_of(request)
    resources = service.resources
    if force and not service.config.force_delete_tenant_allowed:
        raise RestError(405, "Broker doesn't allow forced deletion of tenants")
    if await resources.get_tenant(tenant) is None:
        raise not_found("Tenant doesn't exist")
    namespaces = await resources.list_namespaces(tenant)
    if namespaces and not force:
        raise conflict("The tenant still has active namespaces")
    for ns in namespaces:
        await delete_namespace_records(service, ns, force=True)
    await resources.delete_tenant(tenant)
    log.info("deleted tenant %s", tenant)
    return no_content()
