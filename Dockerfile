# syntax=docker/dockerfile:1
#
# One image for every Magnetar role: `magnetar standalone` (the default command), and the
# `broker`, `bookie` and `operator` sub-commands as they land. The entrypoint is the `magnetar`
# console script, so the role is the first argument:
#
#   docker build -t magnetar:dev .
#   scripts/build-image.sh     # podman, no registry needed: Debian base made by mmdebstrap
#   docker run -p 6650:6650 -p 8080:8080 -v magnetar-data:/data magnetar:dev
#   docker run magnetar:dev operator --liveness=http://0.0.0.0:8080/healthz
#
# The build context is allow-listed in .dockerignore (tests/deploy checks that every package
# in pyproject.toml gets into it).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: one wheel for Magnetar plus wheels for all its dependencies ----------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
# Wheels, not an install: the runtime stage installs from /wheels with --no-index, so the final
# image gets no build tooling, no source tree and no pip cache. The `operator` extra brings the
# operator's dependencies (kopf and the Kubernetes client) so one image serves every role.
# Dependencies first, from pyproject.toml alone: that layer stays cached while only the source
# changes (scripts/build-image.sh rebuilds in seconds then).
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['operator']))" > requirements.txt \
 && pip wheel --wheel-dir /wheels -r requirements.txt
# SOURCE_HASH (scripts/build-image.sh passes the content hash of the context) makes every later step
# miss the cache when the source changes: podman/buildah's layer cache reused a stale `COPY . .`.
ARG SOURCE_HASH=""
RUN echo "source ${SOURCE_HASH}" > /tmp/source-hash
COPY . .
RUN pip wheel --no-deps --wheel-dir /wheels .

# ---- runtime ----------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE}

LABEL org.opencontainers.image.title="magnetar" \
      org.opencontainers.image.description="Messaging platform speaking Apache Pulsar's protocol and admin API; broker, bookie, standalone and Kubernetes operator" \
      org.opencontainers.image.licenses="Apache-2.0"

# HEALTHCHECK_URL is what HEALTHCHECK probes. The default fits `standalone` and `broker` on the
# default HTTP port (/status.html answers without credentials, also with authentication on); for the
# operator set it to the kopf liveness URL (http://127.0.0.1:8080/healthz).
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    HEALTHCHECK_URL=http://127.0.0.1:8080/status.html

# A fixed numeric UID/GID: Kubernetes can only enforce runAsNonRoot against a numeric USER, and
# volume ownership (fsGroup) is predictable across image rebuilds.
RUN groupadd --system --gid 10001 magnetar \
 && useradd --system --uid 10001 --gid 10001 --home-dir /home/magnetar --create-home \
        --shell /usr/sbin/nologin magnetar \
 && mkdir -p /data \
 && chown 10001:10001 /data

# The wheels come from the build stage, copied and removed (a bind mount of that stage, nicer because
# no layer keeps them, installed stale packages with podman/buildah's layer cache).
COPY --from=build /wheels /tmp/wheels
RUN pip install --no-index --find-links=/tmp/wheels "magnetar[operator]" && rm -rf /tmp/wheels

USER 10001:10001
WORKDIR /data

# Messages, ledgers and metadata of standalone/broker/bookie live here; mount a volume to keep
# them across container restarts.
VOLUME ["/data"]

# 6650: Pulsar binary protocol; 8080: admin REST API, /metrics and health (the operator's kopf
# liveness endpoint also listens on 8080 by convention).
EXPOSE 6650 8080

# Python instead of curl/wget: the slim base image ships neither, and adding one only for this
# would enlarge the image. urlopen raises (exit status 1) on refused connections and HTTP >= 400.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['HEALTHCHECK_URL'], timeout=4)"]

ENTRYPOINT ["magnetar"]
CMD ["standalone", "--data-dir=/data"]
