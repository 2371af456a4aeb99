// The demo: a respcoord server, two relay processes (A and B) on one
// session, a WebSocket client on each. A streams a long reply; B's caller
// barges in; A's audio stops. Then the same with B cancelling A's response
// by id. Prints what each client saw and exits 1 if a guarantee failed.
//
//   cd clients/typescript && npm run example:relay
//   node build/examples/realtime-relay/driver.js [--coordinator host:port] [--rounds N] [--verbose]
//
// Without --coordinator it runs the respcoord binary (RESPCOORD_SERVER_BIN,
// default target/debug/respcoord under the repository root) on a free port.
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { createServer, connect as tcpConnect } from "node:net";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import { percentile, RelayProcess, round, violations, type RelayLog, type RoundMode, type RoundReport } from "./scenario.js";

/** build/examples/realtime-relay/driver.js -> the repository root. */
const repoRoot = fileURLToPath(new URL("../../../../../", import.meta.url));

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => {
        if (address !== null && typeof address === "object") resolve(address.port);
        else reject(new Error("no port"));
      });
    });
  });
}

function accepts(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const socket = tcpConnect(port, "127.0.0.1");
    socket.once("connect", () => {
      socket.destroy();
      resolve(true);
    });
    socket.once("error", () => {
      resolve(false);
    });
  });
}

/** Runs the respcoord binary on a free loopback port until `stop()`. */
async function startServer(verbose: boolean): Promise<{ target: string; stop(): Promise<void> }> {
  const bin = process.env.RESPCOORD_SERVER_BIN ?? `${repoRoot}target/debug/respcoord`;
  if (!existsSync(bin)) throw new Error(`${bin} is missing: cargo build --locked --bin respcoord, or pass --coordinator host:port`);
  const port = await freePort();
  const child: ChildProcess = spawn(bin, ["serve", "--listen", `127.0.0.1:${port}`], {
    stdio: ["ignore", "ignore", verbose ? "inherit" : "ignore"],
  });
  let exited: string | undefined;
  child.once("exit", (code, signal) => {
    exited = String(code ?? signal);
  });
  const deadline = Date.now() + 20_000;
  while (!(await accepts(port))) {
    if (exited !== undefined) throw new Error(`respcoord exited (${exited})`);
    if (Date.now() > deadline) throw new Error("respcoord did not accept connections within 20 s");
    await new Promise((r) => setTimeout(r, 25));
  }
  return {
    target: `127.0.0.1:${port}`,
    stop: async () => {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const done = new Promise((r) => child.once("exit", r));
      child.kill("SIGTERM");
      await done;
    },
  };
}

function describe(report: RoundReport): string {
  const a = report.a;
  const lines = [
    `${report.mode} on session ${report.sessionId}:`,
    `  A ${a.responseId}: ${a.deltasBeforeBargeIn} deltas before, ${a.deltasInFlight} in flight, ${a.deltasAfterStop} after its response.done ` +
      `(status ${a.status ?? "?"}, reason ${a.reason ?? "?"}; the fence dropped ${a.droppedByFence ?? "?"})`,
    `  stop reached A's relay ${report.stopAtRelayMs.toFixed(2)} ms and A's client ${report.stopAtClientMs.toFixed(2)} ms after B's ${
      report.mode === "barge-in" ? "speech_started" : "response.cancel"
    } (${report.stopAfterReplyMs.toFixed(2)} ms after B's relay had its ${report.mode === "barge-in" ? "Start" : "Cancel"} reply)`,
  ];
  if (report.b !== undefined) {
    const b = report.b;
    lines.push(`  B ${b.responseId}: answered the turn with ${b.deltas} deltas (status ${b.status ?? "?"}, Finish ${b.finished ?? "?"})`);
  }
  lines.push(`  response.done per response: ${Object.entries(report.terminals).map(([id, n]) => `${id}=${n}`).join(", ")}`);
  return lines.join("\n");
}

async function main(): Promise<number> {
  const { values } = parseArgs({
    options: {
      coordinator: { type: "string" },
      rounds: { type: "string", default: "1" },
      verbose: { type: "boolean", default: false },
    },
    strict: true,
  });
  const rounds = Number(values.rounds);
  if (!Number.isInteger(rounds) || rounds < 1) throw new Error(`--rounds must be a positive integer, not ${values.rounds}`);
  const server = values.coordinator === undefined ? await startServer(values.verbose) : undefined;
  const coordinator = values.coordinator ?? server?.target ?? "";
  console.log(`respcoord: ${coordinator}${server === undefined ? "" : " (started by the driver)"}`);
  const relays: RelayProcess[] = [];
  try {
    const print = (log: RelayLog): void => {
      if (values.verbose) console.log(`    [${typeof log.relay === "string" ? log.relay : "?"}] ${JSON.stringify(log)}`);
    };
    // A's replies are long (ten minutes of audio): the barge-in always lands mid-stream.
    const a = await RelayProcess.spawn({ name: "A", coordinator, replyMs: 600_000, hz: 440 }, print);
    relays.push(a);
    const b = await RelayProcess.spawn({ name: "B", coordinator, replyMs: 400, hz: 660 }, print);
    relays.push(b);
    console.log(`relay A: ${a.url}\nrelay B: ${b.url}`);
    const reports: RoundReport[] = [];
    const failures: string[] = [];
    const tag = Date.now().toString(36);
    for (let i = 0; i < rounds; i += 1) {
      for (const mode of ["barge-in", "cancel"] as const satisfies readonly RoundMode[]) {
        const report = await round({ a, b, sessionId: `relay-demo-${tag}-${i}-${mode}`, mode });
        reports.push(report);
        if (rounds === 1 || values.verbose) console.log(describe(report));
        for (const violation of violations(report)) failures.push(`${report.sessionId}: ${violation}`);
      }
    }
    const client = reports.map((r) => r.stopAtClientMs).sort((x, y) => x - y);
    const relay = reports.map((r) => r.stopAtRelayMs).sort((x, y) => x - y);
    const reply = reports.map((r) => r.stopAfterReplyMs).sort((x, y) => x - y);
    const fmt = (sorted: number[]): string =>
      `p50 ${percentile(sorted, 50).toFixed(2)} ms, p99 ${percentile(sorted, 99).toFixed(2)} ms, max ${percentile(sorted, 100).toFixed(2)} ms`;
    const afterStop = reports.reduce((n, r) => n + r.a.deltasAfterStop, 0);
    const inFlight = reports.reduce((n, r) => n + r.a.deltasInFlight, 0);
    console.log(`\n${reports.length} stops (${rounds} barge-in, ${rounds} cancel):`);
    if (rounds > 1) {
      console.log(`  B's relay has its Start/Cancel reply -> A's relay stops: ${fmt(reply)}`);
      console.log(`  B's event -> A's relay stops: ${fmt(relay)}`);
      console.log(`  B's event -> A's client gets response.done: ${fmt(client)}`);
    }
    console.log(`  A's deltas in flight during the stop: ${inFlight}; after A's response.done: ${afterStop}`);
    if (failures.length > 0) {
      console.log(`\nFAILED:\n  ${failures.join("\n  ")}`);
      return 1;
    }
    console.log("  every response ended with exactly one response.done; no audio after a stop: ok");
    return 0;
  } finally {
    await Promise.all(relays.map((r) => r.stop()));
    await server?.stop();
  }
}

main().then(
  (code) => {
    process.exitCode = code;
  },
  (error: unknown) => {
    console.error(`driver: ${error instanceof Error ? error.message : String(error)}`);
    process.exitCode = 1;
  },
);
