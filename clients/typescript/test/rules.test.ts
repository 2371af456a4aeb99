// The rules written once for every client (clients/scenarios/rules.json):
// this client's id validation, retry classification and stop reasons must say
// what the file says. The Rust and Python clients have the same test; a rule
// changed in one place fails until all three agree.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { describe, test } from "node:test";

import { credentials, Metadata, status as GrpcStatus, type ServiceError } from "@grpc/grpc-js";

import { validateRequestId, validateSessionId } from "../src/client.js";
import { stopReasonFromCancel } from "../src/enums.js";
import * as pb from "../src/gen/respcoord/v1/coordinator.js";
import { Client, InternalError, InvalidArgumentError, MAX_REQUEST_ID_BYTES, MAX_SESSION_ID_BYTES, StopReason } from "../src/index.js";
import { retryable } from "../src/retry.js";
import { within } from "./harness.js";

interface IdCase {
  readonly field: string;
  readonly value?: string;
  readonly repeat?: string;
  readonly times?: number;
  readonly valid: boolean;
  readonly note?: string;
}

interface Rules {
  readonly version: number;
  readonly ids: {
    readonly session_id: { readonly max_bytes: number };
    readonly request_id: { readonly max_bytes: number };
    readonly cases: readonly IdCase[];
  };
  readonly retry: {
    readonly retryable: readonly string[];
    readonly final: readonly string[];
    readonly internal_from_the_transport: string;
  };
  readonly stop_reasons: {
    readonly names: readonly string[];
    readonly from_cancel_reason: Readonly<Record<string, string>>;
  };
}

/** build/test/rules.test.js -> the client's folder (clients/typescript/); the rules are beside it. */
const clientDir = new URL("../../", import.meta.url);
const rulesFile = new URL("../scenarios/rules.json", clientDir);
const rules = JSON.parse(readFileSync(rulesFile, "utf8")) as Rules;

function caseValue(c: IdCase): string {
  if (c.value !== undefined) return c.value;
  if (c.repeat !== undefined && c.times !== undefined) return c.repeat.repeat(c.times);
  throw new Error(`a case needs value or repeat and times: ${JSON.stringify(c)}`);
}

function caseName(c: IdCase): string {
  const shown = c.value !== undefined ? JSON.stringify(c.value) : `${JSON.stringify(c.repeat)} * ${String(c.times)}`;
  return `${c.field} ${shown} is ${c.valid ? "accepted" : "refused"}`;
}

/** What the client refuses before sending: its own validation of each field. */
const VALIDATE: Readonly<Record<string, (value: unknown) => string>> = {
  session_id: validateSessionId,
  request_id: validateRequestId,
};

/** The 16 codes besides OK, by their canonical names. */
const STATUS_NAMES: readonly string[] = Object.keys(GrpcStatus).filter((key) => Number.isNaN(Number(key)) && key !== "OK");

function statusCode(name: string): number {
  const code: unknown = (GrpcStatus as unknown as Record<string, unknown>)[name];
  assert.equal(typeof code, "number", `${name} is not a gRPC status code`);
  return code as number;
}

void describe("the shared rules (clients/scenarios/rules.json)", () => {
  void test("the file is the version this test reads", () => {
    assert.equal(rules.version, 1);
  });

  void test("the id limits are the rules' max_bytes", () => {
    assert.equal(MAX_SESSION_ID_BYTES, rules.ids.session_id.max_bytes);
    assert.equal(MAX_REQUEST_ID_BYTES, rules.ids.request_id.max_bytes);
    assert.ok(rules.ids.cases.length > 10);
  });

  void describe("every id case is accepted or refused (naming the field) as the rules say", () => {
    for (const c of rules.ids.cases) {
      void test(caseName(c), () => {
        const validate = VALIDATE[c.field];
        assert.ok(validate, `unknown field ${c.field}`);
        const value = caseValue(c);
        if (c.valid) {
          assert.equal(validate(value), value);
        } else {
          assert.throws(
            () => validate(value),
            (e: unknown) => e instanceof InvalidArgumentError && e.field === c.field && e.code === "INVALID_ARGUMENT",
          );
        }
      });
    }
  });

  void test("the file classifies every status code, each once", () => {
    const retried = new Set(rules.retry.retryable);
    const final = new Set(rules.retry.final);
    assert.equal(STATUS_NAMES.length, 16);
    assert.equal(retried.size, rules.retry.retryable.length, "a code listed twice in retryable");
    assert.equal(final.size, rules.retry.final.length, "a code listed twice in final");
    for (const name of retried) assert.ok(!final.has(name), `${name} is both retryable and final`);
    assert.deepEqual([...retried, ...final].sort(), [...STATUS_NAMES].sort());
  });

  void test("every status code the server sends is retried or final as the rules say", () => {
    for (const name of rules.retry.retryable) {
      assert.equal(retryable({ code: statusCode(name), details: "from the server" }), true, `${name} is retryable`);
    }
    for (const name of rules.retry.final) {
      assert.equal(retryable({ code: statusCode(name), details: "from the server" }), false, `${name} is final`);
    }
  });

  void test("every cancel reason on the wire maps to the stop reason the rules name", () => {
    const wireNames = Object.keys(pb.CancelReason).filter((key) => Number.isNaN(Number(key)) && key !== "UNRECOGNIZED");
    assert.deepEqual(Object.keys(rules.stop_reasons.from_cancel_reason).sort(), wireNames.sort());
    for (const [name, stop] of Object.entries(rules.stop_reasons.from_cancel_reason)) {
      const wire = pb.CancelReason[name as keyof typeof pb.CancelReason];
      assert.equal(stopReasonFromCancel(wire), stop, name);
    }
  });

  void test("StopReason has exactly the rules' names", () => {
    assert.deepEqual(Object.values(StopReason).sort(), [...rules.stop_reasons.names].sort());
  });
});

