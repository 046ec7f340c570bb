# syntax=docker/dockerfile:1
# One image for every Phalanx service and for the chart's Jobs: `phalanx run <service>`,
# `phalanx bus init`, `phalanx bus kube-secrets` (deploy/helm/phalanx). docs/install.md, "The image".
#
#   docker build -t ghcr.io/phalanx-scheduler/phalanx:0.1.0 .
#
# Two stages: the first builds the wheel (tools/image/wheel.sh: the packages of proto/, libs/ and
# services/ only; no tests, no benchmarks, no simulator) and the wheels of its dependencies; the
# second installs them into a plain Python with no compiler, no pip cache and no sources, and runs
# as an unprivileged user. The base is pinned by version; pin it by digest too in a release
# pipeline (PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:...).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proto ./proto
COPY libs ./libs
COPY services ./services
COPY tools/image/wheel.sh ./tools/image/wheel.sh
RUN PYTHON=python bash tools/image/wheel.sh /wheels /src \
 && python -m pip wheel --no-cache-dir --wheel-dir /wheels /wheels/phalanx-*.whl

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PHALANX_HEALTH_ADDR=0.0.0.0:8080
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir --no-index --find-links /wheels phalanx \
 && python -m pip uninstall --yes pip \
 && phalanx --help >/dev/null
# The uid/gid the chart's pods run as (securityContext runAsUser 65532); the node agent
# topology-discovery runs as root by its pod's securityContext (the kubelet's socket directory).
USER 65532:65532
EXPOSE 8080
# The services serve /healthz (alive) and /readyz (consumers live) on PHALANX_HEALTH_ADDR, the
# same endpoints the chart's probes use; Kubernetes ignores HEALTHCHECK, `docker run` uses it.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
ENTRYPOINT ["phalanx"]
CMD ["--help"]
