#!/usr/bin/env bash
# The Go client (clients/go) against the real server and the scenario
# fixture: the generated code checked against proto/ (regenerated with the
# pure-Go toolchain pinned in clients/go/tools/go.mod, no system protoc),
# gofmt, go vet, staticcheck (pinned there too), the run-time dependencies
# (grpc-go, protobuf-go and their own, nothing else), go test -race (unit
# tests, the rules, every shared scenario on the memory backend, and once
# more on NATS when RESPCOORD_TEST_NATS_URL is set), then the install test:
# a throw-away module outside the tree that requires the client through a
# `replace` and runs the README's quickstart against a local respcoord.
# Needs Go 1.26+ (Go's default caches: ~/go, ~/.cache/go-build) and the Rust
# binaries (RESPCOORD_SERVER_BIN / RESPCOORD_FIXTURE_BIN, default:
# target/debug under the repository root).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export RESPCOORD_SERVER_BIN="${RESPCOORD_SERVER_BIN:-$root/target/debug/respcoord}"
export RESPCOORD_FIXTURE_BIN="${RESPCOORD_FIXTURE_BIN:-$root/target/debug/examples/scenario_fixture}"
for bin in "$RESPCOORD_SERVER_BIN" "$RESPCOORD_FIXTURE_BIN"; do
  [[ -x "$bin" ]] || { echo "test-go: $bin is missing (cargo build --locked --bin respcoord --example scenario_fixture)" >&2; exit 1; }
done
module=github.com/respcoord/respcoord/clients/go
client="$root/clients/go"
tools="$root/target/go-tools"
cd "$client"
# Each section says when it began, so a slow run shows where its time went.
began=$SECONDS
step() { echo "== test-go: $1 (at $((SECONDS - began)) s)"; }

step "generated code"
./scripts/codegen.sh --check

step "gofmt, go vet, staticcheck"
unformatted="$(gofmt -l .)"
[[ -z "$unformatted" ]] || { echo "test-go: not gofmt-clean:" >&2; echo "$unformatted" >&2; exit 1; }
go vet ./...
go build -C tools -o "$tools/staticcheck" honnef.co/go/tools/cmd/staticcheck
"$tools/staticcheck" ./...

step "run-time dependencies"
# Every module the client's packages link, against grpc-go, protobuf-go and
# the modules their own go.mod files require.
allowed="$( {
  echo "$module"
  echo google.golang.org/grpc
  echo google.golang.org/protobuf
  go mod graph | awk '$1 ~ /^google\.golang\.org\/(grpc|protobuf)@/ { sub(/@.*/, "", $2); print $2 }'
} | sort -u)"
linked="$(go list -deps -f '{{with .Module}}{{.Path}}{{end}}' . ./respcoordv1 | sort -u)"
extra="$(comm -23 <(echo "$linked") <(echo "$allowed"))"
[[ -z "$extra" ]] || { echo "test-go: the client links modules beyond grpc-go and protobuf-go's own:" >&2; echo "$extra" >&2; exit 1; }
echo "$linked" | sed 's/^/    /'

step "go test -race (memory backend)"
go test -race -count=1 ./...
if [[ -n "${RESPCOORD_TEST_NATS_URL:-}" ]]; then
  step "the shared scenarios on NATS ($RESPCOORD_TEST_NATS_URL)"
  RESPCOORD_TEST_BACKEND=nats go test -race -count=1 -run 'TestScenarios|TestEveryScenario' .
fi

step "install test"
# The README shows the quickstart this test runs, verbatim.
python3 - README.md examples/quickstart/main.go <<'PY'
import sys
from pathlib import Path

readme, quickstart = (Path(name).read_text() for name in sys.argv[1:3])
if f"```go\n{quickstart}```\n" not in readme:
    sys.exit("test-go: README.md does not show examples/quickstart/main.go verbatim (a ```go block)")
PY
work="$(mktemp -d "${TMPDIR:-/tmp}/respcoord-go-install.XXXXXX")"
server_pid=
cleanup() {
  [[ -n "$server_pid" ]] && kill "$server_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$work/app"
cp examples/quickstart/main.go "$work/app/main.go"
(
  cd "$work/app"
  go mod init example.com/respcoord-quickstart >/dev/null 2>&1
  go mod edit -require="$module@v0.0.0" -replace="$module=$client"
  go mod tidy >/dev/null 2>&1 || go mod tidy
  go build -o "$work/quickstart" .
)
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$RESPCOORD_SERVER_BIN" serve --listen "127.0.0.1:$port" >"$work/respcoord.log" 2>&1 &
server_pid=$!
for _ in $(seq 200); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/respcoord.log" >&2; exit 1; }
  sleep 0.05
done
(cd "$work" && timeout 60 ./quickstart "127.0.0.1:$port")
echo "test-go: ok ($SECONDS s)"
