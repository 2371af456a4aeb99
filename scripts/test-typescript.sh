#!/usr/bin/env bash
# The TypeScript client: install from the lockfile, check the generated code
# against the proto, type-check, lint, build, and run the tests against the
# real server and the scenario fixture on loopback; then the package as a
# user installs it (clients/typescript/scripts/install-test.sh: npm pack of a
# clean copy, npm install of the tarball, the README's quickstart against the
# real server; about 20 s). Needs Node 20+ and the
# Rust binaries (RESPCOORD_SERVER_BIN / RESPCOORD_FIXTURE_BIN, default:
# target/debug under the repository root).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export RESPCOORD_SERVER_BIN="${RESPCOORD_SERVER_BIN:-$root/target/debug/respcoord}"
export RESPCOORD_FIXTURE_BIN="${RESPCOORD_FIXTURE_BIN:-$root/target/debug/examples/scenario_fixture}"
for bin in "$RESPCOORD_SERVER_BIN" "$RESPCOORD_FIXTURE_BIN"; do
  [[ -x "$bin" ]] || { echo "test-typescript: $bin is missing (cargo build --locked --bin respcoord --example scenario_fixture)" >&2; exit 1; }
done
cd "$root/clients/typescript"
npm ci --no-audit --no-fund
npm run codegen:check
# Build first: the tests import the package by its name (its `exports` map,
# resolved to dist/), so the type check and the lint need dist/ to exist.
rm -rf dist build
npm run build
npm run typecheck
npm run lint
npm test
./scripts/install-test.sh
