// A bare HTTP/2 server (Node's node:http2, no gRPC library) for
// test_rules.py, which has no HTTP/2 server in Python's standard library.
//
//   node resetting_server.mjs reset|reset-once|internal
//
// Answers every stream with, by mode:
//   reset       RST_STREAM INTERNAL_ERROR, no headers: a replica killed mid-call;
//   reset-once  the first stream as reset, every later one with an empty
//               reply message (a default GetStateResponse) and status OK;
//   internal    a gRPC status INTERNAL the server sent ("a server bug (stream N)",
//               N counting the streams that reached it).
// Prints its port on one line once it listens; exits when stdin closes.
import http2 from "node:http2";

const mode = process.argv[2];
if (!["reset", "reset-once", "internal"].includes(mode)) {
  console.error(`usage: node resetting_server.mjs reset|reset-once|internal (got ${mode})`);
  process.exit(2);
}

let streams = 0;
const server = http2.createServer();
server.on("session", (session) => {
  session.on("error", () => {});
});
server.on("stream", (stream) => {
  streams += 1;
  // Closing with an error code emits ERR_HTTP2_STREAM_ERROR on our own side too.
  stream.on("error", () => {});
  stream.resume();
  if (mode === "reset" || (mode === "reset-once" && streams === 1)) {
    stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR);
  } else if (mode === "internal") {
    stream.respond(
      {
        ":status": 200,
        "content-type": "application/grpc",
        "grpc-status": "13",
        "grpc-message": `a server bug (stream ${streams})`,
      },
      { endStream: true },
    );
  } else {
    stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true });
    stream.on("wantTrailers", () => {
      stream.sendTrailers({ "grpc-status": "0" });
    });
    // One message, uncompressed, of length 0.
    stream.end(Buffer.alloc(5));
  }
});
server.listen(0, "127.0.0.1", () => {
  console.log(server.address().port);
});
process.stdin.on("end", () => process.exit(0));
process.stdin.resume();
