"""Refresh the shipped pipeline files from a calibration artifact (a maintenance entry point).

`python -m horizonserve.runtime.sim.refresh` rewrites each pipeline file's r̂ profiles
(`sim.profiles.derive_profile`), its simulated solo p95 defaults and its `source` line from the
package's default artifact.
"""

from __future__ import annotations

import json
import sys
from importlib import resources

from horizonserve.runtime.artifact import (
    DEFAULT_ARTIFACT,
    CalibrationArtifact,
    load_packaged,
)
from horizonserve.runtime.config import PIPELINES, PipelineSpec, RequestClass
from horizonserve.runtime.sim.profiles import derive_profile
from horizonserve.runtime.sim.setup import SimSetup, engine_calibration
from horizonserve.runtime.sim.solo import measure_solo_p95
from horizonserve.runtime.workload import load_workload

SOLO_REQUESTS = 200  # requests per class behind the shipped solo_p95_s defaults (seed 0)


def pipeline_source(artifact_name: str, artifact: CalibrationArtifact) -> str:
    """The `source` line of a shipped pipeline file derived from `artifact_name`."""
    if any(p.fit is not None for p in artifact.pipelines.values()):
        what = (
            "measured on the GPU by `horizonserve calibrate`, contention factors fitted to "
            "measured campaign runs by `horizonserve calibrate fit` (provenance in its `fit`)"
        )
    elif artifact.source.startswith("measured"):
        what = "measured on the GPU by `horizonserve calibrate` (per-field provenance in its notes)"
    else:
        what = "an ESTIMATE anchored on the paper's figures, not a calibration"
    return (
        "Classes from the HorizonServe paper (§6.1). Profiles (r̂ inputs) derived by "
        f"horizonserve.runtime.sim.profiles from the calibration artifact "
        f"runtime/data/calibration/{artifact_name} ({what}; key "
        f"{artifact.gpu.name}|{artifact.gpu.driver}|{artifact.gpu.sm_count} SMs); solo_p95_s "
        f"measured by the simulator on that artifact (each class alone, FCFS backend, "
        f"{SOLO_REQUESTS} requests, seed 0) — simulated, not GPU measurements (the artifact's "
        "own solo_p95_s holds what the GPU measured)."
    )


def write_pipeline(name: str, path: str, artifact_name: str = DEFAULT_ARTIFACT) -> None:
    """Refresh the profiles, simulated solo p95 defaults and source of a shipped pipeline file."""
    with open(path) as f:
        data = json.load(f)
    artifact = load_packaged(artifact_name)
    cal = engine_calibration(name, artifact.pipeline(name))
    wl = load_workload(name)
    for c in data["slo"]["classes"]:
        rc = RequestClass.model_validate(c)
        c["profile"] = derive_profile(cal, wl, wl.get(rc.name), rc).model_dump()
    spec = PipelineSpec.model_validate(data)
    setup = SimSetup(spec=spec, cal=cal, slo=spec.slo)
    p95 = measure_solo_p95(setup, wl, n=SOLO_REQUESTS, seed=0)
    for c in data["slo"]["classes"]:
        c["solo_p95_s"] = round(p95[c["name"]], 4)
    data["source"] = pipeline_source(artifact_name, artifact)
    with open(path, "w") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")


def main(argv: list[str]) -> None:
    """`python -m horizonserve.runtime.sim.refresh [pipeline=file ...]`.

    Without arguments: every shipped pipeline file, from the package's default artifact.
    """
    if not argv:
        root = resources.files("horizonserve.runtime").joinpath("data/pipelines")
        argv = [f"{p}={root.joinpath(p + '.json')}" for p in PIPELINES]
    for arg in argv:
        pipeline, _, file = arg.partition("=")
        write_pipeline(pipeline, file)
        print(f"wrote {file} (from {DEFAULT_ARTIFACT})")


if __name__ == "__main__":  # pragma: no cover - maintenance entry point
    main(sys.argv[1:])
