#!/usr/bin/env bash
# Run a SuperNode command; while the SuperLink refuses to activate it, start it again; when Flower leaves
# it offline with its process alive, restart it (bounded, with back-off).
#
#   deploy/retry-activation.sh [--activation-wait SECONDS] [--retry-every SECONDS] [--stop-grace SECONDS]
#                              [--max-restarts N] [--max-backoff SECONDS] [--stable-after SECONDS]
#                              -- flower-supernode ARGS...
#
# What it reads: only Flower's own records, never the node's output. Flower passes its ClientApp tasks'
# stdout and stderr through to the SuperNode's own (the SuperExec and every task inherit them) and marks
# neither, so a ClientApp can print any line Flower prints. When the command is `flower-supernode` (a
# Python console script), it runs under deploy/supernode-records.py, which writes the records of Flower's
# logger that the script acts on to a file descriptor of their own (fd 3; no child process holds it).
# Any other command runs as given, without records: the script then only passes its exit on. The
# command's stdout and stderr go to this script's, untouched.
#
# Refused activation: a SuperNode that crashed or was killed (a reboot, an update, `kill -9`) and starts
# again at once is refused ("Failed to activate SuperNode", Flower's exit code 305): the SuperLink still
# holds its previous session until that session's heartbeats expire, 2 heartbeat intervals of 30 s in
# Flower 1.42 (HEARTBEAT_PATIENCE x HEARTBEAT_DEFAULT_INTERVAL), so up to 60 s after the last
# heartbeat. Started again after that, it activates (with SuperNode authentication, under the same
# node id) and answers the round that lost it (the server waits for it: docs/deployment.md).
# Flower tells the node the same thing when its key was never registered, so the refusal is
# retried for --activation-wait seconds (default 90, longer than any session is held) after the
# first one, every --retry-every seconds (default 2), one line each saying so; a refusal that
# outlasts that will not change by waiting: the script says so and exits 78 (EX_CONFIG).
# Left offline: when the SuperLink answers one of the node's requests (a pull, a run or app fetch) with
# an HTTP error that Flower does not retry (a 500, e.g. from a SuperLink whose state database is busy),
# flower-supernode logs the error (its record: the HTTP error of a `/v1/fleet/` request), deactivates
# the node and stops serving, but its process stays alive (its Runtime API thread runs on), so no
# supervisor would restart it. The script waits --stop-grace seconds (default 10), stops the command
# (SIGTERM), says why (the status and request of Flower's record) and starts it again; the node then
# activates again and answers from a next round. The grace lets Flower tell the SuperLink that the node
# is going (it does so right after logging the error): a node stopped before that is refused when it
# starts again, until the SuperLink lets its session expire. These restarts back off: the first after
# --retry-every seconds, each next one after twice the last, at most --max-backoff (default 60); a node
# that ran --stable-after seconds (default 600) before Flower left it offline starts a new count. After
# --max-restarts such restarts in a row (default 10) the script exits 75 (EX_TEMPFAIL) with a line saying
# so, for its supervisor to start it again later. tests/test_supernode_watchdog.py runs this against
# Flower's own SuperLink and SuperNode.
#
# Exit status: 0 the node ended by itself with 0; 2 a wrong option of this script (a restart does not
# help); 75 it gave up restarting a node that Flower kept leaving offline (try again: supervisors restart
# it); 78 the SuperLink refused the node's activation for --activation-wait seconds (its key is not
# registered: a restart does not help); 128+N stopped by signal N (SIGTERM: 143), as its supervisor
# asked; anything else is the node's own status, passed on (e.g. 1 after Flower's "Exit Code: 3xx" for a
# SuperLink it cannot reach: try again). SIGTERM and SIGINT are passed to the command, so the script can
# be a container's PID 1.
set -uo pipefail

wait_s=90 every=2 grace=10 max_restarts=10 max_backoff=60 stable_after=600
here="$(cd "$(dirname "$0")" && pwd)"
die() { echo "retry-activation.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in --|-h|--help) ;; -*) [ $# -ge 2 ] || die "$1 needs a value (see --help)" ;; esac
    case "$1" in
        --activation-wait) wait_s="$2"; shift 2 ;;
        --retry-every) every="$2"; shift 2 ;;
        --stop-grace) grace="$2"; shift 2 ;;
        --max-restarts) max_restarts="$2"; shift 2 ;;
        --max-backoff) max_backoff="$2"; shift 2 ;;
        --stable-after) stable_after="$2"; shift 2 ;;
        --) shift; break ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done
