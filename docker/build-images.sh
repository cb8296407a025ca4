#!/usr/bin/env bash
# Builds the images of the compose files, each once, with BuildKit:
#
#   superlink  corbin-fl/superlink:TAG             (docker/Dockerfile.server)
#   serverapp  corbin-fl/serverapp:TAG             (docker/Dockerfile.server)
#   supernode  corbin-fl/supernode:TAG             (docker/Dockerfile.client)
#   clientapp  corbin-fl/clientapp:TAG-VARIANT     (docker/Dockerfile.client)
#
# TAG is $CORBIN_IMAGE_TAG (default 0.1.0), the tag the compose files use, so `docker compose up`
# then starts these images without building.
#
# Usage: docker/build-images.sh [--local-bases] [--variant cpu|cuda] [--ca CA_BUNDLE] [TARGET ...]
#   TARGET          superlink, serverapp, supernode, clientapp (default: all four)
#   --local-bases   build on the bases of docker/bases/make-local-bases.sh (no Docker Hub needed)
#                   instead of the official images, with PyTorch from docker/wheels/
#   --variant V     ClientApp variant: cpu (default, as in docker-compose.yml) or cuda
#   --ca FILE       PEM bundle that pip in the build must trust (a TLS-inspecting proxy's CA):
#                   given as the build secret `ca`, mounted only while installing, in no layer
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck disable=SC1091  # followed by the tests with its own shellcheck run
source "${repo}/docker/buildkit.sh"

tag="${CORBIN_IMAGE_TAG:-0.1.0}"
flwr_version="1.41.0"
variant="cpu"
local_bases=0
ca=""
targets=()

usage() { sed -n '/^# Usage:/,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

while (($#)); do
  case "$1" in
    --local-bases) local_bases=1 ;;
    --variant)
      [[ $# -ge 2 ]] || { echo "error: --variant needs a value" >&2; exit 2; }
      variant="$2"
      shift
      ;;
    --ca)
      [[ $# -ge 2 ]] || { echo "error: --ca needs a file" >&2; exit 2; }
      ca="$2"
      shift
      ;;
    -h | --help) usage; exit 0 ;;
    superlink | serverapp | supernode | clientapp) targets+=("$1") ;;
    *) echo "error: unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
if [[ "${variant}" != cpu && "${variant}" != cuda ]]; then
  echo "error: --variant must be cpu or cuda, not ${variant}" >&2
  exit 2
fi
if [[ -n "${ca}" && ! -s "${ca}" ]]; then
  echo "error: --ca ${ca}: no such file, or empty" >&2
  exit 2
fi
if ((${#targets[@]} == 0)); then
  targets=(superlink serverapp supernode clientapp)
fi
require_buildkit

common=()
if [[ -n "${ca}" ]]; then
  common+=(--secret "id=ca,src=${ca}")
fi
if ((local_bases)); then
  for image in corbin-fl/base-python:3.11-bookworm "corbin-fl/base-flwr:${flwr_version}"; do
    if ! docker image inspect "${image}" >/dev/null 2>&1; then
      echo "error: ${image} is missing: run docker/bases/make-local-bases.sh first" >&2
      exit 1
    fi
  done
  if [[ "${variant}" == cuda ]]; then
    echo "error: --local-bases builds the cpu variant only (the CUDA base is PyTorch's image)" >&2
    exit 2
  fi
  common+=(
    --build-arg "SUPERLINK_BASE=corbin-fl/base-flwr:${flwr_version}"
    --build-arg "SUPEREXEC_BASE=corbin-fl/base-flwr:${flwr_version}"
    --build-arg "SUPERNODE_BASE=corbin-fl/base-flwr:${flwr_version}"
    --build-arg "CPU_BASE=corbin-fl/base-python:3.11-bookworm"
    --build-arg "TORCH_INDEX_URL="
  )
fi

# One build; its output goes to a log of its own while the builds run side by side.
build() {
  local target="$1" dockerfile image start
  case "${target}" in
    superlink | serverapp) dockerfile=docker/Dockerfile.server image="corbin-fl/${target}:${tag}" ;;
    supernode) dockerfile=docker/Dockerfile.client image="corbin-fl/${target}:${tag}" ;;
    clientapp) dockerfile=docker/Dockerfile.client image="corbin-fl/${target}:${tag}-${variant}" ;;
  esac
  start=${SECONDS}
  docker build -f "${repo}/${dockerfile}" --target "${target}" \
    --build-arg "FLWR_VERSION=${flwr_version}" --build-arg "CLIENT_VARIANT=${variant}" \
    "${common[@]}" -t "${image}" "${repo}" >"${logs}/${target}.log" 2>&1 || return 1
  echo "== ${image}: built in $((SECONDS - start)) s," \
    "$(docker image inspect --format '{{.Size}}' "${image}" | awk '{printf "%.0f MB", $1 / 1e6}')"
}

# The images are independent: build them at once (pip installs in serverapp and clientapp are
# the long part, and each uses a core of its own); a failed build's log is printed.
logs="$(mktemp -d)"
trap 'rm -rf "${logs}"' EXIT
pids=()
for target in "${targets[@]}"; do
  echo "== building ${target}"
  build "${target}" &
  pids+=($!)
done
failed=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[${i}]}"; then
    echo "error: building ${targets[${i}]} failed:" >&2
    tail -n 40 "${logs}/${targets[${i}]}.log" >&2
    failed=1
  fi
done
exit "${failed}"
