"""What the front process knows about one request: its record, its handle and why it failed.

A `RequestRecord` is written by the dispatcher thread (stage events) and, when a request ends
without an answer, by whoever finishes it (cancel, abort, supervision, shutdown); the pipeline's
retire step makes that happen once per request (`Pipeline._retire`). A `RequestHandle`'s events
are set only by retiring (`done`) and by the first response or retiring (`first`); a listener
is called on the dispatcher thread and must not block.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from horizonserve.runtime.downstream import PlaybackClock

log = logging.getLogger(__name__.rpartition(".")[0] + ".pipeline")  # the pipeline's logger

# Why a request ended without an answer; the HTTP layer maps these to status codes.
REJECTED = "rejected"  # a stage refused the request itself (400)
UNAVAILABLE = "unavailable"  # a stage it needs failed or the pipeline stops (503)
CANCELLED = "cancelled"  # the client went away (499 in the logs; nobody reads the reply)
TIMED_OUT = "timeout"  # no first response within the client's timeout (504)

MAX_RID_CHARS = 128  # request ids longer than this are refused (memory, logs)


@dataclass
class RequestRecord:
    """One request as the front process saw it (times: monotonic seconds)."""

    rid: str
    class_name: str
    priority: int
    path: str
    metric: str
    slo_s: float
    arrival: float
    scheduled: float | None = None  # prompt entered a shared-stage batch
    first: float | None = None  # first response
    handoff: float | None = None  # left the shared stage (long path)
    done: float | None = None
    shared_tpot_s: float | None = None
    shared_tokens: int | None = None
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    downstream: str | None = None  # the downstream stage of a long-path request
    failure: str | None = None  # REJECTED / UNAVAILABLE / CANCELLED / TIMED_OUT with `error`
    retry_after_s: float | None = None  # UNAVAILABLE: when to try again
    playback: PlaybackClock | None = None  # speech: the listener's playback, first chunk on

    @property
    def queueing_s(self) -> float | None:
        return None if self.scheduled is None else self.scheduled - self.arrival

    @property
    def first_response_s(self) -> float | None:
        return None if self.first is None else self.first - self.arrival

    @property
    def slo_met(self) -> bool | None:
        fr = self.first_response_s
        return None if fr is None else fr <= self.slo_s

    @property
    def stage(self) -> str:
        """The stage holding the request now (by what the front has seen)."""
        if self.downstream is not None and self.handoff is not None:
            return self.downstream
        return "shared"

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.rid,
            "class": self.class_name,
            "priority": self.priority,
            "path": self.path,
            "metric": self.metric,
            "slo_s": self.slo_s,
            "arrival": self.arrival,
            "queueing_s": self.queueing_s,
            "first_response_s": self.first_response_s,
            "slo_met": self.slo_met,
            "handoff_s": None if self.handoff is None else self.handoff - self.arrival,
            "done_s": None if self.done is None else self.done - self.arrival,
            "shared_tpot_s": self.shared_tpot_s,
            "shared_tokens": self.shared_tokens,
            "error": self.error,
            **({"info": self.info} if self.info else {}),
        }


def record_bytes(rec: RequestRecord) -> int:
    """Estimated memory of a finished record (object, id, error, info)."""
    n = sys.getsizeof(rec) + sys.getsizeof(rec.rid) + 400  # floats, short strings, the dict
    if rec.error:
        n += sys.getsizeof(rec.error)
    return n + 120 * len(rec.info)


#: A listener gets (event kind, event data) from the dispatcher thread; it must not block.
Listener = Callable[[str, dict[str, Any]], None]


class RequestHandle:
    __slots__ = ("done", "first", "listener", "record")

    def __init__(self, record: RequestRecord, listener: Listener | None = None) -> None:
        self.record = record
        self.first = threading.Event()
        self.done = threading.Event()
        self.listener = listener

    def wait_first(self, timeout: float | None = None) -> bool:
        return self.first.wait(timeout)

    def wait_done(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)

    def notify(self, kind: str, data: dict[str, Any]) -> None:
        if self.listener is not None:
            try:
                self.listener(kind, data)
            except Exception:  # a listener's bug must not stop the dispatcher
                log.exception("request listener failed")
