"""What the framework integrations' gates share (pipecat, openai_agents,
livekit): opening the session's watch when a gate begins serving it, the
record of their responses' stops and the bounded maps they keep of recent
responses. Private: each integration re-exports :class:`StopRecord`."""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeVar

from respcoord._enums import StopReason
from respcoord._errors import ClientClosed

if TYPE_CHECKING:
    from respcoord._client import Session

LOCAL_REASONS: Final = frozenset({StopReason.FINISHED, StopReason.RELEASED})
"""Stops a gate made itself (its Finish, or letting go of the handle): they
never interrupt the framework's output."""
TERMINAL_REASONS: Final = frozenset({StopReason.SHUTDOWN, StopReason.EXPIRED})
MAX_RECORDS: Final = 1024
"""How many recent responses a gate remembers in each of its maps."""


def begin_serving(session: Session) -> None:
    """A gate begins serving ``session``: its watch opens now
    (:meth:`Session.open_watch`), so a stop right after the first response's
    Start needs no Watch set-up. A closed client opens nothing: its Starts
    fail, and a gate drops what it cannot start."""
    with contextlib.suppress(ClientClosed):
        session.open_watch()


_K = TypeVar("_K")
_V = TypeVar("_V")


@dataclass(frozen=True, slots=True)
class StopRecord:
    """When this gate learned that one of its responses stopped."""

    reason: StopReason
    observed_at: float
    """``time.monotonic()`` at the moment the gate closed the response."""


def trim(records: OrderedDict[_K, _V], limit: int = MAX_RECORDS) -> None:
    """Forgets the oldest entries beyond ``limit``: a long call must not grow
    a gate's memory without bound."""
    while len(records) > limit:
        records.popitem(last=False)


class StopRecords:
    """The stops of a gate's latest responses (:meth:`get` answers
    ``stop_record``)."""

    __slots__ = ("_records",)

    def __init__(self) -> None:
        self._records: OrderedDict[int, StopRecord] = OrderedDict()

    def get(self, response_id: int) -> StopRecord | None:
        return self._records.get(response_id)

    def record(self, response_id: int, reason: StopReason, *, replace: bool = False) -> None:
        """Notes the stop now; the first one seen is kept unless ``replace``."""
        if replace or response_id not in self._records:
            self._records[response_id] = StopRecord(reason, time.monotonic())
            trim(self._records)


def notify_stop(
    callback: Callable[[int, StopReason], None] | None,
    response_id: int,
    reason: StopReason,
    log: logging.Logger,
) -> None:
    """Calls the application's ``on_stop``; its failure is logged, never
    raised into the gate."""
    if callback is None:
        return
    try:
        callback(response_id, reason)
    except Exception:
        log.exception("on_stop callback failed")
