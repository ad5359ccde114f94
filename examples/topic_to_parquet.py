"""Stream Pulsar topics into Parquet with the ``pulsar`` PySpark data source (exactly-once with a checkpoint).

    python examples/topic_to_parquet.py --service-url pulsar://localhost:6650 --admin-url http://localhost:8080 \
        --topics orders --starting-offsets earliest --trigger available-now \
        --output /data/orders --checkpoint /data/checkpoints/orders

Also the main application of the Kubernetes job templates in ``manifests/spark/``. Parquet output plus a
checkpoint is exactly-once: the file sink only exposes files listed in its ``_spark_metadata`` log, and a
restarted query re-reads the source from the offsets in the checkpoint.
"""

from __future__ import annotations

import argparse
import os
import sys


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--service-url", default=env("PULSAR_SERVICE_URL", "pulsar://localhost:6650"))
    p.add_argument("--admin-url", default=env("PULSAR_ADMIN_URL", "http://localhost:8080"))
    group = p.add_mutually_exclusive_group()
    group.add_argument("--topics", default=env("PULSAR_TOPICS"), help="comma-separated topic names")
    group.add_argument("--topics-pattern", default=env("PULSAR_TOPICS_PATTERN"), help="regex incl. namespace")
    p.add_argument("--starting-offsets", default=env("STARTING_OFFSETS", "earliest"), help="earliest|latest|JSON")
    p.add_argument(
        "--trigger",
        default=env("TRIGGER", "available-now"),
        help="available-now | once-per:<interval> e.g. 'once-per:10 seconds' (processing-time trigger)",
    )
    p.add_argument("--max-records-per-trigger", type=int, default=int(env("MAX_RECORDS_PER_TRIGGER", "0")))
    p.add_argument("--commit-subscription", default=env("COMMIT_SUBSCRIPTION"), help="durable progress subscription")
    p.add_argument("--output", default=env("OUTPUT_PATH"), required=env("OUTPUT_PATH") is None)
    p.add_argument("--checkpoint", default=env("CHECKPOINT_PATH"), required=env("CHECKPOINT_PATH") is None)
    p.add_argument("--master", default=env("SPARK_MASTER"), help="only when not given by spark-submit")
    args = p.parse_args(argv)
    if not args.topics and not args.topics_pattern:
        p.error("one of --topics / --topics-pattern is required")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from pyspark.sql import SparkSession

    from magnetar.spark import register

    builder = SparkSession.builder.appName("magnetar-topic-to-parquet")
    if args.master:
        builder = builder.master(args.master)
    spark = builder.getOrCreate()
    register(spark)  # unless Spark auto-registered it (regular installs): no "replaced" warnings

    reader = (
        spark.readStream.format("pulsar")
        .option("service.url", args.service_url)
        .option("admin.url", args.admin_url)
        .option("startingOffsets", args.starting_offsets)
    )
    reader = (
        reader.option("topics", args.topics) if args.topics else reader.option("topicsPattern", args.topics_pattern)
    )
    if args.max_records_per_trigger > 0:
        reader = reader.option("maxRecordsPerTrigger", str(args.max_records_per_trigger))
    if args.commit_subscription:
        reader = reader.option("commitSubscription", args.commit_subscription)

    writer = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", args.output)
        .option("checkpointLocation", args.checkpoint)
    )
    if args.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    elif args.trigger.startswith("once-per:"):
        writer = writer.trigger(processingTime=args.trigger.split(":", 1)[1])
    else:
        raise SystemExit(f"unknown trigger {args.trigger!r}")
    query = writer.start()
    query.awaitTermination()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
