"""The kopf settings the operator applies at start-up: Kubernetes API requests are bounded by
``MAGNETAR_OPERATOR_API_REQUEST_TIMEOUT`` (kopf's own default, 300 s, could hold a resource's handlers
that long on one hung request), and a deleted resource's stopping drift timer is looked at again every
``MAGNETAR_OPERATOR_TIMER_STOP_POLL`` seconds, not kopf's 60. Runs the real start-up handler in a fresh
interpreter (importing the operator registers its handlers with kopf)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = """
import asyncio, json, kopf
from magnetar.operator import main
settings = kopf.OperatorSettings()
asyncio.run(main.configure(settings=settings))
print(json.dumps([settings.networking.request_timeout, settings.networking.connect_timeout,
                  settings.background.cancellation_polling]))
"""


def _configured(env: dict[str, str]) -> list[float]:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], env={**os.environ, **env}, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_api_requests_are_bounded_by_default_and_configurable() -> None:
    assert _configured({}) == [30.0, 10.0, 1.0]
    assert _configured({"MAGNETAR_OPERATOR_API_REQUEST_TIMEOUT": "4"}) == [4.0, 4.0, 1.0]


def test_a_stopping_drift_timer_is_polled_every_second_by_default_and_configurably() -> None:
    # kopf's own default, 60 s, held the deletion of a resource whose timer was mid-call that long.
    assert _configured({"MAGNETAR_OPERATOR_TIMER_STOP_POLL": "2.5"})[2] == 2.5
