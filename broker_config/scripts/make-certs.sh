#!/usr/bin/env bash
# Create a certificate authority, a broker certificate and optional client certificates (openssl).
#
#   make-certs.sh [-d OUT_DIR] [-n SERVER_NAME]... [-D DAYS] [CLIENT ...]
#
# OUT_DIR (default /etc/mosquitto/streamfed/certs) receives
#   ca.key ca.crt          the CA (ca.key stays with the operator: mode 0600, never on the broker host
#                          in production); an existing CA is reused, so clients can be added later
#   server.key server.crt  the broker's certificate for localhost, 127.0.0.1 and every -n name
#                          (an IP address or a DNS name)
#   CLIENT.key CLIENT.crt  client certificates (CN = CLIENT) for mutual TLS, if clients are named
# Keys are ECDSA P-256. Run as root, server.key is root:mosquitto 0640 so that Mosquitto (which drops
# to the `mosquitto` user; MOSQUITTO_USER changes that name) can read it; certificates are 0644.
set -euo pipefail

usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

out=/etc/mosquitto/streamfed/certs
days=825
names=(localhost 127.0.0.1)
while getopts "d:n:D:h" opt; do
  case $opt in
    d) out=$OPTARG ;;
    n) names+=("$OPTARG") ;;
    D) days=$OPTARG ;;
    h) usage 0 ;;
    *) usage 2 >&2 ;;
  esac
done
shift $((OPTIND - 1))
command -v openssl >/dev/null || { echo "openssl not found" >&2; exit 1; }
name_re='^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$'

mkdir -p "$out"
umask 077
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

broker_user=${MOSQUITTO_USER:-mosquitto}
as_broker_readable() {  # key files the broker must read
  if [ "$(id -u)" = 0 ] && id "$broker_user" >/dev/null 2>&1; then
    chown "root:$(id -gn "$broker_user")" "$@"
    chmod 0640 "$@"
  else
    chmod 0600 "$@"
  fi
}

newkey() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
serial() { echo "0x$(openssl rand -hex 16)"; }

if [ ! -f "$out/ca.key" ] || [ ! -f "$out/ca.crt" ]; then
  newkey "$out/ca.key"
  openssl req -x509 -new -key "$out/ca.key" -sha256 -days 3650 -subj "/CN=streamfed CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -addext "subjectKeyIdentifier=hash" -out "$out/ca.crt"
  chmod 0600 "$out/ca.key"
  chmod 0644 "$out/ca.crt"
  echo "created CA $out/ca.crt" >&2
fi

sign() {  # sign NAME CN EXTFILE
  newkey "$out/$1.key"
  openssl req -new -key "$out/$1.key" -subj "/CN=$2" -out "$tmp/$1.csr"
  openssl x509 -req -in "$tmp/$1.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -set_serial "$(serial)" \
    -sha256 -days "$days" -extfile "$3" -out "$out/$1.crt" 2>/dev/null
  chmod 0644 "$out/$1.crt"
}

san=""
for n in "${names[@]}"; do
  if [[ $n =~ ^[0-9.]+$ || $n == *:* ]]; then san+="IP:$n,"; else san+="DNS:$n,"; fi
done
cat >"$tmp/server.ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid,issuer
subjectAltName=${san%,}
EXT
sign server "${names[0]}" "$tmp/server.ext"
as_broker_readable "$out/server.key"
echo "created $out/server.crt for ${names[*]}" >&2

cat >"$tmp/client.ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid,issuer
EXT
for client in "$@"; do
  [[ $client =~ $name_re ]] || { echo "invalid client name: '$client'" >&2; exit 2; }
  sign "$client" "$client" "$tmp/client.ext"
  echo "created $out/$client.crt" >&2
done
