#!/usr/bin/env bash
# Sourced by docker/build-images.sh and docker/bases/make-local-bases.sh: checks that `docker`
# reaches an engine and builds with BuildKit (the Dockerfiles use build secrets, cache and bind
# mounts, which the legacy builder does not have).
#
# BuildKit comes with the buildx plugin (Docker Desktop, Docker's own packages) or, in Docker CLIs
# before 23.0 (e.g. Debian 12's docker.io 20.10), built in behind DOCKER_BUILDKIT=1. When the
# first `docker` on PATH has neither (e.g. a CLI 28 without buildx) but another `docker` on PATH
# does and reaches the engine (e.g. the engine's own /usr/bin/docker), that one builds: `docker`
# becomes a shell function calling it, in the sourcing script. With none, the build stops here and
# says so. tests/docker/image_build.py chooses its CLI the same way (find_docker_cli).

# Whether the docker CLI $1 builds with BuildKit: it has buildx, or it is a CLI before 23.0.
cli_builds_with_buildkit() {
  local cli="$1" client
  "${cli}" buildx version >/dev/null 2>&1 && return 0
  client="$("${cli}" version --format '{{.Client.Version}}' 2>/dev/null || true)"
  [[ "${client%%.*}" =~ ^[0-9]+$ ]] && ((${client%%.*} < 23))
}

require_buildkit() {
  local first cli folder seen=" "
  first="$(type -P docker || true)"
  if [[ -z "${first}" ]]; then
    echo "error: no docker CLI on PATH (install Docker: docs/DOCKER.md, Prerequisites)" >&2
    return 1
  fi
  if ! "${first}" info >/dev/null 2>&1; then
    echo "error: no Docker engine answers \`docker info\` (is dockerd running, may you use it?)" >&2
    return 1
  fi
  if cli_builds_with_buildkit "${first}"; then
    export DOCKER_BUILDKIT=1
    return 0
  fi
  # The first CLI cannot build with BuildKit: the next `docker` on PATH that can, and reaches
  # the engine, builds instead.
  local IFS=:
  for folder in ${PATH}; do
    cli="${folder:-.}/docker"
    [[ -x "${cli}" && ! -d "${cli}" ]] || continue
    cli="$(readlink -f "${cli}")"
    [[ "${cli}" != "$(readlink -f "${first}")" && "${seen}" != *" ${cli} "* ]] || continue
    seen+="${cli} "
    if "${cli}" info >/dev/null 2>&1 && cli_builds_with_buildkit "${cli}"; then
      echo "== ${first} builds with BuildKit only through the buildx plugin, not installed:" \
        "building with ${cli}" >&2
      CORBIN_DOCKER_CLI="${cli}"
      # shellcheck disable=SC2329  # called by the sourcing script
      docker() { "${CORBIN_DOCKER_CLI}" "$@"; }
      export DOCKER_BUILDKIT=1
      return 0
    fi
  done
  local client
  client="$("${first}" version --format '{{.Client.Version}}' 2>/dev/null || true)"
  echo "error: this docker CLI (${client:-unknown}) builds with BuildKit only through the buildx" \
    "plugin, which is not installed, and no other docker CLI on PATH does: install the plugin" \
    "(Docker's docker-buildx-plugin package)" >&2
  return 1
}
