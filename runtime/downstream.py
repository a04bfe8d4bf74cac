"""Downstream control: the deadline a request carries past the shared stage, slack-ordered
admission for every downstream stage, and playback credit for started speech streams.

Pure like the rest of the control core: every time is passed in, nothing reads a clock.

Hand-off. The shared stage stamps a long-path request once (`Stamp.of`) and the stamp goes with
it into every downstream stage (talker, code-to-waveform, image generator). No stage recomputes
the class or the deadline.

Admission (`SlackQueue`). A downstream stage admits, whenever it has a free place, the request
with the earliest first-response deadline among those that can still meet it; a request that can
no longer meet it (`now > deadline − first_output_s`, its `late_at`) goes behind every meetable
one. Late requests are still served (earliest deadline first among them) and counted; an
engine may refuse them instead (`ControlParams.reject_late`). Invariants: the popped request is
the earliest-deadline meetable one when any exists; a late request is never ahead of a meetable
one; nothing pushed is lost (every request pops exactly once unless removed). `FifoQueue` is the
same interface in arrival order (baselines, and the "w/o downstream control" ablation).

Both queues are O(log n) per operation: a request's `late_at` is fixed when it is pushed, so the
meetable heap is kept lazily: an entry found late at the top moves to the late heap.

Places (`SlackQueue.order` with the places' free times, `place_order`). A stream holds its
place for the whole of its answer, so once every place is taken, earliest deadline first can
spend a place on one long answer while two short ones behind it miss. With each request's work
(its answer's length, pushed with it) and the stage's seconds per unit of work, the queue
orders its first `PLACE_HORIZON` meetable requests as Moore–Hodgson does on parallel machines:
walk them in deadline order over the places' free times; whenever one would start after its
`late_at`, defer the longest walked so far; repeat until every kept one starts in time. The
kept go first (deadline order), the deferred after every other meetable request, the late
last. Where every meetable request can start in time nothing is deferred and the order is
earliest deadline first: the rule only acts once the places cannot serve everyone.

Continuity (`PlaybackClock`). Once a stream's first chunk is out the client plays it in real
time. Credit = audio generated − audio played. A chunk that arrives after the client ran dry is
an underrun (counted per stream; playback resumes when it arrives). A stream holding more credit
than `margin` may yield its step to a request still waiting for its first chunk (`may_yield`),
but only while such a request is in the step and none waits for a place (`streams_may_yield`):
a yielded step frees no place, and a stream paced at real time holds its place for the whole of
its audio, so yielding while requests queue for places would turn the stage's throughput into
waiting.
`realtime_streams` is how many streams a stage can keep at real time; admission stops there.

Saturation (`reported_slack`). What a stage tells the shared stage's slack split
is its most urgent pending first output's slack ratio. While every place is taken and requests
that can still meet their deadlines wait for one, that ratio flatters them: a waiting request
starts only when a place frees (a stream or a job ends), so the stage's step time, not the
request's own work, decides whether it starts in time. Under
`ControlParams.downstream_urgency` 'saturated' such a stage is the pipeline's bottleneck and reports
`SATURATED` (−inf): below every finite slack, so the split gives it the configuration
calibration chose for an urgent downstream side, level with the shared side's own −inf (a
short-path or protected prompt waiting), which keeps its SMs.
"""

from __future__ import annotations

import heapq
import itertools
import math
from bisect import bisect_left, bisect_right, insort
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import attrgetter, itemgetter
from typing import Generic, Protocol, TypeVar

from horizonserve.runtime.profiler import MIN_REMAINING_S, RequestSignals

T = TypeVar("T")

PLACE_HORIZON = 32  # meetable requests `place_order` considers (the rest keep deadline order)
_late_at = itemgetter(0)  # of a `place_order` request
_deadline_seq = attrgetter("deadline", "seq")  # an entry's place in the queue's order
SATURATED = -math.inf  # the slack a saturated stage reports (`reported_slack`)


Slack = TypeVar("Slack", float, "float | None")  # an engine's "none pending": NaN or None


