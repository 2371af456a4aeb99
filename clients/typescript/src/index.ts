// respcoord: the client for Node gateways. See docs/typescript.md.
export {
  Client,
  Response,
  Session,
  MAX_REQUEST_ID_BYTES,
  MAX_SESSION_ID_BYTES,
  newRequestId,
  type CallSignal,
  type CancelOptions,
  type ConnectOptions,
  type Fence,
  type FinishFailed,
  type FinishResult,
  type ResponseContext,
  type RunOutcome,
  type StartOptions,
  type TlsOptions,
} from "./client.js";
export { Finished, Phase, Source, StopReason, Terminal, type SessionState } from "./enums.js";
export {
  AbortedError,
  AlreadyFinishedError,
  CancelledError,
  ClientClosedError,
  ConfigError,
  DeadlineExceededError,
  InternalError,
  InvalidArgumentError,
  NotFoundError,
  OutOfRangeError,
  PermissionDeniedError,
  RespcoordError,
  ResourceExhaustedError,
  ResponseStoppedError,
  SessionTerminatedError,
  UnauthenticatedError,
  UnavailableError,
  errorFromStatus,
  type StatusName,
} from "./errors.js";
export { defaultRetryPolicy, type RetryPolicy } from "./retry.js";
export { DEFAULT_WATCH_LINGER_MS, STREAMS_PER_CONNECTION, type WatchStatus } from "./watch.js";
