#!/usr/bin/env bash
# Sourced by docker/build-images.sh and docker/bases/make-local-bases.sh: checks that `docker`
# reaches an engine and builds with BuildKit (the Dockerfiles use build secrets, cache and bind
# mounts, which the legacy builder does not have).
#
# BuildKit comes with the buildx plugin (Docker Desktop, Docker's own packages) or, in Docker CLIs
# before 23.0 (e.g. Debian 12's docker.io 20.10), built in behind DOCKER_BUILDKIT=1. With neither,
# the build stops here and says so.

require_buildkit() {
  if ! docker info >/dev/null 2>&1; then
    echo "error: no Docker engine answers \`docker info\` (is dockerd running, may you use it?)" >&2
    return 1
  fi
  if docker buildx version >/dev/null 2>&1; then
    export DOCKER_BUILDKIT=1
    return 0
  fi
  local client
  client="$(docker version --format '{{.Client.Version}}' 2>/dev/null || true)"
  if [[ "${client%%.*}" =~ ^[0-9]+$ ]] && ((${client%%.*} < 23)); then
    export DOCKER_BUILDKIT=1
    return 0
  fi
  echo "error: this docker CLI (${client:-unknown}) builds with BuildKit only through the buildx" \
    "plugin, which is not installed: install it (Docker's docker-buildx-plugin package)" >&2
  return 1
}
