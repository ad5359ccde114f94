"""``/admin/v2/brokers``: health, readiness, the brokers of a cluster, the leader and configuration."""

from __future__ import annotations

from aiohttp import web

from magnetar.broker.admin.api import Routes, json_response, not_found, service_of
from magnetar.broker.listeners import web_address

routes = Routes("brokers")


def _broker_id(request: web.Request) -> str:
    return web_address(service_of(request).config)


@routes.get("/admin/v2/brokers/health", summary="Broker health check", responses={200: "ok"})
async def health(request: web.Request) -> web.Response:
    return web.Response(text="ok")


@routes.get(
    "/admin/v2/brokers/ready",
    summary="Broker readiness (false once a graceful shutdown began)",
    responses={200: "ok", 503: "not ready"},
)
async def ready(request: web.Request) -> web.Response:
    if not _is_ready(request):
        return json_response({"reason": "broker is not ready"}, 503)
    return web.Response(text="ok")


def _is_ready(request: web.Request) -> bool:
    namespaces = service_of(request).namespaces
    return namespaces is None or (namespaces.ready and namespaces.may_write())


@routes.get(
    "/status.html",
    summary="Probe for load balancers and the kubelet (Pulsar's VipStatus): open even with authentication on",
    responses={200: "OK", 503: "not ready (a graceful shutdown began)"},
)
async def vip_status(request: web.Request) -> web.Response:
    if not _is_ready(request):
        return web.Response(status=503, text="Service Unavailable")
    return web.Response(text="OK")


@routes.get("/admin/v2/brokers/leaderBroker", summary="The leader broker", responses={200: "leader"})
async def leader(request: web.Request) -> web.Response:
    service = service_of(request)
    if service.namespaces is not None:
        info = await service.namespaces.registry.leader()
        if info is None:
            raise not_found("No leader broker")
        return json_response({"serviceUrl": info.web_service_url, "brokerId": info.broker_id})
    url = service.web_service_url or service.web_service_url_tls
    return json_response({"serviceUrl": url, "brokerId": _broker_id(request)})


@routes.get("/admin/v2/brokers/configuration", summary="Names of dynamically updatable settings", responses={200: "[]"})
async def dynamic_names(request: web.Request) -> web.Response:
    return json_response([])  # every setting is static (read from the configuration at start)


@routes.get("/admin/v2/brokers/configuration/values", summary="Dynamic setting values", responses={200: "{}"})
async def dynamic_values(request: web.Request) -> web.Response:
    return json_response({})


@routes.get("/admin/v2/brokers/configuration/runtime", summary="Effective settings", responses={200: "map"})
async def runtime_config(request: web.Request) -> web.Response:
    values = service_of(request).config.to_pulsar_dict()
    return json_response(
        {key: str(value).lower() if isinstance(value, bool) else str(value) for key, value in values.items()}
    )


@routes.get("/admin/v2/brokers/{cluster}", summary="Active brokers of a cluster", responses={200: "broker ids"})
async def list_brokers(request: web.Request) -> web.Response:
    service = service_of(request)
    cluster = request.match_info["cluster"]
    if await service.resources.get_cluster(cluster) is None:
        raise not_found("Cluster does not exist")
    if service.namespaces is not None and cluster == service.config.cluster_name:
        return json_response(sorted(b.broker_id for b in await service.namespaces.registry.brokers()))
    return json_response([_broker_id(request)] if cluster == service.config.cluster_name else [])


@routes.get(
    "/admin/v2/autorecovery/status",
    summary="Bookie auto-recovery: lost bookies, under-replicated ledgers, counters (Magnetar)",
    responses={200: "status", 404: "auto-recovery does not run in this broker"},
)
async def autorecovery_status(request: web.Request) -> web.Response:
    recovery = service_of(request).auto_recovery
    if recovery is None:
        raise not_found("Auto-recovery does not run in this broker (standalone has a single bookie)")
    return json_response(await recovery.status())
