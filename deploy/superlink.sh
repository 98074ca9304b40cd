#!/usr/bin/env bash
# Start a SuperLink with TLS and SuperNode authentication (the default), for the fedsynth app.
#
#   deploy/superlink.sh --certs DIR [--name superlink] [--host 0.0.0.0] [--port 8000]
#                       [--database PATH [--busy-timeout SECONDS] [--busy-limit SECONDS]]
#                       [--isolation subprocess|process]
#                       [--superexec-secret FILE] [--stop-timeout SECONDS] [--insecure]
#                       [-- extra flower-superlink flags]
#
# --certs DIR holds ca.crt and NAME.crt/NAME.key (deploy/pki.sh); NAME.crt's subjectAltName must
# list the addresses SuperNodes and the `flwr` CLI dial. Only SuperNodes whose public key was
# registered (deploy/register-supernodes.sh) are accepted. The state database (runs, registered
# keys) persists across restarts when --database is a file; its directory is created if missing.
# In a file, every reply's arrays pass through SQLite, whose connections Flower lets wait only 5 s
# for the write lock: large replies (~45 MB, resnet18) from several sites on a loaded host then fail
# with `database is locked` (HTTP 500, not retried by the SuperNodes). With a file, the SuperLink
# therefore runs under deploy/superlink-state.py, which sets that wait to --busy-timeout seconds
# (default 60; 5 runs Flower's own flower-superlink unchanged). A request that still finds the database
# busy is answered 503 (retried by the nodes) for at most --busy-limit seconds of busy answers with no
# write through (default 60); then the SuperLink logs an error naming the database and answers 500, as
# Flower does, so the retries end.
#
# Runtime dependency installation is disabled: by default a SuperLink runs `uv sync` for every run
# and installs the app's dependencies into a fresh environment (torch with CUDA wheels, ~5 GB and
# minutes per run). Our hosts and images already have the pinned dependencies of pyproject.toml,
# so runs start in seconds and use exactly the tested versions.
#
# --insecure (plain HTTP, no SuperNode authentication, any SuperNode may join) exists for local
# experiments only and must be asked for explicitly.
#
# Stopping: SIGTERM (or SIGINT) is passed on to the SuperLink. Flower's SuperLink then stops its servers
# and waits for its background threads, which last until every `flwr run --stream` client has
# disconnected (54 s with one attached). So the stop is bounded: after --stop-timeout seconds (default
# 20) the SuperLink and its process group are killed (SIGKILL; its SQLite state stays consistent).
# Either way this script exits only once the SuperLink is gone, so a restart never finds the old one
# still holding the port and the state database. It says what it waits for, and whether it had to kill.
set -euo pipefail

certs="" name="superlink" host="0.0.0.0" port="8000" database="" isolation="subprocess"
secret="" insecure=0 extra=() busy_timeout="60" busy_limit="60" stop_timeout="20"
die() { echo "superlink.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in --insecure|--|-h|--help) ;; -*) [ $# -ge 2 ] || die "$1 needs a value (see --help)" ;; esac
    case "$1" in
        --certs) certs="$2"; shift 2 ;;
        --name) name="$2"; shift 2 ;;
        --host) host="$2"; shift 2 ;;
        --port) port="$2"; shift 2 ;;
        --database) database="$2"; shift 2 ;;
        --busy-timeout) busy_timeout="$2"; shift 2 ;;
        --busy-limit) busy_limit="$2"; shift 2 ;;
        --stop-timeout) stop_timeout="$2"; shift 2 ;;
        --isolation) isolation="$2"; shift 2 ;;
        --superexec-secret) secret="$2"; shift 2 ;;
        --insecure) insecure=1; shift ;;
        --) shift; extra=("$@"); break ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done

[[ "$busy_timeout" =~ ^[1-9][0-9]*$ ]] || die "--busy-timeout must be a positive whole number of seconds"
[[ "$busy_limit" =~ ^[1-9][0-9]*$ ]] || die "--busy-limit must be a positive whole number of seconds"
[[ "$stop_timeout" =~ ^[1-9][0-9]{0,4}$ ]] || die "--stop-timeout must be a positive whole number of seconds"
if [ -n "$database" ] && [ "$database" != ":memory:" ]; then
    dir="$(dirname -- "$database")"
    mkdir -p -- "$dir" 2>/dev/null || die "cannot create the database directory $dir (for --database $database)"
    [ -w "$dir" ] || die "the database directory $dir is not writable (for --database $database)"
