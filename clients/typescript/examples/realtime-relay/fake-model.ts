// A stand-in for the model's audio stream: a timer producing base64 PCM16
// chunks (a quiet sine tone, 24 kHz mono) at real-time pace. It takes an
// AbortSignal like a real streaming SDK call, and ends the moment it aborts:
// that is how respcoord's stop reaches the upstream model in this example.
import { setTimeout as sleep } from "node:timers/promises";

export interface FakeModelOptions {
  /** How long the reply is, in audio milliseconds. */
  readonly replyMs: number;
  /** Audio per chunk (and the pause between chunks), in milliseconds. */
  readonly chunkMs: number;
  /** Aborting it ends the stream (no further chunk is produced). */
  readonly signal: AbortSignal;
  /** Tone frequency, so two relays' audio differs when listened to. */
  readonly hz?: number;
}

const SAMPLE_RATE = 24_000;

/** One chunk of PCM16 little-endian mono, starting at sample `offset`. */
export function pcmChunk(offset: number, samples: number, hz: number): Buffer {
  const chunk = Buffer.alloc(samples * 2);
  for (let i = 0; i < samples; i += 1) {
    const value = Math.round(0.2 * 32767 * Math.sin((2 * Math.PI * hz * (offset + i)) / SAMPLE_RATE));
    chunk.writeInt16LE(value, i * 2);
  }
  return chunk;
}

/** The model's reply as base64 chunks; returns early (no throw) once `signal` aborts. */
export async function* fakeModel(options: FakeModelOptions): AsyncGenerator<string, void, undefined> {
  const samples = Math.max(1, Math.round((SAMPLE_RATE * options.chunkMs) / 1000));
  const chunks = Math.max(1, Math.ceil(options.replyMs / options.chunkMs));
  const hz = options.hz ?? 440;
  for (let index = 0; index < chunks; index += 1) {
    if (options.signal.aborted) return;
    try {
      await sleep(options.chunkMs, undefined, { signal: options.signal });
    } catch (error) {
      // The abort: end the stream quietly, like a cancelled SDK stream.
      if (error instanceof Error && error.name === "AbortError") return;
      throw error;
    }
    yield pcmChunk(index * samples, samples, hz).toString("base64");
  }
}
