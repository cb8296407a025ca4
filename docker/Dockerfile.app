# The two app images of a CorBin-FL deployment (Flower 1.42, process isolation), on ONE shared
# stage, `app`, that holds PyTorch and the app's runtime dependencies (docker/requirements.txt):
#
#   serverapp  the ServerApp executor (`flower-superexec`): pulls ServerApp runs from the
#              SuperLink's Runtime API and runs each one in a `flwr-serverapp` process
#   clientapp  the ClientApp executor (`flower-superexec`): pulls ClientApp tasks from its
#              SuperNode and runs each in a `flwr-clientapp` process, where local training runs
#              on the GPU when the container has one (torch picks "cuda" when available)
#
# Both executors run the app's code, so both need what it imports: the SuperLink and the
# SuperNodes never install anything at run time. The two targets differ only in their last
# layers (the runs folder, the default command), so the torch layer (about 1.9 GB unpacked with
# the CPU wheel) is built, stored and pulled once for both: docker/build-images.sh builds the
# `app` stage first, then the two targets from BuildKit's cache.
#
#   docker/build-images.sh serverapp clientapp          # or, by hand (BuildKit):
#   DOCKER_BUILDKIT=1 docker build -f docker/Dockerfile.app --target clientapp \
#       --build-arg TORCH_VARIANT=cuda -t corbin-fl/clientapp:0.1.0-cuda .
#
# TORCH_VARIANT=cpu (default) builds on python:3.12-slim with PyTorch's CPU wheel;
# TORCH_VARIANT=cuda on the official PyTorch CUDA runtime image (CUDA 12.6, cuDNN 9; the host
# needs an NVIDIA driver for CUDA 12 and the NVIDIA Container Toolkit to use the GPU, and it still
# runs on CPU without one), about ten times the size: for the ClientApp of a GPU machine.
# BuildKit builds only the variant asked for.
#
# Base images are build arguments. Their defaults are the official images (PyTorch's, Python's);
# on a machine that cannot pull from Docker Hub, docker/bases/make-local-bases.sh builds an
# equivalent of the CPU base from Debian's packages and docker/build-images.sh uses it (it
# chooses by itself, or --local-bases). No `# syntax=` line makes BuildKit fetch a frontend image.
# A CA that pip must trust (a TLS-inspecting proxy's) is given as the build secret `ca`
# (`--secret id=ca,src=BUNDLE`): mounted for the RUNs that install, in no layer of the image.
# pip's downloads stay in a BuildKit cache mount, shared between builds.
#
# The build context is the repository root; .dockerignore lets in only the files copied below.
# The app itself (server/, client/, mechanisms/, corbin_fl/) is NOT baked in: `flwr run` ships it
# as a Flower App Bundle with every run, so images and runs cannot drift apart.
#
# Both targets run as the non-root user `app` (uid 49999, as in Flower's official images) and
# start Flower's gRPC health server on 127.0.0.1:8081, which the HEALTHCHECK polls.

# The Flower version of docker/requirements.txt; the build fails if they differ.
ARG FLWR_VERSION=1.42.0
ARG TORCH_VARIANT=cpu
# PyTorch 2.13.0, CUDA 12.6, cuDNN 9, Ubuntu 24.04, Python 3.12; the digest pins the exact image.
ARG CUDA_BASE=pytorch/pytorch:2.13.0-cuda12.6-cudnn9-runtime@sha256:6acf597eeb8e376a96580dde4952f37cc017fef732bb40bfc73f28f25e3f64b4
# Local equivalent of the CPU base: corbin-fl/base-python:3.11-bookworm.
ARG CPU_BASE=python:3.12.12-slim-bookworm

# ----------------------------------------------------------------------------- PyTorch bases
# CUDA: torch comes with the image (installed with pip into the system Python 3.12, which is
# marked externally managed; our packages go next to it, as the image's own do).
FROM ${CUDA_BASE} AS torch-cuda
ENV PIP_BREAK_SYSTEM_PACKAGES=1

# CPU: torch from PyTorch's CPU wheel index (no CUDA libraries).
FROM ${CPU_BASE} AS torch-cpu
ARG TORCH_VERSION=2.13.0
# PyTorch's CPU wheel index. Empty: the default index, where a wheel of docker/wheels/
# (make-local-bases.sh), e.g. 2.13.0+cpu, wins as the higher version (PEP 440 local label).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# hadolint ignore=DL3042
RUN --mount=type=secret,id=ca,mode=0444 \
    --mount=type=bind,source=docker/wheels,target=/tmp/wheels \
    --mount=type=cache,id=corbin-fl-pip-root,target=/root/.cache/pip \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && torch_from="PIP_FIND_LINKS=/tmp/wheels" \
    && if [ -n "${TORCH_INDEX_URL}" ]; then torch_from="PIP_INDEX_URL=${TORCH_INDEX_URL}"; fi \
    && env "${torch_from}" python3 -m pip install --find-links /tmp/wheels \
        "torch==${TORCH_VERSION}"

