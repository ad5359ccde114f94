# shellcheck shell=bash
# Sourced by scripts/build-image.sh and manifests/spark/build-image.sh (from the repository root):
# the podman command this sandbox needs, a stderr logger, and the mmdebstrap-built Debian base image.
#
# Environment: PODMAN (default podman with runc and cgroupfs); CONTAINERS_CONF (default: a file with
# default_ulimits = [], since raising RLIMIT_NOFILE/NPROC is not permitted in some sandboxes).

if [ -z "${CONTAINERS_CONF:-}" ]; then
  conf_dir=${XDG_RUNTIME_DIR:-/tmp}/magnetar-podman
  mkdir -p "$conf_dir"
  printf '[containers]\ndefault_ulimits = []\n' >"$conf_dir/containers.conf"
  export CONTAINERS_CONF=$conf_dir/containers.conf
fi
read -r -a podman <<<"${PODMAN:-podman --runtime runc --cgroup-manager=cgroupfs}"

log() { echo "build-image: $*" >&2; }

# build_base IMAGE PACKAGES [podman import options...]: a Debian bookworm image of PACKAGES (comma
# separated) made by mmdebstrap, unless IMAGE already exists. Its Python belongs to the image, so
# Debian's "externally managed" marker (PEP 668) is removed and pip may install into it.
build_base() {
  local image=$1 packages=$2 work start
  shift 2
  "${podman[@]}" image exists "$image" && return 0
  log "building $image with mmdebstrap"
  work=$(mktemp -d)
  start=$(date +%s)
  # shellcheck disable=SC2016  # "$1" is expanded by mmdebstrap (the chroot), not by this shell
  if ! mmdebstrap --quiet --variant=minbase --include="$packages" \
    --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
    --customize-hook='rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*' \
    bookworm "$work/base.tar" >&2 || ! "${podman[@]}" import "$@" "$work/base.tar" "$image" >/dev/null; then
    rm -rf "$work"
    return 1
  fi
  rm -rf "$work"
  log "base built in $(($(date +%s) - start)) s"
}
