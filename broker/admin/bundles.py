"""Namespace bundles over REST: list, unload (bundle or namespace), split, and who owns what.

Paths and JSON as Pulsar's: ``GET /admin/v2/namespaces/{t}/{ns}/bundles`` (``BundlesData``),
``PUT .../{bundle}/unload``, ``PUT .../{bundle}/split?unload=&splitAlgorithmName=``,
``PUT /admin/v2/namespaces/{t}/{ns}/unload``, ``GET /admin/v2/brokers/{cluster}/{broker}/ownedNamespaces``.
A call about one bundle answers on its owner (307 from the others); a namespace unload visits every
owner.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from magnetar.broker.admin.api import (
    Routes,
    bad_request,
    json_response,
    no_content,
    not_found,
    precondition_failed,
    query_bool,
    service_of,
)
from magnetar.broker.admin.redirects import pick_web_url, redirect_target
from magnetar.broker.auth.broker_client import broker_client_headers
from magnetar.broker.bundles import Bundle, bundles_of, split_boundaries, topic_hash
from magnetar.broker.namespace_service import NamespaceService
from magnetar.broker.policies.documents import BundlesData
from magnetar.broker.tls import broker_web_target

routes = Routes("bundles")
_NS = "/admin/v2/namespaces/{tenant}/{namespace}"
_BUNDLE = _NS + "/{bundle:0x[0-9a-fA-F]+_0x[0-9a-fA-F]+}"
#: Pulsar's split algorithms; both halve here unless ``splitBoundaries`` names a position.
SPLIT_ALGORITHMS = {"range_equally_divide", "topic_count_equally_divide", "specified_positions_divide",
                    "flow_or_qps_equally_divide"}  # fmt: skip


async def _namespace(request: web.Request) -> str:
    ns = f"{request.match_info['tenant']}/{request.match_info['namespace']}"
    if not await service_of(request).resources.namespace_exists(ns):
        raise not_found("Namespace does not exist")
    return ns


def _cluster(request: web.Request) -> NamespaceService:
    namespaces = service_of(request).namespaces
    if namespaces is None:
        raise precondition_failed("Bundles have owners only on cluster brokers (standalone owns everything)")
    return namespaces


async def _bundle(request: web.Request) -> Bundle:
    ns = await _namespace(request)
    try:
        bundle = Bundle.parse(ns, request.match_info["bundle"])
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    if bundle not in await _bundles(request, ns):
        raise not_found(f"Bundle {bundle.key} does not exist")
    return bundle


async def _bundles(request: web.Request, ns: str) -> list[Bundle]:
    policies = await service_of(request).policies.namespace(ns)
    data = policies.bundles if policies is not None else None
    return bundles_of(ns, data.boundaries if data is not None else None)


def _topics_in(request: web.Request, bundle: Bundle) -> list[Any]:
    return [
        t for t in service_of(request).loaded_topics()
        if t.name.namespace == bundle.namespace and bundle.contains(topic_hash(str(t.name)))
    ]  # fmt: skip


@routes.get(_NS + "/bundles", summary="The namespace's bundles (BundlesData)", responses={200: "BundlesData"})
async def get_bundles(request: web.Request) -> web.Response:
    ns = await _namespace(request)
    policies = await service_of(request).policies.namespace(ns)
    bundles = policies.bundles if policies is not None else None
    boundaries = bundles.boundaries if bundles is not None and bundles.boundaries else ["0x00000000", "0xffffffff"]
    return json_response({"boundaries": boundaries, "numBundles": len(boundaries) - 1})


async def _owner_or_redirect(request: web.Request, bundle: Bundle) -> NamespaceService | None:
    """This broker's namespace service if it owns ``bundle``; a 307 if another does; ``None`` if nobody."""
    namespaces = _cluster(request)
    if namespaces.ownership.owns(bundle):
        return namespaces
    owner = await namespaces.ownership.owner(bundle)
    if owner is not None and owner.broker_id != namespaces.broker_id:
        raise web.HTTPTemporaryRedirect(
            redirect_target(request, pick_web_url(request, owner.http_url, owner.http_url_tls), False)
        )
    return None


@routes.put(_BUNDLE + "/unload", summary="Unload a bundle (its topics move on the next lookup)",
            responses={204: "unloaded", 307: "owned by another broker", 404: "no such bundle"})  # fmt: skip
async def unload_bundle(request: web.Request) -> web.Response:
    bundle = await _bundle(request)
    service = service_of(request)
    if service.namespaces is None:  # standalone: the topics close, clients reconnect to this broker
        for topic in _topics_in(request, bundle):
            await service.unload_topic(topic)
        return no_content()
    namespaces = await _owner_or_redirect(request, bundle)
    if namespaces is not None:
        await namespaces.unload_bundle(bundle)
    return no_content()


