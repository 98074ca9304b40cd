#!/usr/bin/env bash
# Start a SuperNode of the fedsynth app on this host, against a (remote) SuperLink.
#
#   deploy/supernode.sh --superlink HOST:PORT --ca CA.crt --key NODE_KEY
#                       (--partition-id I --num-partitions N | --dataset-path DIR [--name NAME])
#                       [--data-dir DIR] [--cache-dir DIR] [--device auto|cpu|cuda|cuda:K]
#                       [--supernodes-per-host N] [--torch-threads K]
#                       [--port 9094] [--host 127.0.0.1] [--isolation subprocess|process]
#                       [--runtime-certs DIR --runtime-name NAME] [--superexec-secret FILE]
#                       [--activation-wait SECONDS] [--insecure] [-- extra flower-supernode flags]
#
# The node trusts only the federation's CA (--ca; a SuperLink certificate from any other CA is
# refused) and proves its identity with its private key (--key, from deploy/pki.sh node-key;
# its .pub must have been registered). --dataset-path names the site's own data (runs with
# partition = "node", docs/own-data.md): no partition ids are needed, --name labels the node in
# logs and results. Partition, data directory, cache directory and device go
# into --node-config, where the ClientApp reads them on every message. --port is the node's local
# Runtime API port (one per SuperNode on a host). With --isolation process, an executor
# (flower-superexec) started separately runs the ClientApps; --runtime-certs serves that API
# with TLS (DIR/NAME.crt, DIR/NAME.key, DIR/ca.crt).
# CPU threads: each ClientApp runs torch with K threads (node config torch-threads), by default
# this host's usable cores (nproc) divided by --supernodes-per-host N (how many SuperNodes you run
# on this host, default 1), at least 1: SuperNodes sharing a host then do not oversubscribe it.
# Runtime dependency installation stays off (flower-supernode's default): the host has the pinned
# dependencies installed, see deploy/README.md.
# --insecure (plain HTTP, no authentication) is for local experiments and must be asked for.
# A node started again right after a crash is refused while the SuperLink still holds its previous
# session (up to 60 s): flower-supernode runs under deploy/retry-activation.sh, which starts it again
# every 2 s for --activation-wait seconds (default 90) and then gives up (exit 78: the key is not
# registered). docs/deployment.md shows how to run this script as a service that restarts.
set -euo pipefail

superlink="" ca="" key="" pid="" num="" dataset_path="" name="" data_dir="" cache_dir="" device="" port="9094"
host="127.0.0.1" isolation="subprocess" runtime_certs="" runtime_name="" secret="" insecure=0 extra=()
per_host="1" threads="" activation_wait="90"
die() { echo "supernode.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in --insecure|--|-h|--help) ;; -*) [ $# -ge 2 ] || die "$1 needs a value (see --help)" ;; esac
    case "$1" in
        --superlink) superlink="$2"; shift 2 ;;
        --ca) ca="$2"; shift 2 ;;
        --key) key="$2"; shift 2 ;;
        --partition-id) pid="$2"; shift 2 ;;
        --num-partitions) num="$2"; shift 2 ;;
        --data-dir) data_dir="$2"; shift 2 ;;
        --dataset-path) dataset_path="$2"; shift 2 ;;
        --name) name="$2"; shift 2 ;;
        --cache-dir) cache_dir="$2"; shift 2 ;;
        --device) device="$2"; shift 2 ;;
        --supernodes-per-host) per_host="$2"; shift 2 ;;
        --torch-threads) threads="$2"; shift 2 ;;
        --port) port="$2"; shift 2 ;;
        --host) host="$2"; shift 2 ;;
        --isolation) isolation="$2"; shift 2 ;;
        --runtime-certs) runtime_certs="$2"; shift 2 ;;
        --runtime-name) runtime_name="$2"; shift 2 ;;
        --superexec-secret) secret="$2"; shift 2 ;;
        --activation-wait) activation_wait="$2"; shift 2 ;;
        --insecure) insecure=1; shift ;;
        --) shift; extra=("$@"); break ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done

