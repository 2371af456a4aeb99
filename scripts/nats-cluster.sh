#!/usr/bin/env bash
# A three-node nats-server cluster with JetStream on loopback, for the test
# command's replicated suites and for trying respcoord out:
#
#   scripts/nats-cluster.sh start VERSION [NAME]   prints the seed URL list
#   scripts/nats-cluster.sh stop NAME
#
# VERSION is a nats-server release (installed by scripts/nats-server.sh);
# NAME (default: the version) names the cluster's directory,
# target/nats-cluster/NAME/, which holds each node's store, log and pid.
# Ports are picked free. `start` returns once every node reports a
# JetStream meta leader and the leader reports both peers current, so an R3
# bucket can be created at once.
# RESPCOORD_NATS_CLUSTER_CONFIG names a nats-server config file every node
# also loads (e.g. `jetstream { sync_interval: always }`); the flags here
# take precedence over it.
set -euo pipefail
cd "$(dirname "$0")/.."

stop() {
  local dir=$1 pid
  for pidfile in "$dir"/*.pid; do
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pidfile"
  done
}

free_ports() {
  python3 - "$1" <<'PY'
import socket, sys
held = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    held.append(s)
print(" ".join(str(s.getsockname()[1]) for s in held))
PY
}

# Whether JetStream's meta group is whole: every node (monitoring ports as
# arguments) names a meta leader, and the leader reports both other nodes
# as current peers. A leader alone is not enough: an R3 stream created
# before its peers are current is refused with "no suitable peers for
# placement" (10005), seen on 2.10.26.
meta_ready() {
  python3 - "$@" <<'PY'
import json, sys, urllib.request
whole = False
for port in sys.argv[1:]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/jsz", timeout=1) as r:
            meta = json.load(r).get("meta_cluster", {})
    except Exception:
        sys.exit(1)
    if not meta.get("leader"):
        sys.exit(1)
    peers = meta.get("replicas") or []
    if len(peers) == len(sys.argv) - 2 and all(p.get("current") for p in peers):
        whole = True
sys.exit(0 if whole else 1)
PY
}

command=${1:?usage: scripts/nats-cluster.sh start VERSION [NAME] | stop NAME}
case $command in
stop)
  stop "target/nats-cluster/${2:?usage: scripts/nats-cluster.sh stop NAME}"
  ;;
start)
  version=${2:?usage: scripts/nats-cluster.sh start VERSION [NAME]}
  name=${3:-$version}
  binary=$(scripts/nats-server.sh "$version")
  dir=target/nats-cluster/$name
  # A fresh cluster sometimes never reports both peers current (seen once
  # on 2.10.26: a leader within a second, then the routes flapping as
  # "Duplicate Route" and no peer current for a minute). That is the
  # cluster's start-up, not what the suites test: such a start is thrown
  # away and made again, on fresh ports, at most three times.
  for attempt in 1 2 3; do
    stop "$dir"
    rm -rf "$dir" && mkdir -p "$dir"
    read -r -a ports <<<"$(free_ports 9)"
    routes=""
    for i in 0 1 2; do routes+="${routes:+,}nats://127.0.0.1:${ports[$((3 + i))]}"; done
    urls=""
    for i in 0 1 2; do
      node=node$((i + 1))
      config=()
      [ -n "${RESPCOORD_NATS_CLUSTER_CONFIG:-}" ] && config=(-c "$RESPCOORD_NATS_CLUSTER_CONFIG")
      "$binary" "${config[@]}" -a 127.0.0.1 -p "${ports[$i]}" -n "$node" -js -sd "$dir/$node" \
        --cluster_name "rc-$name" --cluster "nats://127.0.0.1:${ports[$((3 + i))]}" \
        --routes "$routes" -m "${ports[$((6 + i))]}" \
        -l "$dir/$node.log" -P "$dir/$node.pid" >/dev/null 2>&1 &
      urls+="${urls:+,}nats://127.0.0.1:${ports[$i]}"
    done
    ready=0
    for _ in $(seq 300); do
      meta_ready "${ports[6]}" "${ports[7]}" "${ports[8]}" && ready=1 && break
      sleep 0.1
    done
    [ $ready = 1 ] && break
    echo "nats-server $version cluster did not form its JetStream meta group (attempt $attempt of 3); see $dir/*.log" >&2
    tail -n 20 "$dir"/node*.log >&2 || true
  done
  if [ $ready != 1 ]; then
    stop "$dir"
    exit 1
  fi
  echo "$urls"
  ;;
*)
  echo "usage: scripts/nats-cluster.sh start VERSION [NAME] | stop NAME" >&2
  exit 2
  ;;
esac