# ----------------------------------------------------------------------------- the shared stage
# `torch-${TORCH_VARIANT}` names one of the two stages above, not an image, so the "tag your
# image" rule (DL3006) does not apply to it.
# hadolint ignore=DL3006
FROM torch-${TORCH_VARIANT} AS app
ARG FLWR_VERSION

ENV FLWR_TELEMETRY_ENABLED=0 \
    FLWR_DISABLE_UPDATE_CHECK=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/app

USER 0
COPY --chmod=0644 docker/requirements.txt /opt/corbin-fl/requirements.txt
# Install the app's dependencies (Flower with them, FLWR_VERSION or the build fails), fail the
# build if torch was replaced (a
# dependency asking for another torch would pull a multi-GB wheel without the base's build), and
# add the non-root user; Flower keeps installed app bundles under $HOME/.flwr. The import check
# runs as root with HOME=/app and leaves matplotlib's font cache in /app/.cache and /app/.config:
# the whole of /app goes to the app user, or every app process rebuilds that font cache and
# recomputes its partition (corbin-fl's cache in $HOME/.cache, unwritable), 2-4 CPU-seconds.
# /app/runs: results (events.jsonl, metrics.jsonl, summary.json) of runs started with
# --run-config 'out-dir="/app/runs/<name>"' (the ServerApp's); a named volume mounted there
# inherits its owner.
# hadolint ignore=DL3042
RUN --mount=type=secret,id=ca,mode=0444 \
    --mount=type=cache,id=corbin-fl-pip-root,target=/root/.cache/pip \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && TORCH_BEFORE="$(python3 -c 'import torch; print(torch.__version__)')" \
    && python3 -m pip install -r /opt/corbin-fl/requirements.txt \
    && TORCH_AFTER="$(python3 -c 'import torch; print(torch.__version__)')" \
    && test "${TORCH_BEFORE}" = "${TORCH_AFTER}" \
    && FLWR_INSTALLED="$(python3 -c 'import flwr, flwr_datasets, mlxtend, torch; print(flwr.__version__)')" \
    && test "${FLWR_INSTALLED}" = "${FLWR_VERSION}" \
    && groupadd --gid 49999 app \
    && useradd --uid 49999 --gid 49999 --home-dir /app --no-create-home \
        --shell /usr/sbin/nologin app \
    && mkdir -p /app/runs \
    && chown -R 49999:49999 /app

COPY --chmod=0644 docker/healthcheck.py /opt/corbin-fl/healthcheck.py

WORKDIR /app
USER 49999:49999

# ----------------------------------------------------------------------------- ServerApp executor
FROM app AS serverapp

LABEL org.opencontainers.image.title="corbin-fl-serverapp" \
      org.opencontainers.image.description="Flower SuperExec running the CorBin-FL ServerApp" \
      org.opencontainers.image.licenses="Apache-2.0"

USER 49999:49999
VOLUME ["/app/runs"]
HEALTHCHECK --interval=30s --timeout=30s --start-period=60s --retries=3 \
    CMD ["python3", "/opt/corbin-fl/healthcheck.py", "127.0.0.1:8081"]
ENTRYPOINT ["flower-superexec", "--health-server-address", "127.0.0.1:8081"]
CMD ["--insecure", "--runtime-api-address", "superlink:8000"]

# ----------------------------------------------------------------------------- ClientApp executor
FROM app AS clientapp

LABEL org.opencontainers.image.title="corbin-fl-clientapp" \
      org.opencontainers.image.description="Flower SuperExec running the CorBin-FL ClientApp" \
      org.opencontainers.image.licenses="Apache-2.0"

USER 49999:49999
HEALTHCHECK --interval=30s --timeout=30s --start-period=60s --retries=3 \
    CMD ["python3", "/opt/corbin-fl/healthcheck.py", "127.0.0.1:8081"]
ENTRYPOINT ["flower-superexec", "--health-server-address", "127.0.0.1:8081"]
CMD ["--insecure", "--runtime-api-address", "supernode:9094"]
