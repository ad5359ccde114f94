#!/usr/bin/env bash
# Build the Spark job image (manifests/spark/Dockerfile) with podman, without any registry: a Debian bookworm
# base made by mmdebstrap from Debian's packages (Python, Java 17, tini), then the Dockerfile on top of it.
# Both are cached by the hash of their inputs. Prints the image reference on stdout.
#
#   manifests/spark/build-image.sh        # -> localhost/magnetar-spark:<hash>
#
# Environment: MAGNETAR_SPARK_IMAGE_REPO (default localhost/magnetar-spark); PODMAN (default podman with the
# options this sandbox needs: runc, cgroupfs; CONTAINERS_CONF pointing at default_ulimits = []).
set -euo pipefail
cd "$(dirname "$0")/../.."

repo=${MAGNETAR_SPARK_IMAGE_REPO:-localhost/magnetar-spark}
packages="python3,python3-pip,passwd,ca-certificates,openjdk-17-jre-headless,tini,procps"
if [ -z "${CONTAINERS_CONF:-}" ]; then
  conf_dir=${XDG_RUNTIME_DIR:-/tmp}/magnetar-podman
  mkdir -p "$conf_dir"
  printf '[containers]\ndefault_ulimits = []\n' >"$conf_dir/containers.conf"
  export CONTAINERS_CONF=$conf_dir/containers.conf
fi
read -r -a podman <<<"${PODMAN:-podman --runtime runc --cgroup-manager=cgroupfs}"
log() { echo "build-image: $*" >&2; }

base="$repo-base:$(printf '%s\n' bookworm "$packages" | sha256sum | cut -c1-16)"
if ! "${podman[@]}" image exists "$base"; then
  log "building $base with mmdebstrap"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  # The image's Python belongs to the image: let pip install into it (PEP 668 marker removed).
  mmdebstrap --quiet --variant=minbase --include="$packages" \
    --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
    --customize-hook='rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*' \
    bookworm "$work/base.tar" >&2
  "${podman[@]}" import "$work/base.tar" "$base" >/dev/null
fi

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
