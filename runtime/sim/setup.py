"""What one simulated deployment is: pipeline classes, calibration, SLO table, control knobs."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from horizonserve.runtime.artifact import (
    CalibrationArtifact,
    PipelineCalibration,
    load_artifact,
)
from horizonserve.runtime.config import (
    ControlParams,
    Path,
    PipelineSpec,
    PolicyName,
    ServingConfig,
    SharingVerdicts,
    SloTable,
    load_pipeline,
)
from horizonserve.runtime.engine.deploy import load_deploy
from horizonserve.runtime.sim.limits import with_deploy
from horizonserve.runtime.sim.profiles import derive_profile
from horizonserve.runtime.workload import load_workload


def engine_calibration(
    pipeline: str, cal: PipelineCalibration, deploy_profile: str | None = None
) -> PipelineCalibration:
    """`cal` with the engine limits of `deploy_profile`, else of the entry's own profile; with
    neither, `cal` as it is."""
    profile = deploy_profile or cal.deploy_profile
    return with_deploy(cal, load_deploy(pipeline, profile)) if profile else cal


@dataclass(frozen=True)
class SimSetup:
    spec: PipelineSpec
    cal: PipelineCalibration
    slo: SloTable  # the SLO table the policies and the metrics use
    control: ControlParams = field(default_factory=ControlParams)
    slo_source: str = "pipeline defaults"
    # Which SM configurations pay (default: the calibration's, `PipelineCalibration.verdicts`).
    verdicts: SharingVerdicts | None = None

    @classmethod
    def load(
        cls,
        pipeline: str,
        artifact: CalibrationArtifact | None = None,
        control: ControlParams | None = None,
        *,
        derive_profiles: bool = True,
        deploy_profile: str | None = None,
    ) -> SimSetup:
        """The pipeline file's classes on `artifact` (default: the package's default artifact).

        With `derive_profiles` the classes' r̂ profiles are derived from the artifact being
        simulated (`sim.profiles.derive_profile`), as a calibration on that GPU would record
        them; for the default artifact they equal the shipped ones (a test checks it). Without,
        the pipeline file's profiles are used whatever the artifact.

        Engine limits come from the deploy description (`engine.deploy`) under
        `deploy_profile`, else under the artifact's own `deploy_profile`; with neither, the
        artifact's limits stand.
        """
        spec = load_pipeline(pipeline)
        art = artifact if artifact is not None else load_artifact()
        cal = engine_calibration(pipeline, art.pipeline(pipeline), deploy_profile)
        ctl = control if control is not None else cal.control()
        slo = spec.slo
        if derive_profiles:
            wl = load_workload(pipeline)
            classes = [
                c.model_copy(update={"profile": derive_profile(cal, wl, wl.get(c.name), c)})
                for c in slo.classes
            ]
            slo = SloTable.model_validate({**slo.model_dump(), "classes": classes})
        return cls(spec=spec, cal=cal, slo=slo, control=ctl)

    @property
    def class_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.slo.classes)

    @property
    def long_classes(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.slo.classes if c.path is Path.LONG)

    def targets(self) -> dict[str, float]:
        return {c.name: self.slo.target_s(c.name) for c in self.slo.classes}

    def serving_config(self, policy: PolicyName) -> ServingConfig:
        return ServingConfig(
            model=self.spec.model,
            pipeline=self.spec.name,
            policy=policy,
            slo=self.slo,
            ladder=self.cal.ladder,
            control=self.control,
            verdicts=self.verdicts if self.verdicts is not None else self.cal.verdicts(),
        )

    def with_solo_p95(
        self, p95: dict[str, float], source: str, multiplier: float | None = None
    ) -> SimSetup:
        """The same setup with SLO targets from measured solo p95 latencies."""
        classes = [
            c.model_copy(update={"solo_p95_s": p95.get(c.name, c.solo_p95_s)})
            for c in self.slo.classes
        ]
        update: dict[str, object] = {"classes": classes}
        if multiplier is not None:
            update["multiplier"] = multiplier
        slo = SloTable.model_validate({**self.slo.model_dump(), **update})
        return replace(self, slo=slo, slo_source=source)

    def with_calibrated_slo(
        self, cal: PipelineCalibration, where: str, multiplier: float | None = None
    ) -> SimSetup:
        """The same setup with SLO targets from the calibration entry's measured solo p95 (the
        table the H200 evaluations ran); ValueError naming the classes it lacks."""
        solo = dict(cal.solo_p95_s or {})
        missing = [n for n in self.class_names if n not in solo]
        if missing:
            raise ValueError(f"{where} has no solo p95 for {self.spec.name} classes {missing}")
        return self.with_solo_p95(solo, f"solo p95 of {where}", multiplier)
