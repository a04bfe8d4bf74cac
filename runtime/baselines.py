"""What each 2026 co-location baseline adds to the axes its preset sets (`config.PRESETS`).

Their presets are plain FCFS (or EDF) under MPS with every HorizonServe axis off; each engine
that runs one also applies the rules named here:

    policy             shared stage                 downstream stages       GPU sharing
    shed               FCFS, vLLM's queue limits    FIFO                    MPS, uncapped
    shed-edf           EDF, vLLM's queue limits     FIFO                    MPS, uncapped
    vllm-omni-current  DTPS tiers (fixed budgets)   bounded-K window, EDF   MPS, uncapped
    mps-static         FCFS                         FIFO                    MPS, fixed SM shares

Shedding: `runtime.shedding`; the window and the tiers: `runtime.audio_window`; the static
shares: `STATIC_SHARE` below, each pipeline's best share of a sweep in the simulator
(bench/results/sim/baselines-2026/). A refused request is a miss.
"""

from __future__ import annotations

from dataclasses import dataclass

from horizonserve.runtime.config import PolicyName


@dataclass(frozen=True, slots=True)
class BaselineRules:
    shed: bool = False  # vLLM's queue limits at the shared stage (`runtime.shedding`)
    window: bool = False  # bounded-K active streams, EDF order (`audio_window.EdfQueue`)
    tiered: bool = False  # DTPS tier order at the shared stage (`audio_window.dtps_order`)
    static_share: bool = False  # the shared stage on a fixed SM share, downstream on the rest


NONE = BaselineRules()
RULES: dict[PolicyName, BaselineRules] = {
    PolicyName.SHED: BaselineRules(shed=True),
    PolicyName.SHED_EDF: BaselineRules(shed=True),
    PolicyName.VLLM_OMNI_CURRENT: BaselineRules(window=True, tiered=True),
    PolicyName.MPS_STATIC: BaselineRules(static_share=True),
}

# The shared stage's SMs under mps-static, per pipeline, on a 132-SM H200: the static split
# with the highest capacity at 90 % attainment in bench/results/sim/baselines-2026/
# static-capacity.txt (SIMULATED; the downstream stages get the rest). Another GPU scales the
# share by its SM count.
STATIC_SHARE: dict[str, int] = {"qwen2_5_omni": 64, "mimo_audio": 112, "bagel": 40}
STATIC_SHARE_SMS = 132


def rules_for(name: PolicyName | str) -> BaselineRules:
    return RULES.get(PolicyName(name), NONE)


def static_share(pipeline: str, total_sms: int, override: int | None = None) -> int:
    """The shared stage's SMs under mps-static: `override`, else the sweep's share for the
    pipeline scaled to `total_sms` (60 % of the GPU for a pipeline the sweep did not run).
    Invariant: 1 ≤ share < total_sms (the downstream stages keep at least one SM)."""
    if total_sms < 2:
        raise ValueError(f"mps-static: {total_sms} SMs cannot be split between two stages")
    if override is not None:
        share = override
    elif pipeline in STATIC_SHARE:
        share = round(STATIC_SHARE[pipeline] * total_sms / STATIC_SHARE_SMS)
    else:
        share = round(0.6 * total_sms)
    if not 1 <= share < total_sms:
        raise ValueError(
            f"mps-static: share {share} SMs out of range; use 1 to {total_sms - 1} of {total_sms}"
        )
    return share


# The rules each engine applies. A preset whose rules an engine lacks is refused there rather
# than run as the plain preset it would otherwise fall back to.
ENGINE_RULES: dict[str, frozenset[str]] = {
    "sim": frozenset({"shed", "window", "tiered", "static_share"}),
    "reference": frozenset({"shed", "window", "tiered", "static_share"}),
}


def check_engine(name: PolicyName | str, engine: str) -> None:
    """ValueError naming the policy and what to run instead when `engine` lacks its rules."""
    r = rules_for(name)
    wanted = {k for k in ("shed", "window", "tiered", "static_share") if getattr(r, k)}
    missing = sorted(wanted - ENGINE_RULES.get(engine, frozenset()))
    if missing:
        raise ValueError(
            f"policy {PolicyName(name).value!r}: the {engine} engine does not apply its rules "
            f"({', '.join(missing)}); run it in the simulator (horizonserve sim), or pick "
            "another policy"
        )
