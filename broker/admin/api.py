"""Route registry shared by the admin modules: aiohttp routes plus the OpenAPI document.

Each module creates its operations with :func:`route`; handlers raise :class:`RestError` (or a
:class:`~magnetar.broker.errors.BrokerError`) and the error middleware answers Pulsar-style
``{"reason": "..."}`` JSON with Pulsar's status codes. Request bodies are parsed with
:func:`json_body` into pydantic models that forbid unknown fields.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, overload

from aiohttp import web
from pydantic import BaseModel, TypeAdapter, ValidationError

from magnetar.broker.errors import BrokerError, storage_error_code
from magnetar.broker.protocol import pulsar_api_pb2 as pb
from magnetar.broker.service import BrokerService

log = logging.getLogger(__name__)

SERVICE_KEY = web.AppKey("service", BrokerService)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
M = TypeVar("M")


class RestError(Exception):
    """An HTTP error answered as ``{"reason": reason}`` with ``status``."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def not_found(reason: str) -> RestError:
    return RestError(404, reason)


def conflict(reason: str) -> RestError:
    return RestError(409, reason)


def precondition_failed(reason: str) -> RestError:
    return RestError(412, reason)


def bad_request(reason: str) -> RestError:
    return RestError(400, reason)


#: How broker errors surface over HTTP (Pulsar's RestException mapping).
_BROKER_ERROR_STATUS = {
    pb.TopicNotFound: 404,
    pb.SubscriptionNotFound: 404,
    pb.ConsumerNotFound: 404,
    pb.InvalidTopicName: 412,
    pb.NotAllowedError: 405,
    pb.ConsumerBusy: 412,
    pb.ProducerBusy: 409,
    pb.ServiceNotReady: 503,
    pb.TopicTerminatedError: 412,
}


@dataclass(slots=True)
class Operation:
    """One documented endpoint (for the OpenAPI document)."""

    method: str
    path: str
    summary: str
    body: Any = None
    query: dict[str, Any] = field(default_factory=dict)
    responses: dict[int, str] = field(default_factory=dict)
    tag: str = ""


OPERATIONS: list[Operation] = []


