#!/usr/bin/env bash
# Register SuperNode public keys with a SuperLink that runs with --enable-supernode-auth.
#
#   deploy/register-supernodes.sh CONNECTION KEY.pub...
#
# CONNECTION is a `flwr` connection to the SuperLink (deploy/connection.sh). Each key is registered
# under its file name without .pub (node-0.pub -> node-0). A SuperNode whose key is not registered
# is refused by the SuperLink (flower-supernode exits with code 305). Keys that are already
# registered are reported and skipped, so re-running is safe. A SuperLink that was just started
# may take a while to answer (it opens its port before it serves, longer on a loaded host): while
# `flwr` says the connection is unavailable, the script tries again every 2 s for up to
# REGISTER_WAIT_S seconds (default 120), saying so once.
set -euo pipefail

die() { echo "register-supernodes.sh: $*" >&2; exit 2; }
[ $# -ge 2 ] || die "usage: register-supernodes.sh CONNECTION KEY.pub..."
connection="$1"; shift
wait_s="${REGISTER_WAIT_S:-120}"
[[ "$wait_s" =~ ^[0-9]+$ ]] || die "REGISTER_WAIT_S must be a whole number of seconds"
register() {  # flwr's answer for one key, retried while the SuperLink does not answer yet
    local pub="$1" name="$2" deadline=$((SECONDS + wait_s)) said=""
    while :; do
        if output="$(flwr supernode register "$pub" "$connection" --name "$name" 2>&1)"; then
            return 0
        fi
        grep -qi "connection to the superlink is unavailable" <<<"$output" && [ "$SECONDS" -lt "$deadline" ] || return 1
        [ -n "$said" ] || echo "register-supernodes.sh: the SuperLink of '$connection' does not answer yet; trying again for up to ${wait_s} s" >&2
        said=1
        sleep 2
    done
}
for pub in "$@"; do
    [ -f "$pub" ] || die "public key '$pub' not found"
    name="$(basename "$pub" .pub)"
    if register "$pub" "$name"; then
        echo "register-supernodes.sh: registered $name"
    elif grep -qi "already" <<<"$output"; then
        echo "register-supernodes.sh: $name was already registered"
    else
        echo "$output" >&2
        die "registering $pub with '$connection' failed"
    fi
done
