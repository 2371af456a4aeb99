#!/usr/bin/env bash
# The Rust client as a gateway installs it: a throw-away crate under
# target/rust-user that depends on clients/rust by path (no features: the
# library only, no respcoordctl), whose main.rs is the quickstart
# (clients/rust/examples/quickstart.rs) unchanged, built with the
# workspace's locked versions and run against the real server on loopback.
# Needs target/debug/respcoord (scripts/test.sh builds it first).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
server_bin="$root/target/debug/respcoord"
[[ -x "$server_bin" ]] || { echo "test-rust-install: $server_bin is missing (cargo build --locked --bin respcoord)" >&2; exit 1; }
user="$root/target/rust-user"
rm -rf "$user" && mkdir -p "$user/src"
cat >"$user/Cargo.toml" <<TOML
[package]
name = "gateway"
version = "0.0.0"
edition = "2021"
publish = false

# Not part of the respcoord workspace it happens to sit under.
[workspace]

[dependencies]
respcoord-client = { path = "$root/clients/rust" }
tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
TOML
cp "$root/clients/rust/examples/quickstart.rs" "$user/src/main.rs"
# The workspace's lock, so the same versions resolve offline; cargo drops
# what the throw-away crate does not use.
cp "$root/Cargo.lock" "$user/Cargo.lock"
# The workspace's target directory: dependencies built with the same
# features are reused.
export CARGO_TARGET_DIR="$root/target"
cargo build --offline --quiet --manifest-path "$user/Cargo.toml"
if cargo tree --offline --manifest-path "$user/Cargo.toml" -e normal --prefix none \
  | grep -Eq '^(respcoord|async-nats|axum|prometheus|opentelemetry[a-z_-]*|mimalloc) '; then
  echo "test-rust-install: the client pulled in server dependencies:" >&2
  cargo tree --offline --manifest-path "$user/Cargo.toml" -e normal --prefix none \
    | grep -E '^(respcoord|async-nats|axum|prometheus|opentelemetry[a-z_-]*|mimalloc) ' >&2
  exit 1
fi
count=$(cargo tree --offline --manifest-path "$user/Cargo.toml" -p respcoord-client -e normal --prefix none \
  | sed 's/ (\*)$//' | sort -u | wc -l)

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$server_bin" serve --listen "127.0.0.1:$port" >"$user/server.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  sleep 0.1
done
timeout 60 "$CARGO_TARGET_DIR/debug/gateway" "http://127.0.0.1:$port"
echo "test-rust-install: respcoord-client by path ($count crates, no server code), the quickstart ran"
