#!/usr/bin/env bash
# Makes sure a single-node NATS server with JetStream is reachable for the
# tests and prints its URL (scripts/test.sh exports it as
# RESPCOORD_TEST_NATS_URL).
#
# - RESPCOORD_TEST_NATS_URL already set: used as is.
# - otherwise: the newest pinned nats-server (scripts/nats-server.sh) is
#   started with JetStream on a free loopback port, storing under
#   target/nats-test/, and stopped again by scripts/test.sh when the tests
#   end. A server already on 127.0.0.1:4222 is not used: it may be an
#   unsupported release (Debian ships 2.9.10).
set -euo pipefail
cd "$(dirname "$0")/.."

reachable() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

rm -f target/nats-test/nats.pid
if [ -n "${RESPCOORD_TEST_NATS_URL:-}" ]; then
  echo "$RESPCOORD_TEST_NATS_URL"
  exit 0
fi
server=$(scripts/nats-server.sh)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dir=target/nats-test
rm -rf "$dir" && mkdir -p "$dir/store"
"$server" -a 127.0.0.1 -p "$port" -js -sd "$dir/store" -l "$dir/nats.log" -P "$dir/nats.pid" >&2 &
for _ in $(seq 100); do
  reachable "$port" && break
  sleep 0.1
done
reachable "$port" || { echo "nats-server did not start; see $dir/nats.log" >&2; exit 1; }
echo "nats://127.0.0.1:$port"
