# The picker's image: `epp` as the entrypoint, taking upstream's flags (no subcommand = `epp serve`).
#
#   make image                      # docker or podman, base python:3.11-slim-bookworm
#   make image BASE=<local image>   # any Debian-like base with python3 + venv (manifests/image/prove.sh builds one)
#
# Two stages: the first installs the pinned set (constraints.txt) into a virtual environment, the second copies
# only that environment onto the same base. No compiler, no pip cache, no Envoy (only the demo needs one), no
# tests. Runs as 65532:65532 (distroless' nonroot), like upstream's image.
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
# A build behind a TLS-intercepting proxy passes its CA bundle (mounted at build time, never copied into the image):
#   --volume /etc/ssl/certs/ca-certificates.crt:/run/build-ca.crt:ro --build-arg PIP_CERT=/run/build-ca.crt
ARG PIP_CERT=
ARG PIP_INDEX_URL=
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# setup.py builds the optional C extension of epp.kvevents (block keys, the shared table's lookup). The slim base
# has no compiler, so here it is skipped and the numpy code runs (the startup log and /debug/pool say which; the
# precise pick costs about twice as much, benchmarks/RESULTS.md). To compile it, install gcc and libc6-dev in this
# stage only (`apt-get install -y --no-install-recommends gcc libc6-dev`, and python3-dev on a base whose Python is
# Debian's, before the pip install): the second stage
# copies the environment alone, never the compiler.
COPY pyproject.toml setup.py constraints.txt README.md LICENSE ./
COPY epp ./epp
RUN python3 -m venv /opt/epp \
 && /opt/epp/bin/pip install --no-compile -c constraints.txt . \
 && /opt/epp/bin/pip uninstall -y pip \
 && /opt/epp/bin/epp --version

FROM ${BASE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.source="https://github.com/llmkube/epp" \
      org.opencontainers.image.title="epp" \
      org.opencontainers.image.description="Endpoint Picker for the Gateway API Inference Extension, in Python" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/epp/bin:/usr/local/bin:/usr/bin:/bin
COPY --from=build /opt/epp /opt/epp
USER 65532:65532
WORKDIR /tmp
# 9002 ext_proc gRPC (TLS by default), 9003 gRPC health (plaintext, probes), 9090 /metrics and /debug.
EXPOSE 9002 9003 9090
ENTRYPOINT ["/opt/epp/bin/epp"]
