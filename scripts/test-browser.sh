#!/usr/bin/env bash
# The web view (docs/web-ui.md) in a real browser: Debian's chromium, driven
# by playwright-core (pinned in tests/browser/package-lock.json; it never
# downloads a browser), against the real server and respcoordctl on loopback.
# Installs chromium with apt if /usr/bin/chromium is missing. Needs Node 20+
# and the Rust binaries (RESPCOORD_SERVER_BIN / RESPCOORDCTL_BIN, default:
# target/debug under the repository root):
#   cargo build --locked --bin respcoord
#   cargo build --locked -p respcoord-client --features cli --bin respcoordctl
# Writes target/browser/timeline.png (the session page) and
# target/browser/timings.txt (page load, live-update latency; never asserted).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
export RESPCOORD_SERVER_BIN="${RESPCOORD_SERVER_BIN:-$root/target/debug/respcoord}"
export RESPCOORDCTL_BIN="${RESPCOORDCTL_BIN:-$root/target/debug/respcoordctl}"
[[ -x "$RESPCOORD_SERVER_BIN" ]] || { echo "test-browser: $RESPCOORD_SERVER_BIN is missing (cargo build --locked --bin respcoord)" >&2; exit 1; }
[[ -x "$RESPCOORDCTL_BIN" ]] || { echo "test-browser: $RESPCOORDCTL_BIN is missing (cargo build --locked -p respcoord-client --features cli --bin respcoordctl)" >&2; exit 1; }
export CHROMIUM_BIN="${CHROMIUM_BIN:-/usr/bin/chromium}"
if [[ "$CHROMIUM_BIN" = /usr/bin/chromium && ! -x /usr/bin/chromium ]]; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
fi
(cd tests/browser && npm ci --no-audit --no-fund)
mkdir -p target/browser
node --test tests/browser/*.test.mjs
