"""Retries: exponential backoff with jitter, a deadline per attempt and one
for the whole call. The same rules as the Rust client's ``RetryPolicy``."""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

from respcoord._errors import error_from_rpc

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How calls are retried. Only calls that are safe to repeat are retried
    at all: Start (it always carries a request id, so a repeat is a replay),
    Finish (its id fences it), Cancel with ``if_response_id``, Shutdown,
    GetState (the session watches' state reads included)."""

    attempt_timeout: float = 2.0
    """One attempt may take this long, in seconds (sent as ``grpc-timeout``)."""
    deadline: float = 10.0
    """All attempts of one call, backoff included, end this long after it
    began; the last error is raised then."""
    initial_backoff: float = 0.025
    """The first backoff; it doubles per attempt up to ``max_backoff``. Each
    sleep is drawn from [backoff/2, backoff], so gateways that lost the
    coordinator together do not come back in step."""
    max_backoff: float = 1.0
    max_attempts: int | None = None
    """At most this many attempts (at least 1); ``None``: until the deadline."""

    def single_attempt(self) -> RetryPolicy:
        """The same deadlines, one attempt."""
        return RetryPolicy(
            attempt_timeout=self.attempt_timeout,
            deadline=self.deadline,
            initial_backoff=self.initial_backoff,
            max_backoff=self.max_backoff,
            max_attempts=1,
        )


_RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
    }
)

# How grpcio words the INTERNAL it makes from a stream that ended without a
# gRPC status because the server reset it (RST_STREAM, e.g. INTERNAL_ERROR
# from a replica killed mid-call): "Received RST_STREAM with error code 2"
# (grpcio 1.71), "Stream removed (RST_STREAM (Received RST_STREAM with error
# code 2))" (newer). grpcio keeps no other mark of it on the error.
_TRANSPORT_RESET = re.compile(
    r"^(?:Stream removed \(RST_STREAM \()?Received RST_STREAM with error code \d+"
)


def retryable(error: grpc.aio.AioRpcError) -> bool:
    """Whether a failed attempt may be tried again: the transport failed or
    the attempt ran out of time (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED,
    UNKNOWN, CANCELLED). Answers about the request itself (NOT_FOUND,
    FAILED_PRECONDITION, INVALID_ARGUMENT, ...) are final, and so is an
    INTERNAL the server sent. An INTERNAL that grpcio made from a lost stream
    (the server reset it, with no gRPC status) is not an answer: retried."""
    code = error.code()
    if code == grpc.StatusCode.INTERNAL:
        return _TRANSPORT_RESET.match(error.details() or "") is not None
    return code in _RETRYABLE


def backoff(policy: RetryPolicy, attempt: int, draw: Callable[[], float] = random.random) -> float:
    """The jittered sleep before attempt ``attempt + 1`` (attempts count from 1)."""
    doublings = min(max(attempt - 1, 0), 20)
    ceiling = min(policy.initial_backoff * (1 << doublings), policy.max_backoff)
    return ceiling / 2 + draw() * (ceiling / 2)


async def with_retry(policy: RetryPolicy, attempt: Callable[[float], Awaitable[_T]]) -> _T:
    """Runs ``attempt(timeout)`` until it succeeds, fails for good, or the
    policy runs out; raises the mapped error of the last attempt. The
    caller's cancellation ends it at once, as anywhere in asyncio."""
    end = time.monotonic() + policy.deadline
    attempts = 0
    limit = max(policy.max_attempts, 1) if policy.max_attempts is not None else None
    failure: grpc.aio.AioRpcError | None = None
    while True:
        left = end - time.monotonic()
        if failure is not None and left <= 0:
            # The backoff's sleep overran the deadline: an attempt with no
            # time left could only hide the real failure behind a made-up
            # DEADLINE_EXCEEDED.
            raise error_from_rpc(failure) from failure
        attempts += 1
        try:
            return await attempt(min(policy.attempt_timeout, max(left, 0.001)))
        except grpc.aio.AioRpcError as error:
            failure = error
        pause = backoff(policy, attempts)
        if (
            not retryable(failure)
            or (limit is not None and attempts >= limit)
            or time.monotonic() + pause >= end
        ):
            raise error_from_rpc(failure) from failure
        await asyncio.sleep(pause)
