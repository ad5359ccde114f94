#!/usr/bin/env bash
# A local Magnetar cluster on kind (Kubernetes in Docker), end to end:
#   1. create a kind cluster, 2. build the image and load it into the nodes, 3. helm-install the
#   operator with a MagnetarCluster (cluster.enabled=true), 4. wait until it is Ready, 5. apply the
#   Tenant/TopicNamespace/Topic samples, 6. produce and consume with the official Python client from a
#   pod inside the cluster (the brokers advertise pod DNS names, reachable in-cluster only).
#
# Needs docker, kind, kubectl and helm on PATH. Not run by CI here (kind's node image cannot be pulled
# in the build sandbox); shellcheck checks it and tests/deploy renders the same chart and samples.
#
#   scripts/kind-smoke.sh                  # KIND_CLUSTER=magnetar NAMESPACE=magnetar KEEP=1 to keep it
set -euo pipefail
cd "$(dirname "$0")/.."

kind_cluster=${KIND_CLUSTER:-magnetar}
namespace=${NAMESPACE:-magnetar}
image_repo=magnetar
image_tag=${IMAGE_TAG:-dev}
timeout=${TIMEOUT:-15m}

for tool in docker kind kubectl helm; do
  command -v "$tool" >/dev/null || { echo "kind-smoke: $tool is required" >&2; exit 2; }
done

cleanup() {
  if [ -z "${KEEP:-}" ]; then
    kind delete cluster --name "$kind_cluster" || true
  fi
}
trap cleanup EXIT

kind create cluster --name "$kind_cluster" --wait 120s
docker build -t "$image_repo:$image_tag" .
kind load docker-image "$image_repo:$image_tag" --name "$kind_cluster"

helm install magnetar-operator charts/magnetar-operator --namespace "$namespace" --create-namespace \
  --set image.repository="$image_repo" --set image.tag="$image_tag" --set image.pullPolicy=Never \
  --set cluster.enabled=true --set cluster.name=magnetar \
  --set cluster.spec.bookies.journal.size=1Gi --set cluster.spec.bookies.ledgers.size=2Gi \
  --wait --timeout 5m

kubectl -n "$namespace" wait magnetarcluster/magnetar --for=condition=Ready --timeout="$timeout"
kubectl -n "$namespace" get magnetarcluster magnetar -o wide

# The samples' clusterRef names "magnetar"; the MagnetarCluster sample itself is installed by the chart.
for sample in retentionpolicy tenant topicnamespace topic; do
  kubectl -n "$namespace" apply -f "manifests/samples/$sample.yaml"
done
kubectl -n "$namespace" wait tenant/acme topicnamespace/acme-orders topic/orders-events \
  --for=condition=Ready --timeout=5m

kubectl -n "$namespace" run magnetar-smoke --rm -i --restart=Never --image=python:3.11-slim -- sh -c '
pip install --quiet pulsar-client && python - <<PY
import pulsar
client = pulsar.Client("pulsar://magnetar-broker:6650")
topic = "persistent://acme/orders/events"
consumer = client.subscribe(topic, "smoke", initial_position=pulsar.InitialPosition.Earliest)
producer = client.create_producer(topic)
for i in range(10):
    producer.send(("hello-%d" % i).encode(), partition_key=str(i))
got = sorted(consumer.receive(timeout_millis=30000).data().decode() for _ in range(10))
assert got == sorted("hello-%d" % i for i in range(10)), got
print("produced and consumed", len(got), "messages")
client.close()
PY'
echo "kind-smoke: OK"