fi

args=(--host "$host" --port "$port" --isolation "$isolation" --disable-runtime-dependency-installation)
[ -n "$database" ] && args+=(--database "$database")
[ -n "$secret" ] && args+=(--superexec-auth-secret-file "$secret")
if [ "$insecure" = 1 ]; then
    echo "superlink.sh: WARNING: --insecure: no TLS and no SuperNode authentication" >&2
    args+=(--insecure)
else
    [ -n "$certs" ] || die "--certs DIR is required (create it with deploy/pki.sh), or pass --insecure"
    for file in ca.crt "$name.crt" "$name.key"; do
        [ -f "$certs/$file" ] || die "missing $certs/$file (create it with deploy/pki.sh)"
    done
    args+=(--ssl-ca-certfile "$certs/ca.crt" --ssl-certfile "$certs/$name.crt"
           --ssl-keyfile "$certs/$name.key" --enable-supernode-auth)
    # In subprocess isolation the SuperLink's own executor dials it at --host, with 0.0.0.0
    # replaced by 127.0.0.1: the certificate has to name that address too, or no run starts.
    own="$host"; [ "$own" = "0.0.0.0" ] && own="127.0.0.1"
    if [ "$isolation" = subprocess ] && command -v openssl >/dev/null \
        && ! openssl x509 -in "$certs/$name.crt" -noout -ext subjectAltName 2>/dev/null \
            | grep -Eq "(IP Address|DNS):$own(,|\$)"; then
        die "$certs/$name.crt does not list $own in its subjectAltName, which the SuperLink's own executor dials (add IP:$own with deploy/pki.sh server)"
    fi
fi
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1

# Run the SuperLink as a child in its own process group; a stop signal is passed on and bounded (header).
run_bounded() {
    child=""
    trap 'stop_child TERM 143' TERM  # before the SuperLink starts: a stop that comes at once is passed on too
    trap 'stop_child INT 130' INT
    set -m
    "$@" &
    child=$!
    set +m
    status=0
    wait "$child" || status=$?
    exit "$status"
}
stop_child() {  # signal name, exit status
    trap '' TERM INT
    child="${child:-$!}"  # (a stop between the start and `child=$!`)
    [ -n "$child" ] || exit "$2"  # stopped before the SuperLink started
    echo "superlink.sh: SIG$1: stopping flower-superlink (pid $child); it waits until every \`flwr run --stream\` has disconnected, at most --stop-timeout = $stop_timeout s" >&2
    kill -"$1" "$child" 2>/dev/null || true
    # the bound: a timer that kills the SuperLink's process group (its output detached from ours)
    ( trap 'kill "$timer" 2>/dev/null; exit 0' TERM; sleep "$stop_timeout" & timer=$!; wait "$timer"
      kill -KILL -- "-$child" ) </dev/null >/dev/null 2>&1 &
    killer=$!
    status=0
    wait "$child" 2>/dev/null || status=$?  # (bash's own "Killed" job line left out: the line below says it)
    kill "$killer" 2>/dev/null || true
    if [ "$status" = 137 ]; then
        echo "superlink.sh: flower-superlink still running after $stop_timeout s: killed it and its process group (SIGKILL)" >&2
    else
        echo "superlink.sh: flower-superlink stopped (exit $status)" >&2
    fi
    exit "$2"
}
if [ -n "$database" ] && [[ "$database" != ":memory:" && "$database" != ":flwr-in-memory:" ]] \
    && [ "$busy_timeout" != 5 ]; then
    # the Python that runs flower-superlink (its shebang): the one with Flower installed
    flower="$(command -v flower-superlink)" || die "flower-superlink is not on PATH (install deploy/requirements.txt)"
    python="$(head -n 1 "$flower" | sed -n 's|^#! *||p')"
    [[ -n "$python" && "$python" != */sh && "$python" != */bash ]] || python=python3
    run_bounded $python "$(dirname "$0")/superlink-state.py" --busy-timeout-ms "$(( busy_timeout * 1000 ))" \
        --busy-limit "$busy_limit" -- \
        flower-superlink "${args[@]}" "${extra[@]}"
fi
run_bounded flower-superlink "${args[@]}" "${extra[@]}"
