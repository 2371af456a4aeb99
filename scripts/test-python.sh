#!/usr/bin/env bash
# The Python client (clients/python) against the real server and the
# scenario fixture, in two virtualenvs under target/ made from the committed
# locks (clients/python/requirements/*.txt, hash-pinned):
# - target/python-venv: the newest releases the package allows, with the
#   Pipecat extra; ruff, mypy --strict, then every test;
# - target/python-floor: the oldest runtime it allows (grpcio 1.71.2,
#   protobuf 5.29.6) and the stub generator: the committed stubs must match
#   the proto, and the client's tests pass on that runtime too.
# Then the package as a user installs it (install_test below): a wheel and an
# sdist, each in a fresh virtualenv with only the runtime dependencies, and
# examples/quickstart.py (the one the README shows) against a local server.
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
run_pytest "$root/target/python-floor" tests/test_unit.py tests/test_rules.py tests/test_scenarios.py
if [ -n "${RESPCOORD_TEST_NATS_URL:-}" ]; then
  RESPCOORD_TEST_BACKEND=nats run_pytest "$root/target/python-venv" tests/test_scenarios.py
fi

# The package as a user installs it (issue 27), from a clean copy of
# clients/python (its files in the working tree, tracked or new and not
# ignored: no caches, no build output). The wheel and the sdist are built
# with the locked hatchling (pip wheel without build isolation; the sdist
# through hatchling's PEP 517 hook), the sdist then built into a wheel of its
# own, as pip does for a user. Each goes into a fresh virtualenv holding the
# package's runtime dependencies from the lock and nothing else (their wheels
# kept in target/python-wheelhouse while that part of the lock is
# unchanged), where `pip check`, the import, py.typed and the generated
# stubs are checked and examples/quickstart.py runs against a local
# respcoord; mypy --strict checks the quickstart against the installed wheel.
install_test() {
  local work=$root/target/python-install wheels=$root/target/python-wheelhouse
  local py=$root/target/python-venv/bin/python stamp port server_pid kind venv
  local pip=("$py" -m pip --quiet --disable-pip-version-check)
  rm -rf "$work"
  mkdir -p "$work/src" "$work/dist" "$work/from-sdist"
  (
    cd "$package"
    git ls-files -z --cached --others --exclude-standard . |
      while IFS= read -r -d '' file; do
        # A tracked file deleted in the working tree is not part of it.
        [[ -e "$file" ]] && printf '%s\0' "$file"
      done |
      tar --null --files-from=- -cf -
  ) | tar -C "$work/src" -xf -
  "${pip[@]}" wheel --no-deps --no-build-isolation --wheel-dir "$work/dist" "$work/src"
  (cd "$work/src" && "$py" -c 'import sys, hatchling.build as b; b.build_sdist(sys.argv[1])' "$work/dist")
  "${pip[@]}" wheel --no-deps --no-build-isolation --wheel-dir "$work/from-sdist" "$work"/dist/*.tar.gz
  echo "install-test: built $(cd "$work/dist" && echo *)"
  "$py" scripts/runtime_lock.py "$work"/dist/*.whl requirements/test.txt >"$work/runtime.txt"
  stamp=$(sha256sum "$work/runtime.txt" | cut -d' ' -f1)
  if [ "$(cat "$wheels/.lock-sha256" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$wheels"
    "${pip[@]}" download --require-hashes --no-deps --dest "$wheels" -r "$work/runtime.txt"
    echo "$stamp" >"$wheels/.lock-sha256"
  fi

  port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$root/target/debug/respcoord" serve --listen "127.0.0.1:$port" >"$work/respcoord.log" 2>&1 &
  server_pid=$!
  # shellcheck disable=SC2064 # this pid, now
  trap "kill $server_pid 2>/dev/null || true" EXIT
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    kill -0 "$server_pid" 2>/dev/null || { cat "$work/respcoord.log" >&2; return 1; }
    sleep 0.05
  done

  for kind in wheel sdist; do
    venv=$work/$kind-venv
    python3 -m venv --without-pip "$venv"
    "${pip[@]}" --python "$venv/bin/python" install --no-index --find-links "$wheels" \
      --require-hashes --no-deps -r "$work/runtime.txt"
    if [ "$kind" = wheel ]; then
      "${pip[@]}" --python "$venv/bin/python" install --no-index --no-deps "$work"/dist/*.whl
    else
      "${pip[@]}" --python "$venv/bin/python" install --no-index --no-deps "$work"/from-sdist/*.whl
    fi
    "${pip[@]}" --python "$venv/bin/python" check
    (cd "$work" && "$venv/bin/python" -c '
import sys
from importlib.resources import files
from pathlib import Path

import respcoord
from respcoord.v1 import coordinator_pb2_grpc

assert Path(respcoord.__file__).is_relative_to(sys.prefix), respcoord.__file__
assert coordinator_pb2_grpc.ResponseCoordinatorStub
for name in ("py.typed", "v1/coordinator_pb2.pyi", "v1/coordinator_pb2_grpc.pyi"):
    assert files("respcoord").joinpath(name).is_file(), f"no {name} in the package"
')
    echo "install-test: the $kind: examples/quickstart.py"
    (cd "$work" && timeout 60 "$venv/bin/python" "$package/examples/quickstart.py" "127.0.0.1:$port")
  done
  (cd "$work" && "$root/target/python-venv/bin/mypy" --strict --no-incremental \
    --python-executable "$work/wheel-venv/bin/python" "$package/examples/quickstart.py")

  kill "$server_pid"
  wait "$server_pid" || true
  trap - EXIT
}

# The README shows the quickstart this test runs, verbatim.
"$root/target/python-venv/bin/python" - README.md examples/quickstart.py <<'EOF'
import sys
from pathlib import Path

readme, quickstart = (Path(name).read_text() for name in sys.argv[1:3])
if f"```python\n{quickstart}```\n" not in readme:
    sys.exit("README.md does not show examples/quickstart.py verbatim (a ```python block)")
EOF
install_test
