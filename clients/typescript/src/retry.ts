// Retries: exponential backoff with jitter, a deadline per attempt and one
// for the whole call. The same rules as the Rust client's RetryPolicy.
import { status as GrpcStatus } from "@grpc/grpc-js";

import { abortError, isStatusLike, toRespcoordError, type RespcoordError, type StatusLike } from "./errors.js";

export interface RetryPolicy {
  /** One attempt may take this long (sent to the server as `grpc-timeout`). */
  readonly attemptTimeoutMs: number;
  /** All attempts of one call, backoff included, end this long after it began. */
  readonly deadlineMs: number;
  /**
   * The first backoff; it doubles per attempt up to `maxBackoffMs`. Each sleep
   * is drawn from [backoff/2, backoff], so gateways that lost the coordinator
   * together do not come back in step.
   */
  readonly initialBackoffMs: number;
  readonly maxBackoffMs: number;
  /** At most this many attempts (at least 1). */
  readonly maxAttempts: number;
}

export const defaultRetryPolicy: RetryPolicy = Object.freeze({
  attemptTimeoutMs: 2_000,
  deadlineMs: 10_000,
  initialBackoffMs: 25,
  maxBackoffMs: 1_000,
  maxAttempts: Number.POSITIVE_INFINITY,
});

/**
 * The codes whose failed attempt may be tried again: the transport failed or
 * the attempt ran out of time. Answers about the request itself are final.
 */
const RETRYABLE: ReadonlySet<number> = new Set<number>([
  GrpcStatus.UNAVAILABLE,
  GrpcStatus.DEADLINE_EXCEEDED,
  GrpcStatus.ABORTED,
  GrpcStatus.UNKNOWN,
  GrpcStatus.CANCELLED,
]);

/**
 * How grpc-js words the INTERNAL it makes from a stream that ended without a
 * gRPC status because the server reset it (RST_STREAM, e.g. INTERNAL_ERROR
 * from a replica killed mid-call) or a GOAWAY ended its connection:
 * `Received RST_STREAM with code 2 (Internal server error)`,
 * `Received RST_STREAM with code 0 (Call ended without gRPC status)`,
 * `Received RST_STREAM with code 2 triggered by internal client error: Session closed with error code 2`.
 * grpc-js keeps no other mark of it on the error (no rstCode, empty metadata).
 */
const TRANSPORT_RESET = /^Received RST_STREAM with code \d+/;

/**
 * Whether a failed attempt may be tried again: the transport failed or the
 * attempt ran out of time (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, UNKNOWN,
 * CANCELLED). Answers about the request itself (NOT_FOUND,
 * FAILED_PRECONDITION, INVALID_ARGUMENT, ...) are final, and so is an
 * INTERNAL the server sent. An INTERNAL that grpc-js made from a lost stream
 * (see TRANSPORT_RESET) is not an answer: it is retried.
 */
export function retryable(error: StatusLike): boolean {
  if (error.code === (GrpcStatus.INTERNAL as number)) return TRANSPORT_RESET.test(error.details ?? "");
  return RETRYABLE.has(error.code);
}

/** The jittered backoff before attempt `attempt + 1` (attempts count from 1). */
export function backoffMs(policy: RetryPolicy, attempt: number, random: () => number = Math.random): number {
  const doublings = Math.min(Math.max(attempt - 1, 0), 20);
  const ceiling = Math.min(policy.initialBackoffMs * 2 ** doublings, policy.maxBackoffMs);
  return ceiling / 2 + random() * (ceiling / 2);
}

/** Sleeps, or resolves false early when the signal aborts. Never rejects. */
export function sleep(ms: number, signal?: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    if (signal?.aborted) {
      resolve(false);
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      resolve(false);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve(true);
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

export interface Attempted<T> {
  readonly value: T;
  readonly attempts: number;
}

/**
 * Runs `attempt(deadline)` until it succeeds, fails for good, or the policy
 * runs out; rejects with the mapped error of the last attempt. An abort of
 * `signal` ends it at once with CancelledError (cause: the signal's reason).
 */
export async function withRetry<T>(
  policy: RetryPolicy,
  attempt: (deadline: Date) => Promise<T>,
  signal?: AbortSignal,
): Promise<Attempted<T>> {
  const end = Date.now() + policy.deadlineMs;
  let attempts = 0;
  let lastFailure: RespcoordError | undefined;
  for (;;) {
    if (signal?.aborted) throw abortError(signal);
    const left = end - Date.now();
    // The backoff's sleep overran the deadline: an attempt with no time
    // left could only hide the real failure behind a made-up DEADLINE_EXCEEDED.
    if (lastFailure !== undefined && left <= 0) throw lastFailure;
    attempts += 1;
    const deadline = new Date(Date.now() + Math.min(policy.attemptTimeoutMs, Math.max(left, 1)));
    let failure: unknown;
    try {
      return { value: await attempt(deadline), attempts };
    } catch (error) {
      failure = error;
    }
    if (signal?.aborted) throw abortError(signal);
    const mapped: RespcoordError = toRespcoordError(failure);
    if (!isStatusLike(failure) || !retryable(failure) || attempts >= Math.max(policy.maxAttempts, 1)) {
      throw mapped;
    }
    const pause = backoffMs(policy, attempts);
    if (Date.now() + pause >= end) throw mapped;
    lastFailure = mapped;
    if (!(await sleep(pause, signal)) && signal) throw abortError(signal);
  }
}
