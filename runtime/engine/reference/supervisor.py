"""Decisions of the stage supervisor (pure: times are passed in).

The front process's supervisor thread asks, every tick, whether each running stage still
counts as alive (`stage_fault`) and, for a failed stage, when to start it again
(`RestartBackoff`). A stage counts as failed when its process exited, or when its heartbeat in
the control record is older than the hang timeout (a hung or SIGSTOPped process), stamped in
the future, or written by a process that is not the stage.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from horizonserve.runtime.monitor.record import FUTURE_SLACK_NS


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    initial_s: float = 0.5  # delay before the first restart
    max_s: float = 30.0  # delays double up to this
    stable_s: float = 60.0  # running this long since the last failure resets the doubling
    max_restarts: int = 10  # more failures than this within `window_s`: liveness fails
    window_s: float = 600.0


@dataclass(slots=True)
class RestartBackoff:
    """Per-stage failure history and the delay before its next start."""

    policy: RestartPolicy = field(default_factory=RestartPolicy)
    failures: deque[float] = field(default_factory=deque)
    consecutive: int = 0

    def failed(self, now: float) -> float:
        """Record a failure at `now`; returns when the stage may start again."""
        p = self.policy
        if self.failures and now - self.failures[-1] > p.stable_s:
            self.consecutive = 0
        self.consecutive += 1
        self.failures.append(now)
        while self.failures and now - self.failures[0] > p.window_s:
            self.failures.popleft()
        return now + min(p.max_s, p.initial_s * 2 ** (self.consecutive - 1))

    def exhausted(self, now: float) -> bool:
        """True when the stage failed more than `max_restarts` times within the window."""
        p = self.policy
        return sum(1 for t in self.failures if now - t <= p.window_s) > p.max_restarts


HEARTBEAT_CONFIRM_S = 0.5  # a heartbeat fault must hold this long (5 idle beats) to count


@dataclass(slots=True)
class FaultConfirmation:
    """A heartbeat fault counts only once it held `HEARTBEAT_CONFIRM_S`: a healthy stage
    rewrites a corrupted heartbeat word within one beat, a hung or stopped one never does. An
    exited process counts at once."""

    since: float | None = None

    def confirmed(self, fault: str | None, exited: bool, now: float) -> bool:
        if fault is None:
            self.since = None
            return False
        if exited:
            self.since = None
            return True
        if self.since is None:
            self.since = now
        if now - self.since >= HEARTBEAT_CONFIRM_S:
            self.since = None
            return True
        return False


def stage_fault(
    *,
    exitcode: int | None,
    pid: int | None,
    beat_ns: int,
    writer_pid: int,
    ready_ns: int,
    now_ns: int,
    hang_ns: int,
) -> str | None:
    """Why a ready stage counts as failed, or None while it is alive.

    `beat_ns`: the stage's last heartbeat in the control record (0: none yet; a stuck or
    corrupt group also reads as 0); `ready_ns`: when it reported ready (the age of a stage
    that has not beaten yet counts from then); `writer_pid`: the pid the record names as the
    writer (0: unknown, not checked; a predecessor's pid before the stage's first write is fine).
    """
    if exitcode is not None:
        return f"process exited with code {exitcode}"
    if beat_ns - now_ns > FUTURE_SLACK_NS:
        return f"heartbeat {(beat_ns - now_ns) / 1e9:.3f} s in the future"
    age_ns = now_ns - max(beat_ns, ready_ns)
    if age_ns > hang_ns:
        return f"no heartbeat for {age_ns / 1e9:.1f} s (hung, stopped or its record is corrupt)"
    if writer_pid and pid and writer_pid != pid and beat_ns >= ready_ns:
        return f"its control-record group is written by pid {writer_pid}, not the stage ({pid})"
    return None