def reported_slack(
    slack: Slack, places_full: bool, queue_slack: float | None, saturated_first: bool
) -> Slack:
    """The slack ratio a downstream stage publishes to the split: `slack` (its most urgent
    pending first output's, in the engine's own form), or `SATURATED` under
    `saturated_first` while every place is taken (`places_full`) and the queue's next
    admission can still start in time (its slack ratio `queue_slack` ≥ 1: now ≤ its
    `late_at`). A queue of late requests only does not count: past capacity they have missed
    already, and SMs taken for them would cost the shared stage's on-time requests."""
    if saturated_first and places_full and queue_slack is not None and queue_slack >= 1.0:
        return SATURATED
    return slack


def place_order(
    now: float, free_at: Sequence[float], requests: Sequence[tuple[float, float]]
) -> list[int]:
    """Which requests to keep so that each starts in time on the places (Moore–Hodgson).

    `requests`: (late_at, occupancy_s ≥ 0) in deadline order; `free_at`: when each place
    frees (≤ now: free). Returns the kept indices in order; the rest would make a kept one miss
    its start. Invariants: walking the kept ones in order, each takes the earliest free place
    and starts by its `late_at`; where all of `requests` can, all are kept. O(k·log p) without
    deferrals, for k requests (≤ PLACE_HORIZON where the queue calls it) and p places; a
    deferral before the walk's position walks the kept ones before it again: O(k²·log p) at
    worst.

    Dropping a request never makes a later one start later (each place frees no later), so
    after a deferral the walk passes again up to the one that missed. A request due to start
    before any place frees (`late_at` below the earliest) misses on any places: the walk
    would defer, one at a time, every kept one before it at least as long (the longest first,
    the first of equals first), then the request itself; that is done in one go.
    """
    if not free_at or not requests:
        return []
    floor = min(free_at)
    floor = floor if floor > now else now  # no place frees earlier
    lead = 0  # the leading requests that miss on any places go, each alone (none before it)
    if floor > requests[0][0]:
        if floor > max(requests, key=_late_at)[0]:
            return []  # no request can start in time on any place: every one is deferred
        while floor > requests[lead][0]:
            lead += 1
    if lead == len(requests) - 1:
        return [lead]  # the one left starts on the first place to free, in time
    first = sorted(free_at)  # sorted: a heap
    free = bisect_right(first, now)
    first[:free] = [now] * free  # a free place starts a request now
    replace = heapq.heapreplace
    places = first.copy()  # the places' free times before the request the walk is at
    pos = 0
    for late_at, occupancy in itertools.islice(requests, lead, None):  # where all start in time
        start = places[0]
        if start > late_at:
            break
        replace(places, start + occupancy)
        pos += 1
    else:
        return list(range(lead, len(requests)))
    kept = list(range(lead, len(requests)))  # the walk goes on at kept[pos], the one that missed
    while pos < len(kept):
        late_at, occupancy = requests[kept[pos]]
        start = places[0]
        if start <= late_at:
            replace(places, start + occupancy)
            pos += 1
            continue
        # Defer the longest of those walked so far, the one that missed included; the walk
        # resumes where the deferred one stood.
        if not pos:  # nothing walked before it: it is the longest
            del kept[0]
            continue
        if floor > late_at:  # it misses on any places: its deferrals in one go (above)
            shorter = [i for i in kept[:pos] if requests[i][1] < occupancy]
            resume = pos
            if len(shorter) < pos:  # the walk resumes at the first one at least as long
                resume = next(q for q, i in enumerate(kept) if requests[i][1] >= occupancy)
            kept[: pos + 1] = shorter
        else:
            lengths = [requests[i][1] for i in kept[: pos + 1]]
            resume = lengths.index(max(lengths))  # the first of the longest, as max keeps
            del kept[resume]
        if resume < pos:  # the places before kept[resume]: the kept ones before it, again
            places = first.copy()
            for i in kept[:resume]:
                replace(places, places[0] + requests[i][1])
        pos = resume
    return kept


