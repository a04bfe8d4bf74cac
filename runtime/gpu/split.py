"""Where a stage process runs: the one rule that turns the shared stage's published split into
an SM count, for every role and both engines.

The spatial controller (`runtime.spatial`) decides a split each step and the shared stage
publishes it in the control record as (level, shared SMs, downstream SMs). Every stage process
opens one `StageLadder` for its role at start (which Green Contexts to pre-allocate) and asks it,
before each forward pass, which of them to run on. Levels are explicit (`Level`): a ladder index
(≥ 0) or one of the named levels; the record's "no decision" is its own value.

Rules, for a decision that is fresh (a stale or missing one counts as no decision):
  shared      its published SM count; S_aggr before its first decision; the whole GPU for
              UNCAPPED, OPEN or a count of S_tot or more;
  downstream  the whole GPU for no decision (the shared stage is idle), UNCAPPED and OPEN; the
              guaranteed S_tot − S_cap while the shared stage holds S_aggr (AGGRESSIVE, LIFTED:
              the two then overlap as MPS clients); otherwise (a ladder index, RESERVED) the
              published headroom (at least the guarantee; a calibration probe may publish less).
Fallback, the same for both roles: a count with no pre-allocated context snaps down to the
largest one below it (the smallest when none is), so a process never takes SMs it was not
given; a count of S_tot or more is the whole GPU (no context needed).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from horizonserve.runtime.config import SmLadder
from horizonserve.runtime.spatial import NO_DECISION, Level

FLOOR_SMS = 8  # the smallest Green Context the driver grants on Hopper (groups of 8)
_OVERLAPPED = frozenset({Level.AGGRESSIVE, Level.LIFTED})  # the shared stage holds S_aggr


def level_name(level: int) -> str:
    """`ladder[i]` for a ladder index, else the level's name (traces, logs)."""
    if level == NO_DECISION:
        return "none"
    return f"ladder[{level}]" if level >= 0 else Level(level).name.lower()


class Role(StrEnum):
    SHARED = "shared"
    DOWNSTREAM = "downstream"


@dataclass(frozen=True, slots=True)
class StageLadder:
    """One stage process's SM levels and the rule above."""

    role: Role
    total: int
    aggressive: int  # S_aggr: the shared stage's SMs before its first decision
    guaranteed: int  # downstream SMs while co-running never drop below S_tot − S_cap
    contexts: tuple[int, ...]  # SM counts to pre-allocate, ascending (the whole GPU needs none)

    @classmethod
    def open(cls, role: Role | str, ladder: SmLadder, capped: bool = True) -> StageLadder:
        """The ladder of a `role` process; `capped` False (uncapped policies): no contexts."""
        role = Role(role)
        total = ladder.total
        guaranteed = max(total - ladder.s_cap, FLOOR_SMS)
        shared_levels = {*ladder.levels, ladder.s_reserve, ladder.aggressive}
        if not capped:
            counts: set[int] = set()
        elif role is Role.SHARED:
            counts = shared_levels
        else:  # the complement of every shared level (calibration probes ask for the small
            # ones), and the guarantee
            counts = {total - s for s in shared_levels if total - s >= FLOOR_SMS} | {guaranteed}
        contexts = tuple(sorted(c for c in counts if 0 < c < total))
        return cls(role, total, ladder.aggressive, guaranteed, contexts)

    def snap(self, sms: int) -> int | None:
        """The pre-allocated count to run `sms` on (None: the whole GPU); see the fallback."""
        if sms >= self.total or not self.contexts:
            return None
        best = self.contexts[0]
        for c in self.contexts:
            if c <= sms:
                best = c
        return best

    def sms_for(self, level: int, shared_sms: int, downstream_sms: int) -> int | None:
        """SMs this process runs on for a published decision (None: the whole GPU)."""
        if self.role is Role.SHARED and level == NO_DECISION:
            return self.snap(self.aggressive)  # before its first decision
        if level == NO_DECISION or level in (Level.UNCAPPED, Level.OPEN):
            return None
        if self.role is Role.SHARED:
            return self.snap(shared_sms)
        if level in _OVERLAPPED or downstream_sms <= 0:  # S_aggr over the GPU
            return self.snap(self.guaranteed)
        return self.snap(downstream_sms)  # ≥ the guarantee on the ladder; a probe asks less
