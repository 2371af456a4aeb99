#!/usr/bin/env bash
# Makes sure a NATS server with JetStream is reachable for the tests and
# prints its URL (scripts/test.sh exports it as RESPCOORD_TEST_NATS_URL).
#
# - RESPCOORD_TEST_NATS_URL already set: used as is.
# - a server on 127.0.0.1:4222: used (the one a developer or CI runs).
# - otherwise: Debian's nats-server (installed with apt-get if missing) is
#   started with JetStream on 127.0.0.1:14222, storing under target/, and
#   stopped again by scripts/test.sh when the tests end.
set -euo pipefail
cd "$(dirname "$0")/.."

reachable() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

rm -f target/nats-test/nats.pid
if [ -n "${RESPCOORD_TEST_NATS_URL:-}" ]; then
  echo "$RESPCOORD_TEST_NATS_URL"
  exit 0
fi
if reachable 4222; then
  echo "nats://127.0.0.1:4222"
  exit 0
fi
if ! command -v nats-server >/dev/null && [ ! -x /usr/sbin/nats-server ]; then
  echo "installing nats-server (Debian package)" >&2
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq >&2
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server >&2
fi
server=$(command -v nats-server || echo /usr/sbin/nats-server)
dir=target/nats-test
rm -rf "$dir" && mkdir -p "$dir/store"
"$server" -a 127.0.0.1 -p 14222 -js -sd "$dir/store" -l "$dir/nats.log" -P "$dir/nats.pid" >&2 &
for _ in $(seq 100); do
  reachable 14222 && break
  sleep 0.1
done
reachable 14222 || { echo "nats-server did not start; see $dir/nats.log" >&2; exit 1; }
echo "nats://127.0.0.1:14222"
