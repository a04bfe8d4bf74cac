"""A downstream stage's waiting jobs under the policy's admission rule.

The rule itself is the control core's (`runtime.downstream`: slack order under HorizonServe,
FIFO for the baselines), or, under `vllm-omni-current`, EDF playback's order
(`runtime.audio_window.EdfQueue`, the one the simulator runs); this adapter gives the stages
the few list operations they use, the stamp each hand-off carries, and the late count. A job
without a stamp (warm-up, calibration load) has no deadline and goes behind every stamped one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from horizonserve.runtime.audio_window import EdfQueue
from horizonserve.runtime.baselines import rules_for
from horizonserve.runtime.config import PolicyName, ServingConfig
from horizonserve.runtime.downstream import AdmissionQueue, Stamp, make_queue
from horizonserve.runtime.engine.reference.protocol import ERROR, Event
from horizonserve.runtime.policy import make_policy

T = TypeVar("T")
_NO_DEADLINE = Stamp("", "", 0, 0.0, math.inf, 0.0)
_Entry = tuple[T, Stamp, float]  # (job, its stamp, its work at this stage)


@dataclass(frozen=True, slots=True)
class DownstreamRules:
    """What a policy asks of a downstream stage."""

    slack: bool = False  # admit by slack (else first come, first served)
    yield_margin_s: float | None = None  # started streams above this credit yield (None: never)
    reject_late: bool = False  # refuse a request that can no longer meet its deadline
    places: bool = False  # list candidates in the place-aware order (`StageQueue.ordered`)
    saturated_first: bool = False  # report SATURATED while full with waiters (`reported_slack`)
    # vllm-omni-current (`runtime.baselines`): a streaming stage's bounded-K active window in
    # EDF order (`runtime.audio_window`); `window_k` is the K asked for (None: the stage's
    # places), capped at the stage's max_num_seqs by `audio_window.window_size`.
    window: bool = False
    window_k: int | None = None
    edf: bool = False  # admit by deadline, no late-last rule (`audio_window.EdfQueue`)


def downstream_rules(
    config: ServingConfig, policy: PolicyName | str | None = None, window: int | None = None
) -> DownstreamRules:
    """The downstream rules under `policy` (default: the config's); `window`: the K of a
    bounded-K window where the policy has one (None: the stage's places)."""
    name = policy or config.policy
    p = make_policy(name, config)
    bounded = rules_for(name).window
    return DownstreamRules(
        p.downstream_control,
        p.playback_margin_s,
        p.reject_late,
        p.place_admission,
        p.saturated_first,
        window=bounded,
        window_k=window if bounded else None,
        edf=bounded,
    )


def make_stage_queue(slack: bool, edf: bool = False) -> AdmissionQueue[Any]:
    """The queue under a rule: slack order, EDF (`vllm-omni-current`'s window) or FIFO."""
    return EdfQueue() if edf and not slack else make_queue(slack)


LATE_REASON = (
    "deadline: this request can no longer meet its first-response SLO at the {stage} stage "
    "(the queue ahead of it is too long); retry later"
)


def refuse_late(
    queue: StageQueue[T],
    rules: DownstreamRules,
    stage: str,
    rid: Callable[[T], str],
    emit: Any,
    first_s: Callable[[T], float] | None = None,
) -> int:
    """Under `reject_late`: drop the queued jobs that can no longer meet their deadline (by
    `first_s` where the stage measures its own service time), each answered with an ERROR
    event whose message the client gets; returns how many."""
    if not rules.reject_late or not queue:
        return 0
    gone = queue.expired(first_s)
    for job in gone:
        emit(
            Event(
                ERROR,
                stage,
                time.monotonic(),
                rid(job),
                {"message": LATE_REASON.format(stage=stage)},
            )
        )
    return len(gone)


class StageQueue(Generic[T]):
    __slots__ = ("_clock", "_edf", "_q", "_slack", "late")

    def __init__(self, slack: bool, clock: Callable[[], float], edf: bool = False) -> None:
        self._slack = slack
        self._edf = edf
        self._clock = clock
        # Entries are (job, stamp, work) tuples, so a drained job keeps its stamp and length.
        self._q: AdmissionQueue[_Entry[T]] = make_stage_queue(slack, edf)
        self.late = 0  # jobs admitted after they could no longer meet their deadline

    def set_order(self, slack: bool, edf: bool = False) -> None:
        """Switch the rule (between runs); queued jobs are re-queued under the new one."""
        if slack == self._slack and edf == self._edf:
            return
        entries = self._drain()
        self._slack, self._edf = slack, edf
        self._q = make_stage_queue(slack, edf)
        for entry in entries:
            self._push(entry)

    def _push(self, entry: _Entry[T]) -> None:
        self._q.push(entry, entry[1], entry[1].downstream_s, entry[2])

    def append(self, item: T, stamp: Stamp | None, work: float = 0.0) -> None:
        """Queue a job; `work`: its length at this stage (e.g. codes to make; 0: unknown)."""
        self._push((item, stamp or _NO_DEADLINE, work))

    def popleft(self) -> T:
        got = self._q.pop(self._clock())
        if got is None:
            raise IndexError("pop from an empty stage queue")
        (item, _, _), late = got
        self.late += late
        return item

    def retain(self, keep: Callable[[T], bool]) -> None:
        """Drop the jobs `keep` rejects (aborts, cancellations); the rest stay queued."""
        for entry in self._drain():
            if keep(entry[0]):
                self._push(entry)

    def take(self, chosen: list[T]) -> None:
        """Remove jobs a batcher admitted from an ordered listing (`__iter__`), counting the
        late ones."""
        picked = {id(c) for c in chosen}
        now = self._clock()
        for entry in self._drain():
            item, stamp, _ = entry
            if id(item) in picked:
                self.late += now > stamp.deadline - stamp.downstream_s
            else:
                self._push(entry)

    def expired(self, first_s: Callable[[T], float] | None = None) -> list[T]:
        """Remove and return the queued jobs that can no longer meet their deadline (for a
        policy that refuses them: `reject_late`); the rest stay queued in order."""
        now = self._clock()
        gone: list[T] = []
        for entry in self._drain():
            item, stamp, _ = entry
            first = stamp.downstream_s if first_s is None else first_s(item)
            if now > stamp.deadline - first:
                gone.append(item)
            else:
                self._push(entry)
        return gone

    def start_slack(self, free_at: Sequence[float], s_per_work: float) -> float | None:
        """The waiting jobs' smallest slack ratio with their wait for a place counted, on
        places freeing at `free_at` (the stage's clock), a unit of work taking `s_per_work`
        (`AdmissionQueue.start_slack`; None: no meetable job waits)."""
        return self._q.start_slack(self._clock(), free_at, s_per_work)

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
            self._push(entry)
        return iter([e[0] for e in entries])

    def ordered(self, free_at: Sequence[float], s_per_work: float, limit: int) -> list[T]:
        """The first `limit` queued jobs in the place-aware admission order
        (`AdmissionQueue.order`): the stage's places free at `free_at` (its clock), a unit of
        work takes `s_per_work`."""
        got = self._q.order(self._clock(), free_at, s_per_work, limit)
        return [e[0] for e, _ in got]

    def _drain(self) -> list[_Entry[T]]:
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
    queue: StageQueue[T] | None, started: Iterator[tuple[Stamp | None, float]], now: float
) -> float:
    """The smallest slack ratio of a stage's pending first outputs: the queue's next admission
    (None: a stage without an admission queue) and each started job, given as (stamp, share of
    its first-output work still to do), r̂ = the stamp's estimate × that share. NaN when
    nothing with a deadline is pending."""
    best = None if queue is None else queue.peek_slack()
    for stamp, left in started:
        if stamp is None:
            continue
        u = stamp.slack_ratio(now, stamp.downstream_s * left)
        if best is None or u < best:
            best = u
    return math.nan if best is None else best
