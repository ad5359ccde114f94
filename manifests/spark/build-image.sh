#!/usr/bin/env bash
# Build the Spark job image (manifests/spark/Dockerfile) with podman, without any registry: a Debian bookworm
# base made by mmdebstrap from Debian's packages (Python, Java 17, tini), then the Dockerfile on top of it.
# Both are cached by the hash of their inputs. Prints the image reference on stdout.
#
#   manifests/spark/build-image.sh        # -> localhost/magnetar-spark:<hash>
#
# Environment: MAGNETAR_SPARK_IMAGE_REPO (default localhost/magnetar-spark); PODMAN / CONTAINERS_CONF as
# scripts/podman-lib.sh describes.
set -euo pipefail
cd "$(dirname "$0")/../.."

repo=${MAGNETAR_SPARK_IMAGE_REPO:-localhost/magnetar-spark}
packages="python3,python3-pip,passwd,ca-certificates,openjdk-17-jre-headless,tini,procps"
# shellcheck source=scripts/podman-lib.sh
source scripts/podman-lib.sh

base="$repo-base:$(printf '%s\n' bookworm "$packages" | sha256sum | cut -c1-16)"
build_base "$base" "$packages"

ignore=manifests/spark/Dockerfile.dockerignore
image="$repo:$( {
  sha256sum manifests/spark/Dockerfile "$ignore" manifests/spark/entrypoint.sh
  sed -n 's|^!||p' "$ignore" | xargs git ls-files -z -- | xargs -0 sha256sum
  echo "$base"
} | sha256sum | cut -c1-16)"
if ! "${podman[@]}" image exists "$image"; then
  log "building $image"
  opts=()
  # Behind a TLS-intercepting proxy pip needs the host's CA bundle, mounted for RUN steps only.
  ca=${MAGNETAR_BUILD_CA-/etc/ssl/certs/ca-certificates.crt}
  [ -n "$ca" ] && [ -f "$ca" ] && opts+=(--volume "$ca:/etc/ssl/certs/ca-certificates.crt:ro")
  "${podman[@]}" build --quiet --layers "${opts[@]}" --ignorefile "$ignore" --build-arg "PYTHON_IMAGE=$base" \
    -t "$image" -f manifests/spark/Dockerfile . >&2
fi
echo "$image"
