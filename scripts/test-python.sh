#!/usr/bin/env bash
# The Python client (clients/python) against the real server and the
# scenario fixture, in two virtualenvs under target/ made from the committed
# locks (clients/python/requirements/*.txt, hash-pinned):
# - target/python-venv: the newest releases the package allows, with the
#   Pipecat extra; ruff, mypy --strict, then every test;
# - target/python-floor: the oldest runtime it allows (grpcio 1.71.2,
#   protobuf 5.29.6) and the stub generator: the committed stubs must match
#   the proto, and the client's tests pass on that runtime too.
# Needs target/debug/respcoord and target/debug/examples/scenario_fixture
# (scripts/test.sh builds them first). RESPCOORD_TEST_NATS_URL, when set,
# runs the shared scenarios once more on the NATS backend.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
package=$root/clients/python

# A virtualenv at $1 from the lock $2, reused while the lock is unchanged.
venv() {
  local dir=$1 lock=$2 stamp
  stamp=$(sha256sum "$lock" | cut -d' ' -f1)
  if [ "$(cat "$dir/.lock-sha256" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$dir"
    python3 -m venv "$dir"
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check \
      --require-hashes --no-deps -r "$lock"
    echo "$stamp" >"$dir/.lock-sha256"
  fi
  # The package itself, as a user installs it (not editable): its wheel
  # must carry the stubs and py.typed.
  "$dir/bin/python" -m pip install --quiet --disable-pip-version-check \
    --no-deps --no-build-isolation --force-reinstall "$package"
}

venv target/python-venv "$package/requirements/test.txt"
venv target/python-floor "$package/requirements/floor.txt"

cd "$package"
export PYTHONDONTWRITEBYTECODE=1
# Tests import the installed package, never the source tree.
run_pytest() { "$1/bin/python" -m pytest -p no:cacheprovider "${@:2}"; }

"$root/target/python-floor/bin/python" scripts/codegen.py --check
"$root/target/python-venv/bin/ruff" format --check .
"$root/target/python-venv/bin/ruff" check .
"$root/target/python-venv/bin/mypy"
run_pytest "$root/target/python-venv" tests -s
run_pytest "$root/target/python-floor" tests/test_unit.py tests/test_scenarios.py
if [ -n "${RESPCOORD_TEST_NATS_URL:-}" ]; then
  RESPCOORD_TEST_BACKEND=nats run_pytest "$root/target/python-venv" tests/test_scenarios.py
fi
