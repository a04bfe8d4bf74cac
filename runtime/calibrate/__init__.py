"""Offline calibration: GPU measurements, the artifact they build (its schema: runtime.artifact)
and the fit of the simulator's contention factors to measured campaigns (calibrate.fit)."""

from horizonserve.runtime.artifact import (
    SCHEMA_VERSION,
    CalibrationArtifact,
    PipelineCalibration,
    load_artifact,
)

__all__ = ["SCHEMA_VERSION", "CalibrationArtifact", "PipelineCalibration", "load_artifact"]
