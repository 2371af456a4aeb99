#!/usr/bin/env bash
# A respcoord cluster on this machine, in one command: three nats-server
# nodes (the pinned release from scripts/nats-server.sh, JetStream, routed
# to one another, loopback only) and two respcoord replicas on the nats
# backend sharing one three-replica bucket. Prints how to reach them;
# Ctrl-C stops everything.
#
#   scripts/dev-cluster.sh            keep the NATS stores of the last run
#   scripts/dev-cluster.sh --fresh    start from empty stores
#
# Everything lives under target/dev-cluster/: each node's configuration,
# store, log and pid file, and each replica's log. The nodes run with
# `sync_interval: always` like deploy/kubernetes/nats-cluster.
#
# Environment:
#   RESPCOORD_DEV_PROFILE       release (default) or debug: which build of
#                               respcoord runs (a release build from scratch
#                               takes a while; debug builds faster)
#   RESPCOORD_DEV_GRPC_PORT     first replica's gRPC port (default 50051; the
#                               second gets the next one)
#   RESPCOORD_DEV_METRICS_PORT  first replica's metrics port (default 9464)
#   RESPCOORD_DEV_NATS_PORT     first node's client port (default 24222;
#                               routes on +2000, monitoring on +4000)
#   NATS_SERVER_VERSION         nats-server release (default 2.14.6)
set -euo pipefail
cd "$(dirname "$0")/.."

fresh=0
case "${1:-}" in
  "") ;;
  --fresh) fresh=1 ;;
  -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "usage: scripts/dev-cluster.sh [--fresh]" >&2; exit 2 ;;
esac

profile=${RESPCOORD_DEV_PROFILE:-release}
grpc_port=${RESPCOORD_DEV_GRPC_PORT:-50051}
metrics_port=${RESPCOORD_DEV_METRICS_PORT:-9464}
nats_port=${RESPCOORD_DEV_NATS_PORT:-24222}
version=${NATS_SERVER_VERSION:-2.14.6}
dir=target/dev-cluster
nodes=(1 2 3)
replicas=(1 2)

case $profile in
  release) build=(cargo build --release --bin respcoord) ;;
  debug) build=(cargo build --bin respcoord) ;;
  *) echo "RESPCOORD_DEV_PROFILE must be release or debug, not $profile" >&2; exit 2 ;;
esac

client_port() { echo $((nats_port + $1 - 1)); }
route_port() { echo $((nats_port + 2000 + $1 - 1)); }
monitor_port() { echo $((nats_port + 4000 + $1 - 1)); }
replica_grpc() { echo $((grpc_port + $1 - 1)); }
replica_metrics() { echo $((metrics_port + $1 - 1)); }

in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# An HTTP GET on loopback answering 200 (python3: scripts/nats-server.sh
# needs it anyway, curl may be missing).
http_ok() {
  python3 - "$1" <<'PY'
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=1) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception:
    sys.exit(1)
PY
}

# --- stop everything on Ctrl-C, on a failure, or when a process dies ---
pids=()
names=()
stopping=0
stop_all() {
  [ $stopping = 1 ] && return
  stopping=1
  trap - INT TERM
  echo
  echo "dev-cluster: stopping"
  # Replicas first (SIGTERM: they drain, up to their 10 s shutdown grace),
  # then the NATS nodes.
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[$i]}" 2>/dev/null || true
    for _ in $(seq 150); do kill -0 "${pids[$i]}" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "${pids[$i]}" 2>/dev/null || true
    wait "${pids[$i]}" 2>/dev/null || true
  done
  echo "dev-cluster: stopped (stores and logs kept in $dir/)"
}
trap 'stop_all; exit 130' INT
trap 'stop_all; exit 143' TERM
trap 'stop_all' EXIT

started() { pids+=("$1"); names+=("$2"); }

# Fails with the tail of a log if a process died while we waited for it.
alive_or_die() {
  local pid=$1 name=$2 log=$3
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "dev-cluster: $name exited; the end of $log:" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
}

# --- preflight ---
busy=()
for n in "${nodes[@]}"; do
  for port in "$(client_port "$n")" "$(route_port "$n")" "$(monitor_port "$n")"; do
    in_use "$port" && busy+=("$port")
  done
done
for r in "${replicas[@]}"; do
  for port in "$(replica_grpc "$r")" "$(replica_metrics "$r")"; do
    in_use "$port" && busy+=("$port")
  done
