"""Apache Spark integration: the ``pulsar`` PySpark data source (see docs/spark.md).

``magnetar.spark.offsets`` and ``magnetar.spark.options`` are plain Python; importing
``PulsarDataSource`` needs ``pyspark`` (extra ``spark``), so it is loaded on first access.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PulsarDataSource"]


def __getattr__(name: str) -> Any:
    if name == "PulsarDataSource":
        from magnetar.spark.datasource import PulsarDataSource

        return PulsarDataSource
    raise AttributeError(name)
