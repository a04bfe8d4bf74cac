"""The fit base: the shipped default with every entry replaced by the 30-sample calibration.

Qwen2.5-Omni keeps the time-slice factor fitted to the time-sliced runs of qwen2_5_omni-2
(5.5533): its campaigns since ran no time-sliced system, and the calibrated 1.915 ranks the
time-sliced baselines above MPS, which the GPU does not.
"""

import json
from pathlib import Path

fitted = json.loads(Path("runtime/data/calibration/h200-fitted.json").read_text())
measured = json.loads(Path("runtime/data/calibration/h200-measured.json").read_text())
base = dict(measured)
q = base["pipelines"]["qwen2_5_omni"]
old = fitted["pipelines"]["qwen2_5_omni"]["sharing"]["timeslice_downstream_factor"]
q["sharing"]["timeslice_downstream_factor"] = old
q["notes"]["sharing.timeslice_downstream_factor"] = (
    f"carried: {old:.4f}, fitted to the time-sliced runs of bench/results/h200-eval/"
    "qwen2_5_omni-2 (the 30-sample calibration measured 1.915 in situ)"
)
Path("bench/results/sim-fit-h200-2/base.json").write_text(json.dumps(base, indent=1) + "\n")
