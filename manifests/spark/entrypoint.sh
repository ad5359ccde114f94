#!/usr/bin/env bash
# Container entrypoint for Spark on Kubernetes (driver/executor modes) and plain commands.
set -euo pipefail
SPARK_CLASSPATH="${SPARK_CLASSPATH:-}:${SPARK_HOME}/jars/*"
JAVA="${JAVA_HOME:+${JAVA_HOME}/bin/}java"
case "${1:-}" in
  driver)
    shift
    exec "${SPARK_HOME}/bin/spark-submit" \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS}" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=${SPARK_DRIVER_BIND_ADDRESS}" \
      --deploy-mode client "$@"
    ;;
  executor)
    shift
    # Spark hands the executor's JVM options (among them the --add-opens Java 17 needs, without which reads
    # fail with "sun.misc.Unsafe or DirectByteBuffer not available") as SPARK_JAVA_OPT_0, _1, ... in order.
    mapfile -t java_opts < <(env | grep -E '^SPARK_JAVA_OPT_[0-9]+=' | sort -t_ -k4 -n | cut -d= -f2-)
    exec "${JAVA}" "${java_opts[@]}" -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
      -cp "${SPARK_CLASSPATH}" org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL}" --executor-id "${SPARK_EXECUTOR_ID}" \
      --cores "${SPARK_EXECUTOR_CORES}" --app-id "${SPARK_APPLICATION_ID}" \
      --hostname "${SPARK_EXECUTOR_POD_IP}" --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
      --podName "${SPARK_EXECUTOR_POD_NAME:-}"
    ;;
  *)
    exec "$@"
    ;;
esac
