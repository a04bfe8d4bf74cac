"""Spatial control: the shared stage's SM cap from downstream activity and memory pressure.

Eq. (1): with no downstream stage active the shared stage gets S_aggr; while one is active it
gets snap(S_min + ρ (S_cap − S_min)) with ρ = clamp(B̂ / B_sat, 0, 1) and B̂ the EWMA of the
memory-activity signal. Invariants: never above S_cap while downstream is active; the cap moves
only when the snapped target is at least `hysteresis_steps` ladder steps from the current level
(1, the default: any level change; the EWMA does the smoothing); the downstream stage gets
S_tot − s_shared.

Urgent prefill: the cap is a bandwidth argument (capped decode loses little), and prefill is
compute-bound, so an iteration whose prefill carries an urgent prompt (see
`SchedulingPolicy.prefill_sms`) may run that prefill at `SmDecision.prefill` = S_aggr while its
decode keeps the cap; the downstream headroom published for the step does not change.

Backlog lift: the cap assumes the shared stage has time to spare. When its running set is full
and requests wait for a place (`backlog`; `boost` 'backlog', where calibration's
`backlog_lift_pays`), it is the bottleneck instead, and capped decode
(58 % slower at 64 SMs with a batch of ~30 on the H200) only lengthens the queue; the step then
runs at S_aggr (level LIFTED) until the backlog clears. The published downstream headroom is 0,
and a downstream stage keeps its guaranteed S_tot − S_cap.

Slack split (`sm_split` 'slack', beyond Eq. 1): while co-running, the split follows both sides'
most urgent runnable request. The engines pass each side's smallest slack ratio u (None: no
first response pending on that side; −inf on the shared side: a short-path prompt or a
protected request waits, `SchedulingPolicy._shared_slack`; −inf on the downstream side: a
stage's places are all taken while requests wait, `runtime.downstream.reported_slack`; the
shared side keeps its SMs when both are −inf).
When the downstream side's u is the smaller, the shared stage drops to the reservation
(level RESERVED: `SmLadder.s_reserve`, S_min unless calibration chose fewer) and the downstream
gets the rest; otherwise the shared stage takes Eq. (1)'s level, which stays the bound. While
the shared stage is the bottleneck (prompts wait for their prefill, or its running set was
full with requests waiting within `shared_hold_s`), the policy passes no downstream slack: the
downstream side does not take its SMs. An idle side gets nothing reserved: no downstream work
→ S_aggr; the engines give a downstream stage the whole GPU while the shared stage has nothing
to run.

Calibration decides, per pipeline, which configuration serves each side best (each the same kind
of measurement as the backlog lift; `config.SharingVerdicts`): `throttling_pays` False (uncapped
co-running under MPS costs the shared stage no more than the cap) makes the shared side's level
OPEN, the whole GPU under MPS beside the downstream, instead of Eq. (1)'s; `reservation_pays`
False (the downstream co-runner steps faster as an uncapped MPS client than on S_tot − S_min)
makes the urgent downstream side's configuration OPEN instead of S_min.

Unknown pressure (NVML missing or failing): ρ = `unknown_pressure` (default 1.0, i.e. S_cap),
the setting that protects short-path requests most while still bounding the shared stage.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from enum import IntEnum

from horizonserve.runtime.config import ControlParams, SharingVerdicts, SmLadder, SmSplit


class Level(IntEnum):
    """A decision's level that is not a ladder index (ladder indices are ≥ 0). Published as
    an integer in the control record; `runtime.gpu.split` turns it into each stage's SMs."""

    AGGRESSIVE = -1  # S_aggr: nothing runs downstream
    UNCAPPED = -2  # every stage on the whole GPU (baselines, w/o SM throttling)
    LIFTED = -3  # S_aggr while co-running: the shared stage is backlogged
    OPEN = -4  # the whole GPU under MPS beside the downstream (the cap does not pay)
    RESERVED = -5  # the shared stage on `SmLadder.s_reserve`: an urgent downstream side first


NO_DECISION = -128  # the control record's level when it holds no decision (never a Level)
AGGRESSIVE, UNCAPPED, LIFTED, OPEN = Level.AGGRESSIVE, Level.UNCAPPED, Level.LIFTED, Level.OPEN
RESERVED = Level.RESERVED


def partitioned(level: int) -> bool:
    """The shared stage co-runs on its own Green Context, disjoint from the downstream's: a
    ladder index or the reservation."""
    return level >= 0 or level == RESERVED


@dataclass(slots=True, frozen=True)
class SmDecision:
    shared: int  # SMs the shared stage may use this step
    downstream: int  # complementary headroom for downstream stages
    level: int  # index into ladder.levels (≥ 0), or a `Level`
    changed: bool  # differs from the previous step's decision
    prefill: int  # SMs for a prefill carrying urgent prompts (≥ shared)


class PressureEwma:
    """EWMA of the memory-pressure samples; None while unknown."""

    __slots__ = ("_gamma", "value")

    def __init__(self, gamma: float) -> None:
        self._gamma = gamma
        self.value: float | None = None

    def update(self, sample: float | None) -> float | None:
        if sample is None or sample != sample:  # None or NaN: the signal is unavailable
            self.value = None
        elif self.value is None:
            self.value = sample
        else:
            self.value += self._gamma * (sample - self.value)
        return self.value


