#!/usr/bin/env bash
# The test command (README, and CI through .ci/run): every test of the crate.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --locked --all-targets "$@"
