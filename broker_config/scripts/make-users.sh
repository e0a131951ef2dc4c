#!/usr/bin/env bash
# Create or update a Mosquitto password file for streamfed users.
#
#   make-users.sh [-f PASSWD_FILE] USER[:PASSWORD] ...
#
# USER is an agent's client name (the ACL's %u), `aggregator`, `viewer` or `monitor`. A USER given
# without ":PASSWORD" gets a random password, printed as "USER PASSWORD" on stdout — store it, only
# its hash is kept. Existing users not named are kept; named ones are replaced. Passwords never appear
# on a command line (mosquitto_passwd -U hashes a private temporary file).
#
# The file ends up readable by the broker: run as root, it is root:mosquitto 0640 (Mosquitto started
# as root switches to the `mosquitto` user; set MOSQUITTO_USER to change that name); run as another
# user, it is owned by that user, mode 0600 (for a broker running as the same user).
set -euo pipefail

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }

passwd_file=/etc/mosquitto/streamfed/passwd
while getopts "f:h" opt; do
  case $opt in
    f) passwd_file=$OPTARG ;;
    h) usage 0 ;;
    *) usage 2 >&2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || usage 2 >&2
command -v mosquitto_passwd >/dev/null || { echo "mosquitto_passwd not found (apt-get install mosquitto)" >&2; exit 1; }

# Same alphabet as streamfed.fleet.topics.name_problem: safe as topic level, user name and file name.
name_re='^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$'

umask 077
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
plain=$tmp/plain
: >"$plain"
names=()
for spec in "$@"; do
  user=${spec%%:*}
  [[ $user =~ $name_re ]] || { echo "invalid user name: '$user' (allowed: $name_re)" >&2; exit 2; }
  if [[ $spec == *:* ]]; then
    pass=${spec#*:}
  else
    pass=$(openssl rand -base64 24 | tr -d '/+=\n' | cut -c1-24)
    printf '%s %s\n' "$user" "$pass"
  fi
  [ -n "$pass" ] || { echo "empty password for $user" >&2; exit 2; }
  [[ $pass != *$'\n'* ]] || { echo "password of $user contains a newline" >&2; exit 2; }
  printf '%s:%s\n' "$user" "$pass" >>"$plain"
  names+=("$user")
done
mosquitto_passwd -U "$plain"

(umask 022; mkdir -p "$(dirname "$passwd_file")")
merged=$tmp/merged
if [ -f "$passwd_file" ]; then
  # keep every existing entry except the users being (re)defined
  printf '%s\n' "${names[@]}" >"$tmp/names"
  awk -F: 'NR == FNR { skip[$0] = 1; next } !($1 in skip)' "$tmp/names" "$passwd_file" >"$merged"
fi
cat "$plain" >>"$merged"

broker_user=${MOSQUITTO_USER:-mosquitto}
if [ "$(id -u)" = 0 ] && id "$broker_user" >/dev/null 2>&1; then
  install -m 0640 -o root -g "$(id -gn "$broker_user")" "$merged" "$passwd_file"
else
  install -m 0600 "$merged" "$passwd_file"
fi
echo "wrote $passwd_file (${#names[@]} user(s) set)" >&2
