#!/usr/bin/env bash
# The test command (README, and CI through .ci/run): every test of the crate.
set -euo pipefail
cd "$(dirname "$0")/.."
# NATS with JetStream for the cluster backend's tests (started if none runs).
RESPCOORD_TEST_NATS_URL=$(./scripts/nats.sh)
export RESPCOORD_TEST_NATS_URL
if [ -f target/nats-test/nats.pid ]; then
  trap 'kill "$(cat target/nats-test/nats.pid)" 2>/dev/null || true' EXIT
fi
# nats-server 2.10 for the three-node cluster test (tests/nats_cluster.rs).
RESPCOORD_TEST_CLUSTER_NATS_SERVER=$(./scripts/nats-cluster-server.sh)
export RESPCOORD_TEST_CLUSTER_NATS_SERVER
cargo test --locked --all-targets --features client "$@"
# The whole end-to-end suite again, against the NATS JetStream backend.
RESPCOORD_TEST_BACKEND=nats cargo test --locked --features client \
  --test e2e_semantics --test e2e_watch --test e2e_validation --test e2e_concurrency "$@"
# Fault runs on a three-node NATS 2.10 cluster in network namespaces
# (partitions, pauses, kills, clock skew), every history checked for
# linearizability: a build with the test-only `fault-injection` feature,
# which only this target uses (root for `ip netns`; skipped with a message
# otherwise). The long randomized soak is scripts/chaos.sh.
cargo test --locked --features client,fault-injection --test faults "$@"
# The other languages' clients against the real server and the scenario
# fixture (clients/scenarios/): the binaries they spawn, then each suite.
cargo build --locked --features client --bin respcoord --example scenario_fixture
./scripts/test-typescript.sh
./scripts/test-python.sh
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
