#!/usr/bin/env bash
# The fault soak (tests/faults.rs `chaos_soak`, issue 15): a three-node NATS
# cluster and three respcoord replicas in network namespaces under load for
# N minutes while a randomized schedule of partitions, pauses, kills and
# restarts plays out (replica clocks skewed by the seed too); then every
# history is checked. Prints the schedule, the operation counts and the
# verdict. The schedule derives from the seed alone: the same seed replays it.
#
#   scripts/chaos.sh --minutes 30 --seed 42
#
# Needs root (ip netns); runs the newest pinned nats-server (installed by
# scripts/nats-server.sh; RESPCOORD_CHAOS_NATS_VERSION picks another).
# Exit status: the test's.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=5
seed=$(date +%s)
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "usage: $0 [--minutes N] [--seed S]" >&2; exit 2 ;;
  esac
done
RESPCOORD_TEST_CLUSTER_NATS_SERVER=$(./scripts/nats-server.sh "${RESPCOORD_CHAOS_NATS_VERSION:-}")
export RESPCOORD_TEST_CLUSTER_NATS_SERVER
echo "chaos: $minutes minutes, seed $seed" >&2
RESPCOORD_CHAOS_MINUTES=$minutes RESPCOORD_CHAOS_SEED=$seed \
  cargo test --locked --features fault-injection --test faults -- \
  --ignored --exact chaos_soak --nocapture
