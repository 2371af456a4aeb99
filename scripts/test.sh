#!/usr/bin/env bash
# The test command (README, and CI through .ci/run): every test of the crate.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --locked --all-targets --features client "$@"
# Deployment: Dockerfile lint, every Kubernetes manifest rendered and
# validated against the Kubernetes schemas, the Grafana dashboard's metric
# names (deploy/README.md; installs its pinned tools into target/).
./deploy/check.sh
