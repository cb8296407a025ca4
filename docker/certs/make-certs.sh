#!/usr/bin/env bash
# Make every key and certificate a TLS + SuperNode-authenticated CorBin-FL deployment needs.
#
#   docker/certs/make-certs.sh [-o OUT_DIR] [-n NUM_NODES] [-d DAYS] [-u UID:GID] [-f] [ADDRESS ...]
#
# ADDRESS: every DNS name or IP address (v4 or v6) under which SuperNodes and the `flwr` CLI reach
# the SuperLink (e.g. its public IP and DNS name). `superlink` (the compose service name, used by
# the ServerApp executor), `localhost`, 127.0.0.1 and ::1 are always added.
#
# Output (private keys 0600, directories 0700):
#   OUT/ca/ca.key, ca.crt            the certificate authority; keep ca.key off the network
#   OUT/superlink/                   copy to the server machine (docker-compose.server.yml)
#     ca.crt  server.pem  server.key   TLS of the SuperLink (Fleet, Control and Runtime API)
#     superexec.secret                 shared secret of the SuperLink and its ServerApp executor
#   OUT/node-K/ (K = 1..NUM_NODES)   copy to client machine K (docker-compose.client.yml)
#     ca.crt                           to verify the SuperLink
#     node.key  node.key.pub           the SuperNode's ECDSA P-384 identity (ssh-keygen); register
#                                      node.key.pub with `flwr supernode register`
#                                      (docker/certs/register-nodes.sh does it for every node)
#     runtime.pem  runtime.key         TLS of the SuperNode's Runtime API (ClientApp executor link),
#                                      SAN: supernode, supernode-K, localhost, 127.0.0.1
#     superexec.secret                 shared secret of the SuperNode and its ClientApp executor
#
# The containers run as uid 49999 (the `app` user of Flower's images). On the machine that made
# the files, give them through the group (`sudo chgrp -R 49999 ...; chmod -R g+rX ...`, as
# docs/DOCKER.md Part B does: you keep reading the node keys, which register-nodes.sh needs); on a
# client machine of Part C, which only its containers read from, `sudo chown -R 49999:49999` the
# copied node folder. `-u UID:GID` (needs root) chowns OUT's server and node folders here.
set -euo pipefail

readonly ALWAYS_DNS=(superlink localhost)
readonly ALWAYS_IP=(127.0.0.1 ::1)
readonly CURVE="P-384"

out_dir="docker/certs/out"
num_nodes=3
days=825
owner=""
force=0

die() {
    echo "make-certs.sh: error: $*" >&2
    exit 2
}

usage() {
    # The comment block at the top of this file, without the shebang and the '# ' prefixes.
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
}

is_ipv4() {
    local ip="$1" part
    [[ "$ip" =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] || return 1
    for part in "${BASH_REMATCH[@]:1}"; do
        ((10#$part <= 255)) || return 1
    done
}

is_ipv6() {
    [[ "$1" =~ ^[0-9A-Fa-f:.]+$ && "$1" == *:* ]]
}

is_dns() {
    local label='[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?'
    # All-numeric names (e.g. a mistyped IPv4 address) are not host names (RFC 1123, 2.1).
    [[ ${#1} -le 253 && "$1" =~ ^${label}(\.${label})*$ && ! "$1" =~ ^[0-9.]+$ ]]
}

# in_range VALUE LOW HIGH: VALUE is a decimal integer with LOW <= VALUE <= HIGH.
in_range() {
    [[ "$1" =~ ^[0-9]{1,9}$ ]] || return 1
    ((10#$1 >= $2 && 10#$1 <= $3))
}

while getopts ":o:n:d:u:fh" opt; do
    case "$opt" in
        o) out_dir="$OPTARG" ;;
        n) num_nodes="$OPTARG" ;;
        d) days="$OPTARG" ;;
        u) owner="$OPTARG" ;;
        f) force=1 ;;
        h)
            usage
            exit 0
            ;;
        :) die "option -$OPTARG needs a value" ;;
        *) die "unknown option -$OPTARG (see -h)" ;;
    esac
done
shift $((OPTIND - 1))

if ! in_range "$num_nodes" 1 1000; then
    die "-n NUM_NODES must be an integer in [1, 1000], got '$num_nodes'"
fi
if ! in_range "$days" 1 3650; then
    die "-d DAYS must be an integer in [1, 3650], got '$days'"
fi
[[ -z "$owner" || "$owner" =~ ^[0-9]+:[0-9]+$ ]] ||
    die "-u must be numeric UID:GID (e.g. 49999:49999), got '$owner'"

dns_names=("${ALWAYS_DNS[@]}")
ip_addrs=("${ALWAYS_IP[@]}")
for addr in "$@"; do
    if is_ipv4 "$addr" || is_ipv6 "$addr"; then
        ip_addrs+=("$addr")
    elif is_dns "$addr"; then
        dns_names+=("$addr")
    else
        die "'$addr' is neither an IP address nor a DNS name"
    fi
done

# subjectAltName list without duplicates, in the order given.
san_list() {
    local -A seen=()
    local entries=() item
    for item in "$@"; do
        [[ -n "${seen[$item]:-}" ]] && continue
        seen[$item]=1
        entries+=("$item")
    done
    local IFS=,
    echo "${entries[*]}"
}

