#!/usr/bin/env bash
# Builds, from Debian's packages, local equivalents of the base images that docker/Dockerfile.server
# and docker/Dockerfile.client start from, for a machine that cannot pull from Docker Hub:
#
#   corbin-fl/base-python:3.11-bookworm  Debian 12 (minbase) with Python 3.11, pip and venv, made
#                                        by debootstrap and `docker import`; stands for python:*-slim
#                                        (CPU ClientApp image). Like the official Python images, its
#                                        Python is not marked externally managed.
#   corbin-fl/base-flwr:<FLWR_VERSION>   that + Flower in /python/venv, non-root user app (49999);
#                                        stands for flwr/superlink, flwr/superexec, flwr/supernode
#                                        (docker/bases/Dockerfile.flwr)
#
# and puts the PyTorch CPU wheel for Python 3.11 into docker/wheels/ (from this machine's own pip:
# `pip download`), which the image builds use when they are given no PyTorch index.
# Then: docker/build-images.sh --local-bases
#
# Usage: sudo docker/bases/make-local-bases.sh [-c CA_BUNDLE] [-m MIRROR] [-f]
#   -c CA_BUNDLE  PEM bundle that pip in the build must trust (e.g. your system's bundle, if a
#                 proxy re-signs TLS with its own CA); given as a build secret and as debootstrap's
#                 bundle, never written into an image
#   -m MIRROR     Debian mirror for debootstrap (default: debootstrap's own)
#   -f            rebuild the Python base even if the image exists
# Needs root (debootstrap), debootstrap, and a Docker engine that builds with BuildKit.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
# shellcheck disable=SC1091  # followed by the tests with its own shellcheck run
source "${repo}/docker/buildkit.sh"

FLWR_VERSION="${FLWR_VERSION:-1.42.0}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
PYTHON_IMAGE="corbin-fl/base-python:3.11-bookworm"
FLWR_IMAGE="corbin-fl/base-flwr:${FLWR_VERSION}"
ca=""
mirror=""
force=0

usage() { sed -n '/^# Usage:/,/^# Needs/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

while getopts ":c:m:fh" opt; do
  case "${opt}" in
    c) ca="${OPTARG}" ;;
    m) mirror="${OPTARG}" ;;
    f) force=1 ;;
    h) usage; exit 0 ;;
    :) echo "error: -${OPTARG} needs a value" >&2; usage >&2; exit 2 ;;
    *) echo "error: unknown option -${OPTARG}" >&2; usage >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if (($#)); then
  echo "error: unexpected argument: $1" >&2
  usage >&2
  exit 2
fi
if [[ -n "${ca}" && ! -s "${ca}" ]]; then
  echo "error: -c ${ca}: no such file, or empty" >&2
  exit 2
fi
require_buildkit

secret=()
if [[ -n "${ca}" ]]; then
  secret=(--secret "id=ca,src=${ca}")
fi

# 1. The Python base, from Debian's packages (about a minute; kept for later runs).
if ((force)) || ! docker image inspect "${PYTHON_IMAGE}" >/dev/null 2>&1; then
  if ((EUID != 0)); then
    echo "error: debootstrap needs root: run this script with sudo" >&2
    exit 1
  fi
  command -v debootstrap >/dev/null || {
    echo "error: debootstrap is missing (apt-get install debootstrap)" >&2
    exit 1
  }
  rootfs="$(mktemp -d)"
  trap 'rm -rf "${rootfs}"' EXIT
  boot=(--variant=minbase "--include=python3,python3-venv,python3-pip,ca-certificates")
  if [[ -n "${ca}" ]]; then
    # debootstrap downloads with wget, which reads the bundle from here.
    export SSL_CERT_FILE="${ca}"
  fi
  echo "== debootstrap bookworm -> ${PYTHON_IMAGE}"
  debootstrap "${boot[@]}" bookworm "${rootfs}" ${mirror:+"${mirror}"} >/dev/null
  # As in the official Python images: pip may install next to the system's packages.
  rm -f "${rootfs}"/usr/lib/python3*/EXTERNALLY-MANAGED
  rm -rf "${rootfs}"/var/cache/apt/archives/*.deb "${rootfs}"/var/lib/apt/lists/*
  tar -C "${rootfs}" -c . | docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' \
    - "${PYTHON_IMAGE}" >/dev/null
  rm -rf "${rootfs}"
  trap - EXIT
else
  echo "== ${PYTHON_IMAGE} exists (-f rebuilds it)"
fi

# 2. Flower on it, as in Flower's official images.
echo "== ${FLWR_IMAGE}"
docker build -q -f "${here}/Dockerfile.flwr" \
  --build-arg "PYTHON_BASE=${PYTHON_IMAGE}" --build-arg "FLWR_VERSION=${FLWR_VERSION}" \
  "${secret[@]}" -t "${FLWR_IMAGE}" "${here}" >/dev/null

# 3. The PyTorch CPU wheel for the base's Python 3.11, from this machine's pip (its index, or the
#    wheels its configuration points to; PIP_INDEX_URL etc. apply).
wheels="${repo}/docker/wheels"
if compgen -G "${wheels}/torch-${TORCH_VERSION}*-cp311-*.whl" >/dev/null; then
  echo "== ${wheels}: has torch ${TORCH_VERSION} for Python 3.11"
else
  echo "== pip download torch==${TORCH_VERSION} -> ${wheels}"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
    --implementation cp --platform manylinux_2_28_x86_64 -d "${wheels}" "torch==${TORCH_VERSION}"
fi
docker image ls --format '{{.Repository}}:{{.Tag}}  {{.Size}}' | grep '^corbin-fl/base-' || true
echo "done: now docker/build-images.sh --local-bases"
