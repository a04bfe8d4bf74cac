"""What-if artifact: the shared stage behaves as the project's naive H200 probe saw (DESIGN.md).

Decode alone saturates at 64 SMs and does not degrade at full allocation (4.83-4.95 ms from 64 to
132 SMs), and co-running costs about 1.9x whatever the SM split (8.9-10.8 ms vs 4.85 ms), with no
MPS relief. Everything else is the default artifact. Usage:

    .venv/bin/python bench/results/sim/whatif/make_h200_probe_artifact.py OUT.json
    .venv/bin/horizonserve bench --artifact OUT.json --out bench/results/sim/whatif/h200-probe
"""

import sys

from horizonserve.runtime.calibrate.artifact import CalibrationArtifact, load_artifact

data = load_artifact().model_dump()
data["source"] = "WHAT-IF (not a calibration): default-h200 with the naive H200 probe's shared-stage behaviour. " + data["source"]
flat = {"sms": [16, 132], "values": [1.9, 1.9]}
for p in data["pipelines"].values():
    p["shared"]["decode_step_s"] = {
        "sms": [32, 48, 64, 80, 96, 112, 132],
        "values": [0.00609, 0.00527, 0.00483, 0.00495, 0.00485, 0.00490, 0.00492],
    }
    p["shared"]["corun_decode_factor"] = flat
    p["shared"]["corun_prefill_factor"] = flat
    p["sharing"]["mps_shared_excess"] = 1.0
    p["solo_p95_s"] = {}
    p["solo_p95_source"] = None
art = CalibrationArtifact.model_validate(data)
with open(sys.argv[1], "w") as f:
    f.write(art.model_dump_json(indent=2) + "\n")
