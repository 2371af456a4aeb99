// One relay process:
//
//   node build/examples/realtime-relay/serve.js --coordinator 127.0.0.1:50051 --name A --port 8081
//
// Options: --host (default 127.0.0.1), --port (default 0: any free port),
// --reply-ms (the fake model's reply length, default 3000), --chunk-ms
// (audio per delta, default 20), --hz (the tone), --exit-with-stdin (exit
// when stdin closes: the driver's lifeline, so no relay outlives it).
// The coordinator token, if any, comes from RESPCOORD_TOKEN. Logs are JSON
// lines on stdout, the first one `{"event":"listening","url":...}`.
import { parseArgs } from "node:util";

import { Client } from "respcoord";

import { Relay, type LogEvent } from "./relay.js";

function positive(name: string, value: string | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  const parsed = Number(value);
  if (!Number.isFinite(parsed) || parsed <= 0) throw new Error(`--${name} must be a positive number, not ${JSON.stringify(value)}`);
  return parsed;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      coordinator: { type: "string" },
      name: { type: "string", default: "relay" },
      host: { type: "string", default: "127.0.0.1" },
      port: { type: "string", default: "0" },
      "reply-ms": { type: "string" },
      "chunk-ms": { type: "string" },
      hz: { type: "string" },
      "exit-with-stdin": { type: "boolean", default: false },
    },
    strict: true,
  });
  if (values.coordinator === undefined) throw new Error("--coordinator host:port is required");
  const port = Number(values.port);
  if (!Number.isInteger(port) || port < 0 || port > 65_535) throw new Error(`--port must be 0 to 65535, not ${values.port}`);
  const log = (event: LogEvent): void => {
    process.stdout.write(`${JSON.stringify(event)}\n`);
  };
  const token = process.env.RESPCOORD_TOKEN;
  const client = await Client.connect(values.coordinator, token === undefined || token === "" ? {} : { token });
  const relay = await Relay.listen({
    client,
    name: values.name,
    host: values.host,
    port,
    replyMs: positive("reply-ms", values["reply-ms"], 3000),
    chunkMs: positive("chunk-ms", values["chunk-ms"], 20),
    hz: positive("hz", values.hz, 440),
    log,
  });
  let stopping = false;
  const stop = (why: string): void => {
    if (stopping) return;
    stopping = true;
    log({ event: "stopping", relay: relay.name, why });
    relay
      .close()
      .finally(() => {
        client.close();
      })
      .then(
        () => process.exit(0),
        (error: unknown) => {
          console.error(error);
          process.exit(1);
        },
      );
  };
  process.once("SIGTERM", () => {
    stop("SIGTERM");
  });
  process.once("SIGINT", () => {
    stop("SIGINT");
  });
  if (values["exit-with-stdin"]) {
    process.stdin.on("end", () => {
      stop("stdin closed");
    });
    process.stdin.resume();
  }
}

main().catch((error: unknown) => {
  console.error(`relay: ${error instanceof Error ? error.message : String(error)}`);
  process.exit(1);
});
