#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ (one per request message: arbitrary
# bytes through prost decoding, validation and the service; see
# fuzz/src/lib.rs for what each run checks).
#
#   scripts/fuzz.sh [seconds_per_target]   time-bounded run (default 60 s),
#                                           optimized, AddressSanitizer on
#   scripts/fuzz.sh --smoke                 the short deterministic run that
#                                           scripts/test.sh does: unoptimized,
#                                           no sanitizer, fixed seed, a fixed
#                                           number of executions per target
#
# New inputs go to a scratch corpus under fuzz/target/; the committed seeds in
# fuzz/corpus/<target>/ are only read. A crash stops the script with a
# non-zero status and leaves its input in fuzz/artifacts/<target>/.
#
# cargo-fuzz passes nightly-only flags (-Z, sanitizer coverage); the one
# stable toolchain here accepts them with RUSTC_BOOTSTRAP=1. cargo-fuzz is
# installed from crates.io if missing.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=timed
seconds=60
case "${1:-}" in
  --smoke) mode=smoke ;;
  "") ;;
  *[!0-9]*) echo "usage: $0 [seconds_per_target | --smoke]" >&2; exit 2 ;;
  *) seconds=$1 ;;
esac

if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install --locked cargo-fuzz
fi
export RUSTC_BOOTSTRAP=1

if [ "$mode" = smoke ]; then
  build=(--dev --sanitizer none)
  # Fixed seed and count, fresh scratch corpus: the same run every time.
  limits=(-seed=1 -runs="${FUZZ_SMOKE_RUNS:-20000}")
else
  build=()
  limits=(-max_total_time="$seconds")
fi

cargo fuzz build "${build[@]}"
summary=()
for target in $(cargo fuzz list); do
  scratch="fuzz/target/corpus/$mode/$target"
  if [ "$mode" = smoke ]; then rm -rf "$scratch"; fi
  mkdir -p "$scratch"
  log="fuzz/target/$mode-$target.log"
  start=$SECONDS
  if ! cargo fuzz run "${build[@]}" "$target" "$scratch" "fuzz/corpus/$target" -- \
      "${limits[@]}" -timeout=10 -print_final_stats=1 >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "fuzz target $target failed; input saved under fuzz/artifacts/$target/" >&2
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1)
  summary+=("$(printf '%-14s %9s runs %7s exec/s %4ss  %s' "$target" "$runs" "$rate" "$((SECONDS - start))" "$cov")")
done
printf 'fuzz (%s):\n' "$mode"
printf '  %s\n' "${summary[@]}"
# Every target ran its course without a crash (a crash exited above).
echo "fuzz: ${#summary[@]} passed, 0 failed"
