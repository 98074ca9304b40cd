#!/usr/bin/env bash
# Run a SuperNode command; while the SuperLink refuses to activate it, start it again.
#
#   deploy/retry-activation.sh [--activation-wait SECONDS] [--retry-every SECONDS] [--stop-grace SECONDS]
#                              -- flower-supernode ARGS...
#
# Why: a SuperNode that crashed or was killed (a reboot, an update, `kill -9`) and starts again at
# once is refused ("Failed to activate SuperNode", Flower's exit code 305): the SuperLink still holds
# its previous session until that session's heartbeats expire, 2 heartbeat intervals of 30 s in
# Flower 1.42 (HEARTBEAT_PATIENCE x HEARTBEAT_DEFAULT_INTERVAL), so up to 60 s after the last
# heartbeat. Started again after that, it activates (with SuperNode authentication, under the same
# node id) and answers the round that lost it (the server waits for it: docs/deployment.md).
# Flower tells the node the same thing when its key was never registered, so the refusal is
# retried for --activation-wait seconds (default 90, longer than any session is held) after the
# first one, every --retry-every seconds (default 2);
# a refusal that outlasts that will not change by waiting: the script says so and exits 78
# (EX_CONFIG), the status that docs/deployment.md's systemd unit does not restart on.
# Watchdog: when the SuperLink answers one of the node's requests (a pull, a run or app fetch) with an
# HTTP error that Flower does not retry (a 500, e.g. from a SuperLink whose state database is busy),
# flower-supernode logs the error, deactivates the node and stops serving, but its process stays
# alive (its Runtime API thread runs on), so no supervisor would restart it. The script watches the
# output for that log line (an `ERROR` line that is the bare HTTP error of a `/v1/fleet/` request, not
# a handled "Failed to send/receive message"; Flower 1.42 logs e.g. `ERROR :     Server error '500
# Internal Server Error' for url 'https://HOST:PORT/v1/fleet/pull-messages'`), waits --stop-grace
# seconds (default 10), says so, stops the command (SIGTERM) and starts it again after --retry-every
# seconds; the node then activates again and answers from a next round. The grace lets Flower tell
# the SuperLink that the node is going (it does so right after logging the error): a node stopped
# before that is refused when it starts again, until the SuperLink lets its session expire (up to
# 60 s, the refusal retry below waits that out). tests/test_supernode_watchdog.py runs this against
# Flower's own SuperLink and SuperNode.
# The command's output (stdout and stderr) is copied to stdout. Every other exit is passed on
# unchanged (a supervisor such as systemd or Compose's `restart:` decides what to do with a crash). SIGTERM and SIGINT are passed to the
# command, so the script can be a container's PID 1.
set -uo pipefail

wait_s=90 every=2 grace=10
die() { echo "retry-activation.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in --|-h|--help) ;; -*) [ $# -ge 2 ] || die "$1 needs a value (see --help)" ;; esac
    case "$1" in
        --activation-wait) wait_s="$2"; shift 2 ;;
        --retry-every) every="$2"; shift 2 ;;
        --stop-grace) grace="$2"; shift 2 ;;
        --) shift; break ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
[ $# -gt 0 ] || die "no command given (after --)"
[[ "$wait_s" =~ ^[0-9]+$ ]] || die "--activation-wait must be a whole number of seconds"
[[ "$every" =~ ^[1-9][0-9]*$ ]] || die "--retry-every must be a positive whole number of seconds"
[[ "$grace" =~ ^[0-9]+$ ]] || die "--stop-grace must be a whole number of seconds"

refused="$(mktemp)" deactivated="$(mktemp)"
trap 'rm -f "$refused" "$deactivated"' EXIT
child=""
forward() { [ -n "$child" ] && kill -s "$1" "$child" 2>/dev/null; }
stopping=0
trap 'stopping=1; forward TERM' TERM INT  # INT too: a background command ignores SIGINT
# from watch(), --stop-grace seconds after Flower left the node offline (while that command runs)
trap '[ -s "$deactivated" ] && forward TERM' USR1

# Sleep $1 seconds; exit 143 if stopped meanwhile (a late timer signal from watch() does not end it).
pause() {
    sleep "$1" & local timer=$!
    while kill -0 "$timer" 2>/dev/null && [ "$stopping" = 0 ]; do wait "$timer"; done
    kill "$timer" 2>/dev/null
    [ "$stopping" = 0 ] || exit 143
}

# ----- watchdog: the line flower-supernode logs when an unretried HTTP error ends its connection
left_offline() {
    [[ "$1" == *ERROR* && "$1" != *"Failed to "* \
       && "$1" =~ (Server|Client)\ error\ \'[0-9]{3}[^\']*\'\ for\ url\ \'[^\']*/v1/fleet/ ]]
}
# -----

# Copy the command's output through unchanged, noting whether the SuperLink refused its activation
# and whether Flower left the node offline (then the script is told to stop the command, after the
# grace in which Flower deactivates the node at the SuperLink; the timer holds none of our output open).
watch() {
    local line
    while IFS= read -r line; do
        printf '%s\n' "$line"
        [[ "$line" == *"Failed to activate SuperNode"* ]] && echo refused > "$refused"
        if left_offline "$line" && [ ! -s "$deactivated" ]; then
            printf '%s\n' "$line" > "$deactivated"
            { sleep "$grace"; kill -s USR1 $$; } < /dev/null > /dev/null 2>&1 &
        fi
    done
}

first_refusal=""
while :; do
    : > "$refused"; : > "$deactivated"
    "$@" > >(watch) 2>&1 &
    child=$!
    status=0
    wait "$child" || status=$?
    while kill -0 "$child" 2>/dev/null; do  # `wait` returned early for a signal we passed on
        status=0; wait "$child" || status=$?
    done
    child=""
    [ "$stopping" = 1 ] && exit "$status"  # stopped by a supervisor (even within the grace): no restart
    if [ -s "$deactivated" ]; then
        echo "retry-activation.sh: the SuperLink answered this SuperNode with an error Flower does not retry, and Flower deactivated the node but left its process running (it would stay offline); stopped it, starting it again in ${every} s" >&2
        pause "$every"
        continue
    fi
    [ "$status" -eq 0 ] && exit 0
    # The refusal is printed just before the command exits; give the copy of its output a moment.
    for _ in $(seq 30); do [ -s "$refused" ] && break; sleep 0.1; done
    [ -s "$refused" ] || exit "$status"
    now=$(date +%s)
    [ -n "$first_refusal" ] || first_refusal=$now
    waited=$(( now - first_refusal ))
    if [ "$waited" -ge "$wait_s" ]; then
        echo "retry-activation.sh: the SuperLink still refuses to activate this SuperNode after ${waited} s of retries (--activation-wait ${wait_s}; a lost node's old session is held up to 60 s): its key is not registered (deploy/register-supernodes.sh) or the SuperLink refuses it for good; giving up" >&2
        exit 78
    fi
    echo "retry-activation.sh: the SuperLink refused to activate this SuperNode; it may still hold this node's previous session (kept up to 60 s after a node stops); retrying in ${every} s (giving up $(( wait_s - waited )) s from now)" >&2
    pause "$every"
done
