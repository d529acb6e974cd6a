# Conduit HTTP shim (OpenAI API on 8000): Flask + gevent, no torch, no model.
#   docker build -f deploy/shim.Dockerfile -t conduit-shim .
#   Air-gapped: docker buildx build --network=none --build-context wheelhouse=wheelhouse \
#                 --build-arg OFFLINE=1 -f deploy/shim.Dockerfile -t conduit-shim .

# The wheels of an air-gapped build (`make wheelhouse`, docs/operations-offline.md), given as a build
# context of this name; empty otherwise.
FROM scratch AS wheelhouse

FROM python:3.11-slim-bookworm

# 1: pip takes the wheelhouse's wheels alone (--no-index).
ARG OFFLINE=""

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN useradd --create-home --uid 10001 --user-group conduit

WORKDIR /opt/conduit
COPY pyproject.toml README.md ./
COPY protos ./protos
COPY engine_service ./engine_service
COPY http_shim ./http_shim
COPY clients ./clients
COPY conduit_common ./conduit_common
COPY launcher ./launcher
# The shim extra and the base dependencies only: neither pulls torch (the engine extra does). The
# engine_service sources ride along because pyproject.toml lists the package; the shim never imports it.
# Versions are ranged in pyproject.toml (DL3013).
# hadolint ignore=DL3013
RUN --mount=type=bind,from=wheelhouse,target=/wheelhouse \
    pip install --no-cache-dir ${OFFLINE:+--no-index --find-links /wheelhouse} ".[shim]" \
    && python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is not None)"

# Numeric, so Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
WORKDIR /home/conduit
EXPOSE 8000
# SIGTERM drains: /health answers 503, running answers finish within --drain-seconds, exit 0.
STOPSIGNAL SIGTERM
# /health is readiness (503 while the engine is away or draining), so a failing check means "not
# ready", not "dead"; Kubernetes ignores HEALTHCHECK and uses the manifests' probes.
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)"]
ENTRYPOINT ["python", "-m", "http_shim", "--host", "0.0.0.0", "--port", "8000"]
CMD ["--engine", "engine:50051", "--drain-seconds", "30", "--log-format", "json"]
