"""Batch admission for a batched downstream stage whose first output ends its work (the image
generator: the finished image is the first response).

Such a stage runs every job in its batch one step per iteration, and a step of b jobs costs
more than a step of one: a job's time to its first output is its steps left at the step times
*of the batches it runs in*. The profile's estimate (steps × the solo step) is what a request
would see alone; at a busy stage it is several times too optimistic, so the slack order alone
admits jobs that finish late and spend the stage on work that no longer counts.

Under downstream control the stage measures its own step time per batch size (`StepTimes`) and
chooses, before each step, which jobs run in it (`choose_batch`), from the jobs in service and
the queued ones alike (a job left out keeps its progress; pausing it costs nothing):

1. in deadline order, a job joins if every job chosen so far, and itself, still finishes by its
   deadline (`finish_times`: the batch runs as chosen, jobs leave as they finish and the step
   time follows the batch size);
2. then, in deadline order, the rest fill the places left where they make no chosen job late.

So a job that can still make it is never held back by one that cannot, a late job still runs
whenever it slows nothing on time (nothing is lost), and a stage with jobs never idles.

Pure: times are passed in. Invariants: the choice is at most `max_batch` jobs, non-empty when
any job is given; every job chosen in step 1 finishes by its deadline under the estimate, and
no job of step 2 changes that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ALPHA = 0.25  # EWMA weight of the newest step per batch size


@dataclass(slots=True, frozen=True)
class Work:
    """What admission needs of one job: its absolute deadline and the steps it has left."""

    deadline: float
    steps_left: float  # whole steps in the engine; the fluid simulator has fractions


class StepTimes:
    """A stage's step time per batch size: an EWMA of what it measured at each size.

    A size not measured yet is estimated from the nearest measured smaller size by linear
    scaling (b / k: no batching gain assumed, the safe side for admission), else from the
    nearest larger one, else from the prior (the profile's solo step × b).
    """

    __slots__ = ("_solo_min", "_t", "prior_s")

    def __init__(self, prior_s: float) -> None:
        if not prior_s > 0:
            raise ValueError(f"prior_s must be > 0 (the solo step time), got {prior_s!r}")
        self.prior_s = prior_s
        self._t: dict[int, float] = {}
        self._solo_min: float | None = None  # the fastest single-job step measured

    def observe(self, batch: int, seconds: float) -> None:
        if batch < 1 or not seconds > 0:
            return  # an empty step or a clock glitch says nothing about the service time
        old = self._t.get(batch)
        self._t[batch] = seconds if old is None else old + ALPHA * (seconds - old)
        if batch == 1 and (self._solo_min is None or seconds < self._solo_min):
            self._solo_min = seconds

    def fastest_solo(self) -> float:
        """The fastest a job alone has stepped here (else `at(1)`): the bound for refusing a
        job as late even alone. The EWMA follows the SMs the split grants now; a job judged by
        it would be refused during a moment the stage is squeezed, though the split gives an
        urgent stage its SMs back."""
        return self.at(1) if self._solo_min is None else self._solo_min  # ≤ the EWMA at 1

    def at(self, batch: int) -> float:
        b = max(1, batch)
        t = self._t
        if b in t:
            return t[b]
        lower = [k for k in t if k < b]
        if lower:
            k = max(lower)
            return t[k] * b / k
        higher = [k for k in t if k > b]
        if higher:
            k = min(higher)
            return t[k]  # a smaller batch is at most as slow as a larger one
        return self.prior_s * b


def finish_times(batch: Sequence[Work], now: float, times: StepTimes) -> list[float]:
    """When each job of `batch` finishes if the batch runs as it is: the fewest steps left
    finishes first, and every step costs the step time of the jobs still in it."""
    order = sorted(range(len(batch)), key=lambda i: batch[i].steps_left)
    out = [0.0] * len(batch)
    t, done, left = now, 0, len(batch)
    for i in order:
        t += (batch[i].steps_left - done) * times.at(left)
        done = batch[i].steps_left
        out[i] = t
        left -= 1
    return out


def _meets(batch: Sequence[Work], now: float, times: StepTimes, upto: int) -> bool:
    """Whether the first `upto` jobs of `batch` finish by their deadlines."""
    fin = finish_times(batch, now, times)
    return all(fin[k] <= batch[k].deadline for k in range(upto))


def choose_batch(jobs: Sequence[Work], now: float, times: StepTimes, max_batch: int) -> list[int]:
    """Indices of the jobs to run in the next step (module doc), in the order chosen."""
    order = sorted(range(len(jobs)), key=lambda i: jobs[i].deadline)
    chosen: list[int] = []
    for i in order:  # 1: on-time jobs, earliest deadline first
        if len(chosen) == max_batch:
            return chosen
        trial = [jobs[k] for k in chosen] + [jobs[i]]
        if _meets(trial, now, times, len(trial)):
            chosen.append(i)
    on_time = len(chosen)
    picked = set(chosen)
    for i in order:  # 2: fill with what slows no chosen job past its deadline
        if len(chosen) == max_batch:
            break
        if i in picked:
            continue
        trial = [jobs[k] for k in chosen] + [jobs[i]]
        if _meets(trial, now, times, on_time):
            chosen.append(i)
            picked.add(i)
    return chosen
