// The tiny subset of the OpenAI Realtime API's events the relay speaks, as
// JSON text frames. Client events are parsed defensively (the socket is
// client-influenced input): a bad frame gets an `error` event, never a throw.

/** Events a connected client may send. */
export type ClientEvent =
  | { readonly type: "response.create"; readonly event_id?: string }
  | { readonly type: "response.cancel"; readonly event_id?: string; readonly response_id?: string }
  /**
   * The caller started talking. In OpenAI's API this is a server event (its
   * server VAD); here the client side reports it (a phone leg's or an
   * on-device VAD), so the relay can barge in on the session's response.
   */
  | { readonly type: "input_audio_buffer.speech_started"; readonly event_id?: string }
  /** The caller stopped talking: the relay answers the turn. */
  | { readonly type: "input_audio_buffer.speech_stopped"; readonly event_id?: string }
  /** Caller audio; accepted and dropped (the fake model does not listen). */
  | { readonly type: "input_audio_buffer.append"; readonly event_id?: string; readonly audio: string };

/** Events the relay sends. */
export type ServerEvent =
  | { readonly type: "session.created"; readonly event_id: string; readonly session: { readonly id: string; readonly relay: string } }
  | { readonly type: "response.created"; readonly event_id: string; readonly response: ResponseObject }
  | {
      readonly type: "response.audio.delta";
      readonly event_id: string;
      readonly response_id: string;
      readonly item_id: string;
      readonly output_index: 0;
      readonly content_index: 0;
      /** Base64 of PCM16 mono at 24 kHz. */
      readonly delta: string;
    }
  | {
      readonly type: "response.audio.done";
      readonly event_id: string;
      readonly response_id: string;
      readonly item_id: string;
      readonly output_index: 0;
      readonly content_index: 0;
    }
  | { readonly type: "response.done"; readonly event_id: string; readonly response: ResponseObject }
  | {
      readonly type: "error";
      readonly event_id: string;
      readonly error: { readonly type: string; readonly code: string; readonly message: string; readonly event_id?: string };
    };

export type ResponseStatus = "in_progress" | "completed" | "cancelled" | "failed";

export interface ResponseObject {
  readonly object: "realtime.response";
  /** `resp_<respcoord response id>`: the fencing token, in decimal (beyond 2^53). */
  readonly id: string;
  readonly status: ResponseStatus;
  /** For `cancelled`: respcoord's stop reason; for `failed`: what failed. */
  readonly status_details?: {
    readonly type: "cancelled" | "failed";
    readonly reason?: string;
    readonly error?: { readonly type: string; readonly message: string };
  };
}

/** The wire form of a respcoord response id. */
export function responseName(id: bigint): string {
  return `resp_${id.toString()}`;
}

/** The respcoord id in `resp_<decimal>`, undefined when it is not one (1 to 2^64 - 1). */
export function parseResponseName(name: string): bigint | undefined {
  const match = /^resp_([1-9][0-9]{0,19})$/.exec(name);
  if (match?.[1] === undefined) return undefined;
  const id = BigInt(match[1]);
  return id < 1n << 64n ? id : undefined;
}

/** A parsed client frame, or why it was refused (`code` as OpenAI's error codes). */
export type Parsed =
  | { readonly ok: true; readonly event: ClientEvent }
  | { readonly ok: false; readonly code: string; readonly message: string; readonly eventId?: string };

function optionalString(record: Record<string, unknown>, field: string): string | undefined | null {
  const value = record[field];
  if (value === undefined) return undefined;
  return typeof value === "string" ? value : null;
}

/** Parses one text frame from a client. Never throws. */
export function parseClientEvent(text: string): Parsed {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return { ok: false, code: "invalid_json", message: "the frame is not JSON" };
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    return { ok: false, code: "invalid_event", message: "an event is a JSON object" };
  }
  const record = value as Record<string, unknown>;
  const eventId = optionalString(record, "event_id");
  if (eventId === null) return { ok: false, code: "invalid_event", message: "event_id must be a string" };
  const base = eventId === undefined ? {} : { event_id: eventId };
  const refuse = (code: string, message: string): Parsed =>
    eventId === undefined ? { ok: false, code, message } : { ok: false, code, message, eventId };
  switch (record.type) {
    case "response.create":
    case "input_audio_buffer.speech_started":
    case "input_audio_buffer.speech_stopped":
      return { ok: true, event: { type: record.type, ...base } };
    case "response.cancel": {
      const responseId = optionalString(record, "response_id");
      if (responseId === null) return refuse("invalid_value", "response_id must be a string");
      return { ok: true, event: { type: "response.cancel", ...base, ...(responseId === undefined ? {} : { response_id: responseId }) } };
    }
    case "input_audio_buffer.append": {
      const audio = optionalString(record, "audio");
      if (typeof audio !== "string") return refuse("invalid_value", "audio must be a base64 string");
      return { ok: true, event: { type: "input_audio_buffer.append", ...base, audio } };
    }
    default:
      return refuse(
        "unknown_event",
        typeof record.type === "string" ? `unsupported event type ${JSON.stringify(record.type.slice(0, 64))}` : "type must be a string",
      );
  }
}
