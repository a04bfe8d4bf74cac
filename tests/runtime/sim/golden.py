"""The golden runs: per-class attainment of every simulated system on the three pipelines, and
of HorizonServe with each control mechanism switched against the calibration's choice.

Fixed seeds, short traces at a rate past each pipeline's knee (where the mechanisms decide who
meets its SLO). `test_golden.py` compares them with `golden.json`; a change of behaviour shows
there. `VARIANTS` names each mechanism switch by the control settings that make it; the
figures under its name stay whatever the settings are called. Regenerate (only where a
figure is meant to change, in its own commit):

    .venv/bin/python -m tests.runtime.sim.golden --write
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

GOLDEN_FILE = Path(__file__).with_name("golden.json")
# pipeline → (rate req/s, simulated seconds): each past its simulated knee, small enough that
# the 33 runs take a few seconds.
POINTS: dict[str, tuple[float, float]] = {
    "qwen2_5_omni": (7.0, 40.0),
    "mimo_audio": (10.0, 40.0),
    "bagel": (3.5, 40.0),
}
SEED = 1
# variant name → control axes over the calibration's (`SimSetup.load`), run as "horizon"; keys
# of `SharingVerdicts` set the calibration's verdicts instead.
VARIANTS: dict[str, dict[str, Any]] = {
    "no-urgent-prefill-boost": {"boost": "backlog"},
    "backlog-lift-on": {"backlog_lift_pays": True},
    "backlog-lift-off": {"backlog_lift_pays": False},
    "protect-past-deadline": {"late": "protect"},
    "no-late-yield": {"late": "compete"},
    "no-late-phase-yield": {"late": "yield"},
    "no-deadline-order": {"view_order": "arrival"},
    "no-reservation": {"reservation_pays": False},
    "throttling-off": {"throttling_pays": False},
    "throttling-on": {"throttling_pays": True},
    "no-downstream-admission": {
        "downstream": "fifo",
        "downstream_urgency": "slack",
    },
    "no-place-admission": {"downstream": "deadline"},
    "no-saturated-first": {"downstream_urgency": "slack"},
    "reject-late": {"reject_late": True},
    "no-shared-preemption": {"preemption": "none"},
    "no-slack-split": {"sm_split": "ladder", "downstream_urgency": "slack"},
    "no-shared-hold": {"shared_hold_s": 0.0},
}


def run_point(pipeline: str, system: str, control: dict[str, Any] | None = None) -> dict[str, Any]:
    """One run's per-class figures: requests, met share and p95 (rounded to µs)."""
    from horizonserve.runtime.bench.metrics import summarize
    from horizonserve.runtime.sim import SimSetup, simulate
    from horizonserve.runtime.workload import generate, load_workload, mix_weights

    rate, duration = POINTS[pipeline]
    setup = SimSetup.load(pipeline)
    if control:
        from horizonserve.runtime.config import ControlParams, SharingVerdicts

        verdict = {k: v for k, v in control.items() if k in SharingVerdicts.model_fields}
        axes = {k: v for k, v in control.items() if k not in verdict}
        ctl = ControlParams.model_validate({**setup.control.model_dump(), **axes})
        setup = replace(
            setup,
            control=ctl,
            verdicts=setup.cal.verdicts().model_copy(update=verdict),
        )
    workload = load_workload(pipeline)
    mix = mix_weights(workload, setup.long_classes, None, None)
    trace = generate(
        workload, mix, rate=rate, duration_s=duration, warmup_s=0.1 * duration, seed=SEED
    )
    s = summarize(simulate(setup, trace, system, seed=SEED))
    return {
        name: {
            "requests": c["requests"],
            "attainment": None if c["attainment"] is None else round(c["attainment"], 9),
            "p95_s": None if c["p95_s"] is None else round(c["p95_s"], 6),
        }
        for name, c in s["classes"].items()
    }


def golden_values() -> dict[str, dict[str, Any]]:
    from horizonserve.runtime.sim.systems import SYSTEMS

    out: dict[str, dict[str, Any]] = {}
    for p in POINTS:
        out[p] = {name: run_point(p, name) for name in SYSTEMS}
        out[p] |= {f"horizon+{v}": run_point(p, "horizon", c) for v, c in VARIANTS.items()}
    return out


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.runtime.sim.golden --write")
    GOLDEN_FILE.write_text(json.dumps(golden_values(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN_FILE}")