done
if [ ${#busy[@]} -gt 0 ]; then
  echo "dev-cluster: port(s) ${busy[*]} already in use on 127.0.0.1 (another dev cluster?);" \
    "pick others with RESPCOORD_DEV_GRPC_PORT, RESPCOORD_DEV_METRICS_PORT, RESPCOORD_DEV_NATS_PORT" >&2
  exit 1
fi

echo "dev-cluster: building respcoord ($profile): ${build[*]}"
"${build[@]}"
respcoord="${CARGO_TARGET_DIR:-target}/$profile/respcoord"
nats_server=$(scripts/nats-server.sh "$version")

mkdir -p "$dir"
if [ $fresh = 1 ]; then
  rm -rf "${dir:?}"/node* "$dir"/respcoord-*.log
fi

# --- three NATS nodes ---
routes=""
urls=""
for n in "${nodes[@]}"; do
  routes+="${routes:+, }nats://127.0.0.1:$(route_port "$n")"
  urls+="${urls:+,}nats://127.0.0.1:$(client_port "$n")"
done
for n in "${nodes[@]}"; do
  conf="$dir/node$n.conf"
  cat >"$conf" <<EOF
# Written by scripts/dev-cluster.sh: node $n of a loopback dev cluster.
server_name: node$n
listen: 127.0.0.1:$(client_port "$n")
http: 127.0.0.1:$(monitor_port "$n")
pid_file: "$PWD/$dir/node$n.pid"
cluster {
  name: respcoord-dev
  listen: 127.0.0.1:$(route_port "$n")
  routes: [$routes]
  no_advertise: true
}
jetstream {
  store_dir: "$PWD/$dir/node$n"
  max_file_store: 1G
  max_memory_store: 64M
  # As in deploy/kubernetes/nats-cluster/nats-server.conf: fsync before
  # acknowledging.
  sync_interval: always
}
EOF
  if ! out=$("$nats_server" -t -c "$conf" 2>&1); then
    echo "dev-cluster: $out" >&2
    exit 1
  fi
  "$nats_server" -c "$conf" -l "$dir/node$n.log" </dev/null >/dev/null 2>&1 &
  started $! "nats node$n"
done

echo "dev-cluster: waiting for the NATS cluster (JetStream meta leader)"
for _ in $(seq 300); do
  ready=1
  for n in "${nodes[@]}"; do
    alive_or_die "${pids[$((n - 1))]}" "nats node$n" "$dir/node$n.log"
    http_ok "http://127.0.0.1:$(monitor_port "$n")/healthz" || ready=0
  done
  [ $ready = 1 ] && break
  sleep 0.2
done
if [ "$ready" != 1 ]; then
  echo "dev-cluster: the NATS cluster did not become healthy in 60 s; see $dir/node*.log" >&2
  exit 1
fi

# --- two respcoord replicas, one after the other (the first creates the
# bucket) ---
for r in "${replicas[@]}"; do
  log="$dir/respcoord-$r.log"
  "$respcoord" serve --backend nats --nats-url "$urls" --nats-replicas 3 --nats-max-age 2h \
    --listen "127.0.0.1:$(replica_grpc "$r")" --metrics-listen "127.0.0.1:$(replica_metrics "$r")" \
    </dev/null >"$log" 2>&1 &
  started $! "respcoord replica $r"
  for _ in $(seq 600); do
    alive_or_die "${pids[-1]}" "respcoord replica $r" "$log"
    http_ok "http://127.0.0.1:$(replica_metrics "$r")/readyz" && break
    sleep 0.1
  done
  if ! http_ok "http://127.0.0.1:$(replica_metrics "$r")/readyz"; then
    echo "dev-cluster: respcoord replica $r was not ready in 60 s; see $log" >&2
    exit 1
  fi
done

g1=$(replica_grpc 1)
g2=$(replica_grpc 2)
cat <<EOF

respcoord dev cluster is up: nats-server $version x3 (JetStream, R3 bucket "respcoord", fsync always),
respcoord ($profile build) x2 on the nats backend.

  replica 1  gRPC 127.0.0.1:$g1   metrics http://127.0.0.1:$(replica_metrics 1)/metrics  (/readyz, /healthz)   log $dir/respcoord-1.log
  replica 2  gRPC 127.0.0.1:$g2   metrics http://127.0.0.1:$(replica_metrics 2)/metrics  (/readyz, /healthz)   log $dir/respcoord-2.log
  NATS       $urls
             monitoring http://127.0.0.1:$(monitor_port 1)/jsz (and $(monitor_port 2), $(monitor_port 3)); logs $dir/node*.log

Try it (grpcurl; the server offers reflection): start on one replica, read on the other
  grpcurl -plaintext -d '{"session_id":"call-42","source":"SOURCE_CLIENT"}' 127.0.0.1:$g1 respcoord.v1.ResponseCoordinator/Start
  grpcurl -plaintext -d '{"session_id":"call-42"}' 127.0.0.1:$g2 respcoord.v1.ResponseCoordinator/GetState
  grpcurl -plaintext -d '{"session_id":"call-42","after_revision":0}' 127.0.0.1:$g2 respcoord.v1.ResponseCoordinator/Watch
  curl -s http://127.0.0.1:$(replica_metrics 2)/readyz

Kill a NATS node (kill \$(cat $dir/node1.pid)) and watch the replicas carry on;
start it again with: $nats_server -c $dir/node1.conf -l $dir/node1.log &
Ctrl-C stops everything this script started.
EOF

# Until Ctrl-C. A process that dies (or that you kill to see the rest
# carry on) is reported once; when none is left, the script ends.
reported=()
while true; do
  left=0
  for i in "${!pids[@]}"; do
    if kill -0 "${pids[$i]}" 2>/dev/null; then
      left=$((left + 1))
    elif [ -z "${reported[$i]:-}" ]; then
      reported[i]=1
      echo "dev-cluster: ${names[$i]} (pid ${pids[$i]}) exited" >&2
    fi
  done
  [ $left = 0 ] && exit 1
  sleep 1
done