[ $# -gt 0 ] || die "no command given (after --)"
[[ "$wait_s" =~ ^[0-9]+$ ]] || die "--activation-wait must be a whole number of seconds"
[[ "$every" =~ ^[1-9][0-9]*$ ]] || die "--retry-every must be a positive whole number of seconds"
[[ "$grace" =~ ^[0-9]+$ ]] || die "--stop-grace must be a whole number of seconds"
[[ "$max_restarts" =~ ^[0-9]+$ ]] || die "--max-restarts must be a whole number"
[[ "$max_backoff" =~ ^[1-9][0-9]*$ ]] || die "--max-backoff must be a positive whole number of seconds"
[[ "$stable_after" =~ ^[0-9]+$ ]] || die "--stable-after must be a whole number of seconds"

# The Python that runs console script $1: its shebang, or pip's form for long paths
# (#!/bin/sh, then '''exec' "/path/python" "$0" "$@"); fails for anything else.
python_of() {
    local first="" second="" quote="'''exec' \""
    { IFS= read -r first; IFS= read -r second; } < "$1" 2>/dev/null
    if [[ "$first" == "#!/bin/sh"* && "$second" == "$quote"* ]]; then
        second="${second#"$quote"}"
        printf '%s\n' "${second%%\"*}"
        return 0
    fi
    [[ "$first" == "#!"*python* ]] || return 1
    printf '%s\n' "${first#\#!}"
}

# The command as it runs: flower-supernode under deploy/supernode-records.py (Flower's records on fd 3).
command=("$@")
if [ "$(basename -- "$1")" = flower-supernode ]; then
    script="$(command -v -- "$1")" || die "$1 is not on PATH"
    if python="$(python_of "$script")"; then
        read -ra interpreter <<< "$python"
        # and under deploy/supernode-waits.py (adaptive waits; FEDSYNTH_ADAPTIVE_WAITS=0 or another Flower: Flower's
        # own), which runs the script in the same process, so Flower's records still reach supernode-records.py
        command=("${interpreter[@]}" "$here/supernode-records.py" --records-fd 3 -- \
                 "$here/supernode-waits.py" -- "$script" "${@:2}")
    else
        echo "retry-activation.sh: $script is not a Python console script, so Flower's records cannot be read from it: no restarts, its exit is passed on" >&2
    fi
fi

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

# Flower's records (deploy/supernode-records.py): note a refused activation; when Flower left the node
# offline, have this script told to stop the command --stop-grace seconds later (the grace in which Flower
# deactivates the node at the SuperLink; the timer holds no record pipe open).
watch() {
    local kind rest
    while read -r kind rest; do
        case "$kind" in
            refused) printf '%s\n' "$rest" > "$refused" ;;
            deactivated)
                if [ ! -s "$deactivated" ]; then
                    printf '%s\n' "$rest" > "$deactivated"
                    { sleep "$grace"; kill -s USR1 $$; } < /dev/null > /dev/null 2>&1 &
                fi ;;
        esac
    done
}

first_refusal="" restarts=0
while :; do
    : > "$refused"; : > "$deactivated"
    started_at=$(date +%s)
    "${command[@]}" 3> >(watch) &
    child=$!
    status=0
    wait "$child" || status=$?
    while kill -0 "$child" 2>/dev/null; do  # `wait` returned early for a signal we passed on
        status=0; wait "$child" || status=$?
    done
    child=""
    [ "$stopping" = 1 ] && exit "$status"  # stopped by a supervisor (even within the grace): no restart
    if [ -s "$deactivated" ]; then
        read -r http_status request < "$deactivated"
        [ $(( $(date +%s) - started_at )) -ge "$stable_after" ] && restarts=0  # it ran well: a new count
        restarts=$(( restarts + 1 ))
        if [ "$restarts" -gt "$max_restarts" ]; then
            echo "retry-activation.sh: Flower left this SuperNode offline again (HTTP $http_status for $request, an error Flower does not retry) after $max_restarts restarts in a row, each within ${stable_after} s of its start (--max-restarts, --stable-after); giving up with exit 75 for the supervisor to start it again later" >&2
            exit 75
        fi
        delay=$every
        for _ in $(seq 2 "$restarts"); do delay=$(( delay * 2 )); [ "$delay" -ge "$max_backoff" ] && break; done
        [ "$delay" -gt "$max_backoff" ] && delay=$max_backoff
        echo "retry-activation.sh: the SuperLink answered this SuperNode with an error Flower does not retry, and Flower deactivated the node but left its process running (Flower's record: HTTP $http_status for $request; it would stay offline); stopped it, starting it again in ${delay} s (restart $restarts of at most $max_restarts in a row)" >&2
        pause "$delay"
        continue
    fi
    [ "$status" -eq 0 ] && exit 0
    # Flower's refusal record is written just before the command exits; give the record reader a moment.
    for _ in $(seq 30); do [ -s "$refused" ] && break; sleep 0.1; done
    [ -s "$refused" ] || exit "$status"
    now=$(date +%s)
    [ -n "$first_refusal" ] || first_refusal=$now
    waited=$(( now - first_refusal ))
    if [ "$waited" -ge "$wait_s" ]; then
        echo "retry-activation.sh: the SuperLink still refuses to activate this SuperNode after ${waited} s of retries (--activation-wait ${wait_s}; a lost node's old session is held up to 60 s): its key is not registered (deploy/register-supernodes.sh) or the SuperLink refuses it for good; giving up" >&2
        exit 78
    fi
    echo "retry-activation.sh: the SuperLink refused to activate this SuperNode (Flower's exit code $(cat "$refused")); it may still hold this node's previous session (kept up to 60 s after a node stops); retrying in ${every} s (giving up $(( wait_s - waited )) s from now)" >&2
    pause "$every"
done
