#!/usr/bin/env bash
# The package as a user installs it (issue 27). From a clean copy of the
# package's files in the working tree (tracked, or new and not ignored: no
# dist/, build/ or node_modules/), `npm ci` and `npm pack` (its `prepare`
# script must build dist/), then `npm install` of the tarball into a
# throw-away project, which
#   (a) imports it from a plain .mjs file,
#   (b) type-checks a .ts file (and the quickstart, as JavaScript) against
#       its declarations with tsc --strict,
#   (c) runs examples/quickstart.mjs, the file the README shows, against a
#       local respcoord server.
#   (d) adds the optional peer @openai/agents-realtime (the version the lock
#       pins) and runs and type-checks the `respcoord/openai-agents` entry.
# Everything lives under target/typescript-install/ (removed first). npm runs
# with --prefer-offline: the cache filled by `npm ci` serves it.
# Needs Node 20+ and the respcoord binary (RESPCOORD_SERVER_BIN, default:
# target/debug/respcoord under the repository root).
set -euo pipefail
package="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
root="$(git -C "$package" rev-parse --show-toplevel)"
server_bin="${RESPCOORD_SERVER_BIN:-$root/target/debug/respcoord}"
work="$root/target/typescript-install"
npm_flags=(--no-audit --no-fund --prefer-offline --loglevel=error)

rm -rf "$work"
mkdir -p "$work/src" "$work/pack" "$work/app"

# The README shows the quickstart this test runs, verbatim.
# shellcheck disable=SC2016 # JavaScript
node -e '
  const { readFileSync } = require("node:fs");
  const [readme, quickstart] = process.argv.slice(1).map((f) => readFileSync(f, "utf8"));
  if (!readme.includes("```js\n" + quickstart + "```\n")) {
    console.error("install-test: README.md does not show examples/quickstart.mjs verbatim (a ```js block)");
    process.exit(1);
  }
' "$package/README.md" "$package/examples/quickstart.mjs"

echo "== install-test: a clean copy of clients/typescript"
(
  cd "$package"
  git ls-files -z --cached --others --exclude-standard . |
    while IFS= read -r -d '' file; do
      # A tracked file deleted in the working tree is not part of it.
      [[ -e "$file" ]] && printf '%s\0' "$file"
    done |
    tar --null --files-from=- -cf -
) | tar -C "$work/src" -xf -

echo "== install-test: npm ci, npm pack"
# --ignore-scripts: `npm pack` alone must build dist/ (prepare).
(cd "$work/src" && npm ci --ignore-scripts "${npm_flags[@]}" >/dev/null)
tarball="$(cd "$work/src" && npm pack --pack-destination "$work/pack" "${npm_flags[@]}" | tail -n 1)"
tarball="$work/pack/$tarball"
listing="$(tar -tzf "$tarball" | sort)"
echo "    $(basename "$tarball"): $(wc -l <<<"$listing") files"
for want in package/package.json package/README.md package/dist/index.js package/dist/index.d.ts; do
  grep -qx "$want" <<<"$listing" || { echo "install-test: $want is not in the tarball" >&2; exit 1; }
done
if grep -E '^package/(test|build|node_modules|examples|scripts)/' <<<"$listing"; then
  echo "install-test: the tarball holds files a user does not need (above)" >&2
  exit 1
fi

echo "== install-test: npm install the tarball into a fresh project"
cd "$work/app"
# The type checker and Node's types at the versions the package's lock pins.
pinned() { node -e 'console.log(require(process.argv[1]).packages["node_modules/" + process.argv[2]].version)' \
  "$work/src/package-lock.json" "$1"; }
cat >package.json <<'EOF'
{ "name": "respcoord-install-test", "private": true, "type": "module" }
EOF
npm install "${npm_flags[@]}" "$tarball" "typescript@$(pinned typescript)" "@types/node@$(pinned @types/node)" >/dev/null

# Every source map and declaration map points at a file the package ships.
# shellcheck disable=SC2016 # JavaScript
node --input-type=module -e '
  import { readdirSync, readFileSync, existsSync } from "node:fs";
  import { dirname, join } from "node:path";
  const dist = "node_modules/respcoord/dist";
  const maps = readdirSync(dist, { recursive: true }).filter((f) => f.endsWith(".map"));
  if (maps.length === 0) throw new Error("no source maps in dist/");
  for (const map of maps) {
    for (const source of JSON.parse(readFileSync(join(dist, map), "utf8")).sources) {
      const file = join(dist, dirname(map), source);
      if (!existsSync(file)) throw new Error(`${map}: ${source} is not in the package`);
    }
  }
'

echo "== install-test: (a) import from plain .mjs"
# Without the optional peer: npm must not have installed it.
[[ ! -e node_modules/@openai/agents-realtime ]] || { echo "install-test: the optional peer @openai/agents-realtime was installed" >&2; exit 1; }
cat >import.mjs <<'EOF'
import * as respcoord from "respcoord";
import { Client, Source, Terminal, RespcoordError } from "respcoord";
for (const [name, value] of Object.entries({ Client, Source, Terminal, RespcoordError })) {
  if (value === undefined) throw new Error(`respcoord exports no ${name}`);
}
if (typeof Client.connect !== "function") throw new Error("Client.connect is not a function");
console.log(`    imported: ${Object.keys(respcoord).length} names`);
EOF
node import.mjs

