"""The admin API's error middleware: storage and metadata failures a request can meet in normal operation
(the topic fenced or closed under it, a timeout) are answered as Pulsar-style ``{"reason": ...}`` JSON with
a 5xx status, not as aiohttp's plain-text 500 with a traceback; anything else (a bug) still propagates."""

from __future__ import annotations

import json

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from magnetar.broker.admin.api import Handler, error_middleware
from magnetar.ledger.api import LedgerError
from magnetar.managed_ledger.api import ManagedLedgerFencedError
from magnetar.metadata.api import MetadataError


def _raising(exc: Exception) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        raise exc

    return handler


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (ManagedLedgerFencedError("t: another owner updated the ledger list"), 503),
        (TimeoutError("metadata call timed out"), 503),
        (LedgerError("bookies gone"), 500),
        (MetadataError("etcd refused"), 500),
    ],
)
async def test_storage_failures_answer_json_reasons(exc: Exception, status: int) -> None:
    request = make_mocked_request("GET", "/admin/v2/persistent/public/default/t/stats")
    response = await error_middleware(request, _raising(exc))
    assert isinstance(response, web.Response)
    assert response.status == status
    assert response.content_type == "application/json"
    assert json.loads(response.text or "") == {"reason": str(exc)}


async def test_a_bug_still_propagates() -> None:
    request = make_mocked_request("GET", "/admin/v2/persistent/public/default/t/stats")
    with pytest.raises(KeyError):
        await error_middleware(request, _raising(KeyError("bug")))