type Answer = "reset" | "goaway" | "internal" | "ok";

interface Http2Server {
  readonly address: string;
  /** Streams (calls) that reached the server. */
  streams(): number;
  close(): Promise<void>;
}

/**
 * A bare HTTP/2 server (no gRPC library) answering the n-th stream with
 * `answer(n)`: `reset` ends it with RST_STREAM INTERNAL_ERROR and no headers
 * (a replica killed mid-call), `goaway` ends its connection with GOAWAY
 * INTERNAL_ERROR, `internal` is a gRPC status INTERNAL the server sent, `ok`
 * an empty reply message (a default GetStateResponse).
 */
async function http2Server(answer: (stream: number) => Answer): Promise<Http2Server> {
  const server = http2.createServer();
  const sessions = new Set<http2.ServerHttp2Session>();
  let streams = 0;
  server.on("session", (session) => {
    sessions.add(session);
    session.on("error", () => undefined);
    session.on("close", () => sessions.delete(session));
  });
  server.on("stream", (stream) => {
    streams += 1;
    // Closing with an error code emits ERR_HTTP2_STREAM_ERROR on our own side too.
    stream.on("error", () => undefined);
    stream.resume();
    switch (answer(streams)) {
      case "reset":
        stream.close(http2.constants.NGHTTP2_INTERNAL_ERROR);
        break;
      case "goaway":
        stream.session?.goaway(http2.constants.NGHTTP2_INTERNAL_ERROR);
        break;
      case "internal":
        stream.respond(
          { ":status": 200, "content-type": "application/grpc", "grpc-status": "13", "grpc-message": "a server bug" },
          { endStream: true },
        );
        break;
      case "ok":
        stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true });
        stream.on("wantTrailers", () => {
          stream.sendTrailers({ "grpc-status": "0" });
        });
        // One message, uncompressed, of length 0.
        stream.end(Buffer.alloc(5));
        break;
    }
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    address: `127.0.0.1:${port}`,
    streams: () => streams,
    close: async () => {
      for (const session of sessions) session.destroy();
      await new Promise<void>((resolve) => server.close(() => { resolve(); }));
    },
  };
}

/** One GetState through the generated stub, no retries: the error grpc-js reports. */
async function rawGetState(address: string): Promise<ServiceError> {
  const raw = new pb.ResponseCoordinatorClient(address, credentials.createInsecure());
  try {
    return await within(
      "the call ends",
      new Promise<ServiceError>((resolve, reject) => {
        raw.getState({ sessionId: "s" }, new Metadata(), { deadline: Date.now() + 5_000 }, (error) => {
          if (error) resolve(error);
          else reject(new Error("the call succeeded"));
        });
      }),
    );
  } finally {
    raw.close();
  }
}

void describe("an INTERNAL from the transport (rules: retry.internal_from_the_transport)", () => {
  void test("the rules say it is retried", () => {
    assert.match(rules.retry.internal_from_the_transport, /^retryable: /);
  });

  void test("a reset stream: grpc-js reports INTERNAL with its reset details, and retryable() retries it", async () => {
    const server = await http2Server(() => "reset");
    try {
      const error = await rawGetState(server.address);
      assert.equal(error.code, GrpcStatus.INTERNAL, error.message);
      assert.equal(error.details, "Received RST_STREAM with code 2 (Internal server error)");
      assert.equal(retryable(error), true);
    } finally {
      await server.close();
    }
  });

  void test("a connection ended by GOAWAY INTERNAL_ERROR mid-call is retried too", async () => {
    const server = await http2Server(() => "goaway");
    try {
      const error = await rawGetState(server.address);
      assert.equal(error.code, GrpcStatus.INTERNAL, error.message);
      assert.match(error.details, /^Received RST_STREAM with code 2 /);
      assert.equal(retryable(error), true);
    } finally {
      await server.close();
    }
  });

  void test("the client retries a reset stream: the next attempt is answered", async () => {
    const server = await http2Server((n) => (n === 1 ? "reset" : "ok"));
    const client = await Client.connect(`http://${server.address}`, { lazy: true });
    try {
      const state = await within("GetState", client.getState("s"));
      assert.equal(state.phase, "idle");
      assert.equal(server.streams(), 2);
    } finally {
      client.close();
      await server.close();
    }
  });

  void test("the client gives up on resets only when the policy does", async () => {
    const server = await http2Server(() => "reset");
    const client = await Client.connect(`http://${server.address}`, {
      lazy: true,
      retry: { maxAttempts: 3, initialBackoffMs: 1, maxBackoffMs: 2 },
    });
    try {
      await assert.rejects(
        within("GetState", client.getState("s")),
        (e: unknown) => e instanceof InternalError && e.code === "INTERNAL",
      );
      assert.equal(server.streams(), 3);
    } finally {
      client.close();
      await server.close();
    }
  });

  void test("an INTERNAL the server sent is final: one attempt", async () => {
    const server = await http2Server(() => "internal");
    const client = await Client.connect(`http://${server.address}`, {
      lazy: true,
      retry: { maxAttempts: 3, initialBackoffMs: 1, maxBackoffMs: 2 },
    });
    try {
      const error = await rawGetState(server.address);
      assert.equal(error.code, GrpcStatus.INTERNAL);
      assert.equal(error.details, "a server bug");
      assert.equal(retryable(error), false);
      const before = server.streams();
      await assert.rejects(
        within("GetState", client.getState("s")),
        (e: unknown) => e instanceof InternalError && e.code === "INTERNAL" && e.message === "INTERNAL: a server bug",
      );
      assert.equal(server.streams() - before, 1);
    } finally {
      client.close();
      await server.close();
    }
  });
});