class Routes:
    """A module's routes: ``routes = Routes("namespaces")`` then ``@routes.get(path, summary=...)``."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.table = web.RouteTableDef()

    def _add(
        self,
        method: str,
        path: str,
        summary: str,
        body: Any,
        query: dict[str, Any] | None,
        responses: dict[int, str] | None,
    ) -> Callable[[Handler], Handler]:
        def deco(handler: Handler) -> Handler:
            self.table.route(method, path)(handler)
            OPERATIONS.append(Operation(method, path, summary, body, query or {}, responses or {}, self.tag))
            return handler

        return deco

    def get(
        self, path: str, *, summary: str, query: dict[str, Any] | None = None, responses: dict[int, str] | None = None
    ) -> Callable[[Handler], Handler]:
        return self._add("GET", path, summary, None, query, responses)

    def put(
        self,
        path: str,
        *,
        summary: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        responses: dict[int, str] | None = None,
    ) -> Callable[[Handler], Handler]:
        return self._add("PUT", path, summary, body, query, responses)

    def post(
        self,
        path: str,
        *,
        summary: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        responses: dict[int, str] | None = None,
    ) -> Callable[[Handler], Handler]:
        return self._add("POST", path, summary, body, query, responses)

    def delete(
        self, path: str, *, summary: str, query: dict[str, Any] | None = None, responses: dict[int, str] | None = None
    ) -> Callable[[Handler], Handler]:
        return self._add("DELETE", path, summary, None, query, responses)


def service_of(request: web.Request) -> BrokerService:
    return request.app[SERVICE_KEY]


@overload
async def json_body(request: web.Request, model: type[M], *, required: Literal[True] = True) -> M: ...
@overload
async def json_body(request: web.Request, model: type[M], *, required: bool) -> M | None: ...
@overload
async def json_body(request: web.Request, model: object, *, required: bool = True) -> Any: ...  # e.g. a Literal


async def json_body(request: web.Request, model: Any, *, required: bool = True) -> Any:
    """Parse and validate the request body as ``model`` (a pydantic model or any type pydantic accepts);
    ``None`` for an empty body when not ``required``."""
    raw = await request.read()
    if not raw.strip():
        if required:
            raise bad_request("Request body is required")
        return None
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"Invalid JSON: {exc}") from None
    try:
        if isinstance(model, type) and issubclass(model, BaseModel):
            return model.model_validate(data)
        return TypeAdapter(model).validate_python(data, strict=True)
    except ValidationError as exc:
        raise bad_request(f"Invalid request body: {_describe(exc)}") from None


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def query_bool(request: web.Request, name: str, default: bool = False) -> bool:
    value = request.query.get(name)
    if value is None:
        return default
    if value.lower() in ("true", "1"):
        return True
    if value.lower() in ("false", "0"):
        return False
    raise bad_request(f"Invalid boolean for query parameter {name}: {value!r}")


def query_int(request: web.Request, name: str, default: int | None = None) -> int | None:
    value = request.query.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise bad_request(f"Invalid integer for query parameter {name}: {value!r}") from None


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status, dumps=lambda v: json.dumps(v, separators=(",", ":")))


def no_content() -> web.Response:
    return web.Response(status=204)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure becomes ``{"reason": ...}`` with a 4xx (or 5xx for storage trouble) status."""
    try:
        return await handler(request)
    except RestError as exc:
        return json_response({"reason": exc.reason}, exc.status)
    except BrokerError as exc:
        status = exc.http_status or _BROKER_ERROR_STATUS.get(exc.code, 500)
        return json_response({"reason": exc.message}, status)
    except web.HTTPException as exc:
        if exc.status >= 400 and exc.content_type != "application/json":
            return json_response({"reason": exc.reason}, exc.status)
        raise
    except Exception as exc:
        code = storage_error_code(exc)
        if code is None:  # a bug: aiohttp logs the traceback
            raise
        # Storage or metadata refused (the topic fenced or closed under the request, a timeout): one line.
        log.warning("%s %s failed: %s: %s", request.method, request.path, type(exc).__name__, exc)
        return json_response({"reason": str(exc)}, _BROKER_ERROR_STATUS.get(code, 500))


_PATH_PARAM = re.compile(r"\{(\w+)(?::[^}]*)?\}")
_PATH_PARAM_WITH_REGEX = re.compile(r"\{(\w+)(?::([^}]*))?\}")


def _path_param(name: str, regex: str) -> dict[str, Any]:
    """A path parameter; a route regex of plain alternatives (``a|b``) becomes an enum."""
    schema: dict[str, Any] = {"type": "string"}
    if regex and re.fullmatch(r"[\w-]+(\|[\w-]+)*", regex):
        schema["enum"] = regex.split("|")
    return {"name": name, "in": "path", "required": True, "schema": schema}


def openapi_document() -> dict[str, Any]:
    """OpenAPI 3.0 description of every registered operation."""
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for op in OPERATIONS:
        path = _PATH_PARAM.sub(r"{\1}", op.path)
        params = [_path_param(name, regex) for name, regex in _PATH_PARAM_WITH_REGEX.findall(op.path)]
        for name, typ in op.query.items():
            params.append({"name": name, "in": "query", "required": False, "schema": _schema_of(typ, schemas)})
        entry: dict[str, Any] = {
            "summary": op.summary,
            "tags": [op.tag],
            "operationId": f"{op.method.lower()}_{re.sub(r'[^A-Za-z0-9]+', '_', path).strip('_')}",
            "parameters": params,
            "responses": {str(code): {"description": text} for code, text in (op.responses or {200: "OK"}).items()},
        }
        if op.body is not None:
            entry["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": _schema_of(op.body, schemas)}},
            }
        paths.setdefault(path, {})[op.method.lower()] = entry
    return {
        "openapi": "3.0.3",
        "info": {"title": "Magnetar admin API (Pulsar admin REST API v2)", "version": "0.1.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def _schema_of(typ: Any, schemas: dict[str, Any]) -> dict[str, Any]:
    schema = TypeAdapter(typ).json_schema(ref_template="#/components/schemas/{model}")
    for name, definition in schema.pop("$defs", {}).items():
        schemas[name] = definition
    return schema