@dataclass(slots=True, frozen=True)
class Stamp:
    """What a long-path request carries into every downstream stage (set once, at hand-off)."""

    request_id: str
    class_name: str
    priority: int
    arrival: float
    deadline: float  # absolute first-response deadline (same clock as `arrival`)
    downstream_s: float  # estimated downstream time to the first response, from the profile

    @classmethod
    def of(cls, sig: RequestSignals) -> Stamp:
        c = sig.costs
        left = c.downstream_steps - sig.downstream_steps_done
        return cls(
            sig.request_id,
            c.cls.name,
            int(c.cls.priority),
            sig.arrival,
            sig.deadline,
            left * c.downstream_step_s if left > 0 else 0.0,
        )

    def slack_ratio(self, now: float, first_output_s: float) -> float:
        """u = (d − t) / r̂ at this stage (r̂ floored like the profiler's)."""
        r = first_output_s if first_output_s > MIN_REMAINING_S else MIN_REMAINING_S
        return (self.deadline - now) / r


class AdmissionQueue(Protocol[T]):
    """A downstream stage's waiting queue."""

    late_popped: int  # requests handed out after they could no longer meet their deadline

    def push(self, item: T, stamp: Stamp, first_output_s: float, work: float = 0.0) -> None:
        """Queue `item`; `work`: its length at this stage (units the stage steps through, e.g.
        codes; 0: unknown), read only by `order` with places."""
        ...

    def pop(self, now: float) -> tuple[T, bool] | None:
        """The next request to admit and whether it is late; None when empty."""
        ...

    def order(
        self,
        now: float,
        free_at: Sequence[float] | None = None,
        s_per_work: float = 0.0,
        limit: int | None = None,
    ) -> list[tuple[T, bool]]:
        """The queued requests in admission order, with whether each is late, none removed:
        the first `limit` (every one when None). With the places' free times and the stage's
        seconds per unit of work, a slack queue orders by `place_order` (module doc); without
        them, as `pop` would hand them out."""
        ...

    def peek_slack(self, now: float) -> float | None:
        """Slack ratio of the request `pop` would hand out next (None when empty)."""
        ...

    def take(self, item: T, late: bool) -> None:
        """Remove an item `order` listed, counting it as handed out (late or not)."""
        ...

    def remove(self, item: T) -> bool: ...

    def __len__(self) -> int: ...


class _Entry(Generic[T]):
    __slots__ = ("deadline", "first_s", "in_late", "item", "late_at", "seq", "stamp", "work")

    def __init__(self, item: T, stamp: Stamp, first_s: float, seq: int, work: float) -> None:
        self.item = item
        self.stamp = stamp
        self.deadline = stamp.deadline
        self.first_s = first_s
        self.late_at = stamp.deadline - first_s
        self.seq = seq
        self.work = work
        self.in_late = False  # in SlackQueue's late list


class _Handout(Generic[T]):
    """What both queues share: handing out an item their `order` listed."""

    __slots__ = ("late_popped",)

    def remove(self, item: T) -> bool:
        raise NotImplementedError

    def take(self, item: T, late: bool) -> None:
        """Remove an item `order` listed, counting it as handed out (late or not)."""
        if not self.remove(item):
            raise KeyError("not queued")
        self.late_popped += late


