"""Offline calibration: the versioned artifact (schema here) and, later, the GPU measurements."""

from horizonserve.runtime.calibrate.artifact import (
    SCHEMA_VERSION,
    CalibrationArtifact,
    PipelineCalibration,
    load_artifact,
)

__all__ = ["SCHEMA_VERSION", "CalibrationArtifact", "PipelineCalibration", "load_artifact"]
