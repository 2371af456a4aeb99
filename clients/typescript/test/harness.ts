// Real servers on loopback for the tests: the scenario fixture and the
// respcoord binary, found through RESPCOORD_FIXTURE_BIN / RESPCOORD_SERVER_BIN
// (default: target/debug under the repository root).
import { spawn, type ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import { createServer, connect as tcpConnect } from "node:net";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

/** build/test/harness.js -> the repository root. */
export const repoRoot = fileURLToPath(new URL("../../../../", import.meta.url));

export const fixtureBin = process.env.RESPCOORD_FIXTURE_BIN ?? `${repoRoot}target/debug/examples/scenario_fixture`;
export const serverBin = process.env.RESPCOORD_SERVER_BIN ?? `${repoRoot}target/debug/respcoord`;

export interface Scenario {
  readonly id: string;
  readonly server: "fixture" | "binary";
  readonly title: string;
  readonly params?: Record<string, unknown>;
  readonly steps: readonly string[];
  readonly expect: readonly string[];
}

export function loadScenarios(): readonly Scenario[] {
  const file = JSON.parse(readFileSync(`${repoRoot}clients/scenarios/scenarios.json`, "utf8")) as {
    scenarios: Scenario[];
  };
  return file.scenarios;
}

export function numberParam(scenario: Scenario, name: string): number {
  const value = scenario.params?.[name];
  if (typeof value !== "number") throw new Error(`scenario ${scenario.id}: no number param ${name}`);
  return value;
}

export function stringParam(scenario: Scenario, name: string): string {
  const value = scenario.params?.[name];
  if (typeof value !== "string") throw new Error(`scenario ${scenario.id}: no string param ${name}`);
  return value;
}

/** Polls `done` until it holds; fails after the patience bound of `within`. */
export async function until(what: string, done: () => boolean | Promise<boolean>, ms = 20_000): Promise<void> {
  await within(
    what,
    (async () => {
      while (!(await done())) await new Promise((r) => setTimeout(r, 2));
    })(),
    ms,
  );
}

/** Fails a "did it happen at all" wait after a generous time (never a timing assertion). */
export async function within<T>(what: string, promise: Promise<T>, ms = 20_000): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      reject(new Error(`${what}: did not happen within ${ms} ms`));
    }, ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

export interface FixtureAddresses {
  readonly grpc: string;
  readonly proxy: string;
  readonly control: string;
}

/** A running scenario_fixture (stdin kept open: it exits when stdin closes). */
export class Fixture {
  readonly addresses: FixtureAddresses;
  readonly #child: ChildProcess;

  private constructor(child: ChildProcess, addresses: FixtureAddresses) {
    this.#child = child;
    this.addresses = addresses;
  }

  static async start(args: readonly string[] = []): Promise<Fixture> {
    const child = spawn(fixtureBin, ["serve", ...args], { stdio: ["pipe", "pipe", "pipe"] });
    const stderr: string[] = [];
    child.stderr.on("data", (chunk: Buffer) => {
      if (stderr.length < 200) stderr.push(chunk.toString());
    });
    const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream });
    const first = new Promise<string>((resolve, reject) => {
      lines.once("line", resolve);
      child.once("error", reject);
      child.once("exit", (code) => {
        reject(new Error(`scenario_fixture exited (${code}): ${stderr.join("")}`));
      });
    });
    const line = await within("the fixture prints its addresses", first);
    lines.close();
    return new Fixture(child, JSON.parse(line) as FixtureAddresses);
  }

  async #control(method: string, path: string): Promise<Response> {
    const reply = await fetch(`${this.addresses.control}${path}`, { method });
    if (!reply.ok) throw new Error(`${method} ${path}: HTTP ${reply.status}`);
    return reply;
  }

  async finishes(responseId: bigint): Promise<number> {
    const reply = await this.#control("GET", `/finishes/${responseId}`);
    return ((await reply.json()) as { count: number }).count;
  }

  async starts(): Promise<number> {
    return ((await (await this.#control("GET", "/starts")).json()) as { count: number }).count;
  }

  async loseNextStartReply(): Promise<void> {
    await this.#control("POST", "/lose-next-start-reply");
  }

  async cut(): Promise<void> {
    await this.#control("POST", "/cut");
  }

  /** The next Watch call waits, before the server sees it, until `releaseWatches`. */
  async holdNextWatch(): Promise<void> {
    await this.#control("POST", "/hold-next-watch");
  }

  /** Watch calls waiting at the hold. */
  async heldWatches(): Promise<number> {
    return ((await (await this.#control("GET", "/held-watches")).json()) as { count: number }).count;
  }

  async releaseWatches(): Promise<void> {
    await this.#control("POST", "/release-watches");
  }

  async stop(): Promise<void> {
    const exited = new Promise((resolve) => this.#child.once("exit", resolve));
    if (this.#child.exitCode === null) {
      this.#child.stdin?.end();
      this.#child.kill("SIGTERM");
      await exited;
    }
  }

  /** Runs `scenario_fixture certs DIR`. */
  static async certs(dir: string): Promise<void> {
    await runToEnd(fixtureBin, ["certs", dir]);
  }
}

function runToEnd(bin: string, args: readonly string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(bin, args, { stdio: ["ignore", "ignore", "inherit"] });
    child.once("error", reject);
    child.once("exit", (code) => {
      if (code === 0) resolve();
      else reject(new Error(`${bin} ${args.join(" ")}: exit ${code}`));
    });
  });
}

/** A free loopback port (bound, then released). */
export function freePort(): Promise<number> {
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

function portAccepts(port: number): Promise<boolean> {
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

/** The real respcoord binary on a fixed port. */
export class Binary {
  readonly port: number;
  readonly #child: ChildProcess;

  private constructor(child: ChildProcess, port: number) {
    this.#child = child;
    this.port = port;
  }

  static async start(port: number, args: readonly string[] = []): Promise<Binary> {
    const child = spawn(serverBin, ["serve", "--listen", `127.0.0.1:${port}`, ...args], {
      stdio: ["ignore", "ignore", "ignore"],
    });
    let exited: number | null | undefined;
    child.once("exit", (code) => {
      exited = code;
    });
    await within(
      "the respcoord binary accepts connections",
      (async () => {
        for (;;) {
          if (exited !== undefined) throw new Error(`respcoord exited (${exited})`);
          if (await portAccepts(port)) return;
          await new Promise((r) => setTimeout(r, 25));
        }
      })(),
    );
    return new Binary(child, port);
  }

  get target(): string {
    return `127.0.0.1:${this.port}`;
  }

  async kill(signal: NodeJS.Signals = "SIGKILL"): Promise<void> {
    if (this.#child.exitCode !== null || this.#child.signalCode !== null) return;
    const exited = new Promise((resolve) => this.#child.once("exit", resolve));
    this.#child.kill(signal);
    await exited;
  }
}

/** Percentile of sorted values (nearest rank). */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[rank] ?? Number.NaN;
}

/** A deterministic xorshift generator, so a failing round can be replayed. */
export class Rng {
  #state: number;

  constructor(seed: number) {
    this.#state = seed >>> 0 || 1;
  }

  /** An integer in [0, below). */
  below(below: number): number {
    let x = this.#state;
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    this.#state = x;
    return x % below;
  }
}

/** Sleeps about `micros` microseconds (sub-millisecond values yield to the event loop once). */
export function sleepMicros(micros: number): Promise<void> {
  if (micros < 1000) return new Promise((r) => setImmediate(r));
  return new Promise((r) => setTimeout(r, micros / 1000));
}