echo "== install-test: (b) tsc --strict against its declarations"
cat >consumer.ts <<'EOF'
import {
  Client,
  Source,
  Terminal,
  RespcoordError,
  UnavailableError,
  type Fence,
  type FinishResult,
  type RunOutcome,
} from "respcoord";

export async function answer(client: Client, sessionId: string): Promise<RunOutcome<number>> {
  return client.session(sessionId).run(Source.Client, async (ctx) => {
    const fence: Fence = ctx.fence();
    const id: bigint = fence.id;
    return fence.isCurrent() ? Number(id % 7n) : 0;
  });
}

export async function bargeIn(client: Client): Promise<FinishResult> {
  const response = await client.session("call-1").start(Source.Vad);
  const superseded: bigint | undefined = response.superseded;
  void superseded;
  return response.finish(Terminal.Completed);
}

export function describe(error: unknown): string {
  if (error instanceof UnavailableError) return "down";
  return error instanceof RespcoordError ? (error.code ?? "local") : "other";
}

// The declarations are real types, not `any`:
// @ts-expect-error there is no such source
export const wrong: Source = "keyboard";
EOF
cp "$package/examples/quickstart.mjs" quickstart.mjs
cat >tsconfig.json <<'EOF'
{
  "compilerOptions": {
    "target": "ES2022",
    "module": "NodeNext",
    "moduleResolution": "NodeNext",
    "strict": true,
    "allowJs": true,
    "checkJs": true,
    "noEmit": true,
    "skipLibCheck": false,
    "types": ["node"]
  },
  "files": ["consumer.ts", "quickstart.mjs"]
}
EOF
node_modules/.bin/tsc -p tsconfig.json

echo "== install-test: (c) the quickstart against a local respcoord"
port="$(node -e '
  const server = require("node:net").createServer().listen(0, "127.0.0.1", () => {
    console.log(server.address().port);
    server.close();
  });
')"
"$server_bin" serve --listen "127.0.0.1:$port" >"$work/respcoord.log" 2>&1 &
server_pid=$!
trap 'kill "$server_pid" 2>/dev/null || true' EXIT
for _ in $(seq 200); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/respcoord.log" >&2; exit 1; }
  sleep 0.05
done
timeout 60 node quickstart.mjs "127.0.0.1:$port" | sed 's/^/    /'

echo "== install-test: (d) respcoord/openai-agents with its optional peer installed"
# Everything above ran without @openai/agents-realtime (an optional peer: npm
# does not install it). Now the pinned release, as a user adds it: a gate on a
# RealtimeSession (the SDK's scripted transport) against the server, and the
# entry point's declarations under tsc --strict.
npm install "${npm_flags[@]}" "@openai/agents-realtime@$(pinned @openai/agents-realtime)" >/dev/null
cat >agents.mjs <<'EOF'
import { RealtimeAgent, RealtimeSession } from "@openai/agents-realtime";
import { ScriptedRealtimeTransport } from "@openai/agents-realtime/testing";
import { Client } from "respcoord";
import { ResponseGate } from "respcoord/openai-agents";

const client = await Client.connect(process.argv[2]);
const realtime = new RealtimeSession(new RealtimeAgent({ name: "install-test" }), { transport: new ScriptedRealtimeTransport() });
await realtime.connect({ apiKey: "not-used" });
const gate = new ResponseGate(realtime, client.session(`install-${process.pid}`));
let played = 0;
gate.on("audio", () => {
  played += 1;
});
const model = realtime.transport;
model.emit("turn_started", { type: "response_started", providerData: { response: { id: "r1" } } });
model.emit("audio", { type: "audio", data: new ArrayBuffer(8), responseId: "r1" });
model.emit("turn_done", { type: "response_done", response: { id: "r1", output: [], usage: {} } });
// The Start and then the Finish go out in the background (a condition, bounded only to fail).
for (let i = 0; i < 4000 && gate.stats.responsesFinished === 0; i++) await new Promise((r) => setTimeout(r, 5));
await gate.close();
if (played !== 1 || gate.stats.responsesFinished !== 1) throw new Error(`gate: ${JSON.stringify(gate.stats)}`);
realtime.close();
client.close();
console.log("    respcoord/openai-agents: one response started, its audio played, Finish sent");
EOF
timeout 60 node agents.mjs "127.0.0.1:$port"
cat >agents.ts <<'EOF'
import { RealtimeAgent, RealtimeSession } from "@openai/agents-realtime";
import type { Client } from "respcoord";
import { ResponseGate, type GateStats } from "respcoord/openai-agents";

export function gate(client: Client, realtime: RealtimeSession<{ user: string }>): GateStats {
  const g = new ResponseGate(realtime, client.session("call-1"));
  g.on("audio", (event, responseId: bigint) => {
    const bytes: ArrayBuffer = event.data;
    void bytes;
    void responseId;
  });
  return g.stats;
}
export const agent = new RealtimeAgent({ name: "typed" });
EOF
node -e '
  const fs = require("node:fs");
  const config = JSON.parse(fs.readFileSync("tsconfig.json", "utf8"));
  config.files = ["agents.ts"];
  fs.writeFileSync("tsconfig.agents.json", JSON.stringify(config));
'
node_modules/.bin/tsc -p tsconfig.agents.json
echo "== install-test: passed"
