#!/usr/bin/env bash
# Runs the README's 60-second walkthrough as written, against a fresh server.
#
# The block is the shell block after the `<!-- walkthrough: ... -->` marker
# in README.md. Its commands run with this checkout's respcoord and
# respcoordctl first on the PATH and RESPCOORDCTL_ENDPOINT pointing at a
# server started here on a free loopback port (the text of each command is
# run unchanged). Terminal 1's commands (after "# Terminal 1") run in the
# background; terminal 2's (after "# Terminal 2") one by one, each of which
# must exit 0. Then terminal 1 must end by itself (the walkthrough tears the
# session down) within 20 s, its output must show the events the README
# says it shows, in order, and the retried Start must say it replayed.
# Last, a copy of the block with one command misspelt must fail the same
# run: the check can fail.
#
#   cargo build --locked --bin respcoord
#   cargo build --locked -p respcoord-client --features cli --bin respcoordctl
#   scripts/check-walkthrough.sh   # RESPCOORD_BIN_DIR=~/.cargo/bin (or any directory) for other builds
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin_dir=${RESPCOORD_BIN_DIR:-target/debug}
[[ $bin_dir = /* ]] || bin_dir=$root/$bin_dir
for b in respcoord respcoordctl; do
  if [ ! -x "$bin_dir/$b" ]; then
    echo "check-walkthrough: $bin_dir/$b is missing; build it first:" >&2
    echo "  cargo build --locked --bin respcoord" >&2
    echo "  cargo build --locked -p respcoord-client --features cli --bin respcoordctl" >&2
    exit 1
  fi
done
work=$root/target/walkthrough
rm -rf "$work" && mkdir -p "$work"

server_pid=
watch_pid=
cleanup() {
  [ -n "$watch_pid" ] && kill "$watch_pid" 2>/dev/null
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null
  true
}
trap cleanup EXIT

# extract README DIR: writes DIR/terminal1 and DIR/terminal2, one command a
# line (continuations joined, comments and blank lines dropped).
extract() {
  python3 - "$1" "$2" <<'EOF'
import re, sys
readme, out = sys.argv[1], sys.argv[2]
lines = open(readme).read().splitlines()
marks = [i for i, l in enumerate(lines) if re.match(r"^<!--\s*walkthrough:", l)]
if len(marks) != 1:
    sys.exit(f"check-walkthrough: {readme} has {len(marks)} <!-- walkthrough: --> markers, expected one")
i = marks[0] + 1
if not re.match(r"^```(sh|bash)\s*$", lines[i]):
    sys.exit(f"check-walkthrough: {readme}:{i + 1}: no ```sh block right after the marker")
terminals, current, buf = {1: [], 2: []}, None, ""
for line in lines[i + 1:]:
    if line.startswith("```"):
        break
    m = re.match(r"^#\s*Terminal (\d)", line)
    if m:
        current = int(m.group(1))
        continue
    if not line.strip() or line.lstrip().startswith("#"):
        continue
    if current is None:
        sys.exit(f"check-walkthrough: a command before '# Terminal 1': {line}")
    if line.endswith("\\"):
        buf += line[:-1]
        continue
    terminals[current].append(buf + line)
    buf = ""
if len(terminals[1]) != 1 or len(terminals[2]) < 3:
    sys.exit(f"check-walkthrough: expected one command in terminal 1 and several in terminal 2, got {terminals}")
for n, cmds in terminals.items():
    with open(f"{out}/terminal{n}", "w") as f:
        f.write("\n".join(cmds) + "\n")
EOF
}

# walk DIR: runs DIR's terminals against a fresh server; 0 if every claim holds.
walk() {
  local dir=$1 port
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$bin_dir/respcoord" serve --listen "127.0.0.1:$port" >"$dir/server.log" 2>&1 &
  server_pid=$!
  export RESPCOORDCTL_ENDPOINT="http://127.0.0.1:$port" PATH="$bin_dir:$PATH"
  local deadline=$((SECONDS + 20))
  until respcoordctl list >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ] || ! kill -0 "$server_pid" 2>/dev/null; then
      echo "check-walkthrough: the server did not answer on $port:" >&2
      cat "$dir/server.log" >&2
      return 1
    fi
    sleep 0.1
  done
  # exec: the watch itself is the background job (killing a shell would leave it running).
  bash -eu -c "exec $(cat "$dir/terminal1")" >"$dir/terminal1.out" 2>&1 &
  watch_pid=$!
  local status=0 cmd
  : >"$dir/terminal2.out"
  while IFS= read -r cmd; do
    echo "\$ $cmd" >>"$dir/terminal2.out"
    if ! bash -eu -c "$cmd" >>"$dir/terminal2.out" 2>&1; then
      echo "check-walkthrough: terminal 2: \`$cmd\` failed:" >&2
      tail -n 5 "$dir/terminal2.out" >&2
      status=1
      break
    fi
  done <"$dir/terminal2"
  # A failed step leaves the session up: terminal 1 would wait for ever.
  [ $status = 0 ] || kill "$watch_pid" 2>/dev/null || true
  deadline=$((SECONDS + 20))
  while kill -0 "$watch_pid" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then
      echo "check-walkthrough: terminal 1 (\`$(cat "$dir/terminal1")\`) did not end within 20 s" >&2
      kill "$watch_pid" 2>/dev/null || true
      status=1
      break
    fi
    sleep 0.1
  done
  if ! wait "$watch_pid" && [ $status = 0 ]; then
    echo "check-walkthrough: terminal 1 failed:" >&2
    cat "$dir/terminal1.out" >&2
    status=1
  fi
  watch_pid=
  kill "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=
  [ $status = 0 ] || return 1
  # What the README says terminal 1 shows, in order, and the replay.
  python3 - "$dir/terminal1.out" "$dir/terminal2.out" <<'EOF' || return 1
import re, sys
events = open(sys.argv[1]).read()
want = [r"started response=\S+ source=client", r"cancel_requested response=\S+ source=vad reason=superseded",
        r"ended response=\S+ status=cancelled reason=superseded", r"started response=\S+ source=vad",
        r"cancel_requested response=\S+ .*reason=requested", r"ended response=\S+ status=cancelled reason=requested",
        r"terminated reason=shutdown"]
at = 0
for w in want:
    m = re.compile(w).search(events, at)
    if not m:
        sys.exit(f"check-walkthrough: terminal 1 does not show /{w}/ (after offset {at}):\n{events}")
    at = m.end()
if not re.search(r"\(request_id turn-1, replayed", open(sys.argv[2]).read()):
    sys.exit("check-walkthrough: the retried Start did not say it replayed")
EOF
}

extract README.md "$work"
walk "$work"
echo "ok   README.md walkthrough: $(wc -l <"$work/terminal2") commands in terminal 2 and the watch in terminal 1 ran as written; its events and the replay are as the README says"

# The check can fail: the same block with one command misspelt.
mkdir -p "$work/broken"
sed '0,/^respcoordctl start /s//respcoordctl strat /' "$work/terminal2" >"$work/broken/terminal2"
cp "$work/terminal1" "$work/broken/terminal1"
if cmp -s "$work/terminal2" "$work/broken/terminal2"; then
  echo "check-walkthrough: could not break the block (no 'respcoordctl start' in terminal 2)" >&2
  exit 1
fi
if walk "$work/broken" 2>"$work/broken/why"; then
  echo "check-walkthrough: a walkthrough with \`respcoordctl strat\` passed: the check cannot fail" >&2
  exit 1
fi
echo "ok   check-walkthrough: a copy with a misspelt command fails ($(head -n 1 "$work/broken/why"))"
