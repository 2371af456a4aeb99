// @ts-check
// Quickstart: plain JavaScript, Node 20, no build step. Start a coordinator
// (`respcoord serve --listen 127.0.0.1:50051`), then `node quickstart.mjs`
// (or `node quickstart.mjs host:port`). scripts/install-test.sh runs this
// file against a freshly installed package.
import assert from "node:assert/strict";
import { Client, Source, Terminal } from "respcoord";

const target = process.argv[2] ?? "127.0.0.1:50051";
const client = await Client.connect(target); // UnavailableError if nothing answers
try {
  const session = client.session(`quickstart-${process.pid}-${Date.now()}`);

  // The assistant starts answering: the session's one live response.
  const first = await session.start(Source.Client);
  console.log(`response ${first.id} started`);

  // The user barges in (on this gateway process or any other): a second
  // Start supersedes the first.
  const second = await session.start(Source.Vad);
  assert.equal(second.superseded, first.id);
  console.log(`response ${second.id} started, superseding ${first.id}`);

  // The first response's fence turns false: stop sending its audio. (Check
  // `first.isCurrent()` before every chunk, or abort on `first.signal`.)
  const reason = await first.stopped();
  assert.equal(reason, "superseded");
  assert.equal(first.isCurrent(), false);
  console.log(`response ${first.id} stopped (${reason}); its fence is closed`);

  // The second response runs to its end: report its terminal, exactly once.
  const result = await second.finish(Terminal.Completed);
  assert.equal(result.kind, "applied");
  console.log(`response ${second.id} finished: ${result.kind}`);
} finally {
  client.close();
}
