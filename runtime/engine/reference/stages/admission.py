"""A downstream stage's waiting jobs under the policy's admission rule.

The rule itself is the control core's (`runtime.downstream`: slack order under HorizonServe,
FIFO for the baselines); this adapter gives the stages the few list operations they use, the
stamp each hand-off carries, and the late count. A job without a stamp (warm-up, calibration
load) has no deadline and goes behind every stamped one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from horizonserve.runtime.config import PolicyName, ServingConfig
from horizonserve.runtime.downstream import AdmissionQueue, Stamp, make_queue
from horizonserve.runtime.policy import make_policy

T = TypeVar("T")
_NO_DEADLINE = Stamp("", "", 0, 0.0, math.inf, 0.0)


def downstream_rules(
    config: ServingConfig, policy: PolicyName | str | None = None
) -> tuple[bool, float | None]:
    """Under `policy` (default: the config's): whether downstream stages admit by slack, and
    the playback margin above which a started stream yields its step (None: never)."""
    p = make_policy(policy or config.policy, config)
    return p.downstream_control, p.playback_margin_s


class StageQueue(Generic[T]):
    __slots__ = ("_clock", "_q", "_slack", "late")

    def __init__(self, slack: bool, clock: Callable[[], float]) -> None:
        self._slack = slack
        self._clock = clock
        # Entries are (job, stamp) tuples, so a drained job keeps its stamp.
        self._q: AdmissionQueue[tuple[T, Stamp]] = make_queue(slack)
        self.late = 0  # jobs admitted after they could no longer meet their deadline

    def set_order(self, slack: bool) -> None:
        """Switch the rule (between runs); queued jobs are re-queued under the new one."""
        if slack == self._slack:
            return
        entries = self._drain()
        self._slack = slack
        self._q = make_queue(slack)
        for entry in entries:
            self._q.push(entry, entry[1], entry[1].downstream_s)

    def append(self, item: T, stamp: Stamp | None) -> None:
        s = stamp or _NO_DEADLINE
        entry = (item, s)
        self._q.push(entry, s, s.downstream_s)

    def popleft(self) -> T:
        got = self._q.pop(self._clock())
        if got is None:
            raise IndexError("pop from an empty stage queue")
        (item, _), late = got
        self.late += late
        return item

    def retain(self, keep: Callable[[T], bool]) -> None:
        """Drop the jobs `keep` rejects (aborts, cancellations); the rest stay queued."""
        for entry in self._drain():
            if keep(entry[0]):
                self._q.push(entry, entry[1], entry[1].downstream_s)

    def take(self, chosen: list[T]) -> None:
        """Remove jobs a batcher admitted from an ordered listing (`__iter__`), counting the
        late ones."""
        picked = {id(c) for c in chosen}
        now = self._clock()
        for entry in self._drain():
            item, stamp = entry
            if id(item) in picked:
                self.late += now > stamp.deadline - stamp.downstream_s
            else:
                self._q.push(entry, stamp, stamp.downstream_s)

    def peek_slack(self) -> float | None:
        """Slack ratio of the job `popleft` would return now (None: empty or no stamp)."""
        u = self._q.peek_slack(self._clock())
        return None if u is None or u == math.inf else u

    def clear(self) -> None:
        self._drain()

    def __iter__(self) -> Iterator[T]:
        """The queued jobs in admission order (as `popleft` would return them now)."""
        entries = self._drain()
        for entry in entries:
            self._q.push(entry, entry[1], entry[1].downstream_s)
        return iter([e[0] for e in entries])

    def _drain(self) -> list[tuple[T, Stamp]]:
        """Everything queued, in admission order, leaving the queue empty (late not counted)."""
        late = self._q.late_popped
        out = []
        while (got := self._q.pop(self._clock())) is not None:
            out.append(got[0])
        self._q.late_popped = late
        return out

    def __len__(self) -> int:
        return len(self._q)

    def __bool__(self) -> bool:
        return len(self._q) > 0


def min_slack(
    queue: StageQueue[T], started: Iterator[tuple[Stamp | None, float]], now: float
) -> float:
    """The smallest slack ratio of a stage's pending first outputs: the queue's next admission
    and each started job, given as (stamp, share of its first-output work still to do), r̂ =
    the stamp's estimate × that share. NaN when nothing with a deadline is pending."""
    best = queue.peek_slack()
    for stamp, left in started:
        if stamp is None:
            continue
        u = stamp.slack_ratio(now, stamp.downstream_s * left)
        if best is None or u < best:
            best = u
    return math.nan if best is None else best
