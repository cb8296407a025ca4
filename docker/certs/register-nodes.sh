#!/usr/bin/env bash
# Register the SuperNode public keys written by make-certs.sh with a running SuperLink started
# with --enable-supernode-auth, so those SuperNodes may connect (and keep a fixed node id).
#
#   docker/certs/register-nodes.sh CONNECTION [CERTS_DIR]
#
# CONNECTION: a SuperLink connection of the flwr CLI ($FLWR_HOME/config.toml, default
# ~/.flwr/config.toml), using TLS with the deployment's CA, e.g.
#     [superlink.docker-tls]
#     address = "127.0.0.1:8000"
#     root-certificates = "/abs/path/to/docker/certs/out/ca/ca.crt"
# CERTS_DIR: output folder of make-certs.sh (default docker/certs/out); every
# CERTS_DIR/node-K/node.key.pub is registered under the name node-K.
# Exits non-zero if any registration failed (e.g. a key registered before); the others still run.
set -euo pipefail

die() {
    echo "register-nodes.sh: error: $*" >&2
    exit 2
}

[[ $# -ge 1 && $# -le 2 ]] || die "usage: register-nodes.sh CONNECTION [CERTS_DIR]"
connection="$1"
certs_dir="${2:-docker/certs/out}"
[[ -n "$connection" ]] || die "CONNECTION must not be empty"
command -v flwr >/dev/null || die "the flwr CLI is not installed (pip install 'flwr==1.42.*')"

mapfile -t keys < <(
    find "$certs_dir" -mindepth 2 -maxdepth 2 -path '*/node-*/node.key.pub' | sort -V
)
((${#keys[@]} > 0)) || die "no node-*/node.key.pub under '$certs_dir' (run make-certs.sh first)"

failed=0
for key in "${keys[@]}"; do
    name="$(basename "$(dirname "$key")")"
    if flwr supernode register "$key" "$connection" --name "$name"; then
        echo "registered $name ($key)"
    else
        echo "register-nodes.sh: registering $name ($key) failed" >&2
        failed=$((failed + 1))
    fi
done
((failed == 0)) || die "$failed of ${#keys[@]} registrations failed"
echo "registered ${#keys[@]} SuperNodes; list them with: flwr supernode list $connection"