server_sans=()
for name in "${dns_names[@]}"; do server_sans+=("DNS:$name"); done
for ip in "${ip_addrs[@]}"; do server_sans+=("IP:$ip"); done

if [[ -e "$out_dir" && -n "$(ls -A "$out_dir" 2>/dev/null)" && "$force" -ne 1 ]]; then
    die "'$out_dir' is not empty; use -f to overwrite (old node keys stop working)"
fi

# The tools last: every argument is checked first, on any machine.
command -v openssl >/dev/null || die "openssl not found (Debian/Ubuntu: apt-get install openssl)"
command -v ssh-keygen >/dev/null ||
    die "ssh-keygen not found (Debian/Ubuntu: apt-get install openssh-client)"

umask 077
mkdir -p "$out_dir"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

new_key() {
    openssl genpkey -algorithm EC -pkeyopt "ec_paramgen_curve:$CURVE" -out "$1" 2>/dev/null
    chmod 600 "$1"
}

# sign_leaf KEY CERT CN SANS: a serverAuth leaf certificate signed by the CA.
sign_leaf() {
    local key="$1" cert="$2" cn="$3" sans="$4"
    local csr="$work/leaf.csr" ext="$work/leaf.ext"
    openssl req -new -key "$key" -subj "/O=CorBin-FL/CN=$cn" -out "$csr"
    cat >"$ext" <<EOF
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
subjectAltName = $sans
EOF
    openssl x509 -req -in "$csr" -CA "$ca_dir/ca.crt" -CAkey "$ca_dir/ca.key" \
        -CAcreateserial -CAserial "$work/ca.srl" -sha384 -days "$days" \
        -extfile "$ext" -out "$cert" 2>/dev/null
    chmod 644 "$cert"
}

# --- certificate authority
ca_dir="$out_dir/ca"
mkdir -p "$ca_dir"
new_key "$ca_dir/ca.key"
openssl req -x509 -new -key "$ca_dir/ca.key" -sha384 -days "$days" \
    -subj "/O=CorBin-FL/CN=CorBin-FL deployment CA" \
    -addext "basicConstraints = critical, CA:TRUE, pathlen:0" \
    -addext "keyUsage = critical, keyCertSign, cRLSign" \
    -addext "subjectKeyIdentifier = hash" \
    -out "$ca_dir/ca.crt"
chmod 644 "$ca_dir/ca.crt"

# --- SuperLink
link_dir="$out_dir/superlink"
mkdir -p "$link_dir"
install -m 644 "$ca_dir/ca.crt" "$link_dir/ca.crt"
new_key "$link_dir/server.key"
sign_leaf "$link_dir/server.key" "$link_dir/server.pem" superlink "$(san_list "${server_sans[@]}")"
openssl rand -out "$link_dir/superexec.secret" 32
chmod 600 "$link_dir/superexec.secret"

# --- SuperNodes
for ((k = 1; k <= num_nodes; k++)); do
    node_dir="$out_dir/node-$k"
    mkdir -p "$node_dir"
    install -m 644 "$ca_dir/ca.crt" "$node_dir/ca.crt"
    rm -f "$node_dir/node.key" "$node_dir/node.key.pub"
    ssh-keygen -q -t ecdsa -b 384 -N "" -C "corbin-fl-node-$k" -f "$node_dir/node.key"
    chmod 600 "$node_dir/node.key"
    chmod 644 "$node_dir/node.key.pub"
    new_key "$node_dir/runtime.key"
    sign_leaf "$node_dir/runtime.key" "$node_dir/runtime.pem" "supernode-$k" \
        "$(san_list DNS:supernode "DNS:supernode-$k" DNS:localhost IP:127.0.0.1)"
    openssl rand -out "$node_dir/superexec.secret" 32
    chmod 600 "$node_dir/superexec.secret"
done

if [[ -n "$owner" ]]; then
    chown -R "$owner" "$out_dir/superlink" "$out_dir"/node-*
fi

echo "Wrote CA, SuperLink and $num_nodes SuperNode credentials to $out_dir"
echo "SuperLink certificate subjectAltName: $(san_list "${server_sans[@]}")"
# What to do next, as docs/DOCKER.md Part B does it (tests/unit/test_dockerfiles.py checks that
# every command printed here is one of the guide's).
echo "Next (docs/DOCKER.md, Part B):"
if [[ -z "$owner" ]]; then
    echo "  give the containers' user (gid 49999) the files through the group; they stay yours,"
    echo "  and register-nodes.sh reads the node keys (do not chown them to 49999):"
    echo "      sudo chgrp -R 49999 $out_dir/superlink $out_dir/node-*"
    echo "      chmod -R g+rX $out_dir/superlink $out_dir/node-*"
fi
echo "  start the SuperLink and its ServerApp executor, register the nodes, then start the clients:"
echo "      docker compose -f docker-compose.yml -f docker-compose.tls.yml up -d superlink serverapp"
echo "      docker/certs/register-nodes.sh <connection> $out_dir"
echo "      docker compose -f docker-compose.yml -f docker-compose.tls.yml up -d"
echo "On separate machines (Part C), copy $out_dir/node-K to client machine K instead."
