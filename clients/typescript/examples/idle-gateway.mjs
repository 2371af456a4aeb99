// @ts-check
// A gateway that holds one live response and does nothing else, for
// `respcoord-bench gateways` (what an idle gateway pays for the rest of the
// deployment's traffic); clients/rust/examples/idle_gateway.rs in Node:
//
//     node examples/idle-gateway.mjs ENDPOINT SESSION
//
// Prints `ready` once the response is live; exits 0 when its standard input
// closes, or 3 if the response is stopped meanwhile (the reason on stderr).
// Imports the package by its name: run it from this checkout after
// `npm run build` (dist/), or where the package is installed.
import { Client, Source } from "respcoord";

const [endpoint, session] = process.argv.slice(2);
if (endpoint === undefined || session === undefined) {
  console.error("usage: idle-gateway.mjs ENDPOINT SESSION");
  process.exit(2);
}
const client = await Client.connect(endpoint);
const response = await client.session(session).start(Source.Client);
process.stdout.write("ready\n");

const stdinClosed = new Promise((resolve) => {
  process.stdin.on("end", resolve);
  process.stdin.on("close", resolve);
  process.stdin.on("error", resolve);
  process.stdin.resume();
});
const stopped = response.stopped().then((reason) => {
  console.error(`idle-gateway: the response was stopped: ${reason}`);
  client.close();
  process.exit(3);
});
await Promise.race([stdinClosed, stopped]);
client.close();
process.exit(0);