@routes.put(_BUNDLE + "/split", summary="Split a bundle in two (unload=true also unloads the halves)",
            responses={204: "split", 307: "owned by another broker", 404: "no such bundle"})  # fmt: skip
async def split_bundle(request: web.Request) -> web.Response:
    bundle = await _bundle(request)
    algorithm = request.query.get("splitAlgorithmName") or "range_equally_divide"
    if algorithm not in SPLIT_ALGORITHMS:
        raise precondition_failed(f"Unsupported namespace bundle split algorithm: {algorithm}")
    at: int | None = None
    if request.query.get("splitBoundaries"):
        try:
            at = int(request.query["splitBoundaries"].split(",")[0], 0)
        except ValueError:
            raise bad_request("Invalid splitBoundaries") from None
    if service_of(request).namespaces is None:  # standalone: only the policy changes
        ns = bundle.namespace
        current = [f"0x{b.lower:08x}" for b in await _bundles(request, ns)] + ["0xffffffff"]
        try:
            new = split_boundaries(current, bundle, 2, at)
        except ValueError as exc:
            raise precondition_failed(str(exc)) from None

        def mutate(policies: Any) -> None:
            policies.bundles = BundlesData(boundaries=new, numBundles=len(new) - 1)

        await service_of(request).policies.update_namespace(ns, mutate)
        return no_content()
    namespaces = await _owner_or_redirect(request, bundle)
    if namespaces is None:  # nobody owns it: take it, then split (as Pulsar's ownership check does)
        namespaces = _cluster(request)
        await namespaces.ownership.try_acquire(bundle)
        if not namespaces.ownership.owns(bundle):
            raise precondition_failed(f"Bundle {bundle.key} was taken by another broker; retry")
    try:
        await namespaces.split_bundle(bundle, unload=query_bool(request, "unload"), at=at)
    except ValueError as exc:
        raise precondition_failed(str(exc)) from None
    return no_content()


@routes.put(_NS + "/unload", summary="Unload every bundle of the namespace (on every owner)",
            responses={204: "unloaded", 404: "namespace not found"})  # fmt: skip
async def unload_namespace(request: web.Request) -> web.Response:
    import aiohttp

    ns = await _namespace(request)
    service = service_of(request)
    namespaces = service.namespaces
    if namespaces is None:
        for topic in [t for t in service.loaded_topics() if t.name.namespace == ns]:
            await service.unload_topic(topic)
        return no_content()
    owners = await namespaces.ownership.owners_of_namespace(ns)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
        for bundle_range, owner in owners.items():
            bundle = Bundle.parse(ns, bundle_range)
            if owner.broker_id == namespaces.broker_id:
                await namespaces.unload_bundle(bundle)
                continue
            base, tls = await broker_web_target(service.config, owner.http_url, owner.http_url_tls)
            url = f"{base}/admin/v2/namespaces/{ns}/{bundle_range}/unload"
            headers = broker_client_headers(service.config)
            async with http.put(url, allow_redirects=False, ssl=tls or True, headers=headers) as resp:
                if resp.status >= 300:
                    raise precondition_failed(f"Unloading {bundle.key} on {owner.broker_id} failed: HTTP {resp.status}")
    return no_content()


@routes.get(_NS + "/ownership", summary="Owner of each bundle of the namespace (Magnetar)",
            responses={200: "bundle range -> broker id (unowned bundles absent)"})  # fmt: skip
async def ownership(request: web.Request) -> web.Response:
    ns = await _namespace(request)
    owners = await _cluster(request).ownership.owners_of_namespace(ns)
    return json_response({r: o.broker_id for r, o in sorted(owners.items())})


@routes.get("/admin/v2/brokers/{cluster}/{broker}/ownedNamespaces",
            summary="Bundles a broker owns (NamespaceOwnershipStatus by bundle)", responses={200: "map"})  # fmt: skip
async def owned_namespaces(request: web.Request) -> web.Response:
    service = service_of(request)
    namespaces = service.namespaces
    broker = request.match_info["broker"]
    if namespaces is None:
        raise precondition_failed("Bundles have owners only on cluster brokers")
    if broker != namespaces.broker_id:
        info = await namespaces.registry.get(broker)
        if info is None:
            raise not_found(f"Broker {broker} not found")
        target = pick_web_url(request, info.web_service_url, info.web_service_url_tls)
        raise web.HTTPTemporaryRedirect(redirect_target(request, target, False))
    status: dict[str, Any] = {"broker_assignment": "shared", "is_controlled": False, "is_active": True}
    return json_response({b.key: status for b in sorted(namespaces.ownership.owned, key=lambda b: b.key)})


@routes.get("/admin/v2/broker-stats/load-report", summary="This broker's load report", responses={200: "report"})
async def load_report(request: web.Request) -> web.Response:
    namespaces = _cluster(request)
    return json_response({**namespaces.me.to_json(), **namespaces.registry.load_report()})
