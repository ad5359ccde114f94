"""Apache Spark integration: the ``pulsar`` PySpark data source (see docs/spark.md).

``magnetar.spark.offsets`` and ``magnetar.spark.options`` are plain Python; importing
``PulsarDataSource`` needs ``pyspark`` (extra ``spark``), so it is loaded on first access.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PulsarDataSource", "register"]

#: The top-level module Spark registers by itself when it finds it on ``sys.path`` (regular installs).
AUTO_MODULE = "pyspark_magnetar"


def register(spark: Any) -> None:
    """Make ``format("pulsar")`` available in ``spark``, unless Spark registered it already at start-up.

    Registering again over the automatic registration works too, but makes Spark warn "replaced a statically
    registered data source" (in every streaming query).
    """
    if _registered(spark):
        return
    from magnetar.spark.datasource import PulsarDataSource

    spark.dataSource.register(PulsarDataSource)


def _registered(spark: Any) -> bool:
    """Whether Spark knows ``pulsar`` already: asked of Spark itself (its Python workers scanned ``sys.path``,
    which can differ from this process's), else by Spark's rule (a ``pyspark_*`` module found by pkgutil)."""
    try:
        manager = spark._jsparkSession.sessionState().dataSourceManager()
        return bool(manager.dataSourceExists("pulsar"))
    except Exception:  # Spark Connect (no JVM handle here) or an API change
        import pkgutil

        return any(m.name == AUTO_MODULE for m in pkgutil.iter_modules())