class SlackQueue(_Handout[T]):
    """Earliest deadline first among meetable requests, late ones behind (see module doc).

    Invariant: `_meet` and `_late` hold every live entry once, each list sorted by (deadline,
    seq); an entry of `_meet` may be late (found and moved lazily), one of `_late` is."""

    __slots__ = ("_by_item", "_late", "_live", "_meet", "_seq")

    def __init__(self) -> None:
        self._meet: list[tuple[float, int, _Entry[T]]] = []  # (deadline, seq): maybe meetable
        self._late: list[tuple[float, int, _Entry[T]]] = []  # (deadline, seq): known late
        self._by_item: dict[int, _Entry[T]] = {}  # id(item) -> live entry
        self._seq = itertools.count()
        self._live = 0
        self.late_popped = 0

    def __len__(self) -> int:
        return self._live

    def push(self, item: T, stamp: Stamp, first_output_s: float, work: float = 0.0) -> None:
        key = id(item)
        if key in self._by_item:
            raise ValueError(f"request {stamp.request_id!r} is already queued")
        e = _Entry(item, stamp, first_output_s, next(self._seq), work)
        self._by_item[key] = e
        self._live += 1
        insort(self._meet, (e.deadline, e.seq, e))  # seq is unique: entries never compared

    def _settle(self, now: float) -> None:
        """Move the leading entries found late; afterwards `_meet[0]` is meetable."""
        meet = self._meet
        i = 0
        while i < len(meet) and now > meet[i][2].late_at:
            i += 1
        if i:
            for t in meet[:i]:
                t[2].in_late = True
                insort(self._late, t)
            del meet[:i]

    def _head(self, now: float) -> tuple[_Entry[T], bool] | None:
        self._settle(now)
        if self._meet:
            return self._meet[0][2], False
        if self._late:
            return self._late[0][2], True
        return None

    def pop(self, now: float) -> tuple[T, bool] | None:
        head = self._head(now)
        if head is None:
            return None
        e, late = head
        del (self._late if late else self._meet)[0]
        self._forget(e)
        if late:
            self.late_popped += 1
        return e.item, late

    def peek_slack(self, now: float) -> float | None:
        head = self._head(now)
        return None if head is None else head[0].stamp.slack_ratio(now, head[0].first_s)

    def order(
        self,
        now: float,
        free_at: Sequence[float] | None = None,
        s_per_work: float = 0.0,
        limit: int | None = None,
    ) -> list[tuple[T, bool]]:
        self._settle(now)
        n = self._live if limit is None else min(limit, self._live)
        # The meetable ones in deadline order, as far as the listing (and the rule) reads them;
        # entries found late below the meetable list's head follow the late list's.
        want = n + PLACE_HORIZON if free_at is not None else n
        meet: list[_Entry[T]] = []
        stale: list[_Entry[T]] = []
        for _, _, e in self._meet:
            if now > e.late_at:
                stale.append(e)
            elif len(meet) < want:
                meet.append(e)
            else:
                break
        if (
            free_at is not None
            and s_per_work > 0.0
            and meet
            and (meet[0].work > 0.0 or any(e.work > 0.0 for e in meet))  # the head mostly
        ):
            head = meet[:PLACE_HORIZON]
            kept = place_order(now, free_at, [(e.late_at, e.work * s_per_work) for e in head])
            n_deferred = len(head) - len(kept)  # 0: every one starts in time, deadline order
            if n_deferred and (not kept or kept[0] == n_deferred):  # the first ones deferred
                meet = head[n_deferred:] + meet[PLACE_HORIZON:] + head[:n_deferred]
            elif n_deferred:
                chosen = set(kept)
                deferred = [e for i, e in enumerate(head) if i not in chosen]
                meet = [head[i] for i in kept] + meet[PLACE_HORIZON:] + deferred
        out = [(e.item, False) for e in meet[:n]]
        if len(out) < n:  # the late ones follow: the known late list's and the walk's, merged
            m = n - len(out)
            late = [t[2] for t in self._late[:m]]
            if stale:  # both in (deadline, seq) order: their first m hold the merge's first m
                late = sorted(late + stale[:m], key=_deadline_seq)[:m]
            out += [(e.item, True) for e in late]
        # Late stays late (`late_at` is fixed, the clock only moves on): the late entries the
        # walk crossed move to the late list, so later listings do not cross them again; past
        # 16 of them, every late entry at once (O(n)).
        if len(stale) > 16:
            self._rebuild(now)
        elif stale:
            self._move_late(stale)
        return out

    def _move_late(self, entries: list[_Entry[T]]) -> None:
        """Move these entries, found late in `_meet`, to `_late` (O(log n) each)."""
        meet, late = self._meet, self._late
        for e in entries:
            key = (e.deadline, e.seq)
            t = meet.pop(bisect_left(meet, key))
            assert t[2] is e, "a queued entry is in its list"
            e.in_late = True
            insort(late, t)

    def _rebuild(self, now: float) -> None:
        """Every entry of `_meet` late by `now` moved to `_late`: O(n), called once many
        late entries sit where `order` would walk over them, so later listings do not."""
        meet: list[tuple[float, int, _Entry[T]]] = []
        moved: list[tuple[float, int, _Entry[T]]] = []
        for t in self._meet:
            (meet if now <= t[2].late_at else moved).append(t)
        for t in moved:
            t[2].in_late = True
        self._meet = meet
        self._late = sorted(self._late + moved) if moved else self._late

    def remove(self, item: T) -> bool:
        e = self._by_item.get(id(item))
        if e is None:
            return False
        lst = self._late if e.in_late else self._meet
        i = bisect_left(lst, (e.deadline, e.seq))
        assert lst[i][2] is e, "a queued entry is in its list"
        del lst[i]
        del self._by_item[id(item)]  # `_forget`, inlined: `take` pays this per freed place
        self._live -= 1
        return True

    def _forget(self, e: _Entry[T]) -> None:
        del self._by_item[id(e.item)]
        self._live -= 1


