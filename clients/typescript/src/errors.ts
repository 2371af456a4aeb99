// Every error the client raises derives from RespcoordError and keeps its
// cause. gRPC status codes become error classes in ONE place:
// `errorFromStatus`.
import { status as GrpcStatus } from "@grpc/grpc-js";

import type { StopReason } from "./enums.js";

/** A gRPC status code's canonical name (`NOT_FOUND`, ...). */
export type StatusName = keyof typeof GrpcStatus;

export interface ErrorOptions {
  readonly cause?: unknown;
  /** The gRPC code this error came from, if any. */
  readonly code?: StatusName;
}

/** The root of every error this package raises. */
export class RespcoordError extends Error {
  /** The gRPC status code, when the error came from (or stands for) one. */
  readonly code: StatusName | undefined;

  constructor(message: string, options: ErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = options.code;
  }
}

/** Bad input, refused locally or by the server (INVALID_ARGUMENT). `field` is the wire name. */
export class InvalidArgumentError extends RespcoordError {
  readonly field: string;
  readonly reason: string;

  constructor(field: string, reason: string, options: ErrorOptions = {}) {
    super(`${field}: ${reason}`, { code: "INVALID_ARGUMENT", ...options });
    this.field = field;
    this.reason = reason;
  }
}

/** Bad connection settings (target, TLS files, token). `field` names the option. */
export class ConfigError extends RespcoordError {
  readonly field: string;

  constructor(field: string, reason: string, options: ErrorOptions = {}) {
    super(`${field}: ${reason}`, options);
    this.field = field;
  }
}

/** NOT_FOUND: the session does not exist. */
export class NotFoundError extends RespcoordError {}
/** FAILED_PRECONDITION: the session is terminated; no response starts after teardown. */
export class SessionTerminatedError extends RespcoordError {}
/** PERMISSION_DENIED: a known caller outside its token's scope. */
export class PermissionDeniedError extends RespcoordError {}
/** UNAUTHENTICATED: no token, or an unknown one. */
export class UnauthenticatedError extends RespcoordError {}
/** UNAVAILABLE (after the retries ran out): the coordinator could not be reached. */
export class UnavailableError extends RespcoordError {}
/** DEADLINE_EXCEEDED (after the retries ran out). */
export class DeadlineExceededError extends RespcoordError {}
/** RESOURCE_EXHAUSTED: a server limit (sessions, watchers, in-flight calls). */
export class ResourceExhaustedError extends RespcoordError {}
/** OUT_OF_RANGE: a watch position the coordinator no longer retains. */
export class OutOfRangeError extends RespcoordError {}
/** ABORTED: the backend's compare-and-set lost a race too often. */
export class AbortedError extends RespcoordError {}
/**
 * CANCELLED: the call was cancelled; when the caller's AbortSignal did it,
 * `cause` is the signal's reason.
 */
export class CancelledError extends RespcoordError {}
/** Any other code (UNKNOWN, INTERNAL, UNIMPLEMENTED, DATA_LOSS, ...): `code` says which. */
export class InternalError extends RespcoordError {}

/** Local: `finish()` was called a second time on the same response. */
export class AlreadyFinishedError extends RespcoordError {}
/** Local: the client was closed. */
export class ClientClosedError extends RespcoordError {}

/**
 * The reason a response's AbortSignal fires with: `signal.throwIfAborted()`
 * in a body throws this, so the stop is typed too.
 */
export class ResponseStoppedError extends RespcoordError {
  readonly reason: StopReason;
  readonly responseId: bigint;

  constructor(responseId: bigint, reason: StopReason) {
    super(`response ${responseId} stopped: ${reason}`);
    this.reason = reason;
    this.responseId = responseId;
  }
}

/** What grpc-js rejects a call with (ServiceError), reduced to what the mapping reads. */
export interface StatusLike {
  readonly code: number;
  readonly details?: string;
  readonly message?: string;
}

export function isStatusLike(error: unknown): error is StatusLike {
  return typeof error === "object" && error !== null && typeof (error as { code?: unknown }).code === "number";
}

export function statusName(code: number): StatusName {
  const name = GrpcStatus[code];
  return (name ?? "UNKNOWN") as StatusName;
}

const FIELD = /^([a-z_][a-z0-9_.]*): (.*)$/s;

type StatusErrorClass = new (message: string, options: ErrorOptions) => RespcoordError;

/** The one mapping from gRPC status codes to error classes (INVALID_ARGUMENT is handled apart: it names a field). */
const BY_CODE: ReadonlyMap<number, StatusErrorClass> = new Map<number, StatusErrorClass>([
  [GrpcStatus.NOT_FOUND, NotFoundError],
  [GrpcStatus.FAILED_PRECONDITION, SessionTerminatedError],
  [GrpcStatus.PERMISSION_DENIED, PermissionDeniedError],
  [GrpcStatus.UNAUTHENTICATED, UnauthenticatedError],
  [GrpcStatus.UNAVAILABLE, UnavailableError],
  [GrpcStatus.DEADLINE_EXCEEDED, DeadlineExceededError],
  [GrpcStatus.RESOURCE_EXHAUSTED, ResourceExhaustedError],
  [GrpcStatus.OUT_OF_RANGE, OutOfRangeError],
  [GrpcStatus.ABORTED, AbortedError],
  [GrpcStatus.CANCELLED, CancelledError],
]);

export function errorFromStatus(error: StatusLike): RespcoordError {
  const code = statusName(error.code);
  const details = error.details ?? error.message ?? "";
  const options = { cause: error, code };
  if (error.code === (GrpcStatus.INVALID_ARGUMENT as number)) {
    const match = FIELD.exec(details);
    return new InvalidArgumentError(match?.[1] ?? "request", match?.[2] ?? details, options);
  }
  const ErrorClass = BY_CODE.get(error.code) ?? InternalError;
  return new ErrorClass(`${code}: ${details}`, options);
}

/** Any thrown value as a RespcoordError (statuses mapped, others wrapped). */
export function toRespcoordError(error: unknown): RespcoordError {
  if (error instanceof RespcoordError) return error;
  if (isStatusLike(error)) return errorFromStatus(error);
  return new InternalError(error instanceof Error ? error.message : String(error), { cause: error });
}

/** The error a call rejects with when the caller's signal aborted it. */
export function abortError(signal: AbortSignal): CancelledError {
  return new CancelledError("the caller's signal aborted the call", { cause: signal.reason, code: "CANCELLED" });
}
