"""One local Spark session for all Spark tests (the JVM start and the first query cost ~20-30 s)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator

import pytest


def spark_unavailable() -> str | None:
    """Why Spark tests cannot run here, or None."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "Java 17 is not installed (apt-get install openjdk-17-jre-headless; .ci/run does)"
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as exc:
        return f"extra 'spark' is not installed ({exc}); pip install -e '.[spark]'"
    return None


def spark_env() -> dict[str, str]:
    """Environment for the driver and its Python workers (also used by driver subprocesses)."""
    return {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    }


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    reason = spark_unavailable()
    if reason:
        pytest.skip(reason)
    os.environ.update(spark_env())
    from pyspark.sql import SparkSession

    import magnetar.spark

    session = (
        SparkSession.builder.master("local[2]")
        .appName("magnetar-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    magnetar.spark.register(session)  # a no-op when Spark found pyspark_magnetar on its own
    yield session
    session.stop()
