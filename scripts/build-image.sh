#!/usr/bin/env bash
# Build the Magnetar container image with podman, without any registry:
#   1. a Debian bookworm base image made by mmdebstrap from Debian's packages (python3, pip),
#   2. the project image from the repository's Dockerfile on top of it (PYTHON_IMAGE=that base).
# Both are cached by the content hash of their inputs: the base by its package list, the project
# image by the files of the build context (the .dockerignore allow-list) and the Dockerfile, so an
# unchanged tree costs one `podman image exists`. Prints the image reference on stdout.
#
#   scripts/build-image.sh            # -> localhost/magnetar:<hash>
#
# Environment: MAGNETAR_IMAGE_REPO (default localhost/magnetar), MAGNETAR_BASE_REPO, and PODMAN /
# CONTAINERS_CONF as scripts/podman-lib.sh describes.
set -euo pipefail
cd "$(dirname "$0")/.."

repo=${MAGNETAR_IMAGE_REPO:-localhost/magnetar}
base_repo=${MAGNETAR_BASE_REPO:-localhost/magnetar-base}
# python3-pip brings pip; passwd brings groupadd/useradd; python-is-python3 the `python` command
# the HEALTHCHECK runs; ca-certificates lets pip reach PyPI during the build.
base_packages="python3,python3-pip,python-is-python3,passwd,ca-certificates"

# shellcheck source=scripts/podman-lib.sh
source scripts/podman-lib.sh

# ---- base image -------------------------------------------------------------------------------
base_hash=$(printf '%s\n' "bookworm" "$base_packages" "pep668-off" | sha256sum | cut -c1-16)
base="$base_repo:$base_hash"
build_base "$base" "$base_packages" --change 'CMD ["python3"]'

# ---- project image ----------------------------------------------------------------------------
# The build context is what .dockerignore lets in: pyproject.toml, README.md and the packages.
context_hash=$( {
  sha256sum Dockerfile .dockerignore
  # The allow-list entries of .dockerignore ("!path"), so a new package is hashed once it is let in.
  mapfile -t allowed < <(sed -n 's#^!\(.*[^/]\)/*$#\1#p' .dockerignore)
  git ls-files -z -- "${allowed[@]}" | xargs -0 sha256sum
  echo "$base"
} | sha256sum | cut -c1-16)
image="$repo:$context_hash"
if ! "${podman[@]}" image exists "$image"; then
  log "building $image"
  start=$(date +%s)
  build_opts=()
  # Behind a TLS-intercepting proxy pip needs the host's CA bundle: mounted for the RUN steps only,
  # never part of a layer. MAGNETAR_BUILD_CA= (empty) turns it off.
  ca=${MAGNETAR_BUILD_CA-/etc/ssl/certs/ca-certificates.crt}
  if [ -n "$ca" ] && [ -f "$ca" ]; then
    build_opts+=(--volume "$ca:/etc/ssl/certs/ca-certificates.crt:ro")
  fi
  "${podman[@]}" build --quiet --layers "${build_opts[@]}" --build-arg "PYTHON_IMAGE=$base" \
    --build-arg "SOURCE_HASH=$context_hash" -t "$image" -f Dockerfile . >&2
  log "image built in $(($(date +%s) - start)) s"
fi
"${podman[@]}" tag "$image" "$repo:dev" >/dev/null
echo "$image"
