#!/usr/bin/env bash
# Builds the images of the compose files, each once, with BuildKit:
#
#   superlink  corbin-fl/superlink:TAG             (docker/Dockerfile.server)
#   supernode  corbin-fl/supernode:TAG             (docker/Dockerfile.client)
#   serverapp  corbin-fl/serverapp:TAG             (docker/Dockerfile.app, on its stage `app`)
#   clientapp  corbin-fl/clientapp:TAG-VARIANT     (docker/Dockerfile.app, on its stage `app`)
#
# TAG is $CORBIN_IMAGE_TAG (default 0.1.0), the tag the compose files use, so `docker compose up`
# then starts these images without building. The two app images share the stage `app` (PyTorch
# and the app's dependencies): it is built once, first, and both app images are built on it.
#
# Base images: Flower's, PyTorch's and Python's official images when Docker Hub answers (a pull
# of flwr/superlink:FLWR_VERSION), else the local bases of docker/bases/make-local-bases.sh
# (built first if missing, which needs root), as .ci/run chooses.
#
# Usage: docker/build-images.sh [--local-bases|--official-bases] [--variant cpu|cuda]
#                               [--ca CA_BUNDLE] [TARGET ...]
#   TARGET            superlink, serverapp, supernode, clientapp (default: all four)
#   --local-bases     build on the bases of docker/bases/make-local-bases.sh (no Docker Hub
#                     needed), with PyTorch from docker/wheels/, without probing Docker Hub
#   --official-bases  build on the official images, without probing Docker Hub
#   --variant V       ClientApp variant: cpu (default, as in docker-compose.yml) or cuda
#   --ca FILE         PEM bundle that pip in the build must trust (a TLS-inspecting proxy's CA):
#                     given as the build secret `ca`, mounted only while installing, in no layer
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck disable=SC1091  # followed by the tests with its own shellcheck run
source "${repo}/docker/buildkit.sh"

tag="${CORBIN_IMAGE_TAG:-0.1.0}"
flwr_version="1.42.0"
variant="cpu"
bases="auto"
ca=""
targets=()

usage() { sed -n '/^# Usage:/,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

while (($#)); do
  case "$1" in
    --local-bases) bases=local ;;
    --official-bases) bases=official ;;
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

if [[ "${bases}" == auto ]]; then
  if docker pull -q "flwr/superlink:${flwr_version}" >/dev/null 2>&1; then
    bases=official
  else
    bases=local
    echo "== Docker Hub does not answer (docker pull flwr/superlink:${flwr_version}):" \
      "building on the local bases (docker/bases/make-local-bases.sh)"
  fi
fi

common=()
if [[ -n "${ca}" ]]; then
  common+=(--secret "id=ca,src=${ca}")
fi
if [[ "${bases}" == local ]]; then
  if [[ "${variant}" == cuda && " ${targets[*]} " == *" clientapp "* ]]; then
    echo "error: the local bases build the cpu variant only (the CUDA base is PyTorch's image)" >&2
    exit 2
  fi
  for image in corbin-fl/base-python:3.11-bookworm "corbin-fl/base-flwr:${flwr_version}"; do
    if ! docker image inspect "${image}" >/dev/null 2>&1; then
      if ((EUID != 0)); then
        echo "error: ${image} is missing: run sudo docker/bases/make-local-bases.sh first" >&2
        exit 1
      fi
      echo "== ${image} is missing: docker/bases/make-local-bases.sh"
      FLWR_VERSION="${flwr_version}" "${repo}/docker/bases/make-local-bases.sh" ${ca:+-c "${ca}"}
      break
    fi
  done
  common+=(
    --build-arg "SUPERLINK_BASE=corbin-fl/base-flwr:${flwr_version}"
    --build-arg "SUPERNODE_BASE=corbin-fl/base-flwr:${flwr_version}"
    --build-arg "CPU_BASE=corbin-fl/base-python:3.11-bookworm"
    --build-arg "TORCH_INDEX_URL="
  )
fi

# One build; its output goes to a log of its own while the builds run side by side. `app-cpu`
# and `app-cuda` are the shared stage of the app images, built without a tag (BuildKit keeps it
# in its cache for the app images' builds).
build() {
  local target="$1" dockerfile image="" torch="${variant}" stage="$1" start
  case "${target}" in
    superlink) dockerfile=docker/Dockerfile.server image="corbin-fl/${target}:${tag}" ;;
    supernode) dockerfile=docker/Dockerfile.client image="corbin-fl/${target}:${tag}" ;;
    serverapp) dockerfile=docker/Dockerfile.app image="corbin-fl/${target}:${tag}" torch=cpu ;;
    clientapp) dockerfile=docker/Dockerfile.app image="corbin-fl/${target}:${tag}-${variant}" ;;
    app-cpu | app-cuda) dockerfile=docker/Dockerfile.app torch="${target#app-}" stage=app ;;
  esac
  start=${SECONDS}
  docker build -f "${repo}/${dockerfile}" --target "${stage}" \
    --build-arg "FLWR_VERSION=${flwr_version}" --build-arg "TORCH_VARIANT=${torch}" \
    "${common[@]}" ${image:+-t "${image}"} "${repo}" >"${logs}/${target}.log" 2>&1 || return 1
  if [[ -n "${image}" ]]; then
    echo "== ${image}: built in $((SECONDS - start)) s," \
      "$(docker image inspect --format '{{.Size}}' "${image}" | awk '{printf "%.0f MB", $1 / 1e6}')"
  else
    echo "== shared stage ${target} (torch and the app's dependencies): built in" \
      "$((SECONDS - start)) s"
  fi
}

# Builds a group of targets at once (each uses a core of its own); a failed build's log is
# printed.
build_all() {
  local pids=() i failed=0
  for target in "$@"; do
    echo "== building ${target}"
    build "${target}" &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    if ! wait "${pids[${i}]}"; then
      local name=("$@")
      echo "error: building ${name[${i}]} failed:" >&2
      tail -n 40 "${logs}/${name[${i}]}.log" >&2
      failed=1
    fi
  done
  return "${failed}"
}

# First the images without torch and the shared stage(s) of the app images, side by side; then
# the app images, on the stage now in BuildKit's cache (their own layers take seconds).
first=()
apps=()
shared=()
for target in "${targets[@]}"; do
  case "${target}" in
    superlink | supernode) first+=("${target}") ;;
    serverapp) apps+=(serverapp) && shared+=(app-cpu) ;;
    clientapp) apps+=(clientapp) && shared+=("app-${variant}") ;;
  esac
done
if ((${#shared[@]})); then
  mapfile -t shared < <(printf '%s\n' "${shared[@]}" | sort -u)
fi
logs="$(mktemp -d)"
trap 'rm -rf "${logs}"' EXIT
echo "== bases: ${bases}"
start_all=${SECONDS}
build_all "${first[@]}" "${shared[@]}" || exit 1
if ((${#apps[@]})); then
  build_all "${apps[@]}" || exit 1
fi
echo "== all built in $((SECONDS - start_all)) s"
