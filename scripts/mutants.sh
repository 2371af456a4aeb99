#!/usr/bin/env bash
# Mutation testing of the NATS backend's attempt machine
# (src/nats/attempts.rs), the whole per-call policy that model 4 checks.
# Not part of the test command: about 45 minutes on 2 cores.
#
# 1. The mutation table (docs/verification.md, "Model 4"): each row takes
#    one safeguard out of the machine's source, and the machine's tests
#    (its unit tests and model 4) must fail. Run in place on a clean
#    src/nats/attempts.rs, which is restored after each row.
# 2. cargo-mutants over the same file (installed under target/tools), with
#    the same tests: every mutant must be caught, or be one named in
#    docs/verification.md as equivalent.
#
# Usage: scripts/mutants.sh [table|cargo-mutants]   (both by default)
set -euo pipefail
cd "$(dirname "$0")/.."
file=src/nats/attempts.rs
what=${1:-all}
# The machine's unit tests, and model 4.
unit=(--lib -- nats::attempts)
model=(--test model_check -- nats_path)

if ! git diff --quiet -- "$file"; then
  echo "$file has uncommitted changes: commit them first" >&2
  exit 2
fi

# name|the source text taken out|what replaces it, rows apart by a line "=="
table() {
  cat <<'ROWS'
confirmation skipped: an answer without a write is given at once|                    self.pending = Pending::Confirming(answer);
                    Command::Request(Request::Confirm { read: self.read })|                    self.answer(answer, CacheChange::Keep)
==
successor not asked: every conflict is taken as another write's|                self.after_unanswered = written == Written::ConflictAfterUnanswered;
                Command::Request(Request::Successor {
                    expected: self.expected,
                })|                self.lost += 1;
                self.attempt()
==
a conflict answered at once trusted: only one after an unanswered try is asked about|                self.after_unanswered = written == Written::ConflictAfterUnanswered;
                Command::Request(Request::Successor {
                    expected: self.expected,
                })|                if written == Written::Conflict {
                    self.lost += 1;
                    return self.attempt();
                }
                self.after_unanswered = true;
                Command::Request(Request::Successor {
                    expected: self.expected,
                })
==
a create's landing guessed: the missing revision taken as held|        if self.expected == KvRevision::NONE {|        if false {
==
a dropped revision taken as held|        if !held {|        if false {
==
rewrite keeps the events of the transition that wrote the entry|                        entry: entry.without_events(),|                        entry,
==
rewrite on the first attempt|            Read::Live { entry, .. } if self.unconfirmed > 0 && entry.rewritable() => {|            Read::Live { entry, .. } if entry.rewritable() => {
==
rewrite of a terminated session|            Read::Live { entry, .. } if self.unconfirmed > 0 && entry.rewritable() => {|            Read::Live { entry, .. } if self.unconfirmed > 0 => {
==
written entries never cached|                    CacheChange::Put(revision, entry)|                    CacheChange::Forget
==
the cached entry serves every attempt|        match self.cached.take() {|        match self.cached.clone() {
ROWS
}

run_table() {
  local missed=0
  trap 'git checkout -- "$file"' EXIT
  while IFS= read -r -d '' row; do
    name=${row%%|*}
    python3 - "$file" "$row" <<'PY'
import sys
path, row = sys.argv[1], sys.argv[2]
name, old, new = row.split("|")
source = open(path).read()
if source.count(old) != 1:
    sys.exit(f"mutation '{name}': its source text is not in {path} exactly once")
open(path, "w").write(source.replace(old, new))
PY
    unit_verdict=missed
    if ! cargo test --locked "${unit[@]}" >target/mutant-unit.log 2>&1; then
      unit_verdict="caught ($(grep -c '^test .* FAILED$' target/mutant-unit.log || true) failing)"
    fi
    model_verdict=missed
    if ! cargo test --locked "${model[@]}" >target/mutant-model.log 2>&1; then
      model_verdict="caught: $(grep -oE '(no )?counterexample to "[^"]*"|"[^"]*" is never reached' target/mutant-model.log | sort -u | tr '\n' ';' || true)"
    fi
    echo "$name"
    echo "    unit tests: $unit_verdict"
    echo "    model 4:    $model_verdict"
    if [ "$unit_verdict" = missed ] && [ "$model_verdict" = missed ]; then
      missed=$((missed + 1))
    fi
    git checkout -- "$file"
  done < <(table | python3 -c 'import sys; print("\0".join(sys.stdin.read().rstrip("\n").split("\n==\n")), end="\0")')
  trap - EXIT
  echo "mutation table: $missed missed"
  return "$missed"
}

run_cargo_mutants() {
  local bin=target/tools/bin/cargo-mutants
  [ -x "$bin" ] || cargo install --locked cargo-mutants --root target/tools
  "$bin" mutants --file "$file" --output target/mutants --timeout 300 -j 1 \
    -- --lib --test model_check -- nats::attempts nats_path
}

case $what in
  table) run_table ;;
  cargo-mutants) run_cargo_mutants ;;
  all) run_table && run_cargo_mutants ;;
  *) echo "usage: $0 [table|cargo-mutants]" >&2; exit 2 ;;
esac
