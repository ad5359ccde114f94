"""Auto-registration of the ``pulsar`` PySpark data source.

Spark 4 registers ``DefaultSource`` of every top-level ``pyspark_*`` module it finds on ``sys.path``, so with
a regular (non-editable) install ``spark.read.format("pulsar")`` works without
``spark.dataSource.register(PulsarDataSource)``.
"""

from magnetar.spark.datasource import PulsarDataSource as DefaultSource

__all__ = ["DefaultSource"]