[ -n "$superlink" ] || die "--superlink HOST:PORT is required"
if [ -n "$pid$num" ] || [ -z "$dataset_path" ]; then
    [[ "$pid" =~ ^[0-9]+$ && "$num" =~ ^[0-9]+$ ]] || die "--partition-id and --num-partitions must be integers (or give the site's own data with --dataset-path DIR)"
    [ "$pid" -lt "$num" ] || die "--partition-id $pid must be below --num-partitions $num"
fi
[[ "$activation_wait" =~ ^[0-9]+$ ]] || die "--activation-wait must be a whole number of seconds"
[[ "$per_host" =~ ^[1-9][0-9]*$ ]] || die "--supernodes-per-host must be a positive integer"
if [ -z "$threads" ]; then
    threads=$(( $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) / per_host )); [ "$threads" -ge 1 ] || threads=1
fi
[[ "$threads" =~ ^[1-9][0-9]*$ ]] || die "--torch-threads must be a positive integer"
node_config="torch-threads=$threads"
[ -n "$pid" ] && node_config="partition-id=$pid num-partitions=$num $node_config"
for pair in "dataset-path=$dataset_path" "name=$name" "data-dir=$data_dir" "cache-dir=$cache_dir" "device=$device"; do
    value="${pair#*=}"
    [ -z "$value" ] && continue
    [[ "$value" =~ [\"[:space:]] ]] && die "${pair%%=*} '$value' must not contain spaces or quotes"
    node_config+=" ${pair%%=*}=\"$value\""
done

args=(--superlink "$superlink" --node-config "$node_config" --host "$host" --port "$port"
      --isolation "$isolation")
[ -n "$secret" ] && args+=(--superexec-auth-secret-file "$secret")
if [ -n "$runtime_certs" ]; then
    [ -n "$runtime_name" ] || die "--runtime-certs needs --runtime-name (the certificate's name)"
    args+=(--ssl-ca-certfile "$runtime_certs/ca.crt" --ssl-certfile "$runtime_certs/$runtime_name.crt"
           --ssl-keyfile "$runtime_certs/$runtime_name.key")
fi
if [ "$insecure" = 1 ]; then
    echo "supernode.sh: WARNING: --insecure: no TLS and no SuperNode authentication" >&2
    args+=(--insecure)
else
    [ -f "$ca" ] || die "--ca must name the federation's CA certificate (ca.crt), or pass --insecure"
    [ -f "$key" ] || die "--key must name this node's private key (deploy/pki.sh node-key)"
    args+=(--root-certificates "$ca" --auth-supernode-private-key "$key")
fi
# --- warm ClientApp processes (fedsynth/warm_clientapp, docs/deployment.md) -------------------------
# On by default: deploy/warm-clientapp goes first on PATH, so the ClientApp tasks that Flower starts by
# name (`flwr-clientapp`) are forked from a warm process that has torch and Flower imported already; that
# process starts with the node, when the SuperNode starts its SuperExec (`flower-superexec`, also by name).
# FEDSYNTH_WARM_CLIENTAPP=0 turns it off (every task a new process, as plain Flower does). With
# --isolation process, start the separate flower-superexec with this PATH (and switch) instead.
warm_clientapp="${FEDSYNTH_WARM_CLIENTAPP:-1}"
if [[ ! "${warm_clientapp,,}" =~ ^(0|false|no|off)$ ]]; then
    export PATH="$(cd "$(dirname "$0")" && pwd)/warm-clientapp:$PATH"
    echo "supernode.sh: warm ClientApp processes on (FEDSYNTH_WARM_CLIENTAPP=0 turns them off)"
fi
# --- end of warm ClientApp processes ---------------------------------------------------------------
# Flower's SuperNode runs under deploy/retry-activation.sh, which runs it under deploy/supernode-records.py (Flower's
# records) and deploy/supernode-waits.py (adaptive waits; FEDSYNTH_ADAPTIVE_WAITS=0: Flower's own)
node=(flower-supernode)
echo "supernode.sh: node config: $node_config"
exec "$(dirname "$0")/retry-activation.sh" --activation-wait "$activation_wait" -- \
    "${node[@]}" "${args[@]}" "${extra[@]}"