class FifoQueue(_Handout[T]):
    """Arrival order (baselines): the same interface, no reordering."""

    __slots__ = ("_q",)

    def __init__(self) -> None:
        self._q: deque[_Entry[T]] = deque()
        self.late_popped = 0

    def __len__(self) -> int:
        return len(self._q)

    def push(self, item: T, stamp: Stamp, first_output_s: float, work: float = 0.0) -> None:
        self._q.append(_Entry(item, stamp, first_output_s, 0, work))

    def pop(self, now: float) -> tuple[T, bool] | None:
        if not self._q:
            return None
        e = self._q.popleft()
        late = now > e.late_at
        if late:
            self.late_popped += 1
        return e.item, late

    def peek_slack(self, now: float) -> float | None:
        if not self._q:
            return None
        e = self._q[0]
        return e.stamp.slack_ratio(now, e.first_s)

    def remove(self, item: T) -> bool:
        for i, e in enumerate(self._q):
            if e.item is item:
                del self._q[i]
                return True
        return False

    def order(
        self,
        now: float,
        free_at: Sequence[float] | None = None,
        s_per_work: float = 0.0,
        limit: int | None = None,
    ) -> list[tuple[T, bool]]:
        entries = self._q if limit is None else itertools.islice(self._q, limit)
        return [(e.item, now > e.late_at) for e in entries]


def make_queue(slack_order: bool) -> AdmissionQueue:
    """The admission queue a downstream stage uses under a policy (`downstream_control`)."""
    return SlackQueue() if slack_order else FifoQueue()


class PlaybackClock:
    """Real-time playback of one speech stream, from its first chunk on."""

    __slots__ = ("generated_s", "start", "underruns")

    def __init__(self) -> None:
        self.start: float | None = None  # playback start, shifted by every stall
        self.generated_s = 0.0
        self.underruns = 0

    @property
    def started(self) -> bool:
        return self.start is not None

    def on_chunk(self, now: float, seconds: float) -> bool:
        """Account a chunk of `seconds` of audio delivered at `now`; True on an underrun."""
        if self.start is None:
            self.start = now
            self.generated_s = seconds
            return False
        dry = (now - self.start) - self.generated_s  # how long the client has had nothing
        under = dry > 0.0
        if under:
            self.underruns += 1
            self.start += dry  # playback stalled until this chunk arrived
        self.generated_s += seconds
        return under

    def credit(self, now: float) -> float:
        """Audio generated ahead of playback (s); 0 before the first chunk."""
        if self.start is None:
            return 0.0
        return self.generated_s - (now - self.start)

    def may_yield(self, now: float, margin_s: float) -> bool:
        """The stream can skip a step without risking an underrun (credit above the margin)."""
        return self.start is not None and self.credit(now) > margin_s


def streams_may_yield(first_chunk_in_step: bool, waiting_for_place: bool) -> bool:
    """Whether started streams may sit this step out (each then by `PlaybackClock.may_yield`):
    only for a request in this step that still owes its first chunk, and never while a request
    waits for a place (the streams must finish to free one)."""
    return first_chunk_in_step and not waiting_for_place


def realtime_streams(
    step_s: Callable[[int], float], audio_s_per_step: float, max_batch: int
) -> int:
    """How many started streams a stage keeps at real time with step yielding.

    A batch of b streams produces b · audio_s_per_step seconds of audio every step_s(b), so it
    sustains b · audio_s_per_step / step_s(b) real-time streams; the best b up to `max_batch`
    bounds admission. At least 1 (a stage that cannot keep one stream real time still serves).
    """
    best = 0.0
    for b in range(1, max_batch + 1):
        best = max(best, b * audio_s_per_step / step_s(b))
    return max(1, int(best))