def snap(levels: list[int], target: float) -> int:
    """Index of the ladder level nearest to `target` (ties go down)."""
    i = bisect_left(levels, target)
    if i == 0:
        return 0
    if i == len(levels):
        return len(levels) - 1
    return i if levels[i] - target < target - levels[i - 1] else i - 1


class SpatialController:
    """Bandwidth-guided SM throttling with hysteresis."""

    __slots__ = (
        "_aggressive",
        "_b_sat",
        "_boost",
        "_control",
        "_decisions",
        "_hyst",
        "_ladder",
        "_levels",
        "_lift",
        "_open",
        "_prev",
        "_reserve",
        "_s_min",
        "_s_reserve",
        "_slack_split",
        "_span",
        "_total",
        "_unknown_rho",
        "ewma",
    )

    def __init__(
        self,
        ladder: SmLadder,
        control: ControlParams,
        verdicts: SharingVerdicts | None = None,
    ) -> None:
        verdicts = verdicts or SharingVerdicts()
        self._ladder = ladder
        self._control = control
        # The ladder and the control are frozen: their values, read once here, hold for the
        # controller's life.
        self._levels = list(ladder.levels)
        self._s_min = ladder.s_min
        self._span = ladder.s_cap - ladder.s_min
        self._aggressive = ladder.aggressive
        self._total = ladder.total
        self._s_reserve = ladder.s_reserve
        self._b_sat = control.b_sat
        self._unknown_rho = control.unknown_pressure
        self._hyst = control.hysteresis_steps
        self._boost = control.boost.prefill
        self._lift = control.boost.backlog and verdicts.backlog_lift_pays
        self.ewma = PressureEwma(control.ewma_gamma)
        self._prev: SmDecision | None = None
        self._slack_split = control.sm_split is SmSplit.SLACK
        self._open = not verdicts.throttling_pays
        self._reserve = verdicts.reservation_pays
        # A decision is a function of (level, changed) alone (the SMs follow from the level on
        # a fixed ladder), so each is built once and shared: decisions are frozen values.
        self._decisions: dict[tuple[int, bool], SmDecision] = {}

    @property
    def ladder(self) -> SmLadder:
        return self._ladder

    def observe(self, sample: float | None) -> float | None:
        """Feed one raw memory-activity sample (fraction in [0, 1]); returns B̂."""
        return self.ewma.update(sample)

    def rho(self) -> float:
        b = self.ewma.value
        if b is None:
            return self._unknown_rho
        r = b / self._b_sat
        return 0.0 if r < 0.0 else 1.0 if r > 1.0 else r

    def _target_level(self, raw: float, prev: SmDecision | None) -> int:
        target = snap(self._levels, raw)
        if prev is None or prev.level < 0:
            return target  # entering co-running: go straight to the ladder
        # Hysteresis: move only when the snapped target is at least h ladder steps away.
        return target if abs(target - prev.level) >= self._hyst else prev.level

    def select(
        self,
        downstream_active: bool,
        backlog: bool = False,
        shared_slack: float | None = None,
        downstream_slack: float | None = None,
    ) -> SmDecision:
        """The shared-stage SM cap for this step (Eq. 1 with hysteresis, backlog lift, slack
        split; see the module doc for the slack arguments)."""
        prev = self._prev
        if not downstream_active:
            level, shared = AGGRESSIVE, self._aggressive
        elif backlog and self._lift:
            level, shared = LIFTED, self._aggressive
        elif self._slack_split and _downstream_first(shared_slack, downstream_slack):
            level, shared = (RESERVED, self._s_reserve) if self._reserve else (OPEN, self._total)
        elif self._open:
            level, shared = OPEN, self._total
        else:
            raw = self._s_min + self.rho() * self._span
            level = self._target_level(raw, prev)
            shared = self._levels[level]
        if prev is not None and prev.level == level:
            return prev if not prev.changed else self._remember(prev.shared, level, False)
        return self._remember(shared, level, True)

    def _remember(self, shared: int, level: int, changed: bool) -> SmDecision:
        d = self._decisions.get((level, changed))
        if d is None:
            ladder = self._ladder
            prefill = ladder.aggressive if self._boost and partitioned(level) else shared
            down = ladder.total if level == OPEN else ladder.headroom(shared)
            d = self._decisions[level, changed] = SmDecision(shared, down, level, changed, prefill)
        self._prev = d
        return d


def _downstream_first(shared_slack: float | None, downstream_slack: float | None) -> bool:
    """The downstream side's most urgent request has less slack than the shared side's."""
    if downstream_slack is None:
        return False
    return shared_slack is None or downstream_slack < shared_slack


class UncappedSpatial:
    """Baselines and the no-throttling ablation: every stage may use the whole GPU."""

    __slots__ = ("_decision", "ewma")

    def __init__(self, ladder: SmLadder, control: ControlParams) -> None:
        self._decision = SmDecision(ladder.total, ladder.total, UNCAPPED, False, ladder.total)
        self.ewma = PressureEwma(control.ewma_gamma)

    def observe(self, sample: float | None) -> float | None:
        return self.ewma.update(sample)

    def select(
        self,
        downstream_active: bool,
        backlog: bool = False,
        shared_slack: float | None = None,
        downstream_slack: float | None = None,
    ) -> SmDecision:
        return self._decision
